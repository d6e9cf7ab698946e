"""The progress sampler (``/proc`` main-thread CPU time) and the hang detector."""

from __future__ import annotations

import time

import pytest
from diag_helpers import spawn, wait_line

from fsm_agent.torch._progress import HangDetector, Progress, read_progress, sample_period_for

BLOCKED = """
import threading, time
def chatty():
    while True:
        sum(range(20000)); time.sleep(0.005)     # a background thread that keeps busy
threading.Thread(target=chatty, daemon=True).start()
lock = threading.Lock(); lock.acquire()
print("blocked", flush=True)
lock.acquire()                                   # the main thread waits for ever
"""

BUSY = """
print("busy", flush=True)
while True:
    sum(range(1000))
"""


def _samples(pid: int, n: int = 4, gap: float = 0.15) -> list[int | None]:
    out = []
    for _ in range(n):
        out.append(read_progress(pid).cpu)
        time.sleep(gap)
    return out


def test_a_blocked_main_thread_stands_still_even_with_a_busy_background_thread() -> None:
    with spawn(BLOCKED) as proc:
        assert wait_line(proc) == "blocked"
        time.sleep(0.2)
        samples = _samples(proc.pid)
        assert samples[0] is not None and len(set(samples)) == 1, samples
        # the process as a whole kept using CPU: only the main thread stands still
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[11]) + int(fields[12]) > 0


def test_a_busy_main_thread_makes_progress() -> None:
    with spawn(BUSY) as proc:
        assert wait_line(proc) == "busy"
        samples = _samples(proc.pid)
        assert len(set(samples)) == len(samples), samples


def test_a_process_waiting_for_its_child_is_judged_by_the_child() -> None:
    # A shell wrapper (or subprocess.run) as the worker: its own main thread sleeps in wait().
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"
    with spawn(code, argv=[BUSY]) as proc:
        assert wait_line(proc) == "busy"
        time.sleep(0.2)
        first = read_progress(proc.pid)
        assert len(first.via) == 2 and first.via[0] == proc.pid
        samples = _samples(proc.pid)
        assert len(set(samples)) == len(samples), samples


def test_a_gone_process_has_no_progress() -> None:
    with spawn("print('x', flush=True)") as proc:
        wait_line(proc)
        proc.wait(10)
    assert read_progress(proc.pid).cpu is None


class _Fake:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu: dict[int, int | None] = {}

    def clock(self) -> float:
        return self.now

    def read(self, pid: int) -> Progress:
        return Progress(self.cpu[pid], (pid,))


def test_the_group_is_hung_when_every_worker_stood_still_for_the_timeout() -> None:
    fake = _Fake()
    d = HangDetector(2.0, period=0.5, clock=fake.clock, reader=fake.read)
    fake.cpu = {100: 1, 101: 1}
    d.watch({0: 100, 1: 101})
    # rank 1 keeps running until t=1.5; rank 0 never runs after its start
    hung_at = None
    while fake.now <= 6.0:
        if fake.now <= 1.5:
            fake.cpu[101] = int(fake.now * 10) + 2
        hung = d.poll()
        if hung and hung_at is None:
            hung_at = fake.now
        fake.now = round(fake.now + 0.25, 2)
    # the last progress was seen at the sample of t=1.5; two seconds later, on the next sample
    assert hung_at == 3.5
    d.watch({0: 100, 1: 101})
    fake.now = 3.5
    assert d.poll() == ()


def test_one_idle_worker_is_no_hang_while_another_runs() -> None:
    fake = _Fake()
    d = HangDetector(1.0, period=0.1, clock=fake.clock, reader=fake.read)
    fake.cpu = {100: 5, 101: 0}
    d.watch({0: 100, 1: 101})
    for i in range(100):
        fake.now = i * 0.1
        fake.cpu[101] = i
        assert d.poll() == ()


def test_an_exited_worker_counts_as_idle_and_is_named() -> None:
    fake = _Fake()
    d = HangDetector(1.0, period=0.5, clock=fake.clock, reader=fake.read)
    fake.cpu = {100: 5, 101: 5}
    d.watch({0: 100, 1: 101})
    fake.cpu[101] = None
    hung = ()
    while not hung:
        fake.now += 0.5
        hung = d.poll()
    assert fake.now == 1.0
    assert [h.exited for h in hung] == [False, True]
    assert "made no progress" in hung[0].describe(1.0)


