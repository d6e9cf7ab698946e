"""The conformance kit: drive any supervisor with generated scripts and compare it to a reference.

A *target* is either

* a class with the ``SimpleElasticAgent`` shape, whichever package defines it (torch, the
  ``torchelastic`` package, a vendored copy): the kit subclasses it again with scripted hooks
  (``_rendezvous``, ``_start_workers``, ``_stop_workers``, ``_monitor_workers``, ``_shutdown``),
  gives it a scripted rendezvous handler, routes the exit barrier, metrics and sleeps its methods
  call to the recorder, and calls the class's own ``_invoke_run`` (what it finds, and how, is in
  :mod:`._agent_shape`); or
* a callable ``factory(driver, **settings)`` returning an object with ``run(monitor_interval,
  sleep=...)``, as ``fsm_agent.Lifecycle`` has (``Lifecycle`` itself is accepted too). Keyword
  arguments among ``role``, ``max_restarts`` and ``exit_barrier_timeout`` (and, for a spec with
  parameters or timers, ``params``, ``clock`` and ``rng``) are passed when the factory accepts
  them; otherwise the kit keeps those at their defaults.

Every hook call, sleep, metric and barrier wait of a run is recorded as one event; the run ends
when the supervisor returns, raises, or asks for a monitor result beyond the script (the
monitor then raises :class:`EndOfScript`, a ``BaseException``, to unwind it). Time is virtual:
it moves only when the supervisor sleeps and by each tick's ``elapsed``; the run's thread reads
it from ``time.monotonic`` and from the clock the kit passes, and the random source it is given
(or the engine's default one) returns each tick's ``draw``. The *reference* for a preset name is
:func:`fsm_agent.testing._reference.reference_trace` (written from the behaviour tables); for a
spec file it is ``fsm_agent.Lifecycle`` running that spec.

A target the kit cannot script (a hook, type or constructor argument it cannot find or supply,
or a stand-in asked for something it does not have) is a :class:`HarnessError`, never a
counterexample.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import logging
import math
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
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

from .._clock import VirtualClock
from .._drain import Preemption
from .._progress import Mark
from ._agent_shape import (
    SCRIPTED_HOOKS,
    HarnessError,
    Route,
    agent_shape,
    describe,
    hooks_without_loop,
    is_agent_class,
    worker_spec_kwargs,
)
from ._recording import ScriptedRandom
from ._reference import (
    PRESETS,
    RESILIENT_DEFAULTS,
    Event,
    Pending,
    Raised,
    Returned,
    Trace,
    reference_trace,
)
from ._strategies import (
    RESILIENT_PARAM_VALUES,
    ElasticTypes,
    RunConfig,
    Tick,
    barrier_error,
    failure_summary,
    fault_error,
    param_values_for,
    params,
    run_configs,
    tick_result,
    ticks,
)
from ._target_api import TargetAPI, load_target_api

__all__ = [
    "DIVERGENCES",
    "ConformanceFailure",
    "Divergence",
    "EndOfScript",
    "HarnessError",
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
#: What the kit also passes, when the factory takes it, for a spec with parameters or timers:
#: the run's parameter values, its virtual clock and its scripted random source.
TIME_SETTINGS: tuple[str, ...] = ("params", "clock", "rng")
#: The spec the kit checks against when none is named (as every ``fsm-agent`` command).
DEFAULT_SPEC = "torchelastic"
_DEFAULTS = RunConfig()
#: A run that records more events than this is a supervisor looping without end.
MAX_EVENTS = 2_000
#: A run that reads the virtual clock more often than this is waiting without sleeping.
MAX_CLOCK_READS = 50 * MAX_EVENTS


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


class _ScriptClock(VirtualClock):
    """The run's virtual clock: a sleep on it is the recorder's sleep (recorded), and a run that
    keeps reading it without ever sleeping is cut off."""

    __slots__ = ("_reads", "_recorder")

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self._recorder = recorder
        self._reads = 0

    def now(self) -> float:
        self._reads += 1
        if self._reads > MAX_CLOCK_READS:
            raise RunawaySupervisor(f"read the clock {MAX_CLOCK_READS} times without the "
                                    "script moving on (waiting without sleeping?)")
        return self._now

    def sleep(self, seconds: float) -> None:
        self._recorder.sleep(seconds)

    def pass_time(self, seconds: float) -> None:
        self._reads = 0
        self.advance(seconds)


class _Recorder:
    """Plays one script and records every call made to it."""

    def __init__(self, config: RunConfig, script: Sequence[Tick],
                 types: ElasticTypes | None = None) -> None:
        self.config = config
        self.script = tuple(script)
        self.types = types
        self.events: list[Event] = []
        self.tick = 0
        self._fired: set[int] = set()
        self.raised: list[BaseException] = []
        self.clock = _ScriptClock(self)
        self.rng = ScriptedRandom(0.5)
        self.running = False  # whether the workers run (started, not stopped or killed since)
        self.best_step: int | None = None  # the best step the script's workers reported
        self.preempted: Preemption | None = None  # the preemption delivered, once it is
        self._preempted_at = 0  # the tick whose preemption was delivered
        self.draining = False  # whether the supervisor began to drain (drain_workers)
        self.rounds = 0  # rendezvous completed (a target API's "rounds")
        self.notes: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []  # its "ignore" calls

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
        self.rounds += 1

    def start_workers(self) -> None:
        self._hook("start_workers")
        self.running = True

    def stop_workers(self) -> None:
        self._hook("stop_workers")
        self.running = False

    def _drain_tick(self) -> Tick:
        return self.script[self._preempted_at - 1]

    def monitor(self) -> Any:
        if self.draining:
            # A supervisor looking at the workers during a drain sees how they end it.
            self._record(("monitor",))
            tick = self._drain_tick()
            observed = {"exit0": "SUCCEEDED", "fail": "FAILED", "ignore": "HEALTHY"}[tick.drain]
            return tick_result(self._preempted_at, attrs.evolve(tick, observed=observed),
                               self.types)
        self.tick += 1
        if self.tick > len(self.script):
            self.rng.value = 0.5
            self._record(("monitor",))
            raise EndOfScript(f"the script has {len(self.script)} ticks")
        tick = self.script[self.tick - 1]
        self.rng.value = tick.draw
        self._hook("monitor")
        self.clock.pass_time(tick.elapsed)
        if tick.step is not None:
            self.best_step = tick.step if self.best_step is None else max(self.best_step,
                                                                          tick.step)
        return tick_result(self.tick, tick, self.types)

    def num_nodes_waiting(self) -> int:
        self._hook("num_nodes_waiting")
        return self.script[self.tick - 1].nodes_waiting if 1 <= self.tick <= len(self.script) else 0

    def exit_barrier(self, timeout: float | None) -> None:
        self._record(("exit_barrier", timeout))
        outcome = self.script[self.tick - 1].barrier if 1 <= self.tick <= len(self.script) else "ok"
        if outcome != "ok":
            raise barrier_error(outcome)

    def put_metric(self, name: str, value: int) -> None:
        self._record(("put_metric", name, value))

    def sleep(self, seconds: float) -> None:
        self._record(("sleep", seconds))
        self.clock.pass_time(seconds)

    def wait(self, seconds: float) -> str | None:
        """The supervisor's wait (``Lifecycle.run``'s ``sleep``): a sleep, except that it returns
        ``preempted`` at once when the script's preemption is due (the first wait after the
        monitor call of a tick with ``preempt``), and, once the supervisor drains, ``drained``
        at once when the workers exited (``Tick.drain``; stopped workers are drained already)."""
        self._record(("sleep", seconds))
        if self.draining:
            if not self.running or self._drain_tick().drain != "ignore":
                self._record(("woken", "drained"))
                return "drained"
        elif (self.preempted is None and 1 <= self.tick <= len(self.script)
              and self.script[self.tick - 1].preempt is not None):
            name = self.script[self.tick - 1].preempt
            assert name is not None
            self.preempted = Preemption(int(signal.Signals[name]), f"received {name}")
            self._preempted_at = self.tick
            self._record(("woken", "preempted"))
            return "preempted"
        self.clock.pass_time(seconds)
        return None

    # -- a drain, and progress (fsm_agent._drain, fsm_agent._progress) --------------------------

    def preemption(self) -> Preemption | None:
        """The preemption delivered (None before)."""
        return self.preempted

    def announce_preemption(self, exit_code: int, reason: str) -> int:
        """A single agent: its own code wins."""
        self._record(("announce_preemption", exit_code, reason))
        return exit_code

    def drain_workers(self, signum: int) -> None:
        self._record(("drain_workers", signum))
        if self.preempted is not None:
            self.draining = True

    def kill_workers(self) -> None:
        self._record(("kill_workers",))
        self.running = False

    def progress_mark(self) -> Mark:
        """Where training stands: the best step reported so far (no checkpoint source)."""
        return Mark(self.best_step)

    def lost_peers(self) -> tuple[str, ...]:
        """A lost node while the current tick says so (``Tick.peer_lost``); not recorded, as the
        lifecycle asks at every failure."""
        lost = 1 <= self.tick <= len(self.script) and self.script[self.tick - 1].peer_lost
        return ("lost-node",) if lost else ()

    def last_observed(self) -> str | None:
        """What the latest monitor call observed (None before the first, or past the script)."""
        return self.script[self.tick - 1].observed if 1 <= self.tick <= len(self.script) else None


class ScriptedDriver(_Recorder):
    """A ``fsm_agent.Driver`` that plays a script and records every call (the kit's driver)."""


# @prof's own timing metrics (SimpleElasticAgent._restart_workers.success, ...) are torch's
# instrumentation of its helpers, and run()'s summary (_record_metrics: run_total,
# run_success_with_retries, ..., flakiness) describes a whole run after the loop: neither is part
# of the run loop's per-tick contract, so the recorder leaves them out.
_PROF_METRIC = re.compile(r"^(?!workers\.).*\.(success|failure|duration\.ms)$")
_SUMMARY_METRIC = re.compile(r"^workers\.[^.]+\.(run_total|run_(success|failed)_(with|no)_retries"
                             r"|flakiness)$")


class _Routes:
    """Where this process's patched entry points send the calls of the run in progress."""

    recorder: _Recorder | None = None
    thread: int | None = None


class _MetricHandler:
    """The kit's handler in a torch-elastic metrics API (torch's or a copy's): duck-typed, as
    those APIs only ever call ``emit``."""

    def emit(self, metric_data: Any) -> None:
        rec = _Routes.recorder
        name = metric_data.name
        if rec is None or threading.get_ident() != _Routes.thread or _PROF_METRIC.search(
                name) or _SUMMARY_METRIC.search(name):
            return
        rec.put_metric(name, metric_data.value)


_HANDLER = _MetricHandler()


class _RoutedRandom(random.Random):
    """The engine's default random source during a run: the script's draws in the run's thread,
    a real random number anywhere else."""

    def random(self) -> float:
        rec = _Routes.recorder
        if rec is not None and threading.get_ident() == _Routes.thread:
            return rec.rng.value
        return super().random()


_ROUTED_RNG = _RoutedRandom()


@functools.cache
def _signature_of(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              names: Sequence[str]) -> Any:
    """The first of ``names`` a call of ``func`` passes (or defaults), by ``func``'s own
    parameter names: copies of torch's barrier take their arguments in different orders."""
    sig = _signature_of(func)
    try:
        given = sig.bind_partial(*args, **kwargs).arguments if sig is not None else kwargs
    except TypeError:
        given = kwargs
    for name in names:
        if name in given:
            return given[name]
        param = sig.parameters.get(name) if sig is not None else None
        if param is not None and param.default is not param.empty:
            return param.default
    return None


def _routed(route: Route, original: Any, recorder: _Recorder, me: int) -> Any:
    """``original``, except in thread ``me`` where the call goes to ``recorder``."""
    if route.kind == "barrier":
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me:
                return original(*args, **kwargs)
            recorder.exit_barrier(_argument(original, args, kwargs,
                                            ("barrier_timeout", "timeout")))
            return None
    elif route.kind == "put_metric":
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me:
                return original(*args, **kwargs)
            name = _argument(original, args, kwargs, ("metric_name", "name"))
            value = _argument(original, args, kwargs, ("metric_value", "value"))
            recorder.put_metric(name, value)
            return None
    else:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me:
                return original(*args, **kwargs)
            recorder.sleep(*args, **kwargs)
            return None
    return call


@functools.cache
def _torch_routing() -> tuple[tuple[Route, ...], tuple[types.ModuleType, ...]]:
    """What every run routes: torch's store barrier and metrics API (a mixin agent's driver goes
    through them, whatever the agent's own methods name)."""
    import torch.distributed.elastic.metrics.api as metrics_api
    import torch.distributed.elastic.utils.store as store_util

    return ((Route(vars(store_util), "barrier", "barrier", "torch store barrier"),),
            (metrics_api,))


@contextlib.contextmanager
def _patched(recorder: _Recorder, routes: Sequence[Route] = (),
             metric_modules: Sequence[types.ModuleType] = ()) -> Iterator[None]:
    """Route the sleep, exit barrier and metrics of this thread's run to ``recorder``."""
    me = threading.get_ident()
    real_sleep = time.sleep
    torch_routes, torch_metrics = _torch_routing()
    every = {r.key: r for r in (*torch_routes, *routes)}
    # fsm_agent.torch's driver waits at its own signal-interruptible barrier (same store keys).
    # It is imported on first use, so route it whenever fsm_agent.torch is in use.
    if "fsm_agent.torch" in sys.modules:
        fsm_barrier = importlib.import_module("fsm_agent.torch._barrier")
        route = Route(vars(fsm_barrier), "interruptible_barrier", "barrier", "fsm_agent barrier")
        every[route.key] = route
    modules: dict[int, Any] = {id(m): m for m in (*torch_metrics, *metric_modules)}
    real_monotonic = time.monotonic
    clock = recorder.clock

    def sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            recorder.sleep(seconds)
        else:
            real_sleep(seconds)

    def monotonic() -> float:
        return clock.now() if threading.get_ident() == me else real_monotonic()

    # A lifecycle built without a clock or a random source (inside an agent, say) uses the
    # engine's defaults: the system clock (time.monotonic, routed above) and this one.
    engine = sys.modules.get("fsm_agent._engine")
    saved_rng = getattr(engine, "_RNG", None)

    saved = [(r, r.namespace[r.name]) for r in every.values() if r.name in r.namespace]
    saved_handlers = [(m, m._default_metrics_handler, m._metrics_map.get("torchelastic"))
                      for m in modules.values()]
    saved_disable = logging.root.manager.disable
    _Routes.recorder, _Routes.thread = recorder, me
    time.sleep = sleep  # type: ignore[assignment]
    time.monotonic = monotonic  # type: ignore[assignment]
    if saved_rng is not None:
        engine._RNG = _ROUTED_RNG  # type: ignore[union-attr]
    for r, original in saved:
        r.namespace[r.name] = _routed(r, original, recorder, me)
    for m, _, _ in saved_handlers:
        m._default_metrics_handler = _HANDLER
        m._metrics_map["torchelastic"] = _HANDLER
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
        time.monotonic = real_monotonic
        if saved_rng is not None:
            engine._RNG = saved_rng  # type: ignore[union-attr]
        for r, original in saved:
            r.namespace[r.name] = original
        for m, default, group in saved_handlers:
            m._default_metrics_handler = default
            if group is None:
                m._metrics_map.pop("torchelastic", None)
            else:
                m._metrics_map["torchelastic"] = group


class _FakeStore:
    """Stands in for the rendezvous store: the scripted barrier never touches it."""


class _ScriptedNamespace:
    """An attribute of the scripted handler that a target API declares methods on (the
    ``_barrier_state`` of ``_barrier_state.open_rendezvous``)."""

    def __init__(self, path: str) -> None:
        self._fsm_path = path


def _answer(recorder: _Recorder, name: str, answer: Any) -> Any:
    """The attribute a target API's ``answer`` for ``name`` becomes (see ``_target_api``)."""
    if isinstance(answer, tuple) and answer[0] == "value":
        return answer[1]
    if answer == "rounds":
        return lambda *a, **k: recorder.rounds
    if answer == "nodes_waiting":
        return lambda *a, **k: recorder.num_nodes_waiting()
    if answer == "any_nodes_waiting":
        return lambda *a, **k: recorder.num_nodes_waiting() > 0
    if answer == "ignore":
        return lambda *a, **k: recorder.notes.append((name, a, k))
    value = answer[1] if isinstance(answer, tuple) else answer
    return lambda *a, **k: value


class _ScriptedRendezvous:
    def __init__(self, recorder: _Recorder, api: TargetAPI | None = None) -> None:
        self._recorder = recorder
        self._fsm_api = api
        for name, answer in api.rendezvous if api is not None else ():
            *path, last = name.split(".")
            owner: Any = self
            for i, part in enumerate(path):
                if not hasattr(owner, part):
                    setattr(owner, part, _ScriptedNamespace(".".join(path[:i + 1])))
                owner = getattr(owner, part)
            setattr(owner, last, _answer(recorder, name, answer))

    def num_nodes_waiting(self) -> int:
        return self._recorder.num_nodes_waiting()

    def get_run_id(self) -> str:
        return "conformance"

    def get_backend(self) -> str:
        return "scripted"

    def shutdown(self) -> bool:
        return True


_RENDEZVOUS_METHODS = "num_nodes_waiting, get_run_id, get_backend, shutdown"


class _ScriptedHooks:
    """Mixed in before an agent class: every hook plays the script. Hooks take any arguments
    (forks pass more than torch does) and act on ``self._worker_group``."""

    _fsm_recorder: _Recorder
    _worker_group: Any

    def _rendezvous(self, *args: Any, **kwargs: Any) -> None:
        self._fsm_recorder.rendezvous()
        group = self._worker_group
        group.group_rank = 0
        group.group_world_size = 1
        group.store = _FakeStore()
        self._store = group.store

    def _start_workers(self, *args: Any, **kwargs: Any) -> dict[int, Any]:
        self._fsm_recorder.start_workers()
        return {}

    def _stop_workers(self, *args: Any, **kwargs: Any) -> None:
        self._fsm_recorder.stop_workers()

    def _monitor_workers(self, *args: Any, **kwargs: Any) -> Any:
        return self._fsm_recorder.monitor()

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._fsm_recorder._record(("shutdown",))

    def _monitor_wait(self, interval: float) -> str | None:
        # LifecycleAgentMixin waits on its worker processes between ticks (woken early when one
        # exits, or by a signal); with scripted hooks there are none, so the wait is the
        # script's (a sleep, or the preemption and the drain's end).
        return self._fsm_recorder.wait(interval)

    # fsm_agent.torch's driver asks its agent for these (DrainMixin's and the mixin's own).
    def _fsm_drain_workers(self, signum: int) -> None:
        self._fsm_recorder.drain_workers(signum)

    def _fsm_kill_workers(self) -> None:
        self._fsm_recorder.kill_workers()

    def _fsm_current_preemption(self) -> Preemption | None:
        return self._fsm_recorder.preemption()

    def _fsm_progress_mark(self) -> Mark:
        return self._fsm_recorder.progress_mark()

    def _fsm_lost_peers(self) -> tuple[str, ...]:
        return self._fsm_recorder.lost_peers()


def _entrypoint() -> None:  # the WorkerSpec needs one; nothing runs it
    """Conformance run entry point (never called)."""


class _HarnessAbort(BaseException):
    """Carries a :class:`HarnessError` out of hypothesis at once: there is nothing to shrink."""

    def __init__(self, error: HarnessError) -> None:
        super().__init__(str(error))
        self.error = error


def _harness_problem(value: Any, name: str, agent: Any = None,
                     api: TargetAPI | None = None) -> str | None:
    """What the kit failed to provide, if ``value`` (what a run ended with) is an attribute the
    target looked for on one of the kit's stand-ins; None when it is the target's own doing."""
    exc, seen = value, set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AttributeError) and exc.obj is not None:
            obj, attr = exc.obj, exc.name
            if isinstance(obj, (_ScriptedRendezvous, _ScriptedNamespace)):
                where = attr if isinstance(obj, _ScriptedRendezvous) else (
                    f"{obj._fsm_path}.{attr}")
                declared = "".join(f", {n}" for n in (api.names if api is not None else ()))
                return (f"{name} calls its rendezvous handler's {where}, which the kit's scripted "
                        f"handler does not have (it has {_RENDEZVOUS_METHODS}{declared}); "
                        "declare it with a target API (--target-api, docs/conformance.md)")
            if isinstance(obj, _FakeStore):
                return (f"{name} uses the rendezvous store's {attr}; the kit scripts no store "
                        "(it routes the exit barrier, a function named barrier)")
            if isinstance(obj, _Recorder):
                return (f"{name} asks the kit's driver for {attr}, which a fsm_agent.Driver does "
                        "not have (is it an agent class without _invoke_run?)")
            if agent is not None and obj is agent:
                return (f"{name} uses self.{attr}, which neither the class nor the kit's "
                        f"scripted hooks ({', '.join(SCRIPTED_HOOKS)}) set")
        exc = exc.__cause__ or exc.__context__
    return None


