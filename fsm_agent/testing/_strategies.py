"""Scripts for the conformance kit: what the monitored world does, tick by tick.

A *script* is a :class:`RunConfig` (the supervisor's settings, the spec's parameters, and whether
the first rendezvous or start fails) plus a sequence of :class:`Tick` s. Tick ``i`` is what the
``i``-th monitor call returns (the observed state; for a failure, each failed rank's exit code or
signal and the exception type in its error file), how much virtual time passes during that call,
how many nodes wait to join if the supervisor asks during that tick, how the exit barrier ends if
it is entered during that tick, what the random source returns during it (a backoff's jitter),
and which hook (if any) raises the first time it is called during that tick. The same script
drives torch's ``SimpleElasticAgent``, a ``Lifecycle`` and the reference model, so their recorded
calls can be compared line by line.

The strategies weight the common cases (HEALTHY ticks, failures, no fault) so that generated runs
are long enough to exhaust a few restarts, and list the simplest value first so that hypothesis
shrinks towards "healthy, nobody waiting, barrier ok, no fault".
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import strategies as st

from .._core._params import format_value

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult

__all__ = [
    "BARRIER_OUTCOMES",
    "DRAIN_ENDS",
    "HOOKS",
    "INIT_FAULTS",
    "PREEMPT_SIGNALS",
    "RESILIENT_PARAM_VALUES",
    "ElasticTypes",
    "RunConfig",
    "Tick",
    "param_values_for",
    "params",
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
#: Signals a scripted preemption arrives with (``Tick.preempt``): the scheduler's usual ones.
PREEMPT_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
#: How the workers end a drain (``Tick.drain``): every one exits 0 (it checkpointed), they exit
#: failing (the tick's exit codes), or they ignore the drain signal until the deadline.
DRAIN_ENDS: tuple[str, ...] = ("exit0", "fail", "ignore")

_STATE_NAMES = ("UNKNOWN", "INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED")


@functools.cache
def _torch() -> Any:
    # torch takes a second to import; the kit needs it only once a script is built or run.
    from torch.distributed.elastic.agent.server import api

    return api


def _param_items(value: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any],
                                                                                 ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items))


@attrs.frozen
class RunConfig:
    """The supervisor's settings for one run, and whether its first rendezvous/start fails.

    ``params`` are values for the spec's parameters (``Lifecycle(..., params=...)``), as
    ``(name, value)`` pairs (a mapping is accepted); a parameter not listed has its default.
    """

    max_restarts: int = 3
    exit_barrier_timeout: float = 300.0
    role: str = "default"
    monitor_interval: float = 0.1
    init_fault: str | None = None
    params: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_param_items)

    def param_values(self) -> dict[str, Any]:
        """``params`` as a dict (lists as lists, as ``Lifecycle(params=...)`` takes them)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.params}

    def describe(self) -> str:
        """One line for the counterexample table."""
        fault = f", {self.init_fault} raises at start" if self.init_fault else ""
        params = ("; params " + " ".join(f"{k}={format_value(v)}" for k, v in self.params)
                  if self.params else "")
        return (f"role={self.role!r} max_restarts={self.max_restarts} "
                f"exit_barrier_timeout={self.exit_barrier_timeout:g} "
                f"monitor_interval={self.monitor_interval:g}{fault}{params}")


def _exitcodes(value: Iterable[int] | int) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value)


