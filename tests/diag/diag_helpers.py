"""What the diagnosis tests share: scripts, small process helpers, the ``jobs`` fixture."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fsm_test_procs import FAST, Job, Jobs, alive, free_port, jobs_fixture, trace_records

__all__ = ["FAST", "SCRIPTS", "Job", "Jobs", "alive", "free_port", "jobs", "spawn",
           "trace_records", "wait_line"]

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Real ``fsm-agent run`` jobs; fails the test on any process left behind."""
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=3))


@contextlib.contextmanager
def spawn(code: str, *, argv: Sequence[str] = (), prefix: Sequence[str] = ()
          ) -> Iterator[subprocess.Popen[str]]:
    """A Python process running ``code`` (killed with its group at the end)."""
    proc = subprocess.Popen([*prefix, sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


def wait_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The next line the process prints (it must print one in time)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            return line.strip()
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    pytest.fail(f"process {proc.pid} printed nothing within {timeout} s")