# -- targets ---------------------------------------------------------------------------------


@attrs.frozen
class _Target:
    name: str
    run: Callable[[RunConfig, _Recorder], tuple[Any, Any]]  # -> (value or exc, supervisor)
    accepts: frozenset[str]
    result_types: ElasticTypes | None = None  # its monitor results' classes (None: torch's)
    routes: tuple[Route, ...] = ()
    metric_modules: tuple[types.ModuleType, ...] = ()

    def project(self, config: RunConfig) -> RunConfig:
        """``config`` with the settings this target cannot take put back to their defaults."""
        changes = {k: getattr(_DEFAULTS, k) for k in (*FACTORY_SETTINGS, "params")
                   if k not in self.accepts}
        changes = {k: v for k, v in changes.items() if getattr(config, k) != v}
        return attrs.evolve(config, **changes) if changes else config


@functools.cache
def _scripted_agent_class(cls: type) -> type:
    return type(f"Scripted{cls.__name__}", (_ScriptedHooks, cls), {"__module__": cls.__module__})


def _agent_target(cls: type, api: TargetAPI | None = None) -> _Target:
    supplied = api.keywords if api is not None else frozenset()
    shape = agent_shape(cls, supplied)  # raises HarnessError naming what is missing
    scripted = _scripted_agent_class(cls)
    name = describe(cls) + (f" with target API {api.name}" if api is not None else "")
    passed = ", ".join(["spec", *(f"{k}=..." for k in sorted(shape.keywords | supplied))])

    def run(config: RunConfig, rec: _Recorder) -> tuple[Any, Any]:
        rendezvous = _ScriptedRendezvous(rec, api)
        try:
            spec = shape.worker_spec(**worker_spec_kwargs(shape, config, rendezvous, _entrypoint))
        except Exception as e:
            raise HarnessError(f"cannot build {describe(shape.worker_spec)} for {name}: "
                               f"{type(e).__name__}: {e}") from None
        with contextlib.ExitStack() as scratch:
            kwargs: dict[str, Any] = {}
            if "exit_barrier_timeout" in shape.keywords:
                kwargs["exit_barrier_timeout"] = config.exit_barrier_timeout
            log_dir = None
            if "log_dir" in shape.keywords or supplied:  # torchelastic's LocalElasticAgent
                log_dir = scratch.enter_context(            # makes one; so may a logs spec
                    tempfile.TemporaryDirectory(prefix="fsm-agent-conformance-"))
            if "log_dir" in shape.keywords:
                kwargs["log_dir"] = log_dir
            for keyword in sorted(supplied):
                assert api is not None and log_dir is not None
                try:
                    kwargs[keyword] = api.build(keyword, cls, log_dir)
                except Exception as e:
                    raise HarnessError(f"cannot build {keyword} for {name}: "
                                       f"{type(e).__name__}: {e}") from None
            try:
                agent = scripted(spec, **kwargs)
            except Exception as e:
                problem = _harness_problem(e, name, api=api)
                raise HarnessError(problem or f"cannot build {name}({passed}): "
                                   f"{type(e).__name__}: {e}") from None
            agent._fsm_recorder = rec
            driver = getattr(agent, "_fsm_driver", None)
            if driver is not None and hasattr(driver, "announce_preemption"):
                # a single agent's announcement goes to the job's store: record it instead
                driver.announce_preemption = rec.announce_preemption
            try:
                value: Any = agent._invoke_run(config.role)
            except (Exception, EndOfScript, RunawaySupervisor) as e:
                value = e
        problem = _harness_problem(value, name, agent, api)
        if problem is not None:
            raise HarnessError(problem)
        return value, agent

    accepts = frozenset(k for k in FACTORY_SETTINGS
                        if k != "exit_barrier_timeout" or k in shape.keywords)
    return _Target(name, run, accepts, shape.result_types, shape.routes, shape.metric_modules)


