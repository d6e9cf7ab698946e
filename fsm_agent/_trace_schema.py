"""The trace format, declared once: its name and version, every field of a header and of a step
record with its JSON types and meaning, the ``diagnostics`` records, and the fold rule.

The writer (``fsm_agent._trace.step_record``, compiled from ``STEP_FIELDS``), the in-memory
recorder of the run summary (``fsm_agent._summary.RunRecorder``, through ``step_record``), the
fold rule, the reader's checks (``fsm_agent._trace_reader``) and the tables in docs/diagrams.md
(``python tests/tools/trace_tables.py`` writes them; ``tests/tools/test_trace.py`` fails while
they differ) are derived from these tables. A field the engine sets on its ``Step`` needs only
its row here beside the attribute (CONTRIBUTING.md, "A field on trace records").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

__all__ = [
    "DIAGNOSTICS",
    "FOLD_FIELDS",
    "HEADER_FIELDS",
    "STEP_FIELDS",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "Field",
    "TraceError",
    "field_table",
    "fold_key",
]

TRACE_FORMAT = "fsm-agent-trace"
#: Raised when an older reader would misread the new records; a new optional field needs none.
TRACE_VERSION = 1

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
    (``fsm_agent._trace.step_record`` writes ``getattr(step, name)``), passed through
    ``convert`` when the attribute is not JSON as it is; ``from_step=False`` for one the writer
    sets itself (``kind``, ``seq``) or the torch agent adds (``diagnostics``)."""

    name: str
    types: tuple[type, ...]
    meaning: str
    required: bool = False
    owned: bool = True
    from_step: bool = True
    convert: Callable[[Any], Any] | None = None


STEP_FIELDS: tuple[Field, ...] = (
    Field("kind", (str,), "`step`", from_step=False),
    Field("seq", (int,), "1, 2, ... within one lifecycle", from_step=False),
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
    Field("diagnostics", (dict,), "what the torch agent saw on this step, by key (the table "
          "below); absent when nothing", owned=False, from_step=False),
)

#: The fields a folded record adds (docs/diagrams.md, "Folding").
FOLD_FIELDS: tuple[Field, ...] = (
    Field("count", (int,), "how many steps that changed nothing the record stands for"),
    Field("last_wall_time", _NUMBER, "`wall_time` of the last of them"),
    Field("last_monotonic_time", _NUMBER, "`monotonic_time` of the last of them"),
)

HEADER_FIELDS: tuple[Field, ...] = (
    Field("kind", (str,), "`header`"),
    Field("format", (str,), f"`{TRACE_FORMAT}`"),
    Field("version", (int,), f"the format's version ({TRACE_VERSION})"),
    Field("spec", (str,), "the spec's name"),
    Field("spec_path", (str,), "the spec file (never opened by a reader: pass `--spec`)"),
    Field("preset", (bool,), "true when the spec is a built-in one"),
    Field("vocabulary", (str,), "the run's `--vocabulary MODULE:ATTR` (never imported by a "
          "reader)"),
    Field("params", (dict,), "every parameter of the spec in force, each in the spec's syntax"),
    Field("continues", (dict,), "in a rotated file: where the lifecycle stood (`seq`, `state`, "
          "`remaining_restarts`, `restart_count`)"),
)

#: The records the torch agent puts under a step's ``diagnostics`` (``_fsm_note(key, value)``),
#: by key; the readers (``fsm_agent._analysis``) read them by these keys.
DIAGNOSTICS: Mapping[str, str] = {
    "health": "the health checks run before a (re)join: `ok`, `checks` (each `name`, `ok`, "
              "`reason`, `duration_s`), `reason` (the first that failed)",
    "hang": "a hang: `source`, `timeout_s`, `sample_period_s`, `workers` (each hung rank's "
            "`rank`, `local_rank`, `pid`, `idle_s`, `exited`, `why`)",
    "stacks": "the stacks taken of hung workers, one per rank: `rank`, `pid`, `path`, `method` "
              "(`py-spy` or the fallback), `error`",
    "suspects": "the ranks a hang points at across nodes: `waiting` (rank -> where it waits), "
                "`suspects` (rank -> its frame), `summary`",
    "progress": "a failed attempt's progress: `start`, `end` (each `step`, `checkpoint_mtime`), "
                "`progressed`, `attempt`, `stalled_restarts`",
    "drain": "how a drain ended: `reason`, `signal`, `ranks`, `took_s`, `exit_codes`, "
             "`killed_at_timeout`, `workers`",
}

#: Record fields that differ between steps that change nothing.
TIME_FIELDS = ("seq", "wall_time", "monotonic_time")


def fold_key(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a step record must share with the one before to fold into it (every field but the
    times), or None when it cannot fold: it moved, ran an action, ended in an error or carries
    diagnostics. The trace writer and the run summary's recorder fold by this one rule."""
    if (record["source"] != record["dest"] or record["actions"] or record["error"] is not None
            or record.get("diagnostics")):
        return None
    return {k: v for k, v in record.items() if k not in TIME_FIELDS}


def field_table(fields: tuple[Field, ...]) -> str:
    """The Markdown table of ``fields`` that docs/diagrams.md shows."""
    rows = [f"| `{f.name}` | {f.meaning} |" for f in fields]
    return "\n".join(["| field | meaning |", "|---|---|", *rows])


def diagnostics_table() -> str:
    """The Markdown table of the ``diagnostics`` records that docs/diagrams.md shows."""
    rows = [f"| `{k}` | {v} |" for k, v in DIAGNOSTICS.items()]
    return "\n".join(["| key | what it holds |", "|---|---|", *rows])


# What the reader and the writer derive from the tables above.
_STEP_FIELDS: dict[str, tuple[type, ...]] = {f.name: f.types for f in STEP_FIELDS if f.required}
# Fields the writer owns: a writer's static or dynamic fields may not shadow them.
_RESERVED = frozenset(f.name for f in (*HEADER_FIELDS, *STEP_FIELDS, *FOLD_FIELDS) if f.owned)
_TIME_FIELDS = TIME_FIELDS


class TraceError(ValueError):
    """A trace file cannot be read: ``str()`` names the file and line (``trace.jsonl:7: ...``)."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {message}")
