"""JSON Lines traces: one record per transition, written by an engine listener.

A trace file starts with a header record naming the spec, then holds one ``step`` record per
transition the engine took (``Lifecycle(..., listeners=[JsonlTraceWriter(path, spec=spec)])``).
Each record is written and flushed as one line as soon as its transition ends, so a crash loses
nothing written before it; at most the line being written is cut short, and the reader names it.

Record fields (``step``): ``seq``, ``wall_time``, ``monotonic_time``, ``trigger``, ``source``,
``dest``, ``guards`` (``[{"name", "value"}]``, in evaluation order), ``actions`` (``[{"name",
"kind", "duration_s", "outcome", "error"}]``), ``remaining_restarts``, ``restart_count``,
``observed`` (the observed state's name or null), ``failures`` (global rank -> failure),
``error`` (what ended the lifecycle, if anything), ``role`` and the writer's static fields
(``group_rank``, ...). A header (``"kind": "header"``) may appear again later in the file: each
one starts a new lifecycle.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ._engine import Step
    from ._spec import Spec

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "JsonlTraceWriter",
    "Trace",
    "TraceError",
    "TraceRecord",
    "TraceWriter",
    "open_trace",
    "read_trace",
    "step_record",
]

TRACE_FORMAT = "fsm-agent-trace"
TRACE_VERSION = 1

_STEP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "trigger": str,
    "source": str,
    "dest": (str, type(None)),
    "guards": list,
    "actions": list,
    "remaining_restarts": int,
    "restart_count": int,
}
# Header fields the writer owns; static fields may not shadow them or the step fields.
_RESERVED = frozenset({"kind", "format", "version", "spec", "spec_path", "seq", "wall_time",
                       "monotonic_time", "observed", "failures", "error", "role", *_STEP_FIELDS})


class TraceError(ValueError):
    """A trace file cannot be read: ``str()`` names the file and line (``trace.jsonl:7: ...``)."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {message}")


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``value``: torch's ``ProcessFailure`` is a dataclass, for one."""
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


def step_record(step: Step, seq: int, static: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace record (a JSON-safe dict) of one engine ``Step``."""
    record: dict[str, Any] = {
        "kind": "step",
        "seq": seq,
        "wall_time": step.wall_time,
        "monotonic_time": step.monotonic_time,
        "role": step.role,
        "trigger": step.trigger,
        "source": step.source,
        "dest": step.dest,
        "guards": [{"name": name, "value": bool(value)} for name, value in step.guards],
        "actions": [
            {"name": a.name, "kind": a.kind, "duration_s": a.duration, "outcome": a.outcome,
             "error": a.error}
            for a in step.actions
        ],
        "remaining_restarts": step.remaining_restarts,
        "restart_count": step.restart_count,
        "observed": step.observed,
        "failures": _jsonable(dict(step.failures)),
        "error": step.error,
    }
    if static:
        record.update(static)
    return record


class JsonlTraceWriter:
    """An engine listener that appends one JSON line per transition and flushes it at once.

    ``target``: a path (opened for appending, so the traces of several lifecycles can share one
    file) or an open text file. ``spec``: the spec the lifecycle runs, named in the header so that
    ``fsm-agent replay`` needs no ``--spec``. ``static``: fields added to the header and to every
    record, such as ``node`` (the runner knows them, the engine does not). ``dynamic``: called
    for every record, its fields added too: ``group_rank``, which a re-rendezvous may change.

    >>> import io
    >>> out = io.StringIO()
    >>> w = JsonlTraceWriter(out, group_rank=0)
    >>> out.getvalue().startswith('{"kind": "header"')
    True
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        spec: Spec | str | None = None,
        dynamic: Callable[[], Mapping[str, Any]] | None = None,
        **static: Any,
    ) -> None:
        clash = sorted(set(static) & (_RESERVED - {"role"}))
        if clash:
            raise ValueError(f"static trace fields may not be named {', '.join(clash)}")
        self._static = {k: _jsonable(v) for k, v in static.items()}
        self._dynamic = dynamic
        if isinstance(target, (str, os.PathLike)):
            self.path: str = os.fspath(target)
            # Line-buffered: every record reaches the OS when its newline is written.
            self._file: IO[str] = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            self._owns = True
        else:
            self.path = getattr(target, "name", "<stream>")
            self._file = target
            self._owns = False
        self._seq = 0
        header: dict[str, Any] = {"kind": "header", "format": TRACE_FORMAT,
                                  "version": TRACE_VERSION}
        if spec is not None:
            if isinstance(spec, str):
                header["spec"] = spec
            else:
                header["spec"] = spec.name
                header["spec_path"] = os.path.abspath(spec.path) if spec.path != "<string>" \
                    else spec.path
        header.update(self._static)
        self._write(header)

    def _write(self, record: Mapping[str, Any]) -> None:
        # One write call per record: a crash can cut only the line being written.
        self._file.write(json.dumps(record, allow_nan=False, default=repr) + "\n")
        self._file.flush()

    def __call__(self, step: Step) -> None:
        """Write the record of ``step`` (the engine calls this after every transition)."""
        self._seq += 1
        record = step_record(step, self._seq, self._static)
        if self._dynamic is not None:
            extra = {k: _jsonable(v) for k, v in self._dynamic().items()
                     if k not in _RESERVED or k == "role"}
            record.update(extra)
        self._write(record)

    def close(self) -> None:
        """Close the file if this writer opened it."""
        if self._owns and not self._file.closed:
            self._file.close()

    def __enter__(self) -> JsonlTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The name ``fsm-agent run --trace`` looks up.
