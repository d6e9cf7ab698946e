"""The conformance kit: drive any supervisor with generated scripts and compare it to a reference.

A *target* is either

* a ``SimpleElasticAgent`` subclass: the kit subclasses it again with scripted hooks
  (``_rendezvous``, ``_start_workers``, ``_stop_workers``, ``_monitor_workers``, ``_shutdown``),
  a scripted rendezvous handler, a scripted exit barrier (``torch.distributed.elastic.utils.store
  .barrier``) and a metrics handler, and calls the class's own ``_invoke_run``; or
* a callable ``factory(driver, **settings)`` returning an object with ``run(monitor_interval,
  sleep=...)``, as ``fsm_agent.Lifecycle`` has (``Lifecycle`` itself is accepted too). Keyword
  arguments among ``role``, ``max_restarts`` and ``exit_barrier_timeout`` are passed when the
  factory accepts them; otherwise the kit keeps those at their defaults.

Every hook call, sleep, metric and barrier wait of a run is recorded as one event; the run ends
when the supervisor returns, raises, or asks for a monitor result beyond the script (the
monitor then raises :class:`EndOfScript`, a ``BaseException``, to unwind it). The *reference*
for a preset name is :func:`fsm_agent.testing._reference.reference_trace` (written from the
reference table); for a spec file it is ``fsm_agent.Lifecycle`` running that spec.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import attrs
from hypothesis import HealthCheck, Phase, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ._reference import PRESETS, Event, Pending, Raised, Returned, Trace, reference_trace
from ._strategies import (
    RunConfig,
    Tick,
    barrier_error,
    fault_error,
    monitor_result,
    run_configs,
    ticks,
    ticks_or_end,
)

__all__ = [
    "DIVERGENCES",
    "ConformanceFailure",
    "Divergence",
    "EndOfScript",
    "RunawaySupervisor",
    "ScriptedDriver",
    "SupervisorConformance",
    "check_script",
    "compare_traces",
    "conformance_machine",
    "default_settings",
    "draw_case",
    "render_table",
    "run_conformance",
    "run_script",
    "trace_invariants",
]

#: Settings the kit's keyword arguments may take from a factory.
FACTORY_SETTINGS: tuple[str, ...] = ("role", "max_restarts", "exit_barrier_timeout")
_DEFAULTS = RunConfig()
#: A run that records more events than this is a supervisor looping without end.
MAX_EVENTS = 2_000


class EndOfScript(BaseException):
    """Raised by the scripted monitor when the script has no more ticks; ends the run."""


class RunawaySupervisor(BaseException):
    """Raised by a scripted hook once a run has recorded more than ``MAX_EVENTS`` events."""


class ConformanceFailure(AssertionError):
    """The supervisor under test disagreed with the reference (message: the counterexample)."""


@attrs.frozen
class Divergence:
    """A difference from torch 2.13's agent that fsm_agent makes on purpose, and why."""

    name: str
    where: str
    reason: str


DIVERGENCES: tuple[Divergence, ...] = (
    Divergence(
        "give-up-reports-failed",
        "torchrun preset, giving up after an UNHEALTHY observation",
        "torch 2.13 returns the raw UNHEALTHY RunResult, which torchrun's launcher reports as a "
        "success; fsm_agent returns the same result with state FAILED. The kit accepts either.",
    ),
    Divergence(
        "action-errors-wrapped",
        "a hook (driver call) raises inside a transition's action or guard",
        "torch lets the raw exception out of _invoke_run; fsm_agent raises ActionError naming "
        "the action and the transition, with the original as __cause__. The kit compares the "
        "cause's type and message.",
    ),
    Divergence(
        "unknown-after-action-error",
        "the group state after a hook raised inside a transition",
        "torch leaves whatever state it had reached (e.g. STOPPED when the rendezvous of a "
        "restart fails); fsm_agent moves to UNKNOWN, its error state, so that a failed action "
        "never leaves the machine in a state it did not enter cleanly. The kit accepts either.",
    ),
    Divergence(
        "torchelastic-returns-runresult",
        "torchelastic preset, on success",
        "the seed's _invoke_run returns the bare ret_vals dict (its old API); fsm_agent returns "
        "torch's RunResult. The kit compares return values when a bare dict comes back.",
    ),
)


