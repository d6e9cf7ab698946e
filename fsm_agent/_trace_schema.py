"""The trace format shared by its writer (``fsm_agent._trace``) and its reader
(``fsm_agent._trace_reader``): the format's name and version, the fields of a step record, and
the error a reader raises. The records themselves are described in ``fsm_agent._trace``.
"""

from __future__ import annotations

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "TraceError"]

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
_RESERVED = frozenset({"kind", "format", "version", "spec", "spec_path", "preset", "vocabulary",
                       "seq",
                       "wall_time", "params", "rule", "timer",
                       "monotonic_time", "observed", "failures", "error", "role", *_STEP_FIELDS,
                       "count", "last_wall_time", "last_monotonic_time", "continues"})
# Record fields that differ between steps that change nothing.
_TIME_FIELDS = ("seq", "wall_time", "monotonic_time")


class TraceError(ValueError):
    """A trace file cannot be read: ``str()`` names the file and line (``trace.jsonl:7: ...``)."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {message}")
