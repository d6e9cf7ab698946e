"""What one transition did: the ``Step`` listeners (such as the trace writer) receive, and the
fields of its trace record (``STEP_RECORD``), declared beside its attributes.

``fsm_agent.trace._schema`` completes the trace format from these rows (the writer's own ``kind``
and ``seq``, the torch agent's ``diagnostics``, the header and the fold rule), and the writer,
the run summary's recorder, the reader's checks and docs/diagrams.md's table are derived from
it. A new attribute of ``Step`` needs only its row here (CONTRIBUTING.md, "A field on trace
records").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

__all__ = ["STEP_RECORD", "ActionRecord", "Field", "Listener", "Step", "failed_result"]


@attrs.define(slots=True)
class ActionRecord:
    """One action (or guard that raised) run during a step."""

    name: str
    kind: str  # "action", "after", "enter", "exit", "guard"
    duration: float
    outcome: str  # "ok" or "raised"
    error: str | None = None


@attrs.define(slots=True)
class Step:
    """What one transition did; listeners (such as the trace writer) receive one per transition.

    Each attribute means what its row in ``STEP_RECORD`` says (docs/diagrams.md shows them):
    ``rule``, for one, names the failure-policy rule whose transition was taken (None for a plain
    transition), ``timer`` the seconds of the timer set on entering ``dest`` (None when it has
    none).
    """

    trigger: str
    source: str
    wall_time: float
    monotonic_time: float
    role: str
    dest: str | None = None
    guards: list[tuple[str, bool]] = attrs.field(factory=list)
    actions: list[ActionRecord] = attrs.field(factory=list)
    remaining_restarts: int = 0
    restart_count: int = 0
    observed: str | None = None
    failures: Mapping[int, Any] = attrs.field(factory=dict)
    error: str | None = None
    rule: str | None = None
    timer: float | None = None


Listener = Callable[[Step], None]


# -- its trace record ----------------------------------------------------------------------------

_NONE = type(None)
_NUMBER = (int, float)


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``value``: torch's ``ProcessFailure`` is a dataclass, for one."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 6:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name), depth + 1)
                for f in dataclasses.fields(value)}
    if attrs.has(type(value)):
        return {f.name: _jsonable(getattr(value, f.name), depth + 1)
                for f in attrs.fields(type(value))}
    name = getattr(value, "name", None)
    if isinstance(name, str) and type(value).__module__ != "builtins":
        return name  # enum members such as WorkerState
    return repr(value)


def _failure_json(failure: Any) -> Any:
    """One failure as JSON data; a message that is its error file's is written once."""
    data = _jsonable(failure)
    if isinstance(data, dict) and "message" in data:
        from_file = data.get("error_file_data")
        # torch's ProcessFailure sets message = error_file_data["message"]: a worker's 20 MB
        # error message made a 40 MB record.
        if isinstance(from_file, dict) and from_file.get("message") == data["message"]:
            del data["message"]
    return data


# How the Step's lists and mappings become JSON (``Field.convert``).
def _guards_json(guards: Iterable[tuple[str, bool]]) -> list[dict[str, Any]]:
    return [{"name": name, "value": bool(value)} for name, value in guards]


def _actions_json(actions: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": a.name, "kind": a.kind, "duration_s": a.duration, "outcome": a.outcome,
             "error": a.error} for a in actions]


def _failures_json(failures: Mapping[Any, Any]) -> dict[str, Any]:
    return {str(rank): _failure_json(f) for rank, f in dict(failures).items()}


@attrs.frozen
class Field:
    """One field of a trace record: its name, the JSON types it may hold, what it means, and
    whether a reader refuses a record without it (``required``). ``owned``: the writer sets it,
    so a writer's static or dynamic fields may not be named so (``diagnostics`` is the torch
    agent's, passed as a dynamic field).

    A step record's field is the engine ``Step``'s attribute of the same name
    (``fsm_agent.trace._writer.step_record`` writes ``getattr(step, name)``), passed through
    ``convert`` when the attribute is not JSON as it is; ``from_step=False`` for one the writer
    sets itself (``kind``, ``seq``) or the torch agent adds (``diagnostics``)."""

    name: str
    types: tuple[type, ...]
    meaning: str
    required: bool = False
    owned: bool = True
    from_step: bool = True
    convert: Callable[[Any], Any] | None = None

#: The trace record of a ``Step``: a row per attribute, in the record's order (which is not
#: the attributes' order: ``Step``'s positional arguments are public).
STEP_RECORD: tuple[Field, ...] = (
    Field("wall_time", _NUMBER, "`time.time()` when the transition began"),
    Field("monotonic_time", _NUMBER, "`time.monotonic()` when the transition began"),
    Field("role", (str,), "the worker group's role, from the engine"),
    Field("trigger", (str,), "the trigger that fired", required=True),
    Field("source", (str,), "the state the transition left", required=True),
    Field("dest", (str, _NONE), "the state it entered (`UNKNOWN` when an action raised)",
          required=True),
    Field("guards", (list,), "each guard the engine evaluated, in order, with its value "
          "(`{\"name\", \"value\"}`; each is evaluated at most once per step)", required=True,
          convert=_guards_json),
    Field("actions", (list,), "each action run: `name`, `kind` (`action`, `exit`, `enter` or "
          "`after`; `guard` for a guard that raised), `duration_s`, `outcome` (`ok` or "
          "`raised`), `error`", required=True, convert=_actions_json),
    Field("remaining_restarts", (int,), "restarts left in the default budget, after the "
          "transition", required=True),
    Field("restart_count", (int,), "restarts made so far, every budget's, after the transition",
          required=True),
    Field("observed", (str, _NONE), "the state of the monitor result that fired it, or null"),
    Field("failures", (dict,), "that result's failures by global rank (a failure's `message` "
          "that is its error file's is written once, as `error_file_data.message`)",
          convert=_failures_json),
    Field("error", (str, _NONE), "what ended the lifecycle, if something raised"),
    Field("rule", (str, _NONE), "the failure-policy rule whose transition was taken (`retry`, "
          "`no_retry`), null for a plain transition"),
    Field("timer", (*_NUMBER, _NONE), "seconds of the timer set on entering `dest`: its fixed "
          "timeout, or the backoff drawn for a backoff state; null when `dest` has none"),
)


def failed_result(obs: Any, api: Callable[[], Any]) -> Any:
    """The result of a lifecycle that gave up: always in state FAILED (torch 2.13 returns the raw
    UNHEALTHY result here, which its launcher then reports as a success), and a FAILED result
    when it ended before any tick. ``api()``: torch's agent API module, imported on need."""
    if obs is None:
        return api().RunResult(state=api().WorkerState.FAILED)
    if obs.state.name == "FAILED":
        return obs
    failed = type(obs.state)["FAILED"]
    if dataclasses.is_dataclass(obs) and not isinstance(obs, type):
        return dataclasses.replace(obs, state=failed)
    return api().RunResult(state=failed, return_values=dict(obs.return_values),
                           failures=dict(obs.failures))
