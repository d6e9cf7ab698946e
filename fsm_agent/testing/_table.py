"""A counterexample as a table: one row per tick, the expected and actual calls side by side."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any

from .._core._units import format_offset
from ._compare import same_calls
from ._reference import (
    ConformanceTrace,
    Event,
)
from ._strategies import (
    RunConfig,
    Tick,
)


def _short(event: Event, role: str) -> str:
    name = event[0]
    if name == "put_metric":
        metric = str(event[1])
        prefix = f"workers.{role}."
        metric = metric[len(prefix):] if metric.startswith(prefix) else metric
        return f"metric {metric}={event[2]}"
    if name == "sleep":
        return f"sleep({event[1]:g})"
    if name == "exit_barrier":
        return "exit_barrier(?)" if event[1] is None else f"exit_barrier({event[1]:g})"
    if name == "woken":
        return f"-> {event[1]}"
    if name == "announce_preemption":
        return f"announce({event[1]})"
    if name == "drain_workers":
        return f"drain({_signal_name(event[1])})"
    short = {"num_nodes_waiting": "nodes_waiting?", "start_workers": "start",
             "stop_workers": "stop", "kill_workers": "kill"}
    return short.get(str(name), str(name))


def _segments(events: Sequence[Event], n: int) -> list[list[Event]]:
    """Split a run's calls by tick: segment 0 is the start, segment i begins at monitor call i."""
    segs: list[list[Event]] = [[] for _ in range(n + 2)]
    tick = 0
    for e in events:
        if e[0] == "monitor":
            tick = min(tick + 1, n + 1)
            cur = segs[tick - 1]
            if cur and cur[-1][0] == "sleep":
                segs[tick].append(cur.pop())
        segs[tick].append(e)
    while len(segs) > 1 and not segs[-1]:
        segs.pop()
    return segs


def render_table(config: RunConfig, script: Sequence[Tick], expected: ConformanceTrace,
                 actual: ConformanceTrace, problems: Sequence[str] = ()) -> str:
    """The counterexample as a table: one row per tick, expected and actual calls side by side.

    Columns for how a failure failed, the time a tick took and the random draw appear only when
    some tick of the script sets them."""
    exp = _segments(expected.events, len(script))
    act = _segments(actual.events, len(script))
    extra = [(title, get) for title, get, plain in _EXTRA_COLUMNS
             if any(get(t) != plain for t in script)]
    titles = ("tick", "observed", "nodes waiting", "barrier", "fault", *(t for t, _ in extra))
    rows = [(*titles, "expected calls", "actual calls")]
    for i in range(max(len(exp), len(act))):
        if i == 0:
            head = ("start", "-", "-", "-", config.init_fault or "-", *("-" for _ in extra))
        elif i <= len(script):
            t = script[i - 1]
            head = (str(i), t.observed, str(t.nodes_waiting), t.barrier, t.fault or "-",
                    *(get(t) for _, get in extra))
        else:
            head = (str(i), "(none: script ended)", "-", "-", "-", *("-" for _ in extra))
        e = ", ".join(_short(x, config.role) for x in exp[i]) if i < len(exp) else ""
        a = ", ".join(_short(x, config.role) for x in act[i]) if i < len(act) else ""
        same = e == a and same_calls(exp[i] if i < len(exp) else [],
                                     act[i] if i < len(act) else [])
        mark = "" if same else "  <-- differs"
        rows.append((*head, e or "-", (a or "-") + mark))
    n = len(titles) + 1
    widths = [max(len(r[c]) for r in rows) for c in range(n)]
    lines = [" | ".join(r[c].ljust(widths[c]) for c in range(n)) + " | " + r[n] for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 12)
    lines.append("")
    lines.append(f"expected outcome: {_outcome_line(expected)}")
    differs = "  <-- differs" if problems and set(problems) - {"calls"} else ""
    lines.append(f"actual outcome:   {_outcome_line(actual)}{differs}")
    if problems:
        lines.append("differs in: " + ", ".join(problems))
    return "\n".join(lines)


def _outcome_line(trace: ConformanceTrace) -> str:
    code = f", exit code {trace.exit_code}" if trace.exit_code is not None else ""
    return (f"{trace.outcome.describe()}; state {trace.state}, "
            f"remaining_restarts {trace.remaining_restarts}{code}")


#: Columns a script shows when some tick sets them: title, the cell, the cell's plain value.
_EXTRA_COLUMNS: tuple[tuple[str, Callable[[Tick], str], str], ...] = (
    ("failure", lambda t: t.failure_detail() or "-", "-"),
    ("time", lambda t: format_offset(t.elapsed) if t.elapsed else "-", "-"),
    ("draw", lambda t: f"{t.draw:g}", "0.5"),
    ("step", lambda t: "-" if t.step is None else str(t.step), "-"),
    ("preempted after", lambda t: t.preemption_detail() or "-", "-"),
    ("peer", lambda t: "lost" if t.peer_lost else "-", "-"),
)


def _signal_name(number: Any) -> str:
    try:
        return signal.Signals(number).name
    except (ValueError, TypeError):
        return str(number)