def _factory_target(factory: Callable[..., Any], name: str, timed: bool = False,
                    driver: Callable[[Any], Any] | None = None) -> _Target:
    try:
        signature = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        signature = {}  # type: ignore[assignment]
    # Parameters, clock and random source go to a factory that names them, or to one taking
    # **kwargs when the spec has parameters or timers (a **kwargs factory for a torch preset
    # may hand them to something that takes nothing of the sort).
    named = frozenset(k for k in (*FACTORY_SETTINGS, *TIME_SETTINGS) if k in signature)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()):
        accepts = named | frozenset(FACTORY_SETTINGS) | (
            frozenset(TIME_SETTINGS) if timed else frozenset())
    else:
        accepts = named

    def run(config: RunConfig, rec: _Recorder) -> tuple[Any, Any]:
        kwargs: dict[str, Any] = {k: getattr(config, k) for k in FACTORY_SETTINGS
                                  if k in accepts}
        if "params" in accepts and config.params:
            kwargs["params"] = config.param_values()
        if "clock" in accepts:
            kwargs["clock"] = rec.clock
        if "rng" in accepts:
            kwargs["rng"] = rec.rng
        inner: Any = rec
        if driver is not None:
            try:
                inner = driver(rec)
            except Exception as e:
                raise HarnessError(f"cannot build the driver with {describe(driver)}(world): "
                                   f"{type(e).__name__}: {e}") from None
        try:
            supervisor = factory(inner, **kwargs)
        except Exception as e:
            problem = _harness_problem(e, name)
            raise HarnessError(problem or f"cannot build a supervisor with {name}(driver"
                               f"{''.join(f', {k}=...' for k in sorted(kwargs))}): "
                               f"{type(e).__name__}: {e}") from None
        start = getattr(supervisor, "remaining_restarts", None)
        if isinstance(start, int) and start != config.max_restarts:
            raise HarnessError(f"{name} built a supervisor with {start} restarts, but the kit "
                               f"asked for max_restarts={config.max_restarts}")
        run_loop = getattr(supervisor, "run", None)
        if not callable(run_loop):
            raise HarnessError(f"{name} returned {type(supervisor).__name__}, which has no "
                               "run(monitor_interval, sleep=...)")
        try:
            value: Any = run_loop(config.monitor_interval, sleep=rec.wait)
        except (Exception, EndOfScript, RunawaySupervisor) as e:
            value = e
        problem = _harness_problem(value, name)
        if problem is not None:
            raise HarnessError(problem)
        return value, supervisor

    if driver is not None:
        name = f"{name} with driver {describe(driver)}"
    return _Target(name, run, accepts)