@attrs.frozen
class Tick:
    """One monitor tick of a script.

    ``exitcodes`` (FAILED only): one per failed local rank 0, 1, ...; a negative code is a rank
    killed by that signal (``-9``: SIGKILL), as in torch's ``ProcessFailure``. ``errors``: the
    exception type each failed rank recorded in its error file (``"ValueError"``; None, or a
    shorter tuple: no error file). ``elapsed``: virtual seconds that pass during this tick's
    ``monitor()`` call, on top of the wait before it (the workers ran that much longer).
    ``draw``: what the kit's random source returns (``random()``) during this tick, so a backoff
    started here has its jitter chosen by the script.

    ``preempt`` (a signal name of :data:`PREEMPT_SIGNALS`, None: none): a preemption reaches the
    supervisor during its first wait after this tick's monitor call (the next monitor wait, or
    the backoff this tick started): the wait returns ``preempted`` at once. ``drain`` is how the
    workers then end the drain (:data:`DRAIN_ENDS`; workers already stopped, in a backoff, are
    drained at once). ``step``: the training step the workers report by this tick's monitor call
    (``fsm_agent.progress``; None: nothing new), which the driver's ``progress_mark()`` gives as
    the best step so far. ``peer_lost``: another node of the job was lost by this tick's monitor
    call (the driver's ``lost_peers()`` names one until the next tick).
    """

    observed: str = "HEALTHY"
    nodes_waiting: int = 0
    barrier: str = "ok"
    fault: str | None = None
    exitcodes: tuple[int, ...] = attrs.field(default=(1,), converter=_exitcodes)
    errors: tuple[str | None, ...] = attrs.field(default=(), converter=tuple)
    elapsed: float = 0.0
    draw: float = 0.5
    preempt: str | None = None
    drain: str = "exit0"
    step: int | None = None
    peer_lost: bool = False

    def __attrs_post_init__(self) -> None:
        if self.observed not in _STATE_NAMES:
            raise ValueError(f"Tick.observed must be a WorkerState name, got {self.observed!r}")
        if self.barrier not in BARRIER_OUTCOMES:
            raise ValueError(
                f"Tick.barrier must be one of {BARRIER_OUTCOMES}, got {self.barrier!r}")
        if self.fault is not None and self.fault not in HOOKS:
            raise ValueError(f"Tick.fault must be None or one of {HOOKS}, got {self.fault!r}")
        if not self.exitcodes or not all(isinstance(c, int) and not isinstance(c, bool)
                                         and c != 0 for c in self.exitcodes):
            raise ValueError(f"Tick.exitcodes must be non-zero exit codes, one per failed rank, "
                             f"got {self.exitcodes!r}")
        if len(self.errors) > len(self.exitcodes) or not all(
                e is None or (isinstance(e, str) and e) for e in self.errors):
            raise ValueError(f"Tick.errors must be exception type names (or None), at most one "
                             f"per exit code, got {self.errors!r}")
        if not (isinstance(self.elapsed, (int, float)) and 0 <= self.elapsed < math.inf):
            raise ValueError(f"Tick.elapsed must be seconds >= 0, got {self.elapsed!r}")
        if not (isinstance(self.draw, (int, float)) and 0 <= self.draw < 1):
            raise ValueError(f"Tick.draw must be in [0, 1), got {self.draw!r}")
        if self.preempt is not None and self.preempt not in PREEMPT_SIGNALS:
            raise ValueError(f"Tick.preempt must be None or one of {PREEMPT_SIGNALS}, "
                             f"got {self.preempt!r}")
        if self.drain not in DRAIN_ENDS:
            raise ValueError(f"Tick.drain must be one of {DRAIN_ENDS}, got {self.drain!r}")
        if self.step is not None and (not isinstance(self.step, int)
                                      or isinstance(self.step, bool) or self.step < 0):
            raise ValueError(f"Tick.step must be None or a step number >= 0, got {self.step!r}")
        if not isinstance(self.peer_lost, bool):
            raise ValueError(f"Tick.peer_lost must be true or false, got {self.peer_lost!r}")

    def preemption_detail(self) -> str:
        """The preemption and how the drain ends, for the table ("" for none)."""
        if self.preempt is None:
            return ""
        end = {"exit0": "workers exit 0", "fail": "workers fail",
               "ignore": "workers ignore it"}[self.drain]
        return f"{self.preempt}, {end}"

    def failure_detail(self) -> str:
        """The failure's exit codes and error types, for the table ("" for a plain exit 1)."""
        if self.observed != "FAILED" or (self.exitcodes == (1,) and not any(self.errors)):
            return ""
        parts = []
        for i, code in enumerate(self.exitcodes):
            text = f"exit {code}" if code > 0 else f"{_signal_name(-code)}"
            error = self.errors[i] if i < len(self.errors) else None
            parts.append(f"{text} {error}" if error else text)
        return ", ".join(parts)


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
def monitor_result(tick: int, observed: str, types: ElasticTypes | None = None,
                   exitcodes: tuple[int, ...] = (1,),
                   errors: tuple[str | None, ...] = ()) -> RunResult:
    """The ``RunResult`` the ``tick``-th monitor call returns when it observes ``observed``.

    Return values and failures are tagged with the tick (pid ``10000 * (rank + 1) + tick``) so
    that a supervisor which returns the wrong tick's result is caught. A FAILED result has a
    ``ProcessFailure`` per exit code in ``exitcodes``; an error type in ``errors`` becomes its
    error file's message (``"ValueError: ..."``, what torch reads from the file). ``types`` are
    the classes to build it from (default torch's).
    """
    t = types if types is not None else _torch_types()
    state = t.WorkerState[observed]
    return_values: dict[int, Any] = {}
    failures: dict[int, Any] = {}
    if observed == "SUCCEEDED":
        return_values = {0: f"ret@{tick}"}
    elif observed == "FAILED":
        for rank, code in enumerate(exitcodes):
            failure = t.ProcessFailure(local_rank=rank, pid=10_000 * (rank + 1) + tick,
                                       exitcode=code, error_file="<none>")
            error = errors[rank] if rank < len(errors) else None
            if error is not None:
                failure.message = {"message": f"{error}: scripted failure at tick {tick}",
                                   "extraInfo": {"timestamp": "0"}}
            failures[rank] = failure
    return t.RunResult(state=state, return_values=return_values,  # type: ignore[no-any-return]
                       failures=failures)