TraceWriter = JsonlTraceWriter


def open_trace(
    path: str | os.PathLike[str],
    *,
    spec: Spec | str | None = None,
    dynamic: Callable[[], Mapping[str, Any]] | None = None,
    **static: Any,
) -> JsonlTraceWriter:
    """A ``JsonlTraceWriter`` appending to ``path``; close it when the lifecycle ends."""
    return JsonlTraceWriter(path, spec=spec, dynamic=dynamic, **static)


@attrs.frozen
class TraceRecord:
    """One step of a trace, as read back; ``data`` is the whole JSON object."""

    line: int
    data: Mapping[str, Any]

    @property
    def trigger(self) -> str:
        return str(self.data["trigger"])

    @property
    def source(self) -> str:
        return str(self.data["source"])

    @property
    def dest(self) -> str | None:
        dest = self.data.get("dest")
        return None if dest is None else str(dest)

    @property
    def guards(self) -> list[tuple[str, bool]]:
        """The guards the engine evaluated, in order, with their values."""
        return [(str(g["name"]), bool(g["value"])) for g in self.data["guards"]]

    @property
    def actions(self) -> list[Mapping[str, Any]]:
        """The actions run (and guards that raised), in order."""
        return list(self.data["actions"])

    @property
    def error(self) -> str | None:
        err = self.data.get("error")
        return None if err is None else str(err)


@attrs.frozen
class Trace:
    """One lifecycle's records, with the header that started them (empty if there was none)."""

    path: str
    header: Mapping[str, Any]
    header_line: int | None
    records: tuple[TraceRecord, ...]

    @property
    def spec_name(self) -> str | None:
        """The spec the header names, if any."""
        name = self.header.get("spec")
        return None if name is None else str(name)

    @property
    def final_state(self) -> str | None:
        """The state the last record ended in."""
        return self.records[-1].dest if self.records else None


def _lines(path: str) -> Iterator[tuple[int, str, bool]]:
    with open(path, encoding="utf-8", newline="") as f:
        for n, text in enumerate(f, start=1):
            yield n, text.rstrip("\r\n"), text.endswith("\n")


def read_trace(path: str | os.PathLike[str]) -> list[Trace]:
    """Read a trace file into its lifecycles (one per header; records before any header form one).

    Raises ``TraceError`` naming the file and line of the first line that is not a complete,
    well-formed record: a line cut short by a crash, invalid JSON or a missing field.
    """
    shown = os.fspath(path)
    if not Path(shown).is_file():
        raise TraceError(shown, None, "no such trace file")
    traces: list[Trace] = []
    header: dict[str, Any] = {}
    header_line: int | None = None
    records: list[TraceRecord] = []

    def close_segment() -> None:
        if records or header_line is not None:
            traces.append(Trace(shown, header, header_line, tuple(records)))

    try:
        for n, text, complete in _lines(shown):
            if not text.strip():
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                if not complete:
                    raise TraceError(shown, n, "the last record is cut short (no newline at "
                                     "the end; the writer was probably killed while writing "
                                     "it)") from None
                raise TraceError(shown, n, f"not valid JSON: {e.msg} at column {e.colno}") from None
            if not isinstance(data, dict):
                raise TraceError(shown, n, f"expected a JSON object, got {type(data).__name__}")
            kind = data.get("kind", "step")
            if kind == "header":
                if data.get("format", TRACE_FORMAT) != TRACE_FORMAT:
                    raise TraceError(shown, n, f"not an fsm-agent trace (format "
                                     f"{data.get('format')!r})")
                version = data.get("version", TRACE_VERSION)
                if not isinstance(version, int) or version > TRACE_VERSION:
                    raise TraceError(shown, n, f"trace format version {version!r} is newer than "
                                     f"this fsm-agent reads ({TRACE_VERSION})")
                close_segment()
                header, header_line, records = dict(data), n, []
                continue
            if kind != "step":
                raise TraceError(shown, n, f"unknown record kind {kind!r} (expected 'header' "
                                 "or 'step')")
            for field, types in _STEP_FIELDS.items():
                if field not in data:
                    raise TraceError(shown, n, f"record has no {field!r} field")
                if not isinstance(data[field], types) or isinstance(data[field], bool):
                    raise TraceError(shown, n, f"field {field!r} has the wrong type "
                                     f"({type(data[field]).__name__})")
            for i, g in enumerate(data["guards"]):
                if not (isinstance(g, dict) and isinstance(g.get("name"), str)
                        and isinstance(g.get("value"), bool)):
                    raise TraceError(shown, n, f"guards[{i}] must be {{\"name\": str, "
                                     "\"value\": bool}")
            for i, a in enumerate(data["actions"]):
                if not (isinstance(a, dict) and isinstance(a.get("name"), str)):
                    raise TraceError(shown, n, f"actions[{i}] must be an object with a 'name'")
            records.append(TraceRecord(n, data))
    except UnicodeDecodeError as e:
        raise TraceError(shown, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TraceError(shown, None, f"cannot read: {e.strerror or e}") from None
    close_segment()
    if not traces:
        raise TraceError(shown, None, "empty trace (no records)")
    return traces