def resolve_target(target: Any, spec: Any = DEFAULT_SPEC,
                   driver: Callable[[Any], Any] | None = None,
                   target_api: TargetAPI | str | os.PathLike[str] | None = None) -> _Target:
    """Turn what the user gave the kit into a runnable target (see the module docstring).

    ``driver`` is ``make_driver(world) -> Driver``: the user's own driver, put between a factory
    (or ``Lifecycle``) and the kit's scripted driver, which it must drive as its outside world.
    ``target_api`` declares what an agent class needs beyond torch's API (a
    :class:`~fsm_agent.testing._target_api.TargetAPI`, ``"nvrx"`` or a YAML file).
    Raises :class:`HarnessError` when the kit cannot script it.
    """
    if isinstance(target, _Target):
        return target
    api = None
    if target_api is not None:
        try:
            api = load_target_api(target_api)
        except ValueError as e:
            raise HarnessError(str(e)) from None
        if not is_agent_class(target):
            raise HarnessError(f"a target API ({api.name}) declares what an agent class needs; "
                               f"{describe(target)} is not one (a factory builds its own)")
    if driver is not None and not callable(driver):
        raise HarnessError(f"a driver must be a callable make_driver(world) -> Driver, "
                           f"got {driver!r}")
    if inspect.isclass(target):
        if is_agent_class(target):
            if driver is not None:
                raise HarnessError(f"{describe(target)} is an agent class, which drives its own "
                                   "hooks: a driver goes with a factory(driver) or Lifecycle")
            return _agent_target(target, api)
        from fsm_agent import Lifecycle

        if issubclass(target, Lifecycle):
            cls = target
            from fsm_agent import load_spec

            spec = load_spec(spec)  # once, not per run

            def lifecycle(driver: Any, **kw: Any) -> Any:
                return cls(spec, driver, **kw)

            return _factory_target(lifecycle, f"{describe(cls)} with spec {_spec_label(spec)}",
                                   _timed(spec), driver)
        hooks = hooks_without_loop(target)
        if hooks:
            raise HarnessError(f"{describe(target)} has {', '.join(hooks)} but no _invoke_run: "
                               "the kit runs the loop of an agent with the SimpleElasticAgent "
                               "shape")
    if callable(target):
        return _factory_target(target, describe(target), _timed(spec), driver)
    raise HarnessError(f"a conformance target must be a class with the SimpleElasticAgent shape "
                       f"(any package's) or a callable factory(driver) -> supervisor, "
                       f"got {target!r}")


