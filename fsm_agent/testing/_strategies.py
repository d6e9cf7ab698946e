"""Scripts for the conformance kit: what the monitored world does, tick by tick.

A *script* is a :class:`RunConfig` (the supervisor's settings and whether the first rendezvous or
start fails) plus a sequence of :class:`Tick` s. Tick ``i`` is what the ``i``-th monitor call
returns, how many nodes wait to join if the supervisor asks during that tick, how the exit barrier
ends if it is entered during that tick, and which hook (if any) raises the first time it is
called during that tick. The same script drives torch's ``SimpleElasticAgent``, a ``Lifecycle``
and the reference model, so their recorded calls can be compared line by line.

The strategies weight the common cases (HEALTHY ticks, failures, no fault) so that generated runs
are long enough to exhaust a few restarts, and list the simplest value first so that hypothesis
shrinks towards "healthy, nobody waiting, barrier ok, no fault".
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import strategies as st

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

__all__ = [
    "BARRIER_OUTCOMES",
    "HOOKS",
    "INIT_FAULTS",
    "ElasticTypes",
    "RunConfig",
    "Tick",
    "run_configs",
    "scripts",
    "ticks",
    "ticks_or_end",
]

#: Hooks that a tick may make raise (on their first call during that tick).
HOOKS: tuple[str, ...] = (
    "monitor",
    "num_nodes_waiting",
    "stop_workers",
    "rendezvous",
    "start_workers",
)
#: Hooks that may fail before the first monitor tick.
INIT_FAULTS: tuple[str | None, ...] = (None, "rendezvous", "start_workers")
#: How the exit barrier ends: returns, raises, or times out (raises torch's ``DistStoreError``).
BARRIER_OUTCOMES: tuple[str, ...] = ("ok", "error", "timeout")

_STATE_NAMES = ("UNKNOWN", "INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED")


@functools.cache
def _torch() -> Any:
    # torch takes a second to import; the kit needs it only once a script is built or run.
    from torch.distributed.elastic.agent.server import api

    return api


def worker_state(name: str) -> WorkerState:
    """torch's ``WorkerState`` member called ``name``."""
    return _torch().WorkerState[name]  # type: ignore[no-any-return]


@attrs.frozen
class RunConfig:
    """The supervisor's settings for one run, and whether its first rendezvous/start fails."""

    max_restarts: int = 3
    exit_barrier_timeout: float = 300.0
    role: str = "default"
    monitor_interval: float = 0.1
    init_fault: str | None = None

    def describe(self) -> str:
        """One line for the counterexample table."""
        fault = f", {self.init_fault} raises at start" if self.init_fault else ""
        return (f"role={self.role!r} max_restarts={self.max_restarts} "
                f"exit_barrier_timeout={self.exit_barrier_timeout:g} "
                f"monitor_interval={self.monitor_interval:g}{fault}")


@attrs.frozen
class Tick:
    """One monitor tick of a script."""

    observed: str = "HEALTHY"
    nodes_waiting: int = 0
    barrier: str = "ok"
    fault: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.observed not in _STATE_NAMES:
            raise ValueError(f"Tick.observed must be a WorkerState name, got {self.observed!r}")
        if self.barrier not in BARRIER_OUTCOMES:
            raise ValueError(
                f"Tick.barrier must be one of {BARRIER_OUTCOMES}, got {self.barrier!r}")
        if self.fault is not None and self.fault not in HOOKS:
            raise ValueError(f"Tick.fault must be None or one of {HOOKS}, got {self.fault!r}")


def fault_error(hook: str, tick: int) -> RuntimeError:
    """The exception a scripted hook raises (tick 0 is the start, before the first monitor)."""
    return RuntimeError(f"scripted {hook} failure at tick {tick}")


def barrier_error(outcome: str) -> Exception:
    """The exception the scripted exit barrier raises for ``outcome`` ("error" or "timeout")."""
    if outcome == "timeout":
        from torch.distributed import DistStoreError

        return DistStoreError("scripted exit barrier timeout")  # type: ignore[no-any-return]
    return RuntimeError("scripted exit barrier error")


@attrs.frozen
class ElasticTypes:
    """The classes a supervisor's package builds results from: torch's, or those of another
    copy of torch elastic (the ``torchelastic`` package, a vendored copy) with the same shape."""

    WorkerState: Any
    RunResult: Any
    ProcessFailure: Any

    @classmethod
    def torch(cls) -> ElasticTypes:
        """torch's own (``torch.distributed.elastic``)."""
        return _torch_types()


@functools.cache
def _torch_types() -> ElasticTypes:
    api = _torch()
    return ElasticTypes(api.WorkerState, api.RunResult, api.ProcessFailure)


