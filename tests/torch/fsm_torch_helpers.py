"""Real-process helpers for the fsm_agent.torch tests (conftest.py re-exports the `jobs` fixture).

Every job started through the ``jobs`` fixture carries a unique token in its environment, which
torch passes on to the workers and they to their children. At teardown the fixture kills what
is still running and then scans ``/proc`` for the token: a test that leaves any process behind
fails, whatever its own assertions said.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLES = Path(__file__).parents[2] / "examples"
ENV_WORKER = SCRIPTS / "env_worker.py"
RECORD_WORKER = SCRIPTS / "record_worker.py"
TOKEN_VAR = "FSM_AGENT_TEST_TOKEN"

# Small intervals and timeouts keep the whole suite within its budget on 2 cores.
FAST = ["--monitor-interval", "0.05"]


def free_port() -> int:
    """A port nobody listens on right now (for a c10d endpoint shared by two agents)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pids_with_token(token: str) -> list[int]:
    """Live processes whose environment holds ``token``."""
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Job:
    """One launcher process (``fsm-agent run`` or ``torchrun``) and what it left in its dir."""

    def __init__(self, proc: subprocess.Popen[bytes], workdir: Path, log: Path) -> None:
        self.proc = proc
        self.workdir = workdir
        self.out_dir = workdir / "out"
        self.log = log
        self.ended_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (after killing the job) if it does not end in time."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"job did not finish within {timeout} s:\n{self.output[-4000:]}")
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        return rc

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return rc

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def records(self) -> list[dict[str, object]]:
        """What env_worker.py wrote, one dict per worker and attempt, in attempt/rank order."""
        files = sorted(self.out_dir.glob("attempt*_rank*.json"))
        return [json.loads(f.read_text()) for f in files]

    def wait_for_records(self, n: int, timeout: float) -> list[dict[str, object]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = self.records()
            if len(recs) >= n:
                return recs
            if self.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"expected {n} worker records, got {len(self.records())}:\n"
                    f"{self.output[-4000:]}")

    def barrier_count(self) -> int:
        """How many times the exit barrier was entered (the engine logs it at INFO)."""
        return len(re.findall(r"fsm_agent\] \[\w+\] Local worker group finished", self.output))


def _default_signals() -> None:
    # A launcher started from a non-interactive shell's background job inherits SIGINT ignored;
    # Python keeps it ignored, so would the workers. Real users' launchers have the default.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Jobs:
    """Starts jobs for one test and guarantees none of their processes outlive it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.token = uuid.uuid4().hex
        self.jobs: list[Job] = []

    def start(
        self,
        launcher_args: Sequence[str],
        script: Path | str,
        script_args: Sequence[str] = (),
        *,
        launcher: str = "fsm-agent",
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> Job:
        """Start ``launcher [launcher_args] script [script_args]`` in its own directory."""
        name = name or f"job{len(self.jobs)}"
        workdir = self.tmp_path / name
        (workdir / "out").mkdir(parents=True)
        log = workdir / "output.txt"
        if launcher == "fsm-agent":
            cmd = [sys.executable, "-m", "fsm_agent", "run"]
        elif launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run"]
        else:
            raise ValueError(launcher)
        cmd += [*launcher_args, str(script), *script_args]
        full_env = dict(os.environ)
        full_env.update(
            {
                TOKEN_VAR: self.token,
                "OUT_DIR": str(workdir / "out"),
                "LOGLEVEL": "INFO",
                "PYTHONWARNINGS": "ignore",
                "PYTHONUNBUFFERED": "1",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
            }
        )
        full_env.pop("TORCHELASTIC_ERROR_FILE", None)
        full_env.update(env or {})
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                cmd, cwd=workdir, env=full_env, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_default_signals,
            )
        job = Job(proc, workdir, log)
        self.jobs.append(job)
        return job

    def cleanup(self) -> list[int]:
        """Kill whatever is left; return the pids that were still alive (a leak)."""
        for job in self.jobs:
            if job.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait()
        leaked: list[int] = []
        deadline = time.monotonic() + 5.0
        while True:
            left = pids_with_token(self.token)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # workers may still be on their way out after their agent ended
        for pid in left:
            leaked.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leaked


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Start real launcher processes; fail the test if any process of theirs is left behind."""
    js = Jobs(tmp_path)
    try:
        yield js
    finally:
        leaked = js.cleanup()
    if leaked:
        pytest.fail(f"processes left behind by the test: {leaked}")


_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+)[^\n]*\n"
    r"\s*error_file\s*:\s*(?P<error_file>[^\n]*)\n"
    r"\s*traceback\s*:\s*(?P<traceback>[^\n]*)"
)


def summary(output: str) -> dict[str, object]:
    """torch's failure summary (ChildFailedError.format_msg) parsed: root cause and others."""
    head, sep, root = output.rpartition("Root Cause (first observed failure):")
    if not sep:
        return {}
    cause = _FAILURE.search(root)
    assert cause, root
    others = [m.groupdict() for m in _FAILURE.finditer(head.rpartition("Failures:")[2])]
    return {"root": cause.groupdict(), "others": others}
