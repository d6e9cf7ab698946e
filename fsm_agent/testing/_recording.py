"""A driver that plays a script and records every call: for tests and for embedding."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._core._drain import Preemption
from .._core._engine import _torch_types
from .._core._progress import Mark

__all__ = ["Call", "RecordingDriver", "ScriptExhausted", "ScriptedRandom", "make_result"]

#: One recorded driver call: the method name, then its arguments.
Call = tuple[Any, ...]


class ScriptExhausted(AssertionError):
    """``monitor()`` was called after the last scripted result."""


def make_result(
    state: Any,
    *,
    tick: int = 0,
    ranks: Sequence[int] = (0,),
    exitcode: int | Mapping[int, int] = 1,
    error: str | Mapping[int, str] | None = None,
) -> Any:
    """Torch's ``RunResult`` for ``state`` (a ``WorkerState`` or its name).

    FAILED and UNHEALTHY results carry a ``ProcessFailure`` per rank in ``ranks``, with
    ``exitcode`` (one for all ranks, or per rank; negative: killed by that signal) and, if given,
    the ``error`` message its error file would hold (``"ValueError: bad input"``). SUCCEEDED
    results carry a return value per rank.
    """
    api = _torch_types()
    ws = api.WorkerState[state] if isinstance(state, str) else state
    if ws.name in ("FAILED", "UNHEALTHY"):
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        failures = {}
        for r in ranks:
            code = exitcode[r] if isinstance(exitcode, Mapping) else exitcode
            f = ProcessFailure(local_rank=r, pid=1000 + tick, exitcode=code, error_file="")
            message = error.get(r) if isinstance(error, Mapping) else error
            if message is not None:
                # What torch reads from a worker's error file (ErrorHandler.record_exception).
                f.message = {"message": message, "extraInfo": {"timestamp": str(f.timestamp)}}
            failures[r] = f
        return api.RunResult(state=ws, failures=failures)
    if ws.name == "SUCCEEDED":
        return api.RunResult(state=ws, return_values={r: None for r in ranks})
    return api.RunResult(state=ws)


class ScriptedRandom(random.Random):
    """A random source whose ``random()`` returns ``value``, which the test sets: jitter chosen
    by the test, not by chance.

    >>> rng = ScriptedRandom(0.0)
    >>> rng.uniform(-0.5, 0.5)        # uniform(a, b) is a + (b - a) * random()
    -0.5
    >>> rng.value = 0.75; rng.uniform(-0.5, 0.5)
    0.25

    Everything ``random.Random`` draws through ``random()`` (``uniform``, ``choice``, ...) follows
    ``value``; ``getrandbits`` comes from a generator seeded with 0, so it is repeatable too.
    """

    def __init__(self, value: float = 0.5) -> None:
        super().__init__(0)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"random() returns a value in [0, 1), got {value!r}")
        self.value = value

    def random(self) -> float:
        """``value``."""
        return self.value


class RecordingDriver:
    """Scripted monitor results, nodes waiting and barrier outcomes; every call recorded in order.

    >>> d = RecordingDriver(["HEALTHY", "FAILED"], nodes_waiting=[0])
    >>> d.monitor().state.name, d.num_nodes_waiting(), d.calls
    ('HEALTHY', 0, [('monitor',), ('num_nodes_waiting',)])

    ``results``: each a ``RunResult``, a ``WorkerState`` or a state name. ``nodes_waiting``:
    answers of successive ``num_nodes_waiting()`` calls (0 once exhausted). ``barrier``: outcomes
    of successive ``exit_barrier()`` calls, each ``None`` (passes) or an exception to raise.
    ``raises``: a method name mapped to an exception raised on every call of it (a failing hook).
    ``preemption``: what ``preemption()`` answers (a ``fsm_agent.Preemption``: the drain actions
    of ``fsm_agent._core._drain`` read it); ``drain_workers``, ``kill_workers`` and
    ``announce_preemption`` are recorded (the last answers with the code it was given, or
    ``announced`` when set: another agent's code that won). ``mark``: what ``progress_mark()``
    answers (a ``fsm_agent._core._progress.Mark``, where training stands; None: no source), which
    the test may change between ticks.
    """

    def __init__(
        self,
        results: Iterable[Any] = (),
        *,
        nodes_waiting: Iterable[int] = (),
        barrier: Iterable[BaseException | None] = (),
        raises: dict[str, BaseException] | None = None,
        on_call: Callable[[Call], None] | None = None,
        preemption: Preemption | None = None,
        announced: int | None = None,
        mark: Mark | None = None,
    ) -> None:
        self._results = [
            r if hasattr(r, "state") else make_result(r, tick=i) for i, r in enumerate(results)
        ]
        self._waiting = list(nodes_waiting)
        self._barrier = list(barrier)
        self._raises = dict(raises or {})
        self._on_call = on_call
        self.calls: list[Call] = []
        self.metrics: list[tuple[str, int]] = []
        self.preempted = preemption
        self._announced = announced
        self.mark = mark

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if self._on_call is not None:
            self._on_call(call)
        err = self._raises.get(call[0])
        if err is not None:
            raise err

    def extend(
        self,
        results: Iterable[Any] = (),
        *,
        nodes_waiting: Iterable[int] = (),
        barrier: Iterable[BaseException | None] = (),
    ) -> None:
        """Append to the script (for tests that decide each tick as they go)."""
        start = len(self.calls)
        self._results += [r if hasattr(r, "state") else make_result(r, tick=start + i)
                          for i, r in enumerate(results)]
        self._waiting += list(nodes_waiting)
        self._barrier += list(barrier)

    def clear_script(self) -> None:
        """Drop every scripted answer not yet used."""
        self._results.clear()
        self._waiting.clear()
        self._barrier.clear()

    @property
    def ticks_left(self) -> int:
        """Scripted monitor results not yet returned."""
        return len(self._results)

    def names(self) -> list[str]:
        """The recorded call names, without metrics."""
        return [c[0] for c in self.calls if c[0] != "put_metric"]

    def rendezvous(self) -> None:
        self._record("rendezvous")

    def start_workers(self) -> None:
        self._record("start_workers")

    def stop_workers(self) -> None:
        self._record("stop_workers")

    def monitor(self) -> Any:
        self._record("monitor")
        if not self._results:
            raise ScriptExhausted("monitor() called after the last scripted result")
        return self._results.pop(0)

    def num_nodes_waiting(self) -> int:
        self._record("num_nodes_waiting")
        return self._waiting.pop(0) if self._waiting else 0

    def exit_barrier(self, timeout: float) -> None:
        self._record("exit_barrier", timeout)
        outcome = self._barrier.pop(0) if self._barrier else None
        if outcome is not None:
            raise outcome

    def put_metric(self, name: str, value: int) -> None:
        self.metrics.append((name, value))
        self._record("put_metric", name, value)

    def drain_workers(self, signum: int) -> None:
        self._record("drain_workers", signum)

    def kill_workers(self) -> None:
        self._record("kill_workers")

    def preemption(self) -> Preemption | None:
        return self.preempted

    def announce_preemption(self, exit_code: int, reason: str) -> int:
        self._record("announce_preemption", exit_code, reason)
        return exit_code if self._announced is None else self._announced

    def progress_mark(self) -> Mark | None:
        """``mark`` (not recorded: the lifecycle asks at every start and failure)."""
        return self.mark
