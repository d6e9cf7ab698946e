"""One run's scripted world: the recorder that plays a script, and what routes calls to it.

Every hook call, sleep, metric and barrier wait of a run is recorded as one event; the run ends
when the supervisor returns, raises, or asks for a monitor result beyond the script (the
monitor then raises :class:`EndOfScript`, a ``BaseException``, to unwind it). Time is virtual:
it moves only when the supervisor sleeps and by each tick's ``elapsed``; the run's thread reads
it from ``time.monotonic`` and from the clock the kit passes, and the random source it is given
(or the engine's default one) returns each tick's ``draw``.

The stand-ins the kit gives an agent class (scripted hooks, rendezvous handler and store) are
here too, and so is how a run's end is told apart from what the kit failed to provide
(:func:`_harness_problem`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import random
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from .._core._clock import VirtualClock
from .._core._drain import Preemption
from .._core._progress import Mark
from ._agent_shape import (
    SCRIPTED_HOOKS,
    HarnessError,
    Route,
)
from ._recording import ScriptedRandom
from ._reference import (
    Event,
)
from ._strategies import (
    ElasticTypes,
    RunConfig,
    Tick,
    barrier_error,
    fault_error,
    tick_result,
)
from ._target_api import TargetAPI

#: A run that records more events than this is a supervisor looping without end.
MAX_EVENTS = 2_000
#: A run that reads the virtual clock more often than this is waiting without sleeping.
MAX_CLOCK_READS = 50 * MAX_EVENTS


class EndOfScript(BaseException):
    """Raised by the scripted monitor when the script has no more ticks; ends the run."""


class RunawaySupervisor(BaseException):
    """Raised by a scripted hook once a run has recorded more than ``MAX_EVENTS`` events."""



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

    # -- a drain, and progress (fsm_agent._core._drain, fsm_agent._core._progress)
    # --------------------------

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
    engine = sys.modules.get("fsm_agent._core._engine")
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

