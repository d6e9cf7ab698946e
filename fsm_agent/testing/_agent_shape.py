"""What the conformance kit needs to script an agent with the ``SimpleElasticAgent`` shape.

torch's ``SimpleElasticAgent`` is not the only one: the ``torchelastic`` package (its 2020-2021
release), vendored copies (nvidia-resiliency-ext's ``_torch_elastic_compat``) and forks define
their own ``SimpleElasticAgent``, ``WorkerState``, ``RunResult`` and ``WorkerSpec``. So nothing
here asks ``issubclass`` of torch's classes; everything is found by name, on the class and in the
modules its methods were written in:

* the hooks: the kit scripts ``_rendezvous``, ``_start_workers``, ``_stop_workers``,
  ``_monitor_workers`` and ``_shutdown``; ``_initialize_workers``, ``_restart_workers`` and
  ``_exit_barrier`` are the agent's own and must exist if its ``_invoke_run`` calls them;
* the types: ``WorkerState``, ``RunResult``, ``ProcessFailure`` and ``WorkerSpec`` as the modules
  of the class and its bases name them (the first found along the MRO; torch's otherwise);
* the constructor, from its signature: the worker spec as the first argument,
  ``exit_barrier_timeout`` and ``log_dir`` (a scratch directory) when it takes them, and the
  keywords a target API supplies (:mod:`._target_api`);
* the calls to route to the recorder, from the names the methods use: ``barrier`` (the exit
  barrier, a function or a module's, as ``store_util.barrier``), ``put_metric`` (through the
  metrics API's handler when it is a copy of torch's, else the name itself) and ``sleep``.

What cannot be found or supplied is a :class:`HarnessError`, one line naming it: a problem of the
kit's reach, never a finding about the agent.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from ._strategies import ElasticTypes

__all__ = [
    "COMPOSITE_HOOKS",
    "SCRIPTED_HOOKS",
    "AgentShape",
    "HarnessError",
    "Route",
    "agent_shape",
    "is_agent_class",
]

#: Hooks the kit replaces with scripted ones.
SCRIPTED_HOOKS: tuple[str, ...] = (
    "_rendezvous", "_start_workers", "_stop_workers", "_monitor_workers", "_shutdown")
#: Hooks the agent keeps (they call the scripted ones), needed when its ``_invoke_run`` calls them.
COMPOSITE_HOOKS: tuple[str, ...] = ("_initialize_workers", "_restart_workers", "_exit_barrier")
#: ``WorkerSpec`` fields the kit fills in (any other field must have a default).
SPEC_FIELDS: tuple[str, ...] = (
    "role", "local_world_size", "rdzv_handler", "entrypoint", "fn", "max_restarts",
    "monitor_interval")
#: Constructor keywords the kit fills in, besides the worker spec (the first argument).
CONSTRUCTOR_KEYWORDS: tuple[str, ...] = ("exit_barrier_timeout", "log_dir")
_TYPE_NAMES: tuple[str, ...] = ("WorkerState", "RunResult", "ProcessFailure", "WorkerSpec")


class HarnessError(TypeError):
    """The kit cannot script this target: a hook, type or constructor argument it cannot find or
    supply. Not a counterexample: the target's behaviour was not checked."""


@attrs.frozen
class Route:
    """A name the agent's code calls that the kit routes to its recorder during a run.

    ``namespace`` is the dictionary the name is looked up in (a module's ``__dict__``), ``kind``
    what it stands for: ``"barrier"`` (the exit barrier), ``"put_metric"`` or ``"sleep"``.
    """

    namespace: dict[str, Any] = attrs.field(eq=False, repr=False)
    name: str
    kind: str
    where: str

    @property
    def key(self) -> tuple[int, str]:
        """One route per namespace and name, however many methods use it."""
        return (id(self.namespace), self.name)


@attrs.frozen
class AgentShape:
    """How to build, script and listen to one agent class."""

    cls: type
    result_types: ElasticTypes
    worker_spec: Any
    spec_fields: frozenset[str]
    keywords: frozenset[str]
    routes: tuple[Route, ...]
    metric_modules: tuple[types.ModuleType, ...]