# -- recording -------------------------------------------------------------------------------


class _Recorder:
    """Plays one script and records every call made to it."""

    def __init__(self, config: RunConfig, script: Sequence[Tick]) -> None:
        self.config = config
        self.script = tuple(script)
        self.events: list[Event] = []
        self.tick = 0
        self._fired: set[int] = set()
        self.raised: list[BaseException] = []

    def _record(self, event: Event) -> None:
        self.events.append(event)
        if len(self.events) > MAX_EVENTS:
            raise RunawaySupervisor(f"more than {MAX_EVENTS} calls in one run")

    def _hook(self, hook: str) -> None:
        self._record((hook,))
        tick = self.tick
        fault = self.config.init_fault if tick == 0 else (
            self.script[tick - 1].fault if tick <= len(self.script) else None)
        if fault == hook and tick not in self._fired:
            self._fired.add(tick)
            err = fault_error(hook, tick)
            self.raised.append(err)
            raise err

    def rendezvous(self) -> None:
        self._hook("rendezvous")

    def start_workers(self) -> None:
        self._hook("start_workers")

    def stop_workers(self) -> None:
        self._hook("stop_workers")

    def monitor(self) -> Any:
        self.tick += 1
        if self.tick > len(self.script):
            self._record(("monitor",))
            raise EndOfScript(f"the script has {len(self.script)} ticks")
        self._hook("monitor")
        return monitor_result(self.tick, self.script[self.tick - 1].observed)

    def num_nodes_waiting(self) -> int:
        self._hook("num_nodes_waiting")
        return self.script[self.tick - 1].nodes_waiting if 1 <= self.tick <= len(self.script) else 0

    def exit_barrier(self, timeout: float) -> None:
        self._record(("exit_barrier", timeout))
        outcome = self.script[self.tick - 1].barrier if 1 <= self.tick <= len(self.script) else "ok"
        if outcome != "ok":
            raise barrier_error(outcome)

    def put_metric(self, name: str, value: int) -> None:
        self._record(("put_metric", name, value))

    def sleep(self, seconds: float) -> None:
        self._record(("sleep", seconds))


class ScriptedDriver(_Recorder):
    """A ``fsm_agent.Driver`` that plays a script and records every call (the kit's driver)."""


@functools.cache
def _torch_api() -> Any:
    from torch.distributed.elastic.agent.server import api

    return api


# @prof's own timing metrics (SimpleElasticAgent._restart_workers.success, ...) are torch's
# instrumentation of its helpers, and run()'s summary (_record_metrics: run_total,
# run_success_with_retries, ..., flakiness) describes a whole run after the loop: neither is part
# of the run loop's per-tick contract, so the recorder leaves them out.
_PROF_METRIC = re.compile(r"^(?!workers\.).*\.(success|failure|duration\.ms)$")
_SUMMARY_METRIC = re.compile(r"^workers\.[^.]+\.(run_total|run_(success|failed)_(with|no)_retries"
                             r"|flakiness)$")


class _Routes:
    """Where this process's patched torch entry points send the calls of the run in progress."""

    recorder: _Recorder | None = None
    thread: int | None = None


def _metric_handler_class() -> type:
    import torch.distributed.elastic.metrics.api as metrics_api

    class _Handler(metrics_api.MetricHandler):  # type: ignore[misc]
        def emit(self, metric_data: Any) -> None:
            rec = _Routes.recorder
            name = metric_data.name
            if rec is None or threading.get_ident() != _Routes.thread or _PROF_METRIC.search(
                    name) or _SUMMARY_METRIC.search(name):
                return
            rec.put_metric(name, metric_data.value)

    return _Handler


_HANDLER: list[Any] = []  # the one metrics handler, built on first use


