"""The end-of-run summary: a job's analysis (``fsm_agent._readers._analysis``) as text for a
terminal, and the in-memory recorder that lets ``fsm-agent run`` print it without a trace file.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._core._spec import HUNG_TRIGGER
from .._core._units import format_elapsed
from ..trace._reader import Trace, TraceRecord
from ..trace._schema import fold_key
from ..trace._writer import step_record
from ._analysis import FailureInfo, JobAnalysis, _num, analyse

if TYPE_CHECKING:
    from .._core._spec import Spec
    from .._core._step import Step

__all__ = ["RunRecorder", "describe_drain", "describe_failure", "describe_progress",
           "detail_lines", "format_text"]


def describe_failure(f: FailureInfo) -> str:
    """``rank 1 (node a, local rank 1, pid 42): exit code 3: ValueError: bad batch``."""
    where = ", ".join(p for p in (f"node {f.node}", f"local rank {f.local_rank}"
                                  if f.local_rank is not None else "", f"pid {f.pid}"
                                  if f.pid is not None else "") if p)
    what = f.how
    detail = f.exception or (f.message if f.message and not f.message.startswith(
        "To enable traceback") else None)
    if detail and f.hung:
        detail = detail.removeprefix("worker hung: ")
    return f"rank {f.rank} ({where}): {what}" + (f": {detail}" if detail else "")


def describe_progress(p: Mapping[str, Any]) -> str:
    """``step 3 -> 3 (none; 2 restarts in a row without progress)`` for a failed attempt's
    ``diagnostics.progress``."""
    start, end = p.get("start"), p.get("end")

    def mark(m: Any) -> str:
        if not isinstance(m, Mapping):
            return "?"
        if m.get("step") is not None:
            return f"step {m['step']}"
        if m.get("checkpoint_mtime") is not None:
            return f"checkpoint at {_clock_short(_num(m['checkpoint_mtime']))}"
        return "nothing"

    stalled = int(_num(p.get("stalled_restarts")))
    moved = ("progressed" if p.get("progressed") else
             f"no progress ({stalled} restart{'s' if stalled != 1 else ''} in a row)")
    return f"{mark(start)} -> {mark(end)}: {moved}"


def describe_drain(d: Mapping[str, Any]) -> str:
    """``SIGUSR1 to local ranks 0, 1 (received SIGTERM): workers drained in 0.03 s``."""
    ranks = d.get("ranks") if isinstance(d.get("ranks"), list) else []
    who = (f"local rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
           if ranks else "no running worker")
    sig = d.get("signal") or "the drain signal"
    took = d.get("took_s")
    within = f" in {format_elapsed(_num(took))}" if isinstance(took, (int, float)) else ""
    why = f" ({d['reason']})" if d.get("reason") else ""
    return f"{sig} to {who}{why}: {d.get('workers') or 'drained'}{within}"


def _clock_short(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "?"


def detail_lines(a: JobAnalysis, *, restarts: bool = True) -> list[str]:
    """The summary's lines about restarts and budgets per cause (unless not ``restarts``),
    progress and drains (shared by the run summary, ``fsm-agent report --format text`` and
    ``fsm-agent replay``)."""
    lines = []
    if restarts and a.restart_budget is not None:
        lines.append(f"restarts: {a.restarts_used} of {a.restart_budget} used"
                     + "".join(f"; budget {n}: {k} used" for n, k in a.budget_restarts))
    watched = [i for i in a.incidents if i.progress is not None]
    if watched:
        last = watched[-1]
        assert last.progress is not None
        lines.append(f"progress (attempt {last.progress.get('attempt', '?')}, node {last.node}):"
                     f" {describe_progress(last.progress)}")
    for node, d in a.drains:
        lines.append(f"drain (node {node}): {describe_drain(d)}")
    return lines


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def format_text(a: JobAnalysis) -> str:
    """The summary for a terminal: root cause first, then the deciding rule, the restart budget,
    time lost per cause, and where the stacks and error files are."""
    lines = []
    nodes = len(a.lanes)
    head = f"job {a.outcome}"
    if a.spec_name:
        head += f" (spec {a.spec_name!r}"
        head += f", {nodes} agent{'s' if nodes != 1 else ''})"
    lines.append(f"fsm-agent: {head} after {format_elapsed(max(0.0, a.end - a.start))}")
    x = a.root_incident
    if a.root_cause is not None:
        label = "root cause" if a.outcome != "SUCCEEDED" else "first failure (recovered)"
        lines.append(f"{label}: {describe_failure(a.root_cause)}")
    elif x is not None and x.trigger == HUNG_TRIGGER:
        lines.append("root cause: worker group hung")
    left = [i for i in a.incidents if i.cause == "unhealthy node"]
    if left and a.root_cause is None:
        reason = left[0].health.get("reason") if left[0].health else None
        lines.append(f"root cause: node {left[0].node} failed its health check: {reason}")
    if x is not None and x.trigger == HUNG_TRIGGER:
        hung = [f for f in x.failures]
        if hung:
            lines.append("  hung ranks: " + ", ".join(str(f.rank) for f in hung)
                         + (f" (no progress for {format_elapsed(x.hang_idle)})" if x.hang_idle
                            else ""))
    if x is not None and x.decision is not None:
        verb = {"gave up": "gave up", "restart": "restarted", "aborted": "aborted"}.get(
            x.decision.outcome, x.decision.outcome)
        lines.append(f"decided by: {x.decision.describe()} -> {verb}")
    lines.extend(detail_lines(a))
    if a.incidents:
        parts = [f"{c} {format_elapsed(s)} ({k}x)" for c, s, k in a.lost_by_cause]
        lines.append(f"time lost: {format_elapsed(a.lost)}: " + "; ".join(parts))
    if a.stacks:
        lines.append("stacks:")
        for s in a.stacks:
            how = "" if s.get("method") == "py-spy" else f" (no Python frames: {s.get('error')})"
            lines.append(f"  rank {s.get('rank')}: {_rel(str(s.get('path')))}{how}")
    if a.error_files:
        lines.append("error files:")
        lines.extend(f"  {_rel(p)}" for p in a.error_files)
    for w in a.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


class RunRecorder:
    """A lifecycle listener that keeps what the end-of-run summary needs, in memory: every step
    that changed something, and a count for the runs of steps that did not (as the trace writer
    folds them). ``fields``: called per step for extra record fields (the agent's
    ``trace_fields``: diagnostics). ``analysis()`` reads it as one lane.

    Only the last record can still change (a fold adds to its count). Every earlier one is kept
    as its JSON text, compressed :data:`CHUNK_RECORDS` at a time, and read back by
    ``analysis()``: as Python dicts the records of a restart cost about 5 KB, which an agent that
    restarts for days would carry to its end (tests/perf/test_restart_memory.py); compressed, about
    a twentieth. A record that JSON would not give back equal (a value JSON has no type for, a NaN)
    is kept as it is, so ``analysis()`` always reads exactly the records it was given.
    """

    #: Ticks that change nothing fold into one record, so an agent need not tick just for it
    #: (the torch agent then waits longer while nothing can change).
    every_tick = False
    #: Finished records compressed together (the pending ones are kept as JSON text). Each
    #: chunk is compressed with the previous chunk's last line as its dictionary, so that even a
    #: small chunk compresses as well as a long run of records (most of a record repeats the
    #: one before: the same keys, guards, actions, failures' messages).
    CHUNK_RECORDS = 16

    def __init__(self, *, fields: Callable[[], Mapping[str, Any]] | None = None,
                 **static: Any) -> None:
        self._fields = fields
        self._static = static
        # finished records, oldest first: compressed chunks (JSON lines) and records kept as
        # dicts; then the pending JSON lines; then the last record, which a fold may change
        self._done: list[bytes | dict[str, Any]] = []
        self._pending: list[str] = []
        self._last: dict[str, Any] | None = None
        self._zdict: bytes | None = None  # the last line of the last compressed chunk
        self._last_key: dict[str, Any] | None = None  # fold_key of the last record
        self._seq = 0

    def __call__(self, step: Step) -> None:
        self._seq += 1
        record = step_record(step, self._seq, self._static)
        if self._fields is not None:
            record.update(self._fields())
        last = self._last
        key = fold_key(record)  # the trace writer's rule: the summary counts what a trace shows
        if key is not None and last is not None and key == self._last_key:
            last["count"] += 1
            last["last_wall_time"] = record["wall_time"]
            last["last_monotonic_time"] = record["monotonic_time"]
            return
        if key is not None:
            record.update(count=1, last_wall_time=record["wall_time"],
                          last_monotonic_time=record["monotonic_time"])
        if last is not None:
            self._finish(last)
        self._last, self._last_key = record, key

    def _finish(self, record: dict[str, Any]) -> None:
        """Keep ``record``, which no fold can change any more, compactly."""
        try:
            text = json.dumps(record, separators=(",", ":"))
            same = json.loads(text) == record
        except (TypeError, ValueError, RecursionError):
            same = False
        if not same:
            self._compress()
            self._done.append(record)
            return
        self._pending.append(text)
        if len(self._pending) >= self.CHUNK_RECORDS:
            self._compress()

    def _compress(self) -> None:
        if not self._pending:
            return
        packer = _compressor(self._zdict)
        self._done.append(packer.compress("\n".join(self._pending).encode()) + packer.flush())
        self._zdict = self._pending[-1].encode()
        self._pending = []

    def records(self) -> list[dict[str, Any]]:
        """Every record so far, oldest first (a fresh copy: changing it changes nothing here)."""
        out: list[dict[str, Any]] = []
        zdict: bytes | None = None
        for item in self._done:
            if isinstance(item, bytes):
                unpacker = zlib.decompressobj(zdict=zdict) if zdict else zlib.decompressobj()
                lines = (unpacker.decompress(item) + unpacker.flush()).decode().split("\n")
                out.extend(json.loads(line) for line in lines)
                zdict = lines[-1].encode()
            else:
                out.append(item)
        out.extend(json.loads(text) for text in self._pending)
        if self._last is not None:
            out.append(self._last)
        return out

    def analysis(self, spec: Spec | None = None) -> JobAnalysis:
        """What happened so far."""
        header = dict(self._static, spec=spec.name if spec is not None else None)
        trace = Trace("<this run>", header, None,
                      tuple(TraceRecord(i, r) for i, r in enumerate(self.records(), 1)))
        return analyse([trace], spec)


def _compressor(zdict: bytes | None) -> Any:
    return zlib.compressobj(9, zdict=zdict) if zdict else zlib.compressobj(9)
