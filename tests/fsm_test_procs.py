"""Real-process jobs for the tests, and the guarantee that none of their processes outlives a test.

Every process a test starts is found again at teardown in two independent ways:

- by a token: each launcher gets ``FSM_AGENT_TEST_TOKEN=<uuid>`` in its environment, and torch
  hands the environment on to the workers and they to their children, so a worker re-parented to
  init (its agent was SIGKILLed) is still found by scanning ``/proc/*/environ``;
- by the process tree: every live descendant of the pytest process (``/proc/*/stat`` ppid links),
  which catches a process that cleared its environment.

Whatever is still alive a few seconds after the test is killed and the test fails, whatever its
own assertions said. (A unique module name: several test directories have a ``conftest``.)
"""

from __future__ import annotations

import contextlib
import ipaddress
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

TOKEN_VAR = "FSM_AGENT_TEST_TOKEN"
# Small intervals and timeouts keep the whole suite within its budget on 2 cores.
FAST = ["--monitor-interval", "0.05"]
LAUNCHERS = {
    "fsm-agent": [sys.executable, "-m", "fsm_agent", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "fsm-agent store": [sys.executable, "-m", "fsm_agent", "store"],
}


def free_port() -> int:
    """A loopback port nobody listens on right now (for a c10d endpoint shared by agents)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[len("socket:["):-1])
    return out


def _decode(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc/net/tcp6 prints four little-endian 32-bit words.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc/net/tcp{,6}."""
    mine = _socket_inodes(pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in mine:  # 0A: LISTEN
                addr, port = fields[1].split(":")
                found.append((_decode(addr), int(port, 16)))
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def pids_with_token(token: str) -> set[int]:
    """Live processes whose environment holds ``token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = set()
    for pid in _all_pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(pid):
            found.add(pid)
    return found


def descendants(root: int) -> set[int]:
    """Live descendants of ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


class Job:
    """One launcher process (``fsm-agent run`` or ``torchrun``), its directory and its output."""

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

    def records(self, pattern: str = "*.json") -> list[dict[str, object]]:
        """What the worker scripts wrote to ``$OUT_DIR`` (one JSON file each), sorted by name.

        A worker writes ``NAME.tmp`` and renames it: a ``.tmp`` file, or one that goes between
        the listing and the read, is left out (the next poll sees it under its final name).
        """
        found = []
        for f in sorted(self.out_dir.glob(pattern)):
            if f.suffix == ".tmp":
                continue
            try:
                found.append(json.loads(f.read_text()))
            except FileNotFoundError:
                continue
        return found

    def _until(self, done: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():  # type: ignore[operator]
                return
            if self.poll() is not None:
                break
            time.sleep(0.02)
        if not done():  # type: ignore[operator]
            pytest.fail(f"{what}:\n{self.output[-4000:]}")

    def wait_for(self, pattern: str, n: int, timeout: float) -> list[dict[str, object]]:
        """Wait until the workers wrote ``n`` files matching ``pattern``."""
        self._until(lambda: len(self.records(pattern)) >= n, timeout,
                    f"expected {n} files {pattern}, got {len(self.records(pattern))}")
        return self.records(pattern)

    def barrier_count(self) -> int:
        """How many times the exit barrier was entered (the engine logs it at INFO)."""
        return len(re.findall(r"^\S+ \S+ \d+ fsm_agent/\S+\] Local worker group finished",
                              self.output, re.M))

    def wait_output(self, text: str, timeout: float) -> None:
        """Wait until the job's output contains ``text``."""
        self._until(lambda: text in self.output, timeout, f"{text!r} not in the output")

    def final_message(self) -> str:
        """The launcher's one-line verdict (the run summary may follow it)."""
        lines = [x for x in self.output.splitlines() if x.startswith("fsm-agent run: ")]
        assert lines, self.output[-3000:]
        return lines[-1]

    def wait_listening(self, port: int, timeout: float) -> None:
        """Wait until this job (the first agent of several) hosts the rendezvous store on
        ``port``; fail if it ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            assert self.poll() is None, self.output[-3000:]
            time.sleep(0.05)
        pytest.fail(f"nobody listens on {port}:\n{self.output[-3000:]}")


def _default_signals() -> None:
    # A launcher started from a non-interactive shell's background job inherits SIGINT ignored;
    # Python keeps it ignored, so would the workers. Real users' launchers have the default.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Jobs:
    """Starts jobs for one test; none of their processes may outlive it."""

    def __init__(self, tmp_path: Path, *, shutdown_timeout: int = 5,
                 default_script: Path | str | None = None) -> None:
        # the jobs run torch's agent: where torch is not installed (docs/compat.md) this skips
        import torch  # noqa: F401
        self.tmp_path = tmp_path
        self.token = uuid.uuid4().hex
        self.jobs: list[Job] = []
        self.shutdown_timeout = shutdown_timeout
        self.default_script = default_script

    def env(self, workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                TOKEN_VAR: self.token,
                "OUT_DIR": str(workdir / "out"),
                "LOGLEVEL": "INFO",
                "PYTHONWARNINGS": "ignore",
                "PYTHONUNBUFFERED": "1",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(self.shutdown_timeout),
            }
        )
        for var in ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_ENABLE_FILE_TIMER",
                    "TORCHELASTIC_TIMER_FILE"):
            env.pop(var, None)
        env.update(extra or {})
        return env

    def start(
        self,
        launcher_args: Sequence[str],
        script: Path | str | None = ...,  # type: ignore[assignment]
        script_args: Sequence[str] = (),
        *,
        launcher: str = "fsm-agent",
        env: dict[str, str] | None = None,
        name: str | None = None,
        netns: str | None = None,
    ) -> Job:
        """Start ``launcher [launcher_args] script [script_args]`` in its own directory (in the
        network namespace ``netns`` if given: ``ip netns exec`` execs the launcher, same pid)."""
        if script is ...:
            script = self.default_script
        name = name or f"job{len(self.jobs)}"
        workdir = self.tmp_path / name
        (workdir / "out").mkdir(parents=True)
        log = workdir / "output.txt"
        cmd = [*(["ip", "netns", "exec", netns] if netns else []), *LAUNCHERS[launcher],
               *launcher_args]
        if script is not None:
            cmd += [str(script), *script_args]
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                cmd, cwd=workdir, env=self.env(workdir, env), stdout=f,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_signals,
            )
        job = Job(proc, workdir, log)
        self.jobs.append(job)
        return job

    def cleanup(self) -> set[int]:
        """Kill whatever is left; return the pids that were still alive (a leak)."""
        for job in self.jobs:
            if job.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait()
        return kill_leftovers(self.token)


def session_helpers() -> set[int | None]:
    """multiprocessing's forkserver and resource tracker, if this process started them: they
    live as long as it does (tests/torch_upstream starts its workers through a forkserver)."""
    from multiprocessing import forkserver, resource_tracker

    return {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}


def kill_leftovers(token: str, grace: float = 5.0) -> set[int]:
    """Processes with ``token`` or below this one (but :func:`session_helpers`), still alive
    after ``grace`` seconds: killed, and returned (a leak)."""
    deadline = time.monotonic() + grace
    while True:
        # Workers may still be on their way out just after their agent ended.
        left = (pids_with_token(token) | descendants(os.getpid())) - session_helpers()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left  # type: ignore[return-value]


def jobs_fixture(js: Jobs) -> Iterator[Jobs]:
    """The body of a ``jobs`` fixture: yield ``js``, then fail the test on any leftover."""
    try:
        yield js
    finally:
        leaked = js.cleanup()
    if leaked:
        pytest.fail(f"processes left behind by the test: {sorted(leaked)}")


_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+)(?P<exitinfo>[^\n]*)\n"
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


def trace_records(path: Path) -> list[dict[str, object]]:
    """The JSON records of a trace file (every line must be complete JSON)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def standalone_store(jobs: Jobs, port: int = 0) -> tuple[Job, int]:
    """An ``fsm-agent store`` on loopback (``port`` 0: a free one): the job and its port."""
    store = jobs.start(["--host", "127.0.0.1", "--port", str(port)], None,
                       launcher="fsm-agent store", name="store")
    store.wait_output("fsm-agent store: listening on", 60)
    m = re.search(r"listening on 127\.0\.0\.1:(\d+) ", store.output)
    assert m, store.output
    return store, int(m.group(1))


def stop_store(store: Job) -> None:
    """SIGTERM: the store's clean stop, with its last line."""
    os.kill(store.pid, signal.SIGTERM)
    assert store.wait(20) == 0, store.output
    assert store.output.rstrip().endswith("fsm-agent store: stopped (SIGTERM)"), store.output