@contextlib.contextmanager
def _patched(recorder: _Recorder) -> Iterator[None]:
    """Route torch's sleep, exit barrier and metrics of this thread's run to ``recorder``."""
    import torch.distributed.elastic.metrics.api as metrics_api
    import torch.distributed.elastic.utils.store as store_util

    if not _HANDLER:
        _HANDLER.append(_metric_handler_class()())
    handler = _HANDLER[0]
    me = threading.get_ident()
    real_sleep = time.sleep
    real_barrier = store_util.barrier

    def sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            recorder.sleep(seconds)
        else:
            real_sleep(seconds)

    def barrier(*args: Any, **kwargs: Any) -> None:
        if threading.get_ident() != me:
            return real_barrier(*args, **kwargs)  # type: ignore[no-any-return]
        timeout = kwargs.get("barrier_timeout", kwargs.get("timeout",
                                                           args[3] if len(args) > 3 else 300))
        recorder.exit_barrier(timeout)
        return None

    # fsm_agent.torch's driver waits at its own signal-interruptible barrier (same store keys).
    # It is imported on first use, so import it here whenever fsm_agent.torch is in use.
    fsm_barrier = (importlib.import_module("fsm_agent.torch._barrier")
                   if "fsm_agent.torch" in sys.modules else None)
    real_fsm_barrier = getattr(fsm_barrier, "interruptible_barrier", None)

    saved_default = metrics_api._default_metrics_handler
    saved_group = metrics_api._metrics_map.get("torchelastic")
    saved_disable = logging.root.manager.disable
    _Routes.recorder, _Routes.thread = recorder, me
    time.sleep = sleep  # type: ignore[assignment]
    store_util.barrier = barrier
    if real_fsm_barrier is not None:
        fsm_barrier.interruptible_barrier = barrier  # type: ignore[union-attr]
    metrics_api._default_metrics_handler = handler
    metrics_api._metrics_map["torchelastic"] = handler
    if saved_disable < logging.CRITICAL:
        # torch and the engine log every barrier failure with a traceback (and disable() clears
        # every logger's cache, so the state machine does this once per example, not per run).
        logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        if saved_disable < logging.CRITICAL:
            logging.disable(saved_disable)
        _Routes.recorder = _Routes.thread = None
        time.sleep = real_sleep
        store_util.barrier = real_barrier
        if real_fsm_barrier is not None:
            fsm_barrier.interruptible_barrier = real_fsm_barrier  # type: ignore[union-attr]
        metrics_api._default_metrics_handler = saved_default
        if saved_group is None:
            metrics_api._metrics_map.pop("torchelastic", None)
        else:
            metrics_api._metrics_map["torchelastic"] = saved_group


class _FakeStore:
    """Stands in for the rendezvous store: the scripted barrier never touches it."""


class _ScriptedRendezvous:
    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder

    def num_nodes_waiting(self) -> int:
        return self._recorder.num_nodes_waiting()

    def get_run_id(self) -> str:
        return "conformance"

    def get_backend(self) -> str:
        return "scripted"

    def shutdown(self) -> bool:
        return True


class _ScriptedHooks:
    """Mixed in before a ``SimpleElasticAgent`` subclass: every hook plays the script."""

    _fsm_recorder: _Recorder

    def _rendezvous(self, worker_group: Any) -> None:
        self._fsm_recorder.rendezvous()
        worker_group.group_rank = 0
        worker_group.group_world_size = 1
        worker_group.store = _FakeStore()
        self._store = worker_group.store

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        self._fsm_recorder.start_workers()
        return {}

    def _stop_workers(self, worker_group: Any, *args: Any, **kwargs: Any) -> None:
        self._fsm_recorder.stop_workers()

    def _monitor_workers(self, worker_group: Any) -> Any:
        return self._fsm_recorder.monitor()

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._fsm_recorder._record(("shutdown",))

    def _monitor_wait(self, interval: float) -> None:
        # LifecycleAgentMixin waits on its worker processes between ticks (woken early when one
        # exits); with scripted hooks there are none, so the wait is the plain sleep it stands for.
        self._fsm_recorder.sleep(interval)


def _entrypoint() -> None:  # the WorkerSpec needs one; nothing runs it
    """Conformance run entry point (never called)."""