def is_agent_class(obj: Any) -> bool:
    """Whether ``obj`` is a class with the ``SimpleElasticAgent`` shape (it has ``_invoke_run``)."""
    return inspect.isclass(obj) and callable(getattr(obj, "_invoke_run", None))


def hooks_without_loop(obj: Any) -> list[str]:
    """The agent hooks a class has when it has no ``_invoke_run`` (an agent the kit cannot run)."""
    if not inspect.isclass(obj) or is_agent_class(obj):
        return []
    return [h for h in ("_monitor_workers", "_start_workers", "_stop_workers", "_rendezvous")
            if callable(getattr(obj, h, None))]


def describe(obj: Any) -> str:
    """``module:qualname`` of a class or function."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


# -- reading code --------------------------------------------------------------------------------


def _functions(cls: type) -> Iterator[tuple[type, Any]]:
    """Every plain function defined on ``cls`` and its bases (unwrapped), in MRO order."""
    for klass in cls.__mro__:
        if klass is object:
            continue
        for attr in vars(klass).values():
            func = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else (
                attr.fget if isinstance(attr, property) else attr)
            if inspect.isfunction(func):
                yield klass, inspect.unwrap(func)


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names a code object (and the code nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _find_type(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        value = getattr(module, name, None) if module is not None else None
        if inspect.isclass(value):
            return value
    return None


@functools.cache
def _torch_worker_spec() -> Any:
    from torch.distributed.elastic.agent.server.api import WorkerSpec

    return WorkerSpec


def _is_metrics_api(module: Any) -> bool:
    """A copy of torch's metrics API: a handler map and a default handler, read on every put."""
    return isinstance(getattr(module, "_metrics_map", None), dict) and hasattr(
        module, "_default_metrics_handler")


def _routes(cls: type) -> tuple[list[Route], list[types.ModuleType]]:
    routes: dict[tuple[int, str], Route] = {}
    metrics: dict[str, types.ModuleType] = {}

    def add(namespace: dict[str, Any], name: str, kind: str, where: str) -> None:
        route = Route(namespace, name, kind, where)
        routes.setdefault(route.key, route)

    for _klass, fn in _functions(cls):
        names = _names(fn.__code__)
        glob = fn.__globals__
        for name, kind in (("barrier", "barrier"), ("put_metric", "put_metric")):
            if name not in names:
                continue
            owners: list[Any] = []
            value = glob.get(name)
            if callable(value) and not inspect.ismodule(value):
                owners.append((glob, value, f"{glob.get('__name__', '?')}.{name}"))
            for other in names:
                module = glob.get(other)
                if inspect.ismodule(module) and callable(getattr(module, name, None)):
                    owners.append((vars(module), getattr(module, name),
                                   f"{module.__name__}.{name}"))
            for namespace, func, where in owners:
                home = sys.modules.get(getattr(func, "__module__", "") or "")
                if kind == "put_metric" and home is not None and _is_metrics_api(home):
                    metrics.setdefault(home.__name__, home)
                else:
                    add(namespace, name, kind, where)
        if "sleep" in names and glob.get("sleep") is time.sleep:
            add(glob, "sleep", "sleep", f"{glob.get('__name__', '?')}.sleep")
    return list(routes.values()), list(metrics.values())


# -- the shape -----------------------------------------------------------------------------------


