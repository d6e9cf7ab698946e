"""The reliability pieces on their own, in-process and fast: the interruptible exit barrier (with
real TCPStores) and the process-group reaper (with real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from reliability_helpers import alive, wait_gone

from fsm_agent.torch._barrier import BarrierAborted, interruptible_barrier
from fsm_agent.torch._reaper import live_group_members, reap_process_groups


@pytest.fixture
def store_pair():  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                           timeout=timedelta(seconds=10))
    yield server, client
    del client, server


@pytest.mark.timeout(60)
def test_barrier_meets_torchs_own_barrier(store_pair) -> None:  # type: ignore[no-untyped-def]
    """Same keys as torch's barrier: a torch agent and ours leave it together."""
    from torch.distributed.elastic.utils.store import barrier

    server, client = store_pair
    done: list[float] = []
    t = threading.Thread(target=lambda: (barrier(client, 2, "p", barrier_timeout=10),
                                         done.append(time.monotonic())))
    t.start()
    time.sleep(0.5)
    assert not done  # torch's side waits for ours
    interruptible_barrier(server, 2, "p", timeout=10)
    t.join(10)
    assert done and time.monotonic() - done[0] < 2


@pytest.mark.timeout(60)
def test_barrier_times_out_with_a_clear_error(store_pair) -> None:  # type: ignore[no-untyped-def]
    server, _ = store_pair
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not every agent arrived within 0\.5 s"):
        interruptible_barrier(server, 2, "alone", timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 2


@pytest.mark.timeout(60)
def test_zero_timeout_waits_for_nobody(store_pair) -> None:  # type: ignore[no-untyped-def]
    """torch's meaning of ``exit_barrier_timeout=0``: no wait. Its barrier sets a 0 s store
    timeout, so ``store.wait`` gives up at once; ours passes only if every agent is already
    there, and otherwise times out without sleeping."""
    server, client = store_pair
    interruptible_barrier(server, 1, "one", timeout=0)  # the only member: already complete
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="within 0 s"):
        interruptible_barrier(server, 2, "two", timeout=0)
    assert time.monotonic() - start < 0.5
    interruptible_barrier(client, 2, "two", timeout=0)  # the second arrival finds it complete


@pytest.mark.timeout(60)
def test_barrier_lets_a_signal_through(store_pair) -> None:  # type: ignore[no-untyped-def]
    """A signal handler runs within a poll interval, not when the barrier ends."""
    server, _ = store_pair

    class Stop(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Stop

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        timer = threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGUSR1))
        timer.start()
        start = time.monotonic()
        with pytest.raises(Stop):
            interruptible_barrier(server, 2, "sig", timeout=30)
        assert time.monotonic() - start < 2
    finally:
        signal.signal(signal.SIGUSR1, old)
    # nothing of the interrupted wait is left: stderr is the same file, the wake-up fd is free
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.timeout(60)
def test_a_signal_whose_handler_returns_does_not_end_the_barrier(store_pair) -> None:  # type: ignore[no-untyped-def]
    """A handler that only takes note (no exception): the barrier goes on waiting, on a new
    connection, and is released by the other member as usual; stderr is untouched after it."""
    from torch.distributed.elastic.utils.store import barrier

    server, client = store_pair
    seen: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    stderr_before = os.fstat(2)
    try:
        threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGUSR1)).start()
        other = threading.Timer(1.0, lambda: barrier(client, 2, "note", barrier_timeout=20))
        other.start()
        interruptible_barrier(server, 2, "note", timeout=30)
        other.join(20)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen == [signal.SIGUSR1]
    assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (stderr_before.st_dev, stderr_before.st_ino)
    assert signal.set_wakeup_fd(-1) == -1


class _LostAfter:
    """An abort question that answers after ``delay`` seconds, counting how often it is asked."""

    def __init__(self, delay: float) -> None:
        self.at = time.monotonic() + delay
        self.asked = 0

    def __call__(self) -> str | None:
        self.asked += 1
        return "node B lost" if time.monotonic() >= self.at else None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["main thread", "another thread"])
def test_an_abort_answer_ends_the_barrier_within_its_period(store_pair, where: str) -> None:  # type: ignore[no-untyped-def]
    """A peer that can never arrive: the barrier ends within ``abort_every`` of the answer
    (blocking on the main thread, polling elsewhere), not at its timeout; stderr and the
    wake-up fd are left as they were."""
    server, _ = store_pair
    abort = _LostAfter(0.6)
    stderr_before = os.fstat(2)
    outcome: list[object] = []

    def wait() -> None:
        start = time.monotonic()
        try:
            interruptible_barrier(server, 2, f"abort-{where}", timeout=30, abort=abort,
                                  abort_every=0.2)
        except BarrierAborted as e:
            outcome.append((e.reason, time.monotonic() - start))
        except BaseException as e:
            outcome.append(e)

    if where == "main thread":
        wait()
    else:
        t = threading.Thread(target=wait)
        t.start()
        t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], tuple), outcome
    reason, took = outcome[0]
    assert reason == "node B lost"
    assert 0.6 <= took < 2.0, took
    assert abort.asked >= 3  # asked every 0.2 s until it answered
    assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (stderr_before.st_dev, stderr_before.st_ino)
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.timeout(60)
def test_a_released_barrier_never_aborts(store_pair) -> None:  # type: ignore[no-untyped-def]
    """The other member arrives first: released as usual, and the question stops being asked
    (an answer that comes later changes nothing)."""
    from torch.distributed.elastic.utils.store import barrier

    server, client = store_pair
    abort = _LostAfter(1.5)
    other = threading.Timer(0.3, lambda: barrier(client, 2, "released", barrier_timeout=20))
    other.start()
    interruptible_barrier(server, 2, "released", timeout=30, abort=abort, abort_every=0.1)
    other.join(20)
    asked = abort.asked
    time.sleep(0.5)
    assert abort.asked == asked
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.timeout(60)
def test_off_the_main_thread_the_barrier_polls_and_still_meets(store_pair) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.elastic.utils.store import barrier

    server, client = store_pair
    errors: list[BaseException] = []

    def ours() -> None:
        try:
            interruptible_barrier(server, 2, "thread", timeout=20)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=ours)
    t.start()
    barrier(client, 2, "thread", barrier_timeout=20)
    t.join(20)
    assert not t.is_alive() and not errors


LEADER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
"""


@pytest.mark.timeout(60)
def test_reaper_stops_the_children_of_a_leader_that_already_exited() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    assert leader.wait(30) == 0  # the leader is gone, as a crashed worker would be ...
    assert alive(child)  # ... and its child lives on: torch's stop would skip it
    assert live_group_members([leader.pid]) == {leader.pid: [child]}
    assert reap_process_groups([leader.pid], signal.SIGTERM, 5) == [leader.pid]
    assert not wait_gone([child], 5)
    assert reap_process_groups([leader.pid], signal.SIGTERM, 5) == []  # nothing left to do