# -- targets ---------------------------------------------------------------------------------


@attrs.frozen
class _Target:
    name: str
    run: Callable[[RunConfig, _Recorder], tuple[Any, Any]]  # -> (value or exc, supervisor)
    accepts: frozenset[str]

    def project(self, config: RunConfig) -> RunConfig:
        """``config`` with the settings this target cannot take put back to their defaults."""
        changes = {k: getattr(_DEFAULTS, k) for k in FACTORY_SETTINGS if k not in self.accepts}
        return attrs.evolve(config, **changes) if changes else config


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


@functools.cache
def _scripted_agent_class(cls: type) -> type:
    return type(f"Scripted{cls.__name__}", (_ScriptedHooks, cls), {"__module__": cls.__module__})


def _agent_target(cls: type) -> _Target:
    api = _torch_api()
    scripted = _scripted_agent_class(cls)

    def run(config: RunConfig, rec: _Recorder) -> tuple[Any, Any]:
        spec = api.WorkerSpec(
            role=config.role,
            local_world_size=1,
            rdzv_handler=_ScriptedRendezvous(rec),
            entrypoint=_entrypoint,
            max_restarts=config.max_restarts,
            monitor_interval=config.monitor_interval,
        )
        try:
            agent = scripted(spec, exit_barrier_timeout=config.exit_barrier_timeout)
        except TypeError as e:
            raise TypeError(
                f"cannot build {_describe(cls)}(spec, exit_barrier_timeout=...): {e}; give the "
                "kit a factory(driver, **settings) instead") from None
        agent._fsm_recorder = rec
        try:
            value: Any = agent._invoke_run(config.role)
        except (Exception, EndOfScript, RunawaySupervisor) as e:
            value = e
        return value, agent

    return _Target(_describe(cls), run, frozenset(FACTORY_SETTINGS))


def _factory_target(factory: Callable[..., Any], name: str) -> _Target:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepts = frozenset(FACTORY_SETTINGS)
    else:
        accepts = frozenset(k for k in FACTORY_SETTINGS if k in params)

    def run(config: RunConfig, rec: _Recorder) -> tuple[Any, Any]:
        kwargs = {k: getattr(config, k) for k in accepts}
        supervisor = factory(rec, **kwargs)
        start = getattr(supervisor, "remaining_restarts", None)
        if isinstance(start, int) and start != config.max_restarts:
            raise TypeError(f"{name} built a supervisor with {start} restarts, but the kit asked "
                            f"for max_restarts={config.max_restarts}")
        try:
            value: Any = supervisor.run(config.monitor_interval, sleep=rec.sleep)
        except (Exception, EndOfScript, RunawaySupervisor) as e:
            value = e
        return value, supervisor

    return _Target(name, run, accepts)


def resolve_target(target: Any, spec: Any = "torchrun") -> _Target:
    """Turn what the user gave the kit into a runnable target (see the module docstring)."""
    if isinstance(target, _Target):
        return target
    if inspect.isclass(target):
        if issubclass(target, _torch_api().SimpleElasticAgent):
            return _agent_target(target)
        from fsm_agent import Lifecycle

        if issubclass(target, Lifecycle):
            cls = target
            from fsm_agent import load_spec

            spec = load_spec(spec)  # once, not per run

            def lifecycle(driver: Any, **kw: Any) -> Any:
                return cls(spec, driver, **kw)

            return _factory_target(lifecycle, f"{_describe(cls)} with spec {_spec_label(spec)}")
    if callable(target):
        return _factory_target(target, _describe(target))
    raise TypeError(f"a conformance target must be a SimpleElasticAgent subclass or a callable "
                    f"factory(driver) -> supervisor, got {target!r}")


def _spec_label(spec: Any) -> str:
    return spec if isinstance(spec, str) else str(getattr(spec, "name", spec))