def _spec_label(spec: Any) -> str:
    return spec if isinstance(spec, str) else str(getattr(spec, "name", spec))


def _timed(spec: Any) -> bool:
    """Whether ``spec``'s behaviour can depend on time or parameters (the resilient preset; a
    spec file with parameters or a state timer)."""
    if isinstance(spec, str) and spec in PRESETS:
        return spec == "resilient"
    try:
        from fsm_agent import load_spec

        loaded = load_spec(spec)
    except Exception:
        return False  # the oracle reports the spec's problems
    return bool(loaded.params) or any(s.timeout is not None for s in loaded.states)


def _classify(value: Any, rec: _Recorder) -> Returned | Raised | Pending:
    observed = rec.last_observed()
    gave_up_after = observed if observed in ("FAILED", "UNHEALTHY") else None
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
        code = getattr(exc, "exit_code", None)
        return Raised(type(exc).__name__, str(exc), wrapped,
                      scripted=any(exc is r for r in rec.raised),
                      exit_code=code if isinstance(code, int) and not isinstance(code, bool)
                      else None)
    state = getattr(value, "state", None)
    if state is not None and hasattr(value, "return_values"):
        return Returned(getattr(state, "name", str(state)), value.return_values,
                        failure_summary(getattr(value, "failures", {})), gave_up_after)
    if isinstance(value, dict):
        return Returned(None, value, {}, gave_up_after)
    return Returned(f"<{type(value).__name__}>", value, {}, gave_up_after)


def run_script(target: Any, config: RunConfig, script: Sequence[Tick],
               *, spec: Any = DEFAULT_SPEC) -> Trace:
    """Run ``target`` once on a script and return everything it did."""
    tgt = resolve_target(target, spec)
    rec = ScriptedDriver(config, script, tgt.result_types)
    supervisor: Any = None
    with _patched(rec, tgt.routes, tgt.metric_modules):
        value, supervisor = tgt.run(config, rec)
    state: Any
    remaining: Any
    if isinstance(supervisor, _ScriptedHooks):
        state = getattr(getattr(supervisor._worker_group, "state", None), "name", None)
        remaining = getattr(supervisor, "_remaining_restarts", None)
        # an agent built with LifecycleAgentMixin exposes its lifecycle
        code = getattr(getattr(supervisor, "lifecycle", None), "exit_code", None)
    else:
        state = getattr(supervisor, "state", None)
        state = getattr(state, "name", state)
        remaining = getattr(supervisor, "remaining_restarts", None)
        code = getattr(supervisor, "exit_code", None)
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    return Trace(tuple(rec.events), _classify(value, rec), state, remaining, code)


# -- the oracle ------------------------------------------------------------------------------


def _oracle(spec: Any) -> Callable[[RunConfig, Sequence[Tick]], Trace]:
    """The reference for ``spec``: the table for a preset name, the engine for a spec file."""
    if isinstance(spec, str) and spec in PRESETS:
        return functools.partial(reference_trace, spec)
    from fsm_agent import Lifecycle, load_spec

    loaded = load_spec(spec)  # raises SpecError naming file and line
    target = resolve_target(Lifecycle, loaded)
    return lambda config, script: run_script(target, config, script)


@attrs.frozen
class _Profile:
    """What the scripts for one spec look like: its run settings (with parameter values drawn
    for a spec that has parameters) and whether ticks carry time and random draws."""

    configs: st.SearchStrategy[RunConfig]
    timed: bool
    window: Callable[[RunConfig], float]  # the restart window a run's budget counts in
    drains: bool = False  # ticks may carry a preemption (the spec drains)
    progress: bool = False  # ticks may carry a progress step (the spec counts progress)
    peers: bool = False  # failures may follow a lost node (the spec's policy asks peer_lost)

    def ticks(self, faults: bool = True) -> st.SearchStrategy[Tick]:
        """The ticks of this spec's scripts."""
        return ticks(faults=faults, timed=self.timed, drains=self.drains,
                     progress=self.progress, peers=self.peers)


#: Monitor intervals of timed runs: exact binary fractions, as the ticks' elapsed times are.
_TIMED_INTERVALS = (0.5, 4.0)


def _never(config: RunConfig) -> float:
    return math.inf


def _window(spec: Any) -> Callable[[RunConfig], float]:
    """The length of the window ``spec`` counts failure restarts in, for a run's parameters."""
    if isinstance(spec, str) and spec in PRESETS:
        if spec != "resilient":
            return _never
        return lambda c: float(dict(c.params).get("restart_window",
                                                   RESILIENT_DEFAULTS["restart_window"]))
    from fsm_agent import load_spec

    loaded = load_spec(spec)
    ref = loaded.budget.window
    name = ref.name
    if name is None:
        return lambda c: float(ref.value)
    defaults = {p.name: p.default for p in loaded.params}
    return lambda c: float(dict(c.params).get(name, defaults.get(name, math.inf)))


# (spec, fixed) -> (the spec itself, kept so that its id is not reused; its profile)
_PROFILES: dict[Any, tuple[Any, _Profile]] = {}


def _profile(spec: Any, fixed: tuple[tuple[str, Any], ...] = ()) -> _Profile:
    """The script profile of ``spec``; ``fixed`` parameter values are used in every run."""
    # Built once per spec: the config list is hundreds of objects, and hypothesis keeps what it
    # learns about a strategy on the strategy object.
    key = (spec if isinstance(spec, (str, os.PathLike)) else id(spec), fixed)
    entry = _PROFILES.get(key)
    if entry is None or entry[0] is not spec:
        entry = _PROFILES[key] = (spec, _make_profile(spec, fixed))
    return entry[1]


