"""What a target needs from the kit beyond torch's agent API, declared as data.

torch's ``SimpleElasticAgent`` asks its rendezvous handler for ``num_nodes_waiting()`` and its
constructor for a worker spec. Agents built on it often ask for more: NVIDIA's ft_launcher agent
(``nvidia-resiliency-ext`` 0.5 and later) takes a fault-tolerance config and a logs spec, asks
its handler for ``round()``, ``is_next_round_open()`` (instead of ``num_nodes_waiting()``),
``attribution_stop_requested()`` and more. A :class:`TargetAPI` says how the kit answers each of
those, in the kit's own terms, so such an agent is checked as it is, with no adapter class.

``rendezvous`` maps a name on the handler (dotted for an attribute's attribute, as
``_barrier_state.open_rendezvous``) to its answer:

* ``"rounds"``: a method returning how many rendezvous the run has completed;
* ``"nodes_waiting"``: a method returning the script's nodes waiting, asked as the kit's
  ``num_nodes_waiting()`` (the same event in the trace);
* ``"any_nodes_waiting"``: the same question, answered ``nodes_waiting > 0``;
* ``"ignore"``: a method that accepts anything, does nothing and returns None (a signal the
  script has no counterpart for: it is noted on the run, not compared);
* ``{"value": X}``: a plain attribute holding ``X``;
* ``{"returns": X}``, or a bare ``None``, ``false``, ``true`` or number: a method returning it
  (a bare string is always one of the behaviours above, so a misspelt one is an error).

``constructor`` maps a constructor keyword to what builds its value: ``"module:Name"``, or a
bare ``"Name"`` looked up in the modules of the agent class and its bases (so it is the class
the agent itself imports: torch's ``DefaultLogsSpecs`` for one agent, a vendored copy's for
another). It is called with ``log_dir=`` (a scratch directory) when it takes that, else with no
argument.

A declaration is a :class:`TargetAPI`, a built-in name (:data:`TARGET_APIS`: ``"nvrx"``) or a
YAML file with those two mappings (``fsm-agent conformance --target-api``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = ["BEHAVIOURS", "NVRX", "TARGET_APIS", "TargetAPI", "load_target_api"]

#: The answers a rendezvous name can have besides a constant or a ``{"value": X}`` attribute.
BEHAVIOURS: tuple[str, ...] = ("rounds", "nodes_waiting", "any_nodes_waiting", "ignore")


def _pairs(value: Mapping[str, Any] | tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), _frozen(v)) for k, v in items)


def _frozen(value: Any) -> Any:
    # {"value": X} and {"returns": X} kept as pairs, so that the declaration stays hashable
    if isinstance(value, Mapping):
        if len(value) != 1 or next(iter(value)) not in ("value", "returns"):
            raise ValueError(f"a mapping answer must be {{value: X}} or {{returns: X}}, "
                             f"got {dict(value)!r}")
        key = next(iter(value))
        return (key, value[key])
    return value


@attrs.frozen
class TargetAPI:
    """How the kit answers what a target asks beyond torch's agent API (module docstring)."""

    name: str
    rendezvous: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_pairs)
    constructor: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)

    def __attrs_post_init__(self) -> None:
        for name, answer in self.rendezvous:
            if not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"target API {self.name}: {name!r} is not a (dotted) name")
            if isinstance(answer, str) and answer not in BEHAVIOURS:
                raise ValueError(f"target API {self.name}: {name}: {answer!r} is not one of "
                                 f"{', '.join(BEHAVIOURS)} (a method returning a string is "
                                 "{returns: ...})")
        for keyword, ref in self.constructor:
            if not keyword.isidentifier() or not isinstance(ref, str) or not ref:
                raise ValueError(f"target API {self.name}: constructor {keyword!r} needs "
                                 "'module:Name' or 'Name'")

    @property
    def keywords(self) -> frozenset[str]:
        """The constructor keywords this declaration supplies."""
        return frozenset(k for k, _ in self.constructor)

    @property
    def names(self) -> tuple[str, ...]:
        """The rendezvous names this declaration adds."""
        return tuple(n for n, _ in self.rendezvous)

    def build(self, keyword: str, cls: type, log_dir: str) -> Any:
        """The value of constructor ``keyword`` for agent class ``cls``."""
        ref = dict(self.constructor)[keyword]
        factory = _resolve(ref, cls)
        if factory is None:
            raise LookupError(f"{ref} is not a callable in the modules of {cls.__qualname__} "
                              "or its bases (name it module:Name)")
        try:
            takes_dir = "log_dir" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            takes_dir = False
        return factory(log_dir=log_dir) if takes_dir else factory()