def tick_result(tick: int, t: Tick, types: ElasticTypes | None = None) -> RunResult:
    """:func:`monitor_result` for the ``tick``-th monitor call, which observes ``t``."""
    if t.observed == "FAILED":
        return monitor_result(tick, "FAILED", types, t.exitcodes, t.errors)
    return monitor_result(tick, t.observed, types)


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
# A timed spec's behaviour lies in runs of failures (backoffs growing, resetting, a window
# filling): fewer ticks end the run at once.
_OBSERVED_TIMED = ("HEALTHY",) * 6 + ("FAILED",) * 6 + ("UNHEALTHY",) * 3 + (
    "SUCCEEDED", "UNKNOWN", "INIT", "STOPPED")
_FAULTS: tuple[str | None, ...] = (None,) * 14 + HOOKS
#: How a FAILED tick's ranks fail: exit codes (3 and 4 are the no-retry codes the resilient
#: scripts may name; negative: a signal) and error-file exception types.
_FAILURES: tuple[tuple[tuple[int, ...], tuple[str | None, ...]], ...] = (
    ((1,), ()), ((1,), ()), ((3,), ()), ((3,), ()), ((3, 4), ()), ((1, 3), ()), ((-9,), ()),
    ((3, -15), ()), ((1,), ("ValueError",)), ((3, 1), ("MemoryError", None)),
)
#: Virtual time a tick's monitor call takes, and the random source's value during the tick. The
#: values are exact binary fractions, so the reference and the supervisor add up the same times
#: (a restart exactly one window ago is the same instant to both).
_ELAPSED: tuple[float, ...] = (0.0,) * 6 + (0.5, 1.0, 1.5, 2.5, 4.5, 5.0, 30.0, 600.0)
_DRAWS: tuple[float, ...] = (0.5,) * 4 + (0.0, 0.25, 0.75, 1.0 - 2.0**-10)