def _make_profile(spec: Any, fixed: tuple[tuple[str, Any], ...]) -> _Profile:
    if isinstance(spec, str) and spec in PRESETS:
        values: dict[str, Any] = dict(RESILIENT_PARAM_VALUES) if spec == "resilient" else {}
        defaults: dict[str, Any] = dict(RESILIENT_DEFAULTS) if spec == "resilient" else {}
        timed = drains = progress = peers = spec == "resilient"
    else:
        from fsm_agent import load_spec

        loaded = load_spec(spec)
        values = param_values_for(loaded)
        defaults = {p.name: p.default for p in loaded.params}
        timed = bool(loaded.params) or any(s.timeout is not None for s in loaded.states)
        # a preemption only for a spec with the drain's own triggers (the engine refuses a
        # trigger the spec does not declare); progress for one whose guards count it
        drains = {"preempted", "drained"} <= set(loaded.triggers)
        progress = any(g.kind == "no_progress_restarts_at_least" for g in loaded.guard_defs)
        peers = loaded.policy is not None and any(
            "peer_lost" in r.when for r in loaded.policy.rules)
    unknown = sorted(set(dict(fixed)) - set(defaults))
    if unknown:
        if spec == "resilient":
            raise ValueError(f"the reference for resilient (README's table) has no parameter "
                             f"{unknown[0]!r} (its parameters: {', '.join(sorted(defaults))}); "
                             "check the others against the spec file, specs/resilient.yaml, "
                             "where the engine is the reference")
        raise ValueError(f"spec {_spec_label(spec)!r} has no parameter {unknown[0]!r} (its "
                         f"parameters: {', '.join(sorted(defaults)) or 'none'})")
    if not timed:
        return _Profile(run_configs(), False, _never, drains, progress, peers)
    for name, _ in fixed:
        values.pop(name, None)
    drawn = params(values, defaults) if values else None
    configs = run_configs(monitor_intervals=_TIMED_INTERVALS, param_sets=drawn)
    if fixed:
        configs = configs.map(lambda c: attrs.evolve(c, params=(*c.params, *fixed)))
    return _Profile(configs, True, _window(spec), drains, progress, peers)


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
        same = ((expected.type_name, expected.message, expected.exit_code)
                == (actual.type_name, actual.message, actual.exit_code))
        return None if same else "outcome"
    return None if type(expected) is type(actual) else "outcome"


def _same_call(a: Event, b: Event) -> bool:
    """Equal calls; two waits are the same to within float rounding (a supervisor may compute
    the rest of a backoff as deadline - now)."""
    if a == b:
        return True
    return (a[0] == b[0] == "sleep" and len(a) == len(b) == 2
            and isinstance(a[1], (int, float)) and isinstance(b[1], (int, float))
            and math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-9))


def same_calls(expected: Sequence[Event], actual: Sequence[Event]) -> bool:
    """Whether two runs made the same calls (waits compared to within float rounding)."""
    return len(expected) == len(actual) and all(
        _same_call(a, b) for a, b in zip(expected, actual, strict=True))


def compare_traces(expected: Trace, actual: Trace) -> list[str]:
    """What differs between a reference trace and a supervisor's, after intended divergences."""
    problems = []
    if expected.events != actual.events and not same_calls(expected.events, actual.events):
        problems.append("calls")
    if _outcome_mismatch(expected.outcome, actual.outcome):
        problems.append("outcome")
    if actual.state is not None and expected.state is not None and actual.state != expected.state:
        # unknown-after-action-error: after a hook raised, torch's agent stays wherever it got
        # to and the engine moves to UNKNOWN; either side may be the reference (a spec file's
        # reference is the engine).
        errored = isinstance(expected.outcome, Raised) and expected.outcome.scripted
        if not (errored and "UNKNOWN" in (actual.state, expected.state)):
            problems.append("final state")
    if (actual.remaining_restarts is not None and expected.remaining_restarts is not None
            and actual.remaining_restarts != expected.remaining_restarts):
        problems.append("remaining restarts")
    if actual.exit_code != expected.exit_code:
        problems.append("exit code")
    return problems


def trace_invariants(trace: Trace, config: RunConfig, *, windowed: bool = False) -> list[str]:
    """Invariants of the model tests that hold for every lifecycle, checked on one trace.

    ``windowed``: restarts are counted within a sliding window, so the ``remaining_restarts``
    metric may go up again as old restarts leave it.
    """
    ev = trace.events
    out = []
    started = stopped = False
    for i, e in enumerate(ev):
        if e[0] == "monitor" and (i == 0 or ev[i - 1] != ("sleep", config.monitor_interval)):
            out.append(f"call {i + 1}: monitor() not right after "
                       f"sleep({config.monitor_interval:g})")
        if e[0] == "monitor" and stopped:
            out.append(f"call {i + 1}: monitor() while the workers are stopped")
        if e[0] == "rendezvous" and i + 1 < len(ev) and ev[i + 1] != ("start_workers",):
            out.append(f"call {i + 1}: rendezvous() not followed by start_workers()")
        if e[0] == "rendezvous" and started and not stopped:
            # a backoff may wait between the stop and the restart; nothing else may
            out.append(f"call {i + 1}: restart without stop_workers() first")
        if e[0] == "stop_workers":
            stopped = True
        elif e[0] == "start_workers":
            started, stopped = True, False
        elif e[0] not in ("sleep", "rendezvous"):
            stopped = False
    barriers = [i for i, e in enumerate(ev) if e[0] == "exit_barrier"]
    if len(barriers) > 1:
        out.append(f"exit barrier entered {len(barriers)} times")
    if barriers and any(e[0] in ("monitor", "start_workers") for e in ev[barriers[0]:]):
        out.append("workers monitored or started after the exit barrier")
    suffix = ".remaining_restarts"
    left = [e[2] for e in ev if e[0] == "put_metric" and str(e[1]).endswith(suffix)]
    if any(not 0 <= n <= config.max_restarts for n in left):
        out.append(f"remaining_restarts metric outside 0..{config.max_restarts}: {left}")
    if not windowed and any(b > a for a, b in itertools.pairwise(left)):
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
        return "exit_barrier(?)" if event[1] is None else f"exit_barrier({event[1]:g})"
    if name == "woken":
        return f"-> {event[1]}"
    if name == "announce_preemption":
        return f"announce({event[1]})"
    if name == "drain_workers":
        return f"drain({_signal_name(event[1])})"
    short = {"num_nodes_waiting": "nodes_waiting?", "start_workers": "start",
             "stop_workers": "stop", "kill_workers": "kill"}
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
    """The counterexample as a table: one row per tick, expected and actual calls side by side.

    Columns for how a failure failed, the time a tick took and the random draw appear only when
    some tick of the script sets them."""
    exp = _segments(expected.events, len(script))
    act = _segments(actual.events, len(script))
    extra = [(title, get) for title, get, plain in _EXTRA_COLUMNS
             if any(get(t) != plain for t in script)]
    titles = ("tick", "observed", "nodes waiting", "barrier", "fault", *(t for t, _ in extra))
    rows = [(*titles, "expected calls", "actual calls")]
    for i in range(max(len(exp), len(act))):
        if i == 0:
            head = ("start", "-", "-", "-", config.init_fault or "-", *("-" for _ in extra))
        elif i <= len(script):
            t = script[i - 1]
            head = (str(i), t.observed, str(t.nodes_waiting), t.barrier, t.fault or "-",
                    *(get(t) for _, get in extra))
        else:
            head = (str(i), "(none: script ended)", "-", "-", "-", *("-" for _ in extra))
        e = ", ".join(_short(x, config.role) for x in exp[i]) if i < len(exp) else ""
        a = ", ".join(_short(x, config.role) for x in act[i]) if i < len(act) else ""
        same = e == a and same_calls(exp[i] if i < len(exp) else [],
                                     act[i] if i < len(act) else [])
        mark = "" if same else "  <-- differs"
        rows.append((*head, e or "-", (a or "-") + mark))
    n = len(titles) + 1
    widths = [max(len(r[c]) for r in rows) for c in range(n)]
    lines = [" | ".join(r[c].ljust(widths[c]) for c in range(n)) + " | " + r[n] for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 12)
    lines.append("")
    lines.append(f"expected outcome: {_outcome_line(expected)}")
    differs = "  <-- differs" if problems and set(problems) - {"calls"} else ""
    lines.append(f"actual outcome:   {_outcome_line(actual)}{differs}")
    if problems:
        lines.append("differs in: " + ", ".join(problems))
    return "\n".join(lines)


