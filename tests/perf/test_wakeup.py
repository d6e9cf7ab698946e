"""WorkerExitWaker against real processes, including torch's own process contexts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from fsm_agent.torch._wakeup import WorkerExitWaker, available_backends, default_backend

POSIX_BACKENDS = [b for b in ("pidfd", "thread") if b in available_backends()]
LONG = 60.0  # a timeout no passing test waits for; a False return within it is a failure


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_pidfd_is_the_default_on_linux() -> None:
    if not sys.platform.startswith("linux") or "pidfd" not in available_backends():
        pytest.skip("pidfd needs Linux >= 5.3")
    assert default_backend() == "pidfd"
    assert available_backends()[-1] == "tick"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown waker backend 'epoll'"):
        WorkerExitWaker("epoll")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("backend", POSIX_BACKENDS)
def test_wakes_on_exit_and_reports_each_exit_once(
    backend: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    procs += [_sleeper(LONG) for _ in range(3)]
    with WorkerExitWaker(backend) as waker:
        waker.watch({rank: p.pid for rank, p in enumerate(procs)})
        assert waker.watching == 3
        assert waker.wait(0.05) is False  # nobody exited: the tick runs out

        procs[1].send_signal(signal.SIGKILL)
        assert waker.wait(LONG) is True
        # the waker must not reap: the exit code is still there for torch's Popen.poll()
        assert procs[1].wait(5) == -signal.SIGKILL
        assert waker.watching == 2
        # the same exit is not reported again, so the loop does not spin on it
        assert waker.wait(0.05) is False

        procs[0].terminate()
        assert waker.wait(LONG) is True
        assert procs[0].wait(5) == -signal.SIGTERM
        assert waker.wakeups == 2


@pytest.mark.timeout(20)
@pytest.mark.parametrize("backend", POSIX_BACKENDS)
def test_a_worker_reaped_before_watch_is_reported_at_once(
    backend: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    procs += [done, _sleeper(LONG)]
    assert done.wait(10) == 3  # reaped: its pid is free for reuse

    class Handler:  # the shape of torch's SubprocessHandler / SubprocessContext
        def __init__(self, proc: subprocess.Popen[bytes]) -> None:
            self.proc = proc

    class FakeContext:
        def __init__(self) -> None:
            self.subprocess_handlers = {0: Handler(procs[0]), 1: Handler(procs[1])}

        def pids(self) -> dict[int, int]:
            return {r: h.proc.pid for r, h in self.subprocess_handlers.items()}

    with WorkerExitWaker(backend) as waker:
        waker.watch(FakeContext())
        assert waker.watching == 1
        assert waker.wait(LONG) is True
        assert waker.wait(0.05) is False


@pytest.mark.timeout(20)
def test_watch_replaces_the_previous_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    old, new = _sleeper(LONG), _sleeper(LONG)
    procs += [old, new]
    with WorkerExitWaker() as waker:
        waker.watch([old.pid])
        waker.watch([new.pid])
        old.kill()
        old.wait()
        assert waker.wait(0.2) is False  # the replaced worker no longer counts
        new.kill()
        assert waker.wait(LONG) is True


@pytest.mark.timeout(20)
@pytest.mark.parametrize("backend", POSIX_BACKENDS)
def test_wake_from_another_thread(backend: str, procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(_sleeper(LONG))
    with WorkerExitWaker(backend) as waker:
        waker.watch([procs[0].pid])
        threading.Timer(0.05, waker.wake).start()
        assert waker.wait(LONG) is True
        assert procs[0].poll() is None


def test_tick_backend_sleeps_the_whole_interval() -> None:
    with WorkerExitWaker("tick") as waker:
        waker.watch([os.getpid()])
        start = time.monotonic()
        assert waker.wait(0.1) is False
        assert time.monotonic() - start >= 0.1


@pytest.mark.timeout(25)
def test_torch_subprocess_context_still_sees_the_failure(tmp_path: object) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    script = (
        "import os, sys, time\n"
        "if os.environ['LOCAL_RANK'] == '1':\n"
        "    time.sleep(0.2); sys.exit(7)\n"
        f"time.sleep({LONG})\n"
    )
    pc = start_processes(
        name="trainer",
        entrypoint=sys.executable,
        args={r: ("-c", script) for r in range(3)},
        envs={r: {"LOCAL_RANK": str(r)} for r in range(3)},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
    )
    try:
        with WorkerExitWaker() as waker:
            waker.watch(pc)
            assert waker.watching == 3
            assert waker.wait(LONG) is True
            result = pc.wait(0)  # torch's own verdict, after our wake-up
            assert result is not None and result.is_failed()
            assert {r: f.exitcode for r, f in result.failures.items()}[1] == 7
    finally:
        pc.close()


def _returns(rank: int) -> int:
    time.sleep(0.2)
    return rank * 10


def _raises(rank: int) -> int:
    if rank == 0:
        time.sleep(0.2)
        raise RuntimeError("boom")
    time.sleep(LONG)
    return 0


@pytest.mark.timeout(25)
@pytest.mark.parametrize("fn", [_returns, _raises])
def test_torch_multiprocess_context_wakes_on_return_and_on_failure(
    fn: object, tmp_path: object
) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    pc = start_processes(
        name="trainer",
        entrypoint=fn,  # type: ignore[arg-type]
        args={r: (r,) for r in range(2)},
        envs={r: {} for r in range(2)},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
        start_method="fork",
    )
    try:
        with WorkerExitWaker() as waker:
            waker.watch(pc)
            result = None
            for _ in range(10):  # each wake-up answers one worker's event; torch decides
                assert waker.wait(LONG) is True
                result = pc.wait(0)
                if result is not None:
                    break
            assert result is not None
            if fn is _returns:
                assert not result.is_failed()
                assert result.return_values == {0: 0, 1: 10}
            else:
                assert list(result.failures) == [0]
    finally:
        pc.close()


@pytest.mark.timeout(20)
def test_fast_popen_waits_keeps_popen_wait_semantics(procs: list[subprocess.Popen[bytes]]) -> None:
    if "pidfd" not in available_backends():
        pytest.skip("needs pidfd")
    from fsm_agent.torch._wakeup import fast_popen_waits

    procs += [_sleeper(LONG), _sleeper(LONG)]

    class Handler:
        def __init__(self, proc: subprocess.Popen[bytes]) -> None:
            self.proc = proc

    class FakeContext:
        def __init__(self) -> None:
            self.subprocess_handlers = {r: Handler(p) for r, p in enumerate(procs)}

    ctx = FakeContext()
    assert fast_popen_waits(ctx) == 2
    assert fast_popen_waits(ctx) == 0  # applied once per Popen
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        procs[0].wait(0.2)  # still bounded by its timeout, and still raises
    assert time.monotonic() - start >= 0.2
    procs[0].terminate()
    assert procs[0].wait(LONG) == -signal.SIGTERM  # the real wait reaped it: exit code intact
    assert procs[0].returncode == -signal.SIGTERM
    procs[1].kill()
    assert procs[1].wait() == -signal.SIGKILL  # no timeout: the plain wait
