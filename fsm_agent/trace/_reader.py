"""Reading traces back: ``read_trace`` and the ``Trace`` and ``TraceRecord`` it returns.

A trace is untrusted input: every line is bounded, parsed without recursion limits being
reachable, and checked field by field before anything reads it; a bad line is a ``TraceError``
naming the file and line. The format is described in ``fsm_agent.trace._writer``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from .._core._files import FileRefused, open_regular, printable
from ._schema import _STEP_FIELDS, TRACE_FORMAT, TRACE_VERSION, TraceError

__all__ = ["MAX_LINE_BYTES", "Trace", "TraceRecord", "read_trace"]


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

    @property
    def rule(self) -> str | None:
        """The failure-policy rule whose transition was taken (None: a plain transition, or a
        trace written before rules were recorded; ``"rule" in data`` tells the two apart)."""
        rule = self.data.get("rule")
        return None if rule is None else str(rule)

    @property
    def timer(self) -> float | None:
        """Seconds of the timer set on entering ``dest`` (None: no timer, or an older trace)."""
        value = self.data.get("timer")
        return None if value is None else _timer_value(value)

    @property
    def count(self) -> int:
        """How many identical steps this record stands for (1 unless folded)."""
        return int(self.data.get("count", 1))


@attrs.frozen
class Trace:
    """One lifecycle's records, with the header that started them (empty if there was none).

    ``incomplete``: why the records stop early, when the writer marked the trace incomplete (it
    could not write a record: a full disk, a size limit, an I/O error); None otherwise.
    """

    path: str
    header: Mapping[str, Any]
    header_line: int | None
    records: tuple[TraceRecord, ...]
    incomplete: str | None = None

    @property
    def spec_name(self) -> str | None:
        """The spec the header names, if any."""
        name = self.header.get("spec")
        return None if name is None else str(name)

    @property
    def params(self) -> dict[str, str] | None:
        """The spec's parameters in force as the header recorded them (values in the spec's
        syntax), or None when it recorded none."""
        params = self.header.get("params")
        return None if params is None else {str(k): str(v) for k, v in params.items()}

    @property
    def final_state(self) -> str | None:
        """The state the last record ended in."""
        return self.records[-1].dest if self.records else None


#: Bounds on what ``read_trace`` reads: a trace is untrusted input. A record is well under a
#: kilobyte (a failure record of a large group, some kilobytes per failed rank).
MAX_LINE_BYTES = 16 << 20
MAX_TRACE_BYTES = 1 << 30
#: How deeply JSON values may nest in a record (the writer's records nest less than 12 deep).
MAX_DEPTH = 64


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    # Iterative: the check itself must not recurse.
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        todo.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _lines(path: str, fd: int) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes without the line end, whether it ended in a newline), bounded."""
    total = 0
    with os.fdopen(fd, "rb") as f:
        n = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            n += 1
            total += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(path, n, f"line longer than {MAX_LINE_BYTES} bytes (no trace "
                                 "record is that large)")
            if total > MAX_TRACE_BYTES:
                raise TraceError(path, n, f"trace larger than {MAX_TRACE_BYTES} bytes; split "
                                 "it at a header line to replay it")
            complete = raw.endswith(b"\n")
            yield n, raw.rstrip(b"\r\n"), complete


def _shown_value(value: Any) -> str:
    return printable(repr(value), 60)