@functools.cache
def agent_shape(cls: type, supplied: frozenset[str] = frozenset()) -> AgentShape:
    """Find what the kit needs to script ``cls``; raise :class:`HarnessError` naming what is
    missing. ``supplied``: constructor keywords a target API builds (``_target_api``)."""
    name = describe(cls)
    if not is_agent_class(cls):
        raise HarnessError(f"{name} has no _invoke_run: the kit runs the loop of an agent with "
                           "the SimpleElasticAgent shape")
    loop = inspect.unwrap(inspect.getattr_static(cls, "_invoke_run"))
    code = getattr(loop, "__code__", None)
    if code is not None:
        used = _names(code)
        missing = [h for h in COMPOSITE_HOOKS if h in used and not hasattr(cls, h)]
        if missing:
            raise HarnessError(f"{name}._invoke_run calls {', '.join(missing)}, which {name} "
                               "does not have")

    found = {n: _find_type(cls, n) for n in _TYPE_NAMES}
    torch_types = ElasticTypes.torch()
    state = found["WorkerState"] or torch_types.WorkerState
    missing_states = [s for s in ("HEALTHY", "UNHEALTHY", "FAILED", "SUCCEEDED", "UNKNOWN",
                                  "INIT", "STOPPED") if s not in getattr(state, "__members__", {})]
    if missing_states:
        raise HarnessError(f"{name}: its WorkerState ({describe(state)}) has no "
                           f"{', '.join(missing_states)}")
    types_ = ElasticTypes(state, found["RunResult"] or torch_types.RunResult,
                          found["ProcessFailure"] or torch_types.ProcessFailure)
    worker_spec = found["WorkerSpec"] or _torch_worker_spec()

    spec_fields = _fields_taken(worker_spec, f"{name}: its WorkerSpec ({describe(worker_spec)})")
    keywords = _constructor_keywords(cls, name, supplied)
    routes, metrics = _routes(cls)
    return AgentShape(cls, types_, worker_spec, spec_fields, keywords, tuple(routes),
                      tuple(metrics))


def _signature(obj: Any, name: str) -> inspect.Signature:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError) as e:
        raise HarnessError(f"{name}: cannot read its signature ({e})") from None


def _fields_taken(worker_spec: Any, name: str) -> frozenset[str]:
    params = _signature(worker_spec, name).parameters
    needs = [p.name for p in params.values() if p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in SPEC_FIELDS]
    if needs:
        raise HarnessError(f"{name} needs {', '.join(needs)}, which the kit cannot supply (it "
                           f"fills in {', '.join(SPEC_FIELDS)})")
    if "entrypoint" not in params and "fn" not in params:
        raise HarnessError(f"{name} takes neither entrypoint nor fn")
    return frozenset(p for p in SPEC_FIELDS if p in params)


def _constructor_keywords(cls: type, name: str,
                          supplied: frozenset[str] = frozenset()) -> frozenset[str]:
    params = list(_signature(cls, name).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                            params[0].POSITIONAL_OR_KEYWORD,
                                            params[0].VAR_POSITIONAL):
        raise HarnessError(f"cannot build {name}: its constructor takes no worker spec as its "
                           "first argument")
    rest = params[1:] if params[0].kind is not params[0].VAR_POSITIONAL else params
    needs = [p.name for p in rest if p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
             and p.name not in CONSTRUCTOR_KEYWORDS and p.name not in supplied]
    if needs:
        raise HarnessError(
            f"cannot build {name}: its constructor needs {', '.join(needs)}, which the kit "
            "cannot supply (it passes the worker spec, exit_barrier_timeout and log_dir); "
            "declare it in a target API's constructor (--target-api, docs/conformance.md; "
            "nvrx for NVIDIA's ft_launcher)")
    named = {p.name for p in params}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    extra = sorted(supplied - named) if not var_kw else []
    if extra:
        raise HarnessError(f"cannot build {name}: its target API supplies {', '.join(extra)}, "
                           "which its constructor does not take")
    out = {k for k in CONSTRUCTOR_KEYWORDS if k in named}
    if var_kw:  # **kwargs passes on to a base whose signature the kit cannot see
        out.add("exit_barrier_timeout")
    return frozenset(out)


def worker_spec_kwargs(shape: AgentShape, config: Any, rendezvous: Any,
                       entrypoint: Callable[[], None]) -> dict[str, Any]:
    """Keyword arguments for the agent's ``WorkerSpec`` for one run."""
    values = {
        "role": config.role, "local_world_size": 1, "rdzv_handler": rendezvous,
        "max_restarts": config.max_restarts, "monitor_interval": config.monitor_interval,
        "entrypoint": entrypoint,
    }
    if "entrypoint" not in shape.spec_fields:
        values["fn"] = values.pop("entrypoint")
    return {k: v for k, v in values.items() if k in shape.spec_fields}