def test_samples_stay_on_their_grid_and_clear_stops_watching() -> None:
    fake = _Fake()
    d = HangDetector(10.0, clock=fake.clock, reader=fake.read)
    assert d.period == sample_period_for(10.0) == 1.0
    fake.cpu = {1: 1}
    d.watch({0: 1})
    d.poll()
    fake.now = 2.7  # a late poll samples once and keeps the grid
    d.poll()
    assert d.samples == 2 and d.next_sample_in() == pytest.approx(0.3)
    d.clear()
    assert not d.watching and d.poll() == ()
    with pytest.raises(ValueError):
        HangDetector(0)


SPIN = ("spin (busy.py:8)", "main (busy.py:20)")
SPIN_OTHER_LINE = ("spin (busy.py:7)", "main (busy.py:20)")


def _run(d: HangDetector, fake: _Fake, step: float, until: float, tick: object) -> float | None:
    """Poll every ``step`` s until ``until``, calling ``tick(now)`` first; when it hung."""
    while fake.now <= until:
        tick(fake.now)  # type: ignore[operator]
        if d.poll():
            return fake.now
        fake.now = round(fake.now + step, 2)
    return None


def test_a_rank_that_spins_in_one_place_is_hung_beside_a_blocked_one() -> None:
    fake = _Fake()
    stacks = {100: ("all_reduce (torch/distributed/distributed_c10d.py:2806)",
                    "main (busy.py:30)"), 101: SPIN}
    seen: list[int] = []

    def stacker(pid: int) -> tuple[str, ...]:
        seen.append(pid)
        # the loop's samples land on its two lines: still one place
        return SPIN_OTHER_LINE if pid == 101 and len(seen) % 3 == 0 else stacks[pid]

    d = HangDetector(2.0, period=0.5, clock=fake.clock, reader=fake.read, stacker=stacker)
    fake.cpu = {100: 1, 101: 1}
    d.watch({0: 100, 1: 101})

    def tick(now: float) -> None:
        fake.cpu[101] = int(now * 100) + 2  # rank 1's main thread runs all the time

    hung_at = _run(d, fake, 0.5, 10.0, tick)
    # its first run (t=0.5) counts, as a blocked rank waking; from then on it stays in place
    assert hung_at == 2.5
    assert set(seen) == {101}  # the blocked rank is never dumped: its CPU time stood still
    d.watch({0: 100, 1: 101})
    fake.now = 0.0
    hung = ()
    while not hung:
        tick(fake.now)
        hung = d.poll()
        fake.now += 0.5
    spinner = next(h for h in hung if h.local_rank == 1)
    assert spinner.spinning and spinner.where in SPIN + SPIN_OTHER_LINE
    assert "ran but stayed in spin (busy.py:" in spinner.describe(2.0)
    assert not next(h for h in hung if h.local_rank == 0).spinning


def test_a_running_rank_whose_stack_moves_is_working() -> None:
    fake = _Fake()
    frames = [("forward (model.py:10)", "train (t.py:5)"), ("backward (t.py:7)", "train (t.py:5)")]
    d = HangDetector(1.0, period=0.1, clock=fake.clock, reader=fake.read,
                     stacker=lambda pid: frames[d.stacks_taken % 2])
    fake.cpu = {100: 0}
    d.watch({0: 100})
    assert _run(d, fake, 0.1, 20.0, lambda now: fake.cpu.update({100: int(now * 100) + 1})) \
        is None


def test_a_rank_that_blocks_and_wakes_in_one_place_is_working() -> None:
    # a step that waits (a collective, a sleep) longer than a sample, then runs: one place in
    # the stack, but it woke up
    fake = _Fake()
    d = HangDetector(1.0, period=0.1, clock=fake.clock, reader=fake.read,
                     stacker=lambda pid: SPIN)
    fake.cpu = {100: 0}
    d.watch({0: 100})

    def tick(now: float) -> None:
        if round(now * 10) % 5 == 0:  # runs in one sample of five
            fake.cpu[100] += 1

    assert _run(d, fake, 0.1, 20.0, tick) is None


def test_a_step_the_worker_reports_is_progress_and_without_stacks_cpu_is() -> None:
    fake = _Fake()
    step = {"n": 0}
    d = HangDetector(1.0, period=0.1, clock=fake.clock, reader=fake.read,
                     stacker=lambda pid: SPIN, steps=lambda: {0: step["n"] // 5})
    fake.cpu = {100: 0}
    d.watch({0: 100})

    def tick(now: float) -> None:
        fake.cpu[100] += 1
        step["n"] += 1

    assert _run(d, fake, 0.1, 20.0, tick) is None
    # the same spin with no stacks to read: CPU time is progress, as before
    fake.now = 0.0
    d = HangDetector(1.0, period=0.1, clock=fake.clock, reader=fake.read)
    d.watch({0: 100})
    assert _run(d, fake, 0.1, 20.0, lambda now: fake.cpu.update({100: fake.cpu[100] + 1})) \
        is None
