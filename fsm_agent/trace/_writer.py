"""JSON Lines traces: one record per transition, written by an engine listener.

A trace file starts with a header record naming the spec, then holds one ``step`` record per
transition the engine took (``Lifecycle(..., listeners=[JsonlTraceWriter(path, spec=spec)])``).
Each record is written and flushed as one line as soon as its transition ends, so a crash loses
nothing written before it; at most the line being written is cut short, and the reader names it.

Every field of a header and of a step record, its JSON types and meaning, the ``diagnostics``
records and the fold rule are declared in ``fsm_agent.trace._schema`` (docs/diagrams.md shows
them as tables); ``step_record`` is compiled from its ``STEP_FIELDS``, so this module names no
field of a step but the few it reads to fold and to rotate. A header (``"kind": "header"``) may
appear again later in the file: each one starts a new lifecycle.

A writer that cannot write a record (a full disk, a file size limit) stops and, if the file still
takes it, appends ``{"kind": "incomplete", "seq": N, "error": ...}``: records from ``seq`` N on
are missing. A partial line the failed write left just before it is not an error for the reader.

**Folding.** Consecutive steps that change nothing (a transition back to the same state with no
action, no error, and the same guards, counters and fields as the step before) are one record:
``count`` says how many steps it stands for, ``wall_time``/``monotonic_time`` are the first's and
``last_wall_time``/``last_monotonic_time`` the last's. The writer appends such a record once, with
the three fields padded to a fixed width, and updates them in place (one ``pwrite`` of a few
dozen bytes per step) for as long as the steps repeat: a healthy job writes a few records a day,
not ten a second, and a crash still finds the count and time of the last tick in the file.

**Rotation.** With ``max_bytes``, a record that would take the file past that size first moves
it to ``PATH.1`` (``PATH.1`` to ``PATH.2``, ..., keeping ``backups`` of them) and starts a new
file whose header has ``"continues": {"seq", "state", "remaining_restarts", "restart_count"}``:
where the lifecycle stood, so that the new file can be replayed on its own. The newest records
are always in ``PATH``; with ``backups=0`` the file is only ever capped, never lost.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from .._core._files import open_regular
from .._core._step import Step, _jsonable
from ._reader import MAX_LINE_BYTES
from ._schema import (
    _RESERVED,
    STEP_FIELDS,
    TRACE_FORMAT,
    TRACE_VERSION,
    fold_key,
)

if TYPE_CHECKING:
    from .._core._spec import Spec

__all__ = ["JsonlTraceWriter", "TraceWriter", "open_trace", "param_text", "step_record"]

logger = logging.getLogger(__name__)

# The in-place part of a folded record: fixed widths, so an update rewrites the same bytes.
_FOLD_TAIL = '"count": {:<12}, "last_wall_time": {:<24}, "last_monotonic_time": {:<24}}}\n'
_FOLD_TAIL_LEN = len(_FOLD_TAIL.format(0, 0, 0))

def _compile_record() -> tuple[Callable[[Step, int], dict[str, Any]], str]:
    """The function that makes a step's record from ``STEP_FIELDS``, and its source.

    The schema is turned into one dict display (``{"kind": "step", "seq": seq, "wall_time":
    step.wall_time, ..., "guards": convert_guards(step.guards), ...}``), compiled once, as
    ``attrs`` compiles an ``__init__``: a record then costs what the dict written out by hand
    cost (bench/trace_writer.py), where reading the fields in a loop took twice as long.
    """
    writer_set = {"kind": '"step"', "seq": "seq"}  # a new one of these needs its value here
    items: list[str] = []
    env: dict[str, Any] = {}
    for f in STEP_FIELDS:
        if not f.from_step:
            if f.owned:  # not the torch agent's diagnostics, which come as a dynamic field
                items.append(f"{f.name!r}: {writer_set[f.name]}")
            continue
        value = f"step.{f.name}"
        if f.convert is not None:
            env[f"convert_{f.name}"] = f.convert
            value = f"convert_{f.name}({value})"
        items.append(f"{f.name!r}: {value}")
    source = "def record(step, seq):\n    return {" + ", ".join(items) + "}\n"
    exec(compile(source, "<fsm_agent.trace._writer step record>", "exec"), env)
    return env["record"], source


_record, _RECORD_SOURCE = _compile_record()


def step_record(step: Step, seq: int, static: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace record (a JSON-safe dict) of one engine ``Step``: the fields of ``STEP_FIELDS``
    (``fsm_agent.trace._schema``) in their order, then ``static``."""
    record = _record(step, seq)
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
    ``params``: the spec's parameters the lifecycle was given (``Lifecycle(..., params=)``, or
    ``Lifecycle.params``); the header records every parameter in force, the spec's defaults
    merged with these (a ``SpecError`` for an unknown name or a bad value), so that ``replay``
    checks timers against the values the run used.

    A path must be a regular file (or not exist yet): a FIFO, device or directory raises
    ``FileRefused`` (an ``OSError``) at once, as does a header that cannot be written. After
    that the writer is an observer and never raises: a record that cannot be written (a full
    disk, a file size limit, an I/O error, the file deleted) is logged as one warning naming the
    file and the error, the trace is marked incomplete (an ``incomplete`` record, if the file
    still takes one, now or at ``close()``) and later records are dropped.

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
        max_bytes: int | None = None,
        backups: int = 1,
        params: Mapping[str, Any] | None = None,
        vocabulary: str | None = None,
        **static: Any,
    ) -> None:
        clash = sorted(set(static) & (_RESERVED - {"role"}))
        if clash:
            raise ValueError(f"static trace fields may not be named {', '.join(clash)}")
        in_force = _params_in_force(spec, params)
        if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes < 4096):
            raise ValueError(f"max_bytes must be at least 4096, got {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ValueError(f"backups must be an integer >= 0, got {backups!r}")
        self._static = {k: _jsonable(v) for k, v in static.items()}
        self._dynamic = dynamic
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._pfd: int | None = None
        self._file: IO[str] | None = None
        # The open fold: the record's fields without its times, the times and count so far, and
        # where its tail is in the file (None for a stream: written when the fold closes).
        self._fold_sig: dict[str, Any] | None = None
        self._fold_record: dict[str, Any] | None = None
        self._fold_count = 0
        self._fold_at: int | None = None
        self._size = 0
        # Where the lifecycle stands after the last record (for a rotated file's header).
        self._where: dict[str, Any] | None = None
        if isinstance(target, (str, os.PathLike)):
            self.path: str = os.fspath(target)
            self._open()
        else:
            self.path = getattr(target, "name", "<stream>")
            self._file = target
        self._seq = 0
        # Why writing stopped (None while it works); whether the incomplete marker is written.
        self.failure: str | None = None
        self._lost_seq = 0
        self._marked = False
        header: dict[str, Any] = {"kind": "header", "format": TRACE_FORMAT,
                                  "version": TRACE_VERSION}
        if spec is not None:
            if isinstance(spec, str):
                header["spec"] = spec
            else:
                header["spec"] = spec.name
                header["spec_path"] = os.path.abspath(spec.path) if spec.path != "<string>" \
                    else spec.path
                if _is_preset(spec):
                    header["preset"] = True
        if in_force:
            header["params"] = in_force
        if vocabulary:
            # named, never imported by a reader: replay and report suggest it (--vocabulary)
            header["vocabulary"] = vocabulary
        header.update(self._static)
        self._header = header
        try:
            if self._fd is not None:
                self._size = os.fstat(self._fd).st_size
            self._emit(_dumps(header))
        except OSError:
            self.close()
            raise

    def _open(self) -> None:
        # Raw appends, one write call per line: no buffer that keeps a failed line and raises
        # again on close, and no line split across writes. A second descriptor without O_APPEND
        # rewrites a folded record in place (Linux ignores pwrite's offset under O_APPEND).
        self._fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            self._pfd = os.open(self.path, os.O_WRONLY)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise

    def _emit(self, line: str) -> int | None:
        """Append ``line`` (ending in a newline); returns the file offset where it starts (None
        for a stream). Raises ``OSError``."""
        if self._file is not None:
            try:
                self._file.write(line)
                self._file.flush()
            except ValueError as e:  # a closed stream
                raise OSError(errno.EBADF, str(e)) from None
            return None
        if self._fd is None:
            raise OSError(errno.EBADF, "the trace file is closed")
        encoded = line.encode("utf-8")
        data = memoryview(encoded)
        while data:
            # A short write (a size limit reached mid-line) leaves a partial line; the marker
            # that may follow starts on a line of its own, and the reader knows the two.
            n = os.write(self._fd, data)
            if n <= 0:
                raise OSError(errno.EIO, "the file takes no more data")
            data = data[n:]
        if os.fstat(self._fd).st_nlink == 0:
            raise OSError(errno.ENOENT, "the file was deleted while being written (was its "
                          "directory removed?)")
        # With O_APPEND the offset is the end of this write, whoever else appends to the file.
        end = os.lseek(self._fd, 0, os.SEEK_CUR)
        self._size = end
        return end - len(encoded)

    def _write(self, record: Mapping[str, Any], seq: int, *, fold: bool = False) -> None:
        if self.failure is not None:
            return
        try:
            line = _dumps(record)
            if fold:
                line = line[:-2] + ", " + _fold_tail(1, record["wall_time"],
                                                     record["monotonic_time"])
            self._rotate_for(len(line.encode("utf-8")))
            start = self._emit(line)
            if fold:
                self._fold_at = None if start is None else start + len(line.encode(
                    "utf-8")) - _FOLD_TAIL_LEN
        except OSError as e:
            self._fail(seq, e.strerror or str(e), deleted=e.errno == errno.ENOENT)

    def _rotate_for(self, size: int) -> None:
        """Move a full file aside (``PATH.1``, ...) before a record that would overfill it."""
        if self.max_bytes is None or self._fd is None or self._size + size <= self.max_bytes:
            return
        os.close(self._fd)
        self._fd = None
        if self._pfd is not None:
            os.close(self._pfd)
            self._pfd = None
        if self.backups == 0:
            os.unlink(self.path)
        else:
            for i in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{i}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        self._open()
        self._size = 0
        header = dict(self._header)
        if self._where is not None:
            header["continues"] = dict(self._where, seq=self._seq)
        self._emit(_dumps(header))

    def _update_fold(self, wall: float, mono: float) -> None:
        """Count one more step into the open fold: rewrite its tail in place."""
        self._fold_count += 1
        if self._fold_at is None or self._fd is None:
            return
        tail = _fold_tail(self._fold_count, wall, mono).encode("ascii")
        fd = self._pfd
        try:
            if fd is None:
                raise OSError(errno.EBADF, "the trace file is closed")
            os.pwrite(fd, tail, self._fold_at)
            if os.fstat(fd).st_nlink == 0:
                raise OSError(errno.ENOENT, "the file was deleted while being written (was its "
                              "directory removed?)")
        except OSError as e:
            self._fail(self._seq, e.strerror or str(e), deleted=e.errno == errno.ENOENT)

    def _close_fold(self) -> None:
        """End the open fold; a stream gets its record now (a file has it already)."""
        record, count = self._fold_record, self._fold_count
        self._fold_sig = self._fold_record = None
        if record is None or self._file is None or self.failure is not None:
            return
        try:
            self._emit(_dumps(record)[:-2] + ", " + _fold_tail(
                count, record["last_wall_time"], record["last_monotonic_time"]))
        except OSError as e:
            self._fail(int(record["seq"]), e.strerror or str(e), deleted=False)

    def _fail(self, seq: int, why: str, *, deleted: bool) -> None:
        self.failure = why
        # The one warning; the job goes on as if there were no trace.
        logger.warning("trace %s: cannot write record %d: %s; the trace is incomplete from "
                       "there on (later records are dropped; the job is not affected)",
                       self.path, seq, why)
        self._lost_seq = seq
        self._marked = deleted  # nobody will read a deleted file
        self._mark()

    def _mark(self) -> None:
        if self._marked or self.failure is None:
            return
        marker = {"kind": "incomplete", "seq": self._lost_seq, "wall_time": time.time(),
                  "error": self.failure}
        try:
            # A blank line first: it ends a partial line, and the reader skips blank lines.
            self._emit("\n" + _dumps(marker))
            self._marked = True
        except OSError:
            pass  # tried again by close(): space may have been freed by then

    def __call__(self, step: Step) -> None:
        """Write the record of ``step`` (the engine calls this after every transition)."""
        self._seq += 1
        if self.failure is not None:
            return
        record = step_record(step, self._seq, self._static)
        if self._dynamic is not None:
            extra = {k: _jsonable(v) for k, v in self._dynamic().items()
                     if k not in _RESERVED or k == "role"}
            record.update(extra)
        self._add(record)
        # Where the lifecycle stands now: a rotated file's header says so.
        self._where = {"state": record["dest"] or record["source"],
                       "remaining_restarts": record["remaining_restarts"],
                       "restart_count": record["restart_count"]}

    def _add(self, record: dict[str, Any]) -> None:
        sig = fold_key(record)
        if sig is None:
            if self._fold_record is not None:
                self._close_fold()
            self._write(record, self._seq)
            return
        if sig == self._fold_sig and self._fold_record is not None:
            self._fold_record["last_wall_time"] = record["wall_time"]
            self._fold_record["last_monotonic_time"] = record["monotonic_time"]
            self._update_fold(record["wall_time"], record["monotonic_time"])
            return
        if self._fold_record is not None:
            self._close_fold()
        self._fold_sig = sig
        self._fold_record = dict(record, last_wall_time=record["wall_time"],
                                 last_monotonic_time=record["monotonic_time"])
        self._fold_count = 1
        if self._file is None:
            self._write(record, self._seq, fold=True)

    def close(self) -> None:
        """Close the file if this writer opened it (after a last try to mark a failed trace
        incomplete). Never raises."""
        self._mark()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> JsonlTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fold_tail(count: int, wall: float, mono: float) -> str:
    """The fixed-width end of a folded record: its count and last times, then ``}`` and the
    newline."""
    return _FOLD_TAIL.format(count, repr(float(wall))[:24], repr(float(mono))[:24])


def _params_in_force(spec: Spec | str | None, params: Mapping[str, Any] | None) -> dict[str, str]:
    """The header's ``params``: every value in force, in the spec's syntax (``60``, ``[3, 4]``)."""
    from .._core._params import format_value

    if spec is None or isinstance(spec, str):
        # Nothing to merge with: what the caller says, as it says it.
        return {str(k): format_value(v) for k, v in (params or {}).items()}
    types = {p.name: p.type for p in spec.params}
    return {k: param_text(types[k], v) for k, v in spec.bind(params).items()}


def param_text(type_name: str, value: Any) -> str:
    """A parameter's value in the spec's syntax, exactly: ``10m`` when the unit says it without
    losing anything, else plain seconds (``600.125``), so that replay reads back what ran."""
    from .._core._params import format_param, format_value, parse_text
    from .._core._units import BadValue

    text = format_param(type_name, value)
    try:
        if parse_text(type_name, text) == value:
            return text
    except BadValue:
        pass
    return format_value(value)


def _dumps(record: Mapping[str, Any]) -> str:
    try:
        line = json.dumps(record, allow_nan=False, default=repr) + "\n"
    except ValueError:
        # NaN or infinity somewhere (a failure's data): written as strings, not invalid JSON.
        record = _jsonable(record)
        line = json.dumps(record, allow_nan=False, default=repr) + "\n"
    # No line the reader refuses (a worker's 20 MB error message, kept twice by torch's
    # failure): its strings are cut to 64 KiB, then 4 KiB, then 256 characters until it fits.
    data: Any = None
    for limit in (1 << 16, 1 << 12, 1 << 8):
        if len(line) <= MAX_LINE_BYTES // 4 or len(line.encode()) <= MAX_LINE_BYTES:
            return line
        if data is None:
            data = _jsonable(record)
        line = json.dumps(_cut_strings(data, limit), allow_nan=False, default=repr) + "\n"
    return line


def _cut_strings(value: Any, limit: int) -> Any:
    """``value`` (JSON data) with every string longer than ``limit`` characters cut, saying so."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}... [{len(value) - limit} characters cut: a trace line holds " \
               f"at most {MAX_LINE_BYTES} bytes]"
    if isinstance(value, dict):
        return {k: _cut_strings(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_strings(v, limit) for v in value]
    return value


def _is_preset(spec: Spec) -> bool:
    """Whether ``spec`` is this installation's built-in spec of its name (the header says so,
    and ``fsm-agent replay`` then uses the preset without opening any file the trace names)."""
    from .._core._load import load_spec, preset_names

    if spec.name not in preset_names():
        return False
    try:
        return os.path.abspath(load_spec(spec.name).path) == os.path.abspath(spec.path)
    except Exception:
        return False


#: The name ``fsm-agent run --trace`` looks up.
TraceWriter = JsonlTraceWriter


def open_trace(
    path: str | os.PathLike[str],
    *,
    spec: Spec | str | None = None,
    dynamic: Callable[[], Mapping[str, Any]] | None = None,
    params: Mapping[str, Any] | None = None,
    **static: Any,
) -> JsonlTraceWriter:
    """A ``JsonlTraceWriter`` appending to ``path``; close it when the lifecycle ends."""
    return JsonlTraceWriter(path, spec=spec, dynamic=dynamic, params=params, **static)
