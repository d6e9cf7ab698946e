"""What the resilient-preset tests share: the worker script, flags, and the ``jobs`` fixture on
``fsm_test_procs`` (which also fails a test that leaves any process behind)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsm_test_procs import (
    FAST,
    LAUNCHERS,
    Job,
    Jobs,
    alive,
    jobs_fixture,
    summary,
    trace_records,
    wait_gone,
)

__all__ = [
    "LAUNCH_SCRIPT", "ONE", "SHUTDOWN_TIMEOUT", "WORKER", "Job", "Jobs", "alive", "jobs",
    "resilient", "summary", "trace_records", "wait_gone",
]

SCRIPTS = Path(__file__).parent / "scripts"
WORKER = SCRIPTS / "crash_worker.py"
LAUNCH_SCRIPT = SCRIPTS / "launch_backoff.py"
ONE = ["--standalone", "--nproc-per-node", "1", *FAST]
SHUTDOWN_TIMEOUT = 3
# A program that calls fsm_agent.torch.launch itself (started and leak-checked like a launcher).
LAUNCHERS.setdefault("python", [sys.executable])
# fsm-agent run with a trace writer slow to record the step into BACKOFF.
LAUNCHERS.setdefault("slow trace", [sys.executable, str(SCRIPTS / "slow_trace_run.py")])


def resilient(*params: str) -> list[str]:
    """``--spec resilient`` and a ``--spec-param`` per ``NAME=VALUE``."""
    out = ["--spec", "resilient"]
    for p in params:
        out += ["--spec-param", p]
    return out


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Start real ``fsm-agent run`` jobs (``crash_worker.py`` by default); fail on any leftover."""
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=WORKER))