def _outcome_line(trace: Trace) -> str:
    code = f", exit code {trace.exit_code}" if trace.exit_code is not None else ""
    return (f"{trace.outcome.describe()}; state {trace.state}, "
            f"remaining_restarts {trace.remaining_restarts}{code}")


def _seconds(value: float) -> str:
    return f"+{value:g}s"


#: Columns a script shows when some tick sets them: title, the cell, the cell's plain value.
_EXTRA_COLUMNS: tuple[tuple[str, Callable[[Tick], str], str], ...] = (
    ("failure", lambda t: t.failure_detail() or "-", "-"),
    ("time", lambda t: _seconds(t.elapsed) if t.elapsed else "-", "-"),
    ("draw", lambda t: f"{t.draw:g}", "0.5"),
    ("step", lambda t: "-" if t.step is None else str(t.step), "-"),
    ("preempted after", lambda t: t.preemption_detail() or "-", "-"),
    ("peer", lambda t: "lost" if t.peer_lost else "-", "-"),
)


def _signal_name(number: Any) -> str:
    try:
        return signal.Signals(number).name
    except (ValueError, TypeError):
        return str(number)


# -- checking one script --------------------------------------------------------------------


def check_script(
    target: Any,
    config: RunConfig,
    script: Sequence[Tick],
    *,
    spec: Any = DEFAULT_SPEC,
    expected: Trace | None = None,
    spec_label: str | None = None,
    windowed: bool | None = None,
) -> Trace:
    """Run ``target`` on one script; raise :class:`ConformanceFailure` (the table) if it differs
    from the reference for ``spec`` or breaks an invariant. Returns the target's trace.

    ``windowed`` says whether restarts are counted in a sliding window in this run (default:
    worked out from ``spec`` and ``config``)."""
    tgt = resolve_target(target, spec)
    if expected is None:
        expected = _oracle(spec)(config, script)
    if windowed is None:
        windowed = _window(spec)(config) < math.inf
    actual = run_script(tgt, config, script)
    problems = compare_traces(expected, actual)
    broken = trace_invariants(actual, config, windowed=windowed)
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
    timed: bool = False,
    tick_strategy: st.SearchStrategy[Tick] | None = None,
) -> tuple[RunConfig, tuple[Tick, ...], Trace]:
    """Draw a config, then ticks one at a time until the reference run is over (or the draw
    says the script ends there, with the run still going).

    Drawing lazily keeps every tick of a script meaningful: a list drawn up front would mostly
    hold ticks after the run ended, which cost generation and shrinking time and test nothing.
    Returns the config, the script and the reference trace for it. ``timed``: ticks carry
    elapsed time and random draws (for a spec with timers or parameters); ``tick_strategy``
    replaces :func:`ticks` (a spec's profile adds preemptions and progress steps).
    """
    config = data.draw(configs if configs is not None else run_configs(), label="config")
    if tick_strategy is None:
        tick_strategy = ticks(faults=faults, timed=timed)
    script: list[Tick] = []
    expected = oracle(config, script)
    while isinstance(expected.outcome, Pending) and len(script) < max_ticks:
        # One draw in ten ends the script here. A separate draw, not a None among the ticks:
        # hypothesis draws the first entry of a long sampled_from list far more often than its
        # share, which left half the scripts without a single tick; this draw still shrinks
        # towards 0, ending the script, so counterexamples get short.
        if data.draw(_GO_ON, label=f"go on after {len(script)}") == 0:
            break
        script.append(data.draw(tick_strategy, label=f"tick {len(script) + 1}"))
        expected = oracle(config, script)
    return config, tuple(script), expected


_GO_ON = st.integers(0, 9)


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
    spec: ClassVar[Any] = DEFAULT_SPEC
    #: run_conformance's machines stop hypothesis at once on a HarnessError (nothing to shrink).
    _abort_on_harness_error: ClassVar[bool] = False
    #: Parameter values every run uses (run_conformance's ``params``).
    _fixed_params: ClassVar[tuple[tuple[str, Any], ...]] = ()

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
        profile = _profile(spec, cls._fixed_params)
        self._configs = profile.configs.map(self._target.project)
        self._ticks = profile.ticks()
        self._window = profile.window
        self.config: RunConfig = _DEFAULTS
        self.script: list[Tick] = []
        self.last: Trace | None = None
        self.running = False
        self._saved_disable = logging.root.manager.disable
        logging.disable(logging.CRITICAL)

    def _verify(self, expected: Trace) -> None:
        try:
            self.last = check_script(self._target, self.config, self.script, expected=expected,
                                     spec_label=_spec_label(type(self).spec),
                                     windowed=self._window(self.config) < math.inf)
        except HarnessError as e:
            if type(self)._abort_on_harness_error:
                raise _HarnessAbort(e) from None
            raise

    def _advance(self) -> None:
        # The target runs once per run, when the reference says the run is over (or at
        # teardown): replaying it after every tick would make shrinking quadratic.
        expected = self._expected(self.config, self.script)
        self.running = isinstance(expected.outcome, Pending)
        if not self.running:
            self._verify(expected)

    # The strategies depend on the spec (its parameters, whether it is timed): each run's
    # settings and each tick are drawn from the machine's own.
    @precondition(lambda self: not self.running)
    @rule(data=st.data())
    def start_run(self, data: st.DataObject) -> None:
        """Start a fresh supervisor with settings drawn for the spec."""
        config = data.draw(self._configs, label="config")
        self.config = self._target.project(config)
        self.script = []
        self.last = None
        self._advance()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        """The next monitor call returns what a tick drawn for the spec says."""
        self.script.append(data.draw(self._ticks, label="tick"))
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


def conformance_machine(target: Any, spec: Any = DEFAULT_SPEC) -> type[SupervisorConformance]:
    """A ``SupervisorConformance`` subclass bound to ``target`` and ``spec``."""
    name = getattr(target, "__name__", type(target).__name__)
    return type(f"Conformance[{name}]", (SupervisorConformance,),
                {"target": staticmethod(target) if not inspect.isclass(target) else target,
                 "spec": spec, "__module__": __name__})