def _resolve(ref: str, cls: type) -> Any:
    if ":" in ref:
        module, _, attr = ref.partition(":")
        value: Any = importlib.import_module(module)
        for part in attr.split("."):
            value = getattr(value, part)
        return value if callable(value) else None
    for klass in cls.__mro__:
        home = sys.modules.get(klass.__module__)
        found = getattr(home, ref, None) if home is not None else None
        if callable(found):
            return found
    return None


#: NVIDIA's ft_launcher agent (``nvidia_resiliency_ext.fault_tolerance.launcher``): its
#: constructor's config and logs spec for every release, and the rendezvous API of 0.5-0.7's
#: barrier handler, answered as a job where no attribution verdict and no no-restart decision
#: ever arrive (those paths are not checked) and a peer's restart is the script's nodes waiting.
NVRX = TargetAPI(
    "nvrx",
    rendezvous={
        "round": "rounds",
        "is_next_round_open": "any_nodes_waiting",
        "attribution_stop_requested": False,
        "no_restart_reason": None,
        "is_shutdown_due_to_failure": False,
        "signal_no_restart": "ignore",
        "set_worker_group": "ignore",
        "use_agent_store": {"value": False},
        "_this_node": {"value": "conformance-node"},
        "_barrier_state.open_rendezvous": "ignore",
    },
    constructor={"fault_tol_cfg": "FaultToleranceConfig", "logs_specs": "DefaultLogsSpecs"},
)

#: The built-in declarations, by the name ``--target-api`` takes.
TARGET_APIS: dict[str, TargetAPI] = {"nvrx": NVRX}


def load_target_api(value: TargetAPI | str | os.PathLike[str] | Mapping[str, Any]) -> TargetAPI:
    """A declaration from a :class:`TargetAPI`, a built-in name, a YAML file or a mapping with
    ``rendezvous`` and ``constructor``. Raises ``ValueError`` naming what is wrong."""
    if isinstance(value, TargetAPI):
        return value
    if isinstance(value, Mapping):
        return _from_mapping(value, "<mapping>")
    text = os.fspath(value)
    if text in TARGET_APIS:
        return TARGET_APIS[text]
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"target API {text!r} is neither a built-in one "
                         f"({', '.join(TARGET_APIS)}) nor a file")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"target API {path}: not YAML ({e})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"target API {path}: expected a mapping with rendezvous and constructor")
    return _from_mapping(data, str(path))


def _from_mapping(data: Mapping[str, Any], where: str) -> TargetAPI:
    unknown = set(data) - {"name", "rendezvous", "constructor"}
    if unknown:
        raise ValueError(f"target API {where}: unknown key(s) {', '.join(sorted(unknown))} "
                         "(it has name, rendezvous, constructor)")
    parts = {k: data.get(k) or {} for k in ("rendezvous", "constructor")}
    for key, part in parts.items():
        if not isinstance(part, Mapping):
            raise ValueError(f"target API {where}: {key} must be a mapping")
    try:
        return TargetAPI(str(data.get("name") or where), **parts)
    except (TypeError, ValueError) as e:
        raise ValueError(str(e)) from None
