"""Traces: what a lifecycle did, one JSON line per transition, and checking one against a spec.

Write one with a listener (``open_trace`` or ``TraceWriter``), read one back with
``read_trace``, check it against a spec with ``replay``::

    from fsm_agent import Lifecycle, load_spec
    from fsm_agent.trace import open_trace, read_trace, replay

    spec = load_spec("torchelastic")
    with open_trace("run.jsonl", spec=spec, node="host-1") as writer:
        Lifecycle(spec, driver, listeners=[writer]).run(monitor_interval=5)
    for lifecycle in read_trace("run.jsonl"):
        assert replay(spec, lifecycle).ok

A spec with parameters (``resilient``): give the writer the values the lifecycle runs with,
``open_trace(path, spec=spec, params=lifecycle.params)``; the header records them, and replay
checks the rule and the timer each step recorded against them.

``fsm-agent run --trace FILE`` writes the same format, and ``fsm-agent replay FILE`` replays it.
The record fields are listed in docs/diagrams.md ("Traces"). Importing this module does not
import torch.
"""

from __future__ import annotations

from ._reader import Trace, TraceRecord, read_trace
from ._replay import Divergence, ReplayResult, replay
from ._schema import TRACE_FORMAT, TRACE_VERSION, TraceError
from ._writer import JsonlTraceWriter, TraceWriter, open_trace

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "Divergence",
    "JsonlTraceWriter",
    "ReplayResult",
    "Trace",
    "TraceError",
    "TraceRecord",
    "TraceWriter",
    "open_trace",
    "read_trace",
    "replay",
]