def run_conformance(
    target: Any,
    spec: str | os.PathLike[str] | Any = DEFAULT_SPEC,
    settings: Settings | None = None,
    *,
    seed: int | None = None,
    stateful: bool = False,
    params: Mapping[str, Any] | None = None,
    driver: Callable[[Any], Any] | None = None,
    target_api: TargetAPI | str | os.PathLike[str] | None = None,
) -> None:
    """Check ``target`` against ``spec``'s reference behaviour; raise on a counterexample.

    ``target`` is a ``SimpleElasticAgent`` subclass or a ``factory(driver, **settings)``
    returning an object with ``run(monitor_interval, sleep=...)``. ``spec`` is a preset name
    (``"torchelastic"``, the default as for every ``fsm-agent`` command, ``"torchrun"``,
    ``"resilient"``: checked against the reference tables) or a spec file / ``Spec`` (checked
    against ``fsm_agent.Lifecycle`` running it). Raises :class:`ConformanceFailure` whose message
    is the shrunk counterexample as a table.

    For a spec with parameters the kit draws their values per run (the target gets them as
    ``params=`` when it takes them; otherwise the defaults are checked); ``params`` fixes some
    for every run instead.

    ``driver`` (``make_driver(world) -> Driver``) checks your own driver too: the target gets
    ``make_driver(world)`` where it would get the kit's driver, and ``world`` is the kit's
    scripted driver, which yours must call as its outside world (what is compared is what
    reaches ``world``).

    ``target_api`` declares what an agent class asks for beyond torch's agent API: constructor
    arguments and rendezvous handler methods, each answered from the script (``"nvrx"`` for
    NVIDIA's ft_launcher agent, a YAML file, or a
    :class:`~fsm_agent.testing._target_api.TargetAPI`; docs/conformance.md).

    Each example is one whole script (:func:`scripts`); ``stateful=True`` runs
    :class:`SupervisorConformance` instead (several runs per example, tick by tick; it finds the
    same bugs but shrinks several times slower).
    """
    # A bad target or spec fails here, not inside hypothesis; so does a target the kit cannot
    # script on the probe scripts (HarnessError).
    tgt = resolve_target(target, spec, driver, target_api)
    oracle = _oracle(spec)
    fixed = RunConfig(params=params or {}).params
    profile = _profile(spec, fixed)
    if fixed and "params" not in tgt.accepts:
        raise HarnessError(f"{tgt.name} takes no params=, so the kit cannot set "
                           f"{', '.join(k for k, _ in fixed)}")
    settings = settings or default_settings()
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        probe(tgt, params=fixed)
        if stateful:
            wrapped = driver is not None or target_api is not None
            machine = conformance_machine(tgt if wrapped else target, spec)
            if fixed:
                machine._fixed_params = fixed
            machine._abort_on_harness_error = True
            if seed is not None:
                machine = hypothesis_seed(seed)(machine)
            run_state_machine_as_test(machine, settings=settings)
            return
        label = _spec_label(spec)
        configs = profile.configs.map(tgt.project)
        failing: list[tuple[RunConfig, tuple[Tick, ...]]] = []

        @settings
        @given(st.data())
        def conformance(data: Any) -> None:
            config, script, expected = draw_case(data, oracle, configs=configs,
                                                 timed=profile.timed,
                                                 tick_strategy=profile.ticks())
            try:
                check_script(tgt, config, script, expected=expected, spec_label=label,
                             windowed=profile.window(config) < math.inf)
            except HarnessError as e:
                raise _HarnessAbort(e) from None
            except ConformanceFailure:
                failing[:] = [(config, script)]  # hypothesis replays the shrunk one last
                raise

        if seed is not None:
            conformance = hypothesis_seed(seed)(conformance)
        try:
            conformance()
        except ConformanceFailure:
            if not failing:
                raise
            config, script = simplify(tgt, oracle, *failing[0], window=profile.window,
                                      keep=[name for name, _ in fixed])
            try:
                check_script(tgt, config, script, expected=oracle(config, script),
                             spec_label=label, windowed=profile.window(config) < math.inf)
            except ConformanceFailure as plain:
                raise plain from None
            raise
    except _HarnessAbort as abort:
        raise abort.error from None
    finally:
        logging.disable(saved)


_PLAIN_TICK = Tick()
#: Tick fields simplify puts back to their plain value, in this order (the error types before
#: the exit codes they belong to).
_PLAIN_FIELDS = ("fault", "barrier", "nodes_waiting", "errors", "exitcodes", "elapsed", "draw",
                 "preempt", "drain", "step")


def _plainer(field: str, value: Any) -> tuple[Any, ...]:
    """The values ``simplify`` tries for a tick's ``field``, plainest first: the default, and
    for nodes waiting every smaller count (hypothesis can stop at 2 where 1 shows the bug)."""
    plain = getattr(_PLAIN_TICK, field)
    if value == plain:
        return ()
    if field == "nodes_waiting":
        return tuple(range(plain, value))
    return (plain,)


def simplify(target: Any, oracle: Callable[[RunConfig, Sequence[Tick]], Trace],
             config: RunConfig, script: Sequence[Tick], *,
             window: Callable[[RunConfig], float] = _never,
             keep: Sequence[str] = ()) -> tuple[RunConfig, tuple[Tick, ...]]:
    """Make a failing script plainer while it still fails: each tick's fault, barrier outcome,
    nodes waiting (0, else the fewest that still fail), failure details, elapsed time, random
    draw, preemption and step back to the default, one at a time, then each drawn parameter
    (not those in ``keep``, fixed by the caller) back to its default (a few runs).

    hypothesis draws a tick as one index into every combination, which it shrinks well towards
    fewer faults but can leave, say, a barrier error beside the FAILED the bug is about: the
    table would show a detail that plays no part.
    """
    tgt = resolve_target(target)

    def fails(c: RunConfig, s: tuple[Tick, ...]) -> bool:
        expected = oracle(c, s)
        actual = run_script(tgt, c, s)
        return bool(compare_traces(expected, actual) or trace_invariants(
            actual, c, windowed=window(c) < math.inf))

    ticks_ = tuple(script)
    if config.init_fault is not None and fails(attrs.evolve(config, init_fault=None), ticks_):
        config = attrs.evolve(config, init_fault=None)
    for i in range(len(ticks_)):
        for field in _PLAIN_FIELDS:
            value = getattr(ticks_[i], field)
            for plain in _plainer(field, value):
                candidate = (*ticks_[:i], attrs.evolve(ticks_[i], **{field: plain}),
                             *ticks_[i + 1:])
                if fails(config, candidate):
                    ticks_ = candidate
                    break
    for name, _ in config.params:
        if name in keep:
            continue
        plainer = attrs.evolve(config, params=tuple(p for p in config.params if p[0] != name))
        if fails(plainer, ticks_):
            config = plainer
    return config, ticks_


#: Scripts every target is run on before hypothesis starts: between them they call every hook
#: (a membership restart, a counted restart, success through the exit barrier; giving up after
#: an UNHEALTHY group), so that a target the kit cannot script fails at once, in one line.
PROBES: tuple[tuple[RunConfig, tuple[Tick, ...]], ...] = (
    (RunConfig(max_restarts=1),
     (Tick("HEALTHY", nodes_waiting=1), Tick("FAILED"), Tick("SUCCEEDED"))),
    (RunConfig(max_restarts=0), (Tick("UNHEALTHY"),)),
)


def probe(target: Any, spec: Any = DEFAULT_SPEC, *,
          params: tuple[tuple[str, Any], ...] = ()) -> None:
    """Run ``target`` on :data:`PROBES` (with ``params`` set); raise :class:`HarnessError` if the
    kit cannot script it. What the target does on them is not judged here."""
    tgt = resolve_target(target, spec)
    for config, script in PROBES:
        run_script(tgt, tgt.project(attrs.evolve(config, params=params)), script)
