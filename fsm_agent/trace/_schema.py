"""The trace format, declared once: its name and version, every field of a header and of a step
record with its JSON types and meaning, the ``diagnostics`` records, and the fold rule.

The writer (``fsm_agent.trace._writer.step_record``, compiled from ``STEP_FIELDS``), the in-memory
recorder of the run summary (``fsm_agent._readers._summary.RunRecorder``, through ``step_record``),
the fold rule, the reader's checks (``fsm_agent.trace._reader``) and the tables in docs/diagrams.md
(``with_trace_tables``; ``python tools/generated_docs.py`` writes them, and
``tests/tools/test_trace.py`` fails while they differ) are derived from these tables. The rows
of the fields the engine sets on its ``Step`` are declared beside the attributes, as
``fsm_agent._core._step.STEP_RECORD``; a new one needs only its row there (CONTRIBUTING.md, "A field
on trace records").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core._step import _NUMBER, STEP_RECORD, Field

__all__ = [
    "DIAGNOSTICS",
    "FOLD_FIELDS",
    "HEADER_FIELDS",
    "STEP_FIELDS",
    "TABLE_MARK",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "Field",
    "TraceError",
    "field_table",
    "fold_key",
    "trace_tables",
    "with_trace_tables",
]

TRACE_FORMAT = "fsm-agent-trace"
#: Raised when an older reader would misread the new records; a new optional field needs none.
TRACE_VERSION = 1

STEP_FIELDS: tuple[Field, ...] = (
    Field("kind", (str,), "`step`", from_step=False),
    Field("seq", (int,), "1, 2, ... within one lifecycle", from_step=False),
    *STEP_RECORD,
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
#: by key; the readers (``fsm_agent._readers._analysis``) read them by these keys.
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


#: The line after which docs/diagrams.md shows each table of ``trace_tables()``.
TABLE_MARK = "<!-- trace-schema: {} -->"


def trace_tables() -> dict[str, str]:
    """docs/diagrams.md's tables of the format, by the name in their ``TABLE_MARK`` line."""
    return {"step": field_table(STEP_FIELDS), "fold": field_table(FOLD_FIELDS),
            "diagnostics": diagnostics_table(), "header": field_table(HEADER_FIELDS)}


def with_trace_tables(text: str) -> str:
    """``text`` (docs/diagrams.md) with the table after each ``TABLE_MARK`` line (up to the
    first line that is not a table row) replaced by the schema's; a marker missing from
    ``text`` is a ``ValueError`` (a table the page has lost)."""
    lines = text.split("\n")
    for name, table in trace_tables().items():
        mark = TABLE_MARK.format(name)
        if mark not in lines:
            raise ValueError(f"no {mark!r} line before the {name} table")
        start = lines.index(mark) + 1
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = table.split("\n")
    return "\n".join(lines)


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