def _parse(shown: str, n: int, raw: bytes, complete: bool) -> dict[str, Any]:
    """One line as a JSON object; ``TraceError`` naming the line otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if not complete:
            raise TraceError(shown, n, _CUT_SHORT) from None
        raise TraceError(shown, n, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if not complete:
            raise TraceError(shown, n, _CUT_SHORT) from None
        raise TraceError(shown, n, f"not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        data = _TOO_DEEP
    if data is _TOO_DEEP or (isinstance(data, (dict, list)) and _too_deep(data)):
        raise TraceError(shown, n, f"JSON nested more than {MAX_DEPTH} levels deep (no trace "
                         "record is)")
    if not isinstance(data, dict):
        raise TraceError(shown, n, f"expected a JSON object, got {type(data).__name__}")
    return data


_TOO_DEEP = object()
_CUT_SHORT = ("the last record is cut short (no newline at the end: the writer was killed while "
              "writing it, or the file took no more, e.g. a full disk or a file size limit)")


def _check_header(shown: str, n: int, data: Mapping[str, Any]) -> None:
    if data.get("format", TRACE_FORMAT) != TRACE_FORMAT:
        raise TraceError(shown, n, f"not an fsm-agent trace (format "
                         f"{_shown_value(data.get('format'))})")
    version = data.get("version", TRACE_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version > TRACE_VERSION:
        raise TraceError(shown, n, f"trace format version {_shown_value(version)} is newer "
                         f"than this fsm-agent reads ({TRACE_VERSION})")
    for field in ("spec", "spec_path", "vocabulary"):
        if not isinstance(data.get(field, ""), str):
            raise TraceError(shown, n, f"header field {field!r} must be a string")
    params = data.get("params", {})
    if not (isinstance(params, dict) and all(_is_name(k) and isinstance(v, str)
                                             for k, v in params.items())):
        raise TraceError(shown, n, "header field 'params' must map parameter names to values "
                         "written as strings")


def _is_name(value: object) -> bool:
    # Names go into diagrams and messages: as in specs, identifiers only (no markup, no escapes).
    return isinstance(value, str) and value.isidentifier() and len(value) <= 200


def _timer_value(value: Any) -> float | None:
    """A record's ``timer`` as seconds (the writer writes an infinite one as ``"inf"``), or None
    if it is not one."""
    if value == "inf":
        return math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _check_step(shown: str, n: int, data: Mapping[str, Any]) -> None:
    for field, types in _STEP_FIELDS.items():
        if field not in data:
            raise TraceError(shown, n, f"record has no {field!r} field")
        if not isinstance(data[field], types) or isinstance(data[field], bool):
            raise TraceError(shown, n, f"field {field!r} has the wrong type "
                             f"({type(data[field]).__name__})")
    for field in ("trigger", "source", "dest"):
        if data[field] is not None and not _is_name(data[field]):
            raise TraceError(shown, n, f"field {field!r} is not a name (letters, digits, "
                             f"underscores): {_shown_value(data[field])}")
    for i, g in enumerate(data["guards"]):
        if not (isinstance(g, dict) and _is_name(g.get("name"))
                and isinstance(g.get("value"), bool)):
            raise TraceError(shown, n, f"guards[{i}] must be {{\"name\": NAME, \"value\": "
                             "bool}")
    for i, a in enumerate(data["actions"]):
        if not (isinstance(a, dict) and _is_name(a.get("name"))):
            raise TraceError(shown, n, f"actions[{i}] must be an object with a 'name' (letters, "
                             "digits, underscores)")
    if not isinstance(data.get("error", ""), (str, type(None))):
        raise TraceError(shown, n, "field 'error' must be a string or null")
    if data.get("rule") is not None and not _is_name(data["rule"]):
        raise TraceError(shown, n, f"field 'rule' is not a name (letters, digits, underscores): "
                         f"{_shown_value(data['rule'])}")
    if data.get("timer") is not None and _timer_value(data["timer"]) is None:
        raise TraceError(shown, n, f"field 'timer' must be a number of seconds >= 0 or null, got "
                         f"{_shown_value(data['timer'])}")
    if "count" in data:
        count = data["count"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TraceError(shown, n, "field 'count' must be an integer >= 1")
        for field in ("last_wall_time", "last_monotonic_time"):
            if not isinstance(data.get(field), (int, float)) or isinstance(data[field], bool):
                raise TraceError(shown, n, f"a folded record needs a number {field!r}")


def _check_continues(shown: str, n: int, data: Mapping[str, Any]) -> None:
    cont = data.get("continues")
    if cont is None:
        return
    if not (isinstance(cont, dict) and _is_name(cont.get("state"))
            and all(isinstance(cont.get(k), int) and not isinstance(cont.get(k), bool)
                    for k in ("remaining_restarts", "restart_count"))):
        raise TraceError(shown, n, "header field 'continues' must be {\"state\": NAME, "
                         "\"remaining_restarts\": int, \"restart_count\": int, ...}")


def read_trace(path: str | os.PathLike[str]) -> list[Trace]:
    """Read a trace file into its lifecycles (one per header; records before any header form one).

    Raises ``TraceError`` naming the file and line of the first line that is not a complete,
    well-formed record: a line cut short by a crash, invalid JSON or a missing field. A trace
    is untrusted input: only a regular file is read (a FIFO or device is refused, never waited
    on), lines and the whole file are bounded (``MAX_LINE_BYTES``, ``MAX_TRACE_BYTES``), and so
    is nesting (``MAX_DEPTH``). A line the writer left cut short when it could write no more is
    accepted when its ``incomplete`` marker follows: that lifecycle's ``Trace.incomplete``
    says why it stops.
    """
    shown = os.fspath(path)
    try:
        fd = open_regular(shown, os.O_RDONLY)
    except FileNotFoundError:
        raise TraceError(shown, None, "no such trace file") from None
    except FileRefused as e:
        raise TraceError(shown, None, f"cannot read: {e.strerror}") from None
    except OSError as e:
        raise TraceError(shown, None, f"cannot read: {e.strerror or e}") from None
    traces: list[Trace] = []
    header: dict[str, Any] = {}
    header_line: int | None = None
    records: list[TraceRecord] = []
    incomplete: str | None = None
    # The first bad line, held back: the writer's "incomplete" marker may follow it.
    pending: TraceError | None = None

    def close_segment() -> None:
        if records or header_line is not None or incomplete is not None:
            traces.append(Trace(shown, header, header_line, tuple(records), incomplete))

    try:
        for n, raw, complete in _lines(shown, fd):
            if not raw.strip():
                continue
            try:
                data = _parse(shown, n, raw, complete)
            except TraceError as e:
                if not complete:
                    raise (pending or e) from None
                pending = pending or e
                continue
            kind = data.get("kind", "step")
            if kind == "incomplete":
                seq, err = data.get("seq"), data.get("error")
                incomplete = (f"the writer could not write record {_shown_value(seq)} or any "
                              f"later one ({printable(err, 120)})")
                pending = None
                continue
            if pending is not None:
                raise pending
            if kind == "header":
                _check_header(shown, n, data)
                _check_continues(shown, n, data)
                close_segment()
                header, header_line, records, incomplete = dict(data), n, [], None
                continue
            if kind != "step":
                raise TraceError(shown, n, f"unknown record kind {_shown_value(kind)} (expected "
                                 "'header' or 'step')")
            _check_step(shown, n, data)
            records.append(TraceRecord(n, data))
    except OSError as e:
        raise TraceError(shown, None, f"cannot read: {e.strerror or e}") from None
    if pending is not None:
        raise pending
    close_segment()
    if not traces:
        raise TraceError(shown, None, "empty trace (no records)")
    return traces