def _classify(value: Any, rec: _Recorder) -> Returned | Raised | Pending:
    if isinstance(value, EndOfScript):
        return Pending()
    if isinstance(value, RunawaySupervisor):
        return Raised("RunawaySupervisor", str(value))
    if isinstance(value, BaseException):
        exc: BaseException = value
        wrapped = None
        cause = exc.__cause__
        if type(exc).__name__ == "ActionError" and cause is not None:
            wrapped, exc = "ActionError", cause
        return Raised(type(exc).__name__, str(exc), wrapped,
                      scripted=any(exc is r for r in rec.raised))
    state = getattr(value, "state", None)
    if state is not None and hasattr(value, "return_values"):
        return Returned(getattr(state, "name", str(state)), value.return_values,
                        getattr(value, "failures", {}))
    if isinstance(value, dict):
        return Returned(None, value, {})
    return Returned(f"<{type(value).__name__}>", value, {})


def run_script(target: Any, config: RunConfig, script: Sequence[Tick],
               *, spec: Any = "torchrun") -> Trace:
    """Run ``target`` once on a script and return everything it did."""
    tgt = resolve_target(target, spec)
    rec = ScriptedDriver(config, script)
    supervisor: Any = None
    with _patched(rec):
        value, supervisor = tgt.run(config, rec)
    state: Any
    remaining: Any
    if isinstance(supervisor, _ScriptedHooks):
        state = supervisor._worker_group.state.name  # type: ignore[attr-defined]
        remaining = supervisor._remaining_restarts  # type: ignore[attr-defined]
    else:
        state = getattr(supervisor, "state", None)
        state = getattr(state, "name", state)
        remaining = getattr(supervisor, "remaining_restarts", None)
    return Trace(tuple(rec.events), _classify(value, rec), state, remaining)


# -- the oracle ------------------------------------------------------------------------------


def _oracle(spec: Any) -> Callable[[RunConfig, Sequence[Tick]], Trace]:
    """The reference for ``spec``: the table for a preset name, the engine for a spec file."""
    if isinstance(spec, str) and spec in PRESETS:
        return functools.partial(reference_trace, spec)
    from fsm_agent import Lifecycle, load_spec

    loaded = load_spec(spec)  # raises SpecError naming file and line
    target = resolve_target(Lifecycle, loaded)
    return lambda config, script: run_script(target, config, script)


# -- comparing -------------------------------------------------------------------------------


def _outcome_mismatch(expected: Any, actual: Any) -> str | None:
    if isinstance(expected, Returned) and isinstance(actual, Returned):
        if actual.state is None:  # a bare dict of return values (the seed's API)
            ok = expected.state == "SUCCEEDED" and actual.return_values == expected.return_values
        else:
            states = {expected.state, expected.gave_up_after} - {None}
            ok = (actual.state in states and actual.return_values == expected.return_values
                  and actual.failures == expected.failures)
        return None if ok else "outcome"
    if isinstance(expected, Raised) and isinstance(actual, Raised):
        same = (expected.type_name, expected.message) == (actual.type_name, actual.message)
        return None if same else "outcome"
    return None if type(expected) is type(actual) else "outcome"


def compare_traces(expected: Trace, actual: Trace) -> list[str]:
    """What differs between a reference trace and a supervisor's, after intended divergences."""
    problems = []
    if expected.events != actual.events:
        problems.append("calls")
    if _outcome_mismatch(expected.outcome, actual.outcome):
        problems.append("outcome")
    if actual.state is not None and expected.state is not None and actual.state != expected.state:
        errored = isinstance(expected.outcome, Raised) and expected.outcome.scripted
        if not (errored and actual.state == "UNKNOWN"):
            problems.append("final state")
    if (actual.remaining_restarts is not None and expected.remaining_restarts is not None
            and actual.remaining_restarts != expected.remaining_restarts):
        problems.append("remaining restarts")
    return problems