#: Values the kit gives the ``resilient`` preset's parameters: its table's defaults (jitter aside:
#: 0.1 is not an exact binary fraction), and small ones so that short scripts reach the backoff
#: cap, a reset and the edge of a window: a few intervals and elapsed times (and a backoff) add
#: up to 3, 4, 5 or 10 s exactly. Names and meanings are specs/resilient.yaml's, the drain and
#: no-progress parameters too (``drain_on`` is the agent's signal handling, not the lifecycle's:
#: a scripted preemption is a ``drain_on`` signal that arrived).
RESILIENT_PARAM_VALUES: Mapping[str, tuple[Any, ...]] = {
    "no_retry_exit_codes": ((), (3,), (3, 4)),
    "no_requeue_exit_code": (93, 42),
    "backoff_initial": (1.0, 0.5, 0.0),
    "backoff_factor": (2.0, 1.0, 3.0),
    "backoff_max": (60.0, 4.0, 1.5),
    "backoff_jitter": (0.0, 0.25, 0.5, 1.0),
    "backoff_reset": (600.0, 5.0, 4.0),
    "restart_window": (math.inf, 10.0, 5.0, 3.0),
    # preemption: a drain (its signal, deadline and exit code) and the no-progress count
    "drain_signal": ("SIGTERM", "SIGUSR1"),
    "drain_timeout": (25.0, 0.0, 2.5),
    "preempted_exit_code": (0, 99),
    "no_progress_restarts": (3, 1, 2, 0),
    # budgets per cause: failures of the infrastructure spend infra_restarts, not max_restarts
    "infra_exit_codes": ((), (1,), (3, 4)),
    "infra_restarts": (3, 0, 1),
    "backoff_reset_on_progress": (False, True),
    # lost peers: failures after a lost node spend node_replacements (default: unlimited)
    "node_replacements": (math.inf, 1, 0),
}


# Each strategy is one sampled_from over every combination, not st.builds of one draw per field:
# hypothesis's per-draw cost dominated the differential test, and one index per value still
# shrinks towards the simplest combination (the product is ordered most significant first, so
# the shrinker first drops the fault, then the barrier outcome, ...).