@functools.lru_cache(maxsize=4096)
def monitor_result(tick: int, observed: str, types: ElasticTypes | None = None) -> RunResult:
    """The ``RunResult`` the ``tick``-th monitor call returns when it observes ``observed``.

    Return values and failures are tagged with the tick so that a supervisor which returns the
    wrong tick's result is caught. ``types`` are the classes to build it from (default torch's).
    """
    t = types if types is not None else _torch_types()
    state = t.WorkerState[observed]
    return_values: dict[int, Any] = {}
    failures: dict[int, Any] = {}
    if observed == "SUCCEEDED":
        return_values = {0: f"ret@{tick}"}
    elif observed == "FAILED":
        failures = {0: t.ProcessFailure(local_rank=0, pid=10_000 + tick, exitcode=1,
                                        error_file="<none>")}
    return t.RunResult(state=state, return_values=return_values,  # type: ignore[no-any-return]
                       failures=failures)


def failure_summary(failures: Any) -> dict[Any, tuple[Any, Any]]:
    """``failures`` (rank -> ``ProcessFailure``) as ``rank -> (pid, exitcode)``.

    Two copies of torch elastic have two ``ProcessFailure`` classes (never equal to each other),
    and each failure carries the time it was built; what a supervisor must pass on is which
    process failed and how.
    """
    return {rank: (getattr(f, "pid", f), getattr(f, "exitcode", None))
            for rank, f in dict(failures or {}).items()}


# Listed with the simplest first (hypothesis shrinks towards the start of a sampled_from list);
# repeats weight the draw.
_OBSERVED = ("HEALTHY",) * 4 + ("FAILED",) * 3 + ("UNHEALTHY",) * 3 + (
    "SUCCEEDED", "SUCCEEDED", "UNKNOWN", "INIT", "STOPPED")
_FAULTS: tuple[str | None, ...] = (None,) * 14 + HOOKS


# Each strategy is one sampled_from over every combination, not st.builds of one draw per field:
# hypothesis's per-draw cost dominated the differential test, and one index per value still
# shrinks towards the simplest combination (the product is ordered most significant first, so
# the shrinker first drops the fault, then the barrier outcome, ...).


@functools.cache
def run_configs(
    *,
    max_restarts: Sequence[int] = range(6),
    exit_barrier_timeouts: Sequence[float] = (300.0, 0.5),
    roles: Sequence[str] = ("default", "trainer"),
    monitor_intervals: Sequence[float] = (0.1, 5.0),
    init_faults: Sequence[str | None] = (None,) * 10 + INIT_FAULTS[1:],
) -> st.SearchStrategy[RunConfig]:
    """Run settings: max_restarts 0..5, two barrier timeouts, two roles, rare start failures."""
    return st.sampled_from([
        RunConfig(max_restarts=m, exit_barrier_timeout=t, role=r, monitor_interval=i,
                  init_fault=f)
        for f, i, r, t, m in itertools.product(init_faults, monitor_intervals, roles,
                                               exit_barrier_timeouts, max_restarts)
    ])


def _tick_combinations(faults: bool) -> list[Tick]:
    return [
        Tick(observed=o, nodes_waiting=n, barrier=b, fault=f)
        for f, b, n, o in itertools.product(_FAULTS if faults else (None,),
                                            ("ok", "ok", "error", "timeout"), (0, 0, 0, 1, 2),
                                            _OBSERVED)
    ]


@functools.cache
def ticks(*, faults: bool = True) -> st.SearchStrategy[Tick]:
    """One tick: all seven observed states, 0..2 nodes waiting, barrier ok/error/timeout, faults."""
    return st.sampled_from(_tick_combinations(faults))


@functools.cache
def ticks_or_end(*, faults: bool = True) -> st.SearchStrategy[Tick | None]:
    """A tick, or ``None`` (about one draw in ten): the script ends here, the run still going.

    ``None`` comes first so that the shrinker can end a script early: without it, a script whose
    simplest tick (HEALTHY) never ends the run could only shrink to its full length.
    """
    every = _tick_combinations(faults)
    return st.sampled_from([None] * (len(every) // 9) + every)


def scripts(
    *, max_ticks: int = 16, faults: bool = True, configs: st.SearchStrategy[RunConfig] | None = None
) -> st.SearchStrategy[tuple[RunConfig, tuple[Tick, ...]]]:
    """A whole script: a config and up to ``max_ticks`` ticks."""
    return st.tuples(
        configs if configs is not None else run_configs(),
        st.lists(ticks(faults=faults), max_size=max_ticks).map(tuple),
    )