def trace_invariants(trace: Trace, config: RunConfig) -> list[str]:
    """Invariants of the model tests that hold for every lifecycle, checked on one trace."""
    ev = trace.events
    out = []
    for i, e in enumerate(ev):
        if e[0] == "monitor" and (i == 0 or ev[i - 1] != ("sleep", config.monitor_interval)):
            out.append(f"call {i + 1}: monitor() not right after "
                       f"sleep({config.monitor_interval:g})")
        if e[0] == "rendezvous" and i + 1 < len(ev) and ev[i + 1] != ("start_workers",):
            out.append(f"call {i + 1}: rendezvous() not followed by start_workers()")
        if e[0] == "rendezvous" and any(x[0] == "start_workers" for x in ev[:i]) and (
                ev[i - 1] != ("stop_workers",)):
            out.append(f"call {i + 1}: restart without stop_workers() first")
    barriers = [i for i, e in enumerate(ev) if e[0] == "exit_barrier"]
    if len(barriers) > 1:
        out.append(f"exit barrier entered {len(barriers)} times")
    if barriers and any(e[0] in ("monitor", "start_workers") for e in ev[barriers[0]:]):
        out.append("workers monitored or started after the exit barrier")
    suffix = ".remaining_restarts"
    left = [e[2] for e in ev if e[0] == "put_metric" and str(e[1]).endswith(suffix)]
    if any(not 0 <= n <= config.max_restarts for n in left):
        out.append(f"remaining_restarts metric outside 0..{config.max_restarts}: {left}")
    if any(b > a for a, b in itertools.pairwise(left)):
        out.append(f"remaining_restarts went up: {left}")
    return out


# -- the table -------------------------------------------------------------------------------


def _short(event: Event, role: str) -> str:
    name = event[0]
    if name == "put_metric":
        metric = str(event[1])
        prefix = f"workers.{role}."
        metric = metric[len(prefix):] if metric.startswith(prefix) else metric
        return f"metric {metric}={event[2]}"
    if name == "sleep":
        return f"sleep({event[1]:g})"
    if name == "exit_barrier":
        return f"exit_barrier({event[1]:g})"
    short = {"num_nodes_waiting": "nodes_waiting?", "start_workers": "start",
             "stop_workers": "stop"}
    return short.get(str(name), str(name))


def _segments(events: Sequence[Event], n: int) -> list[list[Event]]:
    """Split a run's calls by tick: segment 0 is the start, segment i begins at monitor call i."""
    segs: list[list[Event]] = [[] for _ in range(n + 2)]
    tick = 0
    for e in events:
        if e[0] == "monitor":
            tick = min(tick + 1, n + 1)
            cur = segs[tick - 1]
            if cur and cur[-1][0] == "sleep":
                segs[tick].append(cur.pop())
        segs[tick].append(e)
    while len(segs) > 1 and not segs[-1]:
        segs.pop()
    return segs


def render_table(config: RunConfig, script: Sequence[Tick], expected: Trace, actual: Trace,
                 problems: Sequence[str] = ()) -> str:
    """The counterexample as a table: one row per tick, expected and actual calls side by side."""
    exp = _segments(expected.events, len(script))
    act = _segments(actual.events, len(script))
    rows = [("tick", "observed", "nodes waiting", "barrier", "fault", "expected calls",
             "actual calls")]
    for i in range(max(len(exp), len(act))):
        if i == 0:
            head = ("start", "-", "-", "-", config.init_fault or "-")
        elif i <= len(script):
            t = script[i - 1]
            head = (str(i), t.observed, str(t.nodes_waiting), t.barrier, t.fault or "-")
        else:
            head = (str(i), "(none: script ended)", "-", "-", "-")
        e = ", ".join(_short(x, config.role) for x in exp[i]) if i < len(exp) else ""
        a = ", ".join(_short(x, config.role) for x in act[i]) if i < len(act) else ""
        mark = "" if e == a else "  <-- differs"
        rows.append((*head, e or "-", (a or "-") + mark))
    widths = [max(len(r[c]) for r in rows) for c in range(6)]
    lines = [" | ".join(r[c].ljust(widths[c]) for c in range(6)) + " | " + r[6] for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 12)
    lines.append("")
    lines.append(f"expected outcome: {expected.outcome.describe()}; state {expected.state}, "
                 f"remaining_restarts {expected.remaining_restarts}")
    lines.append(f"actual outcome:   {actual.outcome.describe()}; state {actual.state}, "
                 f"remaining_restarts {actual.remaining_restarts}")
    if problems:
        lines.append("differs in: " + ", ".join(problems))
    return "\n".join(lines)