def params(values: Mapping[str, Sequence[Any]],
           defaults: Mapping[str, Any] | None = None) -> st.SearchStrategy[tuple[tuple[str, Any],
                                                                               ...]]:
    """Parameter values: one of ``values[name]`` per name, the first simplest; a value equal to
    ``defaults[name]`` is left out (the run then shows only what differs from the defaults)."""
    names = sorted(values)
    defaults = defaults or {}

    def pack(chosen: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
        return tuple((n, v) for n, v in zip(names, chosen, strict=True)
                     if n not in defaults or defaults[n] != v)

    # One draw over every combination of a group of parameters while there are not too many
    # (as for ticks: a draw costs more than the run it sets up): the names, in order, in as few
    # groups as keep each group's combinations within _MAX_COMBINATIONS.
    groups: list[list[str]] = []
    for n in names:
        if groups and math.prod(len(values[m]) for m in groups[-1]) * len(values[n]) \
                <= _MAX_COMBINATIONS:
            groups[-1].append(n)
        else:
            groups.append([n])
    parts = [st.sampled_from(list(itertools.product(*(values[n] for n in g)))) for g in groups]
    if len(parts) == 1:
        return parts[0].map(pack)
    return st.tuples(*parts).map(lambda chosen: pack(tuple(itertools.chain(*chosen))))


_MAX_COMBINATIONS = 50_000


def param_values_for(spec: Any) -> dict[str, tuple[Any, ...]]:
    """Values worth trying for each parameter a spec declares (its default first), from the
    parameter's type and bounds: what the kit draws for a spec file. A value the spec's own
    guards, actions or timers refuse (an infinite command timeout, say) is left out."""
    from fsm_agent import Lifecycle, SpecError

    from ._recording import RecordingDriver

    def usable(name: str, value: Any) -> bool:
        try:
            Lifecycle(spec, RecordingDriver(), params={name: value})
        except (ValueError, TypeError, SpecError):
            return False
        return True

    out: dict[str, tuple[Any, ...]] = {}
    for p in getattr(spec, "params", ()):
        if p.type == "duration":
            candidates: list[Any] = [p.default, 0.0, 0.5, 1.0, 3.0, 10.0, 60.0, math.inf]
        elif p.type == "float":
            candidates = [p.default, p.min, p.max, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0]
        elif p.type == "int":
            candidates = [p.default, p.min, p.max, 0, 1, 3]
        elif p.type == "count":
            candidates = [p.default, p.min, p.max, 0, 1, 3, math.inf]
        elif p.type == "int_list":
            candidates = [tuple(p.default), (), (3,), (3, 4)]
        elif p.type == "bool":
            candidates = [p.default, not p.default]
        elif p.type == "str" and p.choices:
            candidates = [p.default, *p.choices]
        else:
            candidates = [p.default]
        kept: list[Any] = []
        for candidate in candidates:
            if candidate is None or (isinstance(candidate, float) and math.isinf(candidate)
                                     and p.type not in ("duration", "count")):
                continue
            try:
                value = p.check(list(candidate) if isinstance(candidate, tuple) else candidate)
            except ValueError:
                continue
            value = tuple(value) if isinstance(value, list) else value
            if value not in kept and (not kept or usable(p.name, value)):
                kept.append(value)
        out[p.name] = tuple(kept)
    return out


@functools.cache
def _config_list(max_restarts: Sequence[int], exit_barrier_timeouts: Sequence[float],
                 roles: Sequence[str], monitor_intervals: Sequence[float],
                 init_faults: Sequence[str | None]) -> list[RunConfig]:
    return [
        RunConfig(max_restarts=m, exit_barrier_timeout=t, role=r, monitor_interval=i,
                  init_fault=f)
        for f, i, r, t, m in itertools.product(init_faults, monitor_intervals, roles,
                                               exit_barrier_timeouts, max_restarts)
    ]


@functools.cache
def run_configs(
    *,
    max_restarts: Sequence[int] = range(6),
    exit_barrier_timeouts: Sequence[float] = (300.0, 0.5),
    roles: Sequence[str] = ("default", "trainer"),
    monitor_intervals: Sequence[float] = (0.1, 5.0),
    init_faults: Sequence[str | None] = (None,) * 10 + INIT_FAULTS[1:],
    param_sets: st.SearchStrategy[tuple[tuple[str, Any], ...]] | None = None,
) -> st.SearchStrategy[RunConfig]:
    """Run settings: max_restarts 0..5, two barrier timeouts, two roles, rare start failures;
    spec parameters from ``param_sets`` (:func:`params`; default: none, every default)."""
    configs = st.sampled_from(_config_list(max_restarts, exit_barrier_timeouts, roles,
                                           monitor_intervals, init_faults))
    if param_sets is None:
        return configs
    return st.tuples(configs, param_sets).map(lambda cp: attrs.evolve(cp[0], params=cp[1]))


@functools.cache
def _tick_combinations(faults: bool, timed: bool = False) -> list[Tick]:
    return [
        Tick(observed=o, nodes_waiting=n, barrier=b, fault=f)
        for f, b, n, o in itertools.product(_FAULTS if faults else (None,),
                                            ("ok", "ok", "error", "timeout"), (0, 0, 0, 1, 2),
                                            _OBSERVED_TIMED if timed else _OBSERVED)
    ]


# What a tick adds to its base combination: how a failure fails (drawn for every tick, used by
# FAILED ones: one index, so the share of FAILED ticks stays that of _OBSERVED) and, for timed
# specs, the time the tick takes and the random source's value.
_Extra = tuple[tuple[tuple[int, ...], tuple[str | None, ...]], float, float]


@functools.cache
def _extras(timed: bool) -> st.SearchStrategy[_Extra]:
    timing = itertools.product(_ELAPSED, _DRAWS) if timed else [(0.0, 0.5)]
    return st.sampled_from([(f, e, d) for (e, d), f in itertools.product(timing, _FAILURES)])


def _with(tick: Any, extra: _Extra) -> Any:
    (codes, errors), elapsed, draw = extra
    if tick is None:
        return None
    if tick.observed != "FAILED":
        codes, errors = (1,), ()
    if (codes, errors, elapsed, draw) == ((1,), (), 0.0, 0.5):
        return tick
    return attrs.evolve(tick, exitcodes=codes, errors=errors, elapsed=elapsed, draw=draw)


#: A tick's preemption, drain end and progress step, for a spec that drains or counts progress:
#: a preemption in about one tick in twelve as hypothesis draws them (it ends the run), a step
#: reported in about one in three (absolute, so a repeated or lower step is no progress).
_PREEMPTS: tuple[str | None, ...] = (None,) * 14 + PREEMPT_SIGNALS
_STEPS: tuple[int | None, ...] = (None,) * 5 + (1, 2, 3)
_Events = tuple[str | None, str, int | None]


@functools.cache
def _events(drains: bool, progress: bool) -> st.SearchStrategy[_Events] | None:
    if not (drains or progress):
        return None
    return st.sampled_from(list(itertools.product(
        _PREEMPTS if drains else (None,), DRAIN_ENDS if drains else ("exit0",),
        _STEPS if progress else (None,))))


#: Whether a tick follows a lost node, for a spec that asks (``peer_lost``): about one failed
#: or healthy tick in six (a healthy one: the node was lost while the workers ran).
_PEER_LOST: tuple[bool, ...] = (False,) * 5 + (True,)


def _with_peer_lost(tick: Any, lost: bool) -> Any:
    if tick is None or not lost or tick.observed not in ("FAILED", "UNHEALTHY", "HEALTHY"):
        return tick
    return attrs.evolve(tick, peer_lost=True)


def _with_peers(strategy: st.SearchStrategy[Any], peers: bool) -> st.SearchStrategy[Any]:
    if not peers:
        return strategy
    return st.tuples(strategy, st.sampled_from(_PEER_LOST)).map(lambda tl: _with_peer_lost(*tl))


def _with_events(tick: Any, events: _Events) -> Any:
    preempt, drain, step = events
    if tick is None or (preempt, step) == (None, None):
        return tick
    if preempt is None:
        drain = "exit0"
    return attrs.evolve(tick, preempt=preempt, drain=drain, step=step)


@functools.cache
def ticks(*, faults: bool = True, timed: bool = False, drains: bool = False,
          progress: bool = False, peers: bool = False) -> st.SearchStrategy[Tick]:
    """One tick: all seven observed states (failures with various exit codes, signals and error
    types), 0..2 nodes waiting, barrier ok/error/timeout, faults; with ``timed``, also virtual
    time passing during the tick and the random source's value; with ``drains``, sometimes a
    preemption after it and how the drain ends; with ``progress``, sometimes a step reported;
    with ``peers``, sometimes a failed or healthy tick that follows a lost node
    (``Tick.peer_lost``)."""
    base = st.sampled_from(_tick_combinations(faults, timed))
    plain = st.tuples(base, _extras(timed)).map(lambda te: _with(*te))
    events = _events(drains, progress)
    if events is None:
        return _with_peers(plain, peers)
    return _with_peers(st.tuples(plain, events).map(lambda te: _with_events(*te)), peers)


@functools.cache
def ticks_or_end(*, faults: bool = True, timed: bool = False, drains: bool = False,
                 progress: bool = False, peers: bool = False) -> st.SearchStrategy[Tick | None]:
    """A tick, or ``None`` (about one draw in ten): the script ends here, the run still going.

    ``None`` comes first so that the shrinker can end a script early: without it, a script whose
    simplest tick (HEALTHY) never ends the run could only shrink to its full length.
    """
    every = _tick_combinations(faults, timed)
    base = st.sampled_from([None] * (len(every) // 9) + every)
    plain = st.tuples(base, _extras(timed)).map(lambda te: _with(*te))
    events = _events(drains, progress)
    if events is None:
        return _with_peers(plain, peers)
    return _with_peers(st.tuples(plain, events).map(lambda te: _with_events(*te)), peers)


def scripts(
    *, max_ticks: int = 16, faults: bool = True,
    configs: st.SearchStrategy[RunConfig] | None = None, timed: bool = False,
    drains: bool = False, progress: bool = False, peers: bool = False,
) -> st.SearchStrategy[tuple[RunConfig, tuple[Tick, ...]]]:
    """A whole script: a config and up to ``max_ticks`` ticks."""
    return st.tuples(
        configs if configs is not None else run_configs(),
        st.lists(ticks(faults=faults, timed=timed, drains=drains, progress=progress,
                       peers=peers),
                 max_size=max_ticks).map(tuple),
    )
