"""What the kit runs: any supervisor made a target, and one run of a target on a script.

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

A target the kit cannot script (a hook, type or constructor argument it cannot find or supply,
or a stand-in asked for something it does not have) is a :class:`HarnessError`, never a
counterexample.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import tempfile
import types
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._core._spec import DEFAULT_SPEC
from ._agent_shape import (
    HarnessError,
    Route,
    agent_shape,
    describe,
    hooks_without_loop,
    is_agent_class,
    worker_spec_kwargs,
)
from ._reference import (
    PRESETS,
    ConformanceTrace,
    Pending,
    Raised,
    Returned,
)
from ._scripted import (
    EndOfScript,
    RunawaySupervisor,
    ScriptedDriver,
    _entrypoint,
    _harness_problem,
    _patched,
    _Recorder,
    _ScriptedHooks,
    _ScriptedRendezvous,
)
from ._strategies import (
    ElasticTypes,
    RunConfig,
    Tick,
    failure_summary,
)
from ._target_api import TargetAPI, load_target_api

#: Settings the kit's keyword arguments may take from a factory.
FACTORY_SETTINGS: tuple[str, ...] = ("role", "max_restarts", "exit_barrier_timeout")
#: What the kit also passes, when the factory takes it, for a spec with parameters or timers:
#: the run's parameter values, its virtual clock and its scripted random source.
TIME_SETTINGS: tuple[str, ...] = ("params", "clock", "rng")
_DEFAULTS = RunConfig()


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
               *, spec: Any = DEFAULT_SPEC) -> ConformanceTrace:
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
    return ConformanceTrace(tuple(rec.events), _classify(value, rec), state, remaining, code)