# -- checking one script --------------------------------------------------------------------


def check_script(
    target: Any,
    config: RunConfig,
    script: Sequence[Tick],
    *,
    spec: Any = "torchrun",
    expected: Trace | None = None,
    spec_label: str | None = None,
) -> Trace:
    """Run ``target`` on one script; raise :class:`ConformanceFailure` (the table) if it differs
    from the reference for ``spec`` or breaks an invariant. Returns the target's trace."""
    tgt = resolve_target(target, spec)
    if expected is None:
        expected = _oracle(spec)(config, script)
    actual = run_script(tgt, config, script)
    problems = compare_traces(expected, actual)
    broken = trace_invariants(actual, config)
    if problems or broken:
        label = spec_label if spec_label is not None else _spec_label(spec)
        head = f"{tgt.name} does not conform to spec {label!r}\nrun: {config.describe()}\n"
        extra = "".join(f"\ninvariant broken: {b}" for b in broken)
        raise ConformanceFailure(
            head + render_table(config, script, expected, actual, problems) + extra)
    return actual


def draw_case(
    data: Any,
    oracle: Callable[[RunConfig, Sequence[Tick]], Trace],
    *,
    configs: st.SearchStrategy[RunConfig] | None = None,
    max_ticks: int = 16,
    faults: bool = True,
) -> tuple[RunConfig, tuple[Tick, ...], Trace]:
    """Draw a config, then ticks one at a time until the reference run is over (or the draw
    says the script ends there, with the run still going).

    Drawing lazily keeps every tick of a script meaningful: a list drawn up front would mostly
    hold ticks after the run ended, which cost generation and shrinking time and test nothing.
    Returns the config, the script and the reference trace for it.
    """
    config = data.draw(configs if configs is not None else run_configs(), label="config")
    tick_strategy = ticks_or_end(faults=faults)
    script: list[Tick] = []
    expected = oracle(config, script)
    while isinstance(expected.outcome, Pending) and len(script) < max_ticks:
        tick = data.draw(tick_strategy, label=f"tick {len(script) + 1}")
        if tick is None:
            break
        script.append(tick)
        expected = oracle(config, script)
    return config, tuple(script), expected


# -- the state machine -----------------------------------------------------------------------


def _class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return value.__func__ if isinstance(value, staticmethod) else value
    return None


class SupervisorConformance(RuleBasedStateMachine):
    """Base state machine: subclass it, set ``target`` and ``spec``, and run its ``TestCase``.

    Each hypothesis step either starts a new run (settings drawn by :func:`run_configs`) or adds
    one monitor tick to the current run's script (:func:`ticks`); after every step the target is
    run on the whole script so far and compared with the reference, call by call. Add your own
    ``@rule``/``@invariant`` methods in the subclass; ``self.config``, ``self.script`` and
    ``self.last`` (the target's latest :class:`Trace`) are there to read.

    >>> class TestMyAgent(SupervisorConformance):  # doctest: +SKIP
    ...     target = MyAgent          # a SimpleElasticAgent subclass, or a factory(driver)
    ...     spec = "torchrun"
    >>> TestMyAgentCase = TestMyAgent.TestCase     # doctest: +SKIP
    """

    target: ClassVar[Any] = None
    spec: ClassVar[Any] = "torchrun"

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        target = _class_attr(cls, "target")
        if target is None:
            raise TypeError(f"{cls.__name__}.target is not set: give it a SimpleElasticAgent "
                            "subclass or a factory(driver) -> supervisor")
        spec = _class_attr(cls, "spec")
        self._target = resolve_target(target, spec)
        self._expected = _oracle(spec)
        self.config: RunConfig = _DEFAULTS
        self.script: list[Tick] = []
        self.last: Trace | None = None
        self.running = False
        self._saved_disable = logging.root.manager.disable
        logging.disable(logging.CRITICAL)

    def _verify(self, expected: Trace) -> None:
        self.last = check_script(self._target, self.config, self.script, expected=expected,
                                 spec_label=_spec_label(type(self).spec))

    def _advance(self) -> None:
        # The target runs once per run, when the reference says the run is over (or at
        # teardown): replaying it after every tick would make shrinking quadratic.
        expected = self._expected(self.config, self.script)
        self.running = isinstance(expected.outcome, Pending)
        if not self.running:
            self._verify(expected)

    @precondition(lambda self: not self.running)
    @rule(config=run_configs())
    def start_run(self, config: RunConfig) -> None:
        """Start a fresh supervisor with these settings."""
        self.config = self._target.project(config)
        self.script = []
        self.last = None
        self._advance()

    @precondition(lambda self: self.running)
    @rule(tick=ticks())
    def tick(self, tick: Tick) -> None:
        """The next monitor call returns ``tick.observed`` (and the tick's other events)."""
        self.script.append(tick)
        self._advance()

    def teardown(self) -> None:
        """Check the run still in progress (the target must still be asking for ticks)."""
        try:
            if self.running:
                self._verify(self._expected(self.config, self.script))
        finally:
            logging.disable(self._saved_disable)

    @invariant()
    def restarts_within_bounds(self) -> None:
        """Remaining restarts never leave 0..max_restarts."""
        last = self.last
        if last is not None and last.remaining_restarts is not None and not (
                0 <= last.remaining_restarts <= self.config.max_restarts):
            raise ConformanceFailure(
                f"{self._target.name}: remaining_restarts={last.remaining_restarts} outside "
                f"0..{self.config.max_restarts}")


