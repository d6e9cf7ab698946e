"""Hang detection without any change to the worker's script: does the main thread get anywhere?

A worker's *progress* is read from outside, never from the worker. First the CPU time of its
main thread (``/proc/PID/task/PID/schedstat``, nanoseconds; ``/proc/PID/task/PID/stat`` in clock
ticks where the kernel has no schedstat). A Python training script does its work on its main
thread (it runs the training loop and launches every collective), and a main thread that waits
for something that never comes (a peer that never sends, a lock never released, a store key
never set) is not scheduled at all: its CPU time stands still to the nanosecond. Background
threads are ignored on purpose: gloo's socket loop, NCCL's watchdog, logging and telemetry
threads wake up regularly in a process whose main thread is stuck, so counting them would hide
every hang.

A main thread that runs may still be stuck: it spins (a busy-wait on a flag, polling a future
or a queue, NCCL's spinning wait inside a hung collective). So a rank whose main thread ran
since the last sample has its Python stack read (``py-spy dump --locals`` of the main thread,
``fsm_agent.torch._stacks``): after two such samples in a row it made progress only if the
stack moved. Moved means: the innermost frame's function changed (not its line: a loop's
samples land on its several lines, and a spin changes its own locals), or a caller's line or
locals changed (the loop of a caller that went on to its next step changed them; a caller
waiting for a spin to return did not). A rank that was blocked through a sample and then ran (a
collective that completed, a sleep that ended) made progress without looking at the stack. A
step number the worker reports itself (``fsm_agent.progress(step)``) that advanced is progress
too. Where no stack can be taken (no py-spy, no permission, not a Python process) CPU time alone
counts, as before.

A main thread that waits for a child process (``subprocess.run``, a shell wrapper started as
the worker) is judged by that child instead: while the thread sleeps in ``wait()``, the progress
of its children's main threads counts as its own.

:class:`HangDetector` samples every worker on a fixed period and reports a hang when *every*
worker of the group has made no progress for ``timeout`` seconds: a lone slow rank is normal
(its peers wait for it and are idle, it is not); a group in which nobody gets anywhere is stuck.
The report comes at most one sample period after the timeout, counted from the last sample that
saw progress.

What it cannot tell apart: a healthy loop whose every sample lands on the same line of the same
function (one Python function calling one CPU-bound C call per step, each longer than
``timeout``) from a spin there; such a script should call ``fsm_agent.progress(step)``. And a
spin that moves between lines or functions counts as progress. A main thread that legitimately
waits longer than ``timeout`` for another thread or process (a checkpoint written by a helper
thread, a peer node that is slower by more than the timeout) is reported hung: choose a
``hang_timeout`` longer than the longest such wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs

__all__ = ["HangDetector", "HungWorker", "Progress", "read_progress", "sample_period_for"]

# How many levels of wait()-ing parents are followed down to the process doing the work.
_MAX_WAIT_DEPTH = 4


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(512)
    except OSError:
        return None


def _main_thread_cpu(pid: int) -> int | None:
    """The main thread's CPU time in nanoseconds (schedstat) or clock ticks (stat); None if gone."""
    raw = _read(f"/proc/{pid}/task/{pid}/schedstat")
    if raw:
        return int(raw.split(None, 1)[0])
    raw = _read(f"/proc/{pid}/task/{pid}/stat")
    if raw is None:
        return None
    fields = raw.rsplit(b")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) * 10_000_000


def _waiting_for_child(pid: int) -> bool:
    raw = _read(f"/proc/{pid}/wchan")
    return raw is not None and raw.strip() in (b"do_wait", b"kernel_wait4", b"do_waitid")


def _children(pid: int) -> list[int]:
    raw = _read(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in raw.split()] if raw else []


@attrs.frozen
class Progress:
    """One sample of a worker: the CPU time of the thread(s) whose progress counts, or None if
    the process is gone. ``via`` names the pids read (the worker, or the children it waits for).
    """

    cpu: int | None
    via: tuple[int, ...]


def read_progress(pid: int) -> Progress:
    """Sample ``pid``: its main thread's CPU time, or that of the children it waits for."""
    cpu = _main_thread_cpu(pid)
    if cpu is None:
        return Progress(None, (pid,))
    via = [pid]
    total = cpu
    frontier = [pid]
    for _ in range(_MAX_WAIT_DEPTH):
        # Only a parent blocked in wait() hands its progress over to its children: a Python
        # worker's data-loader processes wake up every few seconds whether or not it is stuck.
        waiting = [p for p in frontier if _waiting_for_child(p)]
        if not waiting:
            break
        frontier = [c for p in waiting for c in _children(p)]
        for child in frontier:
            c = _main_thread_cpu(child)
            if c is not None:
                total += c
                via.append(child)
    return Progress(total, tuple(via))


def _place(stack: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Where a stack stands, for telling a spin from work: the innermost frame by its function
    alone (a loop's samples land on its several lines, ``while`` and body, and a spin changes
    its own locals); every caller with its line and its locals (a caller's loop that moved on
    to its next step changed them, while a caller waiting for a spin to return did not)."""
    if not stack:
        return None
    return (stack[0].split(" (", 1)[0], *stack[1:])


def _frame(entry: str) -> str:
    """``func (file:line)`` of a stack entry (without the locals that may follow it)."""
    return entry.split("\n", 1)[0]


@attrs.frozen
class HungWorker:
    """A worker that made no progress: its local rank, pid and for how long (seconds);
    ``spinning``: its main thread ran, but its stack stayed at ``where`` (innermost frame)."""

    local_rank: int
    pid: int
    idle_for: float
    exited: bool = False
    spinning: bool = False
    where: str | None = None

    def describe(self, timeout: float) -> str:
        """One line for the failure summary."""
        if self.exited:
            return f"process exited while its peers made no progress for {self.idle_for:.1f} s"
        if self.spinning:
            return (f"worker hung: its main thread ran but stayed in {self.where} for "
                    f"{self.idle_for:.1f} s (hang_timeout {timeout:g} s)")
        return (
            f"worker hung: its main thread made no progress (used no CPU time) for "
            f"{self.idle_for:.1f} s (hang_timeout {timeout:g} s)"
        )


def sample_period_for(timeout: float) -> float:
    """How often workers are sampled for a ``timeout``: a tenth of it, within [0.05 s, 5 s]."""
    return min(5.0, max(0.05, timeout / 10.0))


class HangDetector:
    """Samples a worker group's progress; :meth:`poll` says when every worker has been idle for
    ``timeout`` seconds.

    >>> d = HangDetector(timeout=10.0)
    >>> d.period
    1.0

    Call :meth:`watch` after every start of the workers (with their local rank -> pid), then
    :meth:`poll` as often as convenient: it samples whenever a sample period has passed and
    returns the hung workers once the whole group is idle (an empty tuple before that). Each
    sample costs one small ``/proc`` read per worker (see ``bench/progress_sampling.py``), and
    one ``stacker(pid)`` call (a stack, innermost frame first; None if none could be taken) per
    worker whose main thread ran since the last sample; ``steps()`` gives the step each local
    rank reported itself (``fsm_agent.progress``).
    """

    def __init__(
        self,
        timeout: float,
        *,
        period: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        reader: Callable[[int], Progress] = read_progress,
        stacker: Callable[[int], tuple[str, ...] | None] | None = None,
        steps: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"hang timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.period = sample_period_for(self.timeout) if period is None else float(period)
        self._clock = clock
        self._read = reader
        self._stacker = stacker
        self._steps = steps
        self._pids: dict[int, int] = {}
        self._last: dict[int, int | None] = {}
        self._since: dict[int, float] = {}
        self._ran: dict[int, bool] = {}
        self._stack: dict[int, tuple[str, ...] | None] = {}
        self._spinning: dict[int, bool] = {}
        self._step: dict[int, int] = {}
        self._gone: set[int] = set()
        self._next = 0.0
        self.samples = 0
        self.stacks_taken = 0

    @property
    def watching(self) -> bool:
        """Whether a group is being watched."""
        return bool(self._pids)

    def watch(self, pids: Mapping[int, int]) -> None:
        """Watch a freshly started group (local rank -> pid); forgets the previous one."""
        now = self._clock()
        self._pids = dict(pids)
        self._last = {rank: None for rank in self._pids}
        self._since = dict.fromkeys(self._pids, now)
        self._ran = dict.fromkeys(self._pids, False)
        self._stack = dict.fromkeys(self._pids)
        self._spinning = dict.fromkeys(self._pids, False)
        self._step = dict(self._steps() if self._steps is not None else {})
        self._gone = set()
        self._next = now
        self.samples = 0

    def clear(self) -> None:
        """Stop watching (the workers were stopped)."""
        self._pids = {}

    def next_sample_in(self) -> float:
        """Seconds until the next sample is due (0 if due now)."""
        return max(0.0, self._next - self._clock())

    def poll(self) -> tuple[HungWorker, ...]:
        """Sample if a period has passed; the hung workers if the whole group is idle."""
        if not self._pids:
            return ()
        now = self._clock()
        if now < self._next:
            return ()
        # A fixed grid: late samples do not push the later ones back.
        self._next += self.period * (1 + int((now - self._next) // self.period))
        self.samples += 1
        steps = self._steps() if self._steps is not None else {}
        idle = True
        for rank, pid in self._pids.items():
            if self._moved(rank, pid, steps.get(rank)):
                self._since[rank] = now
            if now - self._since[rank] < self.timeout:
                idle = False
        if not idle:
            return ()
        return tuple(
            HungWorker(rank, pid, now - self._since[rank], exited=rank in self._gone,
                       spinning=self._spinning[rank],
                       where=_frame(self._stack[rank][0])  # type: ignore[index]
                       if self._spinning[rank] and self._stack[rank] else None)
            for rank, pid in self._pids.items()
        )

    def _moved(self, rank: int, pid: int, step: int | None) -> bool:
        """Whether ``rank`` made progress since the last sample (module docstring)."""
        moved = False
        if step is not None and step != self._step.get(rank):
            self._step[rank] = step
            moved = True
        cpu = self._read(pid).cpu
        if cpu is None:
            self._gone.add(rank)
            return moved
        if self._last[rank] is None or cpu == self._last[rank]:
            if self._last[rank] is not None:  # blocked through the interval
                self._ran[rank] = self._spinning[rank] = False
            self._last[rank] = cpu
            return moved
        self._last[rank] = cpu
        woke = not self._ran[rank]
        self._ran[rank] = True
        if self._stacker is None:
            return True  # CPU time is all there is to go by
        stack = self._stacker(pid)
        self.stacks_taken += 1
        same = stack is not None and _place(stack) == _place(self._stack[rank])
        self._stack[rank] = stack
        self._spinning[rank] = same and not woke
        return moved or woke or not same