_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def default_settings(max_examples: int = 200) -> Settings:
    """The kit's settings: no deadline, one bug reported, no "explain" phase (it re-runs the
    failing script hundreds of times to annotate lines, which costs more than finding it)."""
    return Settings(
        max_examples=max_examples,
        stateful_step_count=12,
        deadline=None,
        report_multiple_bugs=False,
        phases=_PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def conformance_machine(target: Any, spec: Any = "torchrun") -> type[SupervisorConformance]:
    """A ``SupervisorConformance`` subclass bound to ``target`` and ``spec``."""
    name = getattr(target, "__name__", type(target).__name__)
    return type(f"Conformance[{name}]", (SupervisorConformance,),
                {"target": staticmethod(target) if not inspect.isclass(target) else target,
                 "spec": spec, "__module__": __name__})


def run_conformance(
    target: Any,
    spec: str | os.PathLike[str] | Any = "torchrun",
    settings: Settings | None = None,
    *,
    seed: int | None = None,
    stateful: bool = False,
) -> None:
    """Check ``target`` against ``spec``'s reference behaviour; raise on a counterexample.

    ``target`` is a ``SimpleElasticAgent`` subclass or a ``factory(driver, **settings)``
    returning an object with ``run(monitor_interval, sleep=...)``. ``spec`` is a preset name
    (``"torchrun"``, ``"torchelastic"``: checked against the reference table) or a spec file /
    ``Spec`` (checked against ``fsm_agent.Lifecycle`` running it). Raises
    :class:`ConformanceFailure` whose message is the shrunk counterexample as a table.

    Each example is one whole script (:func:`scripts`); ``stateful=True`` runs
    :class:`SupervisorConformance` instead (several runs per example, tick by tick; it finds the
    same bugs but shrinks several times slower).
    """
    tgt = resolve_target(target, spec)  # a bad target or spec fails here, not inside hypothesis
    oracle = _oracle(spec)
    settings = settings or default_settings()
    if stateful:
        machine = conformance_machine(target, spec)
        if seed is not None:
            machine = hypothesis_seed(seed)(machine)
        run_state_machine_as_test(machine, settings=settings)
        return
    label = _spec_label(spec)
    configs = run_configs().map(tgt.project)

    @settings
    @given(st.data())
    def conformance(data: Any) -> None:
        config, script, expected = draw_case(data, oracle, configs=configs)
        check_script(tgt, config, script, expected=expected, spec_label=label)

    if seed is not None:
        conformance = hypothesis_seed(seed)(conformance)
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        conformance()
    finally:
        logging.disable(saved)
