"""``fsm-agent report``: a job's traces as one self-contained HTML page.

The page needs no network and no script: inline CSS, inline SVG (the timeline, drawn here; the
spec's diagram, drawn by Graphviz when the ``diagrams`` extra is installed, else a table of the
transitions taken), and ``<details>`` for the long parts (stacks, tracebacks). Everything that
comes from a trace is escaped: a trace is untrusted input.

Sections: the outcome and the root cause; a timeline with a lane per agent (attempts, failures,
restarts, backoffs, rendezvous and barrier waits); every incident with the rule or transition
that decided it and what it cost; time lost per cause; the spec's diagram with the path taken;
the stacks of hung workers and the error files. The root cause names the run's log directory and,
under a ``--log-dir`` given, shows the end of its stderr.
"""

from __future__ import annotations

import datetime
import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._core._files import FileRefused, printable_lines, read_tail_under, read_under
from .._core._spec import HUNG_TRIGGER
from .._core._units import format_elapsed
from ._analysis import FailureInfo, Incident, JobAnalysis
from ._summary import describe_failure, describe_progress

__all__ = ["render_html"]

#: Timeline colours per segment kind (and the legend's order).
COLOURS: dict[str, tuple[str, str]] = {
    "running": ("#4caf50", "workers running"),
    "stopping": ("#ff9800", "stopping workers"),
    "restarting": ("#ff9800", "restarting workers"),
    "rendezvous": ("#2196f3", "rendezvous"),
    "starting": ("#00bcd4", "starting workers"),
    "backoff": ("#ffc107", "backoff"),
    "hung": ("#e57373", "hung (no progress, before detection)"),
    "barrier": ("#9c27b0", "exit barrier"),
    "stacks": ("#795548", "capturing stacks"),
    "health": ("#607d8b", "health checks"),
    "action": ("#9e9e9e", "other actions"),
    "waiting": ("#cfd8dc", "other states"),
}
#: How many lines of each stack dump the page embeds.
MAX_STACK_LINES = 400
#: The most of one stack file read (py-spy's dump of one process is a few kB).
MAX_STACK_BYTES = 1 << 20
#: How many of the root cause's last stderr lines the page shows, and the most of it read.
STDERR_TAIL_LINES = 20
MAX_STDERR_BYTES = 64 << 10

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #1d2329; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 40px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #dde1e6; padding-bottom: 4px; }
.meta { color: #5a6570; margin: 0 0 12px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; color: #fff;
         font-weight: 600; font-size: 13px; vertical-align: middle; }
.b-SUCCEEDED { background: #2e7d32; } .b-FAILED, .b-ABORTED { background: #c62828; }
.b-INTERRUPTED, .b-RUNNING, .b-EMPTY, .b-LEFT, .b-PREEMPTED { background: #6d4c41; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 12px 0; }
.card { background: #fff; border: 1px solid #dde1e6; border-radius: 8px; padding: 10px 14px;
        min-width: 150px; }
.card .v { font-size: 20px; font-weight: 600; } .card .k { color: #5a6570; font-size: 12px; }
.cause { background: #fff; border: 1px solid #e0b4b4; border-left: 5px solid #c62828;
         border-radius: 6px; padding: 10px 14px; }
.cause.ok { border-color: #b7d7b9; border-left-color: #2e7d32; }
.cause p { margin: 4px 0; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #1d2329; color: #e8eaed; padding: 10px 12px; border-radius: 6px;
      overflow-x: auto; max-height: 420px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { border: 1px solid #dde1e6; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 6px 0; font-size: 12px; }
.legend span::before { content: ""; display: inline-block; width: 12px; height: 12px;
                       margin-right: 5px; vertical-align: -2px; background: var(--c);
                       border-radius: 2px; }
.timeline, .diagram { background: #fff; border: 1px solid #dde1e6; border-radius: 8px;
                      padding: 8px; overflow-x: auto; }
.diagram svg { max-width: 100%; height: auto; }
.bar { height: 14px; background: #c62828; border-radius: 3px; }
details { margin: 6px 0; } summary { cursor: pointer; }
.warn { color: #8a5300; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _clock(t: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "?"


# ---------------------------------------------------------------------------------------------
# timeline

_LABEL_W = 230
_PLOT_W = 880
_RIGHT_W = 96  # the final state's label, right of every bar
_LANE_H = 44
_BAND_H = 14  # above each bar: the attempts' labels
_BAR_H = 24
_TOP = 26
_CHAR_W = 6.6  # an 11 px character's width, at most (the labels are cut to fit)


def _ticks(span: float) -> list[float]:
    if span <= 0:
        return [0.0]
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def _fit(text: str, pixels: float) -> str:
    """``text`` cut to what ``pixels`` hold at the timeline's font size."""
    n = max(0, int(pixels / _CHAR_W))
    return text if len(text) <= n else (text[: n - 1] + "\u2026" if n > 1 else "")


def _attempts(segments: Sequence[Any]) -> list[tuple[float, float]]:
    """Each attempt's span: from one start of the workers to the next (or the lane's end)."""
    starts = [s.start for s in segments if s.kind == "starting"]
    end = max((s.end for s in segments), default=0.0)
    return [(t, starts[i + 1] if i + 1 < len(starts) else end) for i, t in enumerate(starts)]


def _timeline(a: JobAnalysis) -> str:
    span = max(a.end - a.start, 1e-6)
    height = _TOP + _LANE_H * len(a.lanes) + 12
    width = _LABEL_W + _PLOT_W + _RIGHT_W

    def x(t: float) -> float:
        return _LABEL_W + (t - a.start) / span * _PLOT_W

    out = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" font-size="11" '
           'font-family="system-ui, sans-serif">']
    for tick in _ticks(span):
        tx = x(a.start + tick)
        out.append(f'<line x1="{tx:.1f}" y1="{_TOP - 6}" x2="{tx:.1f}" y2="{height - 8}" '
                   'stroke="#e3e6ea"/>')
        out.append(f'<text x="{tx:.1f}" y="{_TOP - 10}" text-anchor="middle" fill="#5a6570">'
                   f'{_e(format_elapsed(tick).replace(" s", "s"))}</text>')
    for row, lane in enumerate(a.lanes):
        y = _TOP + row * _LANE_H
        out.append(f'<g class="lane" data-node="{_e(lane.node)}" data-final="'
                   f'{_e(lane.final_state or "")}">')
        bar = y + _BAND_H + 2  # the bar's top; the band above it holds the attempts' labels
        out.append(f'<text class="lane-label" x="4" y="{bar + 16}" fill="#1d2329">'
                   f'{_e(_fit(lane.label, _LABEL_W - 12))}<title>{_e(lane.label)}</title></text>')
        out.append(f'<rect x="{_LABEL_W}" y="{bar}" width="{_PLOT_W}" height="{_BAR_H}" '
                   'fill="#f1f3f5"/>')
        for n, (t0, t1) in enumerate(_attempts(lane.segments)):
            ax, aw = x(t0), max(x(t1) - x(t0), 0.0)
            name = f"attempt {n}" if aw >= _CHAR_W * 10 else str(n)
            out.append(f'<g class="attempt" data-attempt="{n}"><line x1="{ax:.1f}" y1="{y + 2}" '
                       f'x2="{ax:.1f}" y2="{bar}" stroke="#8a96a3"/><text x="{ax + 3:.1f}" '
                       f'y="{y + _BAND_H - 2}" font-size="10" fill="#5a6570">'
                       f'{_e(_fit(name, aw - 4))}</text><title>attempt {n} (start {n + 1} of '
                       f'the workers): +{_e(format_elapsed(t0 - a.start))}, '
                       f'{_e(format_elapsed(t1 - t0))}</title></g>')
        for s in lane.segments:
            x0 = x(s.start)
            w = max(x(s.end) - x0, 0.0 if s.kind == "running" else 1.5)
            colour = COLOURS.get(s.kind, COLOURS["action"])[0]
            out.append(
                f'<rect class="seg seg-{_e(s.kind)}" x="{x0:.2f}" y="{bar}" width="{w:.2f}" '
                f'height="{_BAR_H}" fill="{colour}"><title>{_e(s.label)}: '
                f'{_e(format_elapsed(s.end - s.start))} '
                f'from +{_e(format_elapsed(s.start - a.start))}'
                '</title></rect>')
        final = lane.final_state or "?"
        shown = final if not lane.error or final == "FAILED" else "interrupted"
        out.append(f'<text class="final" x="{_LABEL_W + _PLOT_W + 6}" y="{bar + 16}" '
                   f'fill="#5a6570">{_e(_fit(shown, _RIGHT_W - 8))}<title>{_e(shown)}</title>'
                   '</text>')
        out.append("</g>")
    rows = {lane.index: row for row, lane in enumerate(a.lanes)}
    for inc in a.incidents:
        if inc.hang_idle > 0 and inc.lane in rows:
            bar = _TOP + rows[inc.lane] * _LANE_H + _BAND_H + 2
            x0 = x(max(a.start, inc.start - inc.hang_idle))
            out.append(f'<rect class="seg seg-hung" x="{x0:.2f}" y="{bar}" '
                       f'width="{max(x(inc.start) - x0, 1.5):.2f}" height="{_BAR_H}" '
                       f'fill="{COLOURS["hung"][0]}"><title>no progress for '
                       f'{_e(format_elapsed(inc.hang_idle))} before the hang was detected</title>'
                       '</rect>')
    for inc in a.incidents:
        y = _TOP + rows.get(inc.lane, 0) * _LANE_H + _BAND_H + 2  # the marker sits on the bar
        ix = x(inc.start)
        colour = "#c62828" if inc.cause not in ("membership change",) else "#1565c0"
        tip = f"{inc.cause} at +{format_elapsed(inc.start - a.start)}"
        if inc.decision is not None:
            tip += f"; {inc.decision.outcome}: {inc.decision.describe()}"
        out.append(f'<g class="incident"><path d="M{ix:.1f},{y + 1} l5,-7 h-10 z" '
                   f'fill="{colour}"/><line x1="{ix:.1f}" y1="{y + 2}" x2="{ix:.1f}" '
                   f'y2="{y + _BAR_H}" stroke="{colour}" stroke-width="1.5"/>'
                   f'<title>{_e(tip)}</title></g>')
    out.append("</svg>")
    kinds = {s.kind for ln in a.lanes for s in ln.segments}
    if any(i.hang_idle > 0 for i in a.incidents):
        kinds.add("hung")
    legend = "".join(f'<span style="--c:{c}">{_e(label)}</span>' for kind, (c, label)
                     in COLOURS.items() if kind in kinds)
    legend += '<span style="--c:#c62828">failure (marker)</span>'
    return f'<div class="legend">{legend}</div><div class="timeline">{"".join(out)}</div>'


# ---------------------------------------------------------------------------------------------
# sections


def _run_log_dir(stderr: str | None) -> str | None:
    """The run's log directory from a stderr path (``<it>/attempt_<n>/<local rank>/``)."""
    attempt = os.path.dirname(os.path.dirname(stderr or ""))
    return os.path.dirname(attempt) if os.path.basename(attempt).startswith("attempt_") else None


def _attempt_of(x: Incident | None) -> int:
    """The failed attempt's number, as torch names its log directory (``attempt_<n>``, its
    ``TORCHELASTIC_RESTART_COUNT``): the restarts counted before this incident."""
    if x is None:
        return 0
    consumed = x.decision is not None and x.decision.outcome == "restart"
    return max(0, x.restart_count - (1 if consumed else 0))


def _find_stderr(a: JobAnalysis, f: FailureInfo, log_dirs: Sequence[str]) -> str | None:
    """Where torch saved ``f``'s stderr under a ``--log-dir`` given: ``<dir>/<run id>_*/attempt_
    <n>/<local rank>/stderr.log``. Only the directories the user named are listed, and the
    run id (from the trace: untrusted) must be one plain name."""
    run_id, rank = a.run_id, f.local_rank if f.local_rank is not None else f.rank
    if not run_id or os.sep in run_id or run_id in (".", "..") or not log_dirs:
        return None
    attempt = _attempt_of(a.root_incident)
    for root in log_dirs:
        try:
            runs = sorted(n for n in os.listdir(root) if n.startswith(f"{run_id}_"))
        except OSError:
            continue
        for run in runs:
            path = os.path.join(root, run, f"attempt_{attempt}", str(rank), "stderr.log")
            if os.path.lexists(path):
                return path
    return None


def stderr_tail(path: str | None, log_dirs: Sequence[str], root: bool
                ) -> tuple[list[str] | None, str | None]:
    """The last :data:`STDERR_TAIL_LINES` lines of the stderr file at ``path`` (None when not
    read) and a note saying why not, or how to see them (None when there is nothing to say).
    ``root``: the failure is the job's root cause, where a missing ``--log-dir`` is worth a
    hint."""
    if path is None:
        if root and not log_dirs:
            return None, ("not read; fsm-agent report --log-dir DIR (the run's --log-dir) shows "
                          f"its last {STDERR_TAIL_LINES} lines")
        return None, None
    try:
        # A trace is untrusted: the path is read only under a --log-dir the user gave, a
        # regular file only, and only its end.
        raw = read_tail_under(path, log_dirs, MAX_STDERR_BYTES)
    except FileNotFoundError:
        return None, ("not saved: the workers' stderr went to the console; fsm-agent run "
                      "--log-dir DIR --redirects 2, or --tee 2, saves it")
    except FileRefused as e:
        return None, (f"not read; fsm-agent report --log-dir DIR shows its last "
                      f"{STDERR_TAIL_LINES} lines" if not log_dirs else str(e.strerror))
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    lines = printable_lines(raw.decode("utf-8", "replace"), 1000).splitlines()
    if len(raw) == MAX_STDERR_BYTES and len(lines) > 1:
        lines = lines[1:]  # the first line may be cut
    return lines[-STDERR_TAIL_LINES:], None


def root_stderr_text(a: JobAnalysis, log_dirs: Sequence[str]) -> list[str]:
    """The root cause's stderr for ``fsm-agent report --format text``: its last lines, or where
    it is and why it was not read."""
    f = a.root_cause
    if f is None:
        return []
    path = f.stderr_file or _find_stderr(a, f, log_dirs)
    tail, note = stderr_tail(path, log_dirs, True)
    if tail is not None:
        return [f"last {len(tail)} line(s) of rank {f.rank}'s stderr ({path}):",
                *(f"  {line}" for line in tail)]
    if note is None:
        return []
    return [f"stderr of rank {f.rank}: " + (f"{path} ({note})" if path else note)]


def _stderr_tail(path: str | None, log_dirs: Sequence[str], root: bool) -> str:
    tail, note = stderr_tail(path, log_dirs, root)
    if tail is not None:
        return (f"<p>last {len(tail)} line(s) of its stderr, <code>{_e(path)}</code>:</p>"
                f'<pre id="stderr-tail">{_e(chr(10).join(tail))}</pre>')
    if note is None:
        return ""
    if path is None:
        return f"<p>stderr: {_e(note)}</p>"
    return f"<p>stderr: <code>{_e(path)}</code> {_e(f'({note})')}</p>"


def _failure_block(f: FailureInfo, log_dirs: Sequence[str] = (),
                   a: JobAnalysis | None = None) -> str:
    parts = [f"<p><b>{_e(describe_failure(f))}</b></p>"]
    if f.timestamp is not None and not math.isnan(f.timestamp):
        parts.append(f"<p>at {_e(_clock(f.timestamp))}</p>")
    if f.error_file:
        parts.append(f"<p>error file: <code>{_e(f.error_file)}</code></p>")
    if f.message and f.exception is None and not f.hung \
            and not f.message.startswith("To enable traceback"):
        parts.append(f"<p>{_e(f.message)}</p>")
    if f.traceback:
        parts.append(f"<details><summary>traceback</summary><pre>{_e(f.traceback)}</pre>"
                     "</details>")
    stderr = f.stderr_file or (_find_stderr(a, f, log_dirs) if a is not None else None)
    shown = f.log_dir or _run_log_dir(stderr)
    if shown:
        parts.append(f'<p>log directory: <code id="log-dir">{_e(shown)}</code></p>')
    parts.append(_stderr_tail(stderr, log_dirs, a is not None))
    return "".join(parts)


def _root_cause(a: JobAnalysis, log_dirs: Sequence[str] = ()) -> str:
    ok = a.outcome == "SUCCEEDED"
    body: list[str] = []
    x = a.root_incident
    if a.root_cause is not None:
        body.append(f"<p>{'First failure (recovered)' if ok else 'Root cause'}: first failing "
                    f"rank {a.root_cause.rank} on {_e(a.root_cause.node)}</p>")
        body.append(_failure_block(a.root_cause, log_dirs, a))
    left = [i for i in a.incidents if i.cause == "unhealthy node"]
    if left:
        for inc in left:
            reason = inc.health.get("reason") if inc.health else None
            body.append(f"<p><b>node {_e(inc.node)} failed its health check and left the job:"
                        f"</b> {_e(reason)}</p>")
    if x is not None and x.trigger == HUNG_TRIGGER:
        body.append(f"<p><b>hang:</b> rank(s) {_e(', '.join(str(f.rank) for f in x.failures))}"
                    f" made no progress for {_e(format_elapsed(x.hang_idle))} before detection; "
                    "stacks below.</p>")
    if x is not None and x.decision is not None:
        body.append(f"<p>decided by <code>{_e(x.decision.describe())}</code>: "
                    f"<b>{_e(x.decision.outcome)}</b></p>")
    if not body:
        body.append("<p>No failure was observed.</p>")
    return f'<div id="root-cause" class="cause{" ok" if ok else ""}">{"".join(body)}</div>'


def _incidents(a: JobAnalysis) -> str:
    if not a.incidents:
        return "<p>No failures, hangs or membership changes.</p>"
    labels = {lane.index: lane.label for lane in a.lanes}
    rows = []
    for n, inc in enumerate(a.incidents, 1):
        ranks = "<br>".join(
            f"{f.rank}: {_e(f.how)}" + (f"<br><small>{_e(f.exception)}</small>" if f.exception
                                        else "") for f in inc.failures) or "-"
        d = inc.decision
        rows.append(
            f'<tr class="incident-row"><td class="num">{n}</td>'
            f'<td class="num">+{_e(format_elapsed(inc.start - a.start))}</td>'
            f"<td>{_e(labels.get(inc.lane, inc.node))}</td><td>{_e(inc.cause)}"
            + (f'<br><small class="progress">progress: {_e(describe_progress(inc.progress))}'
               "</small>" if inc.progress is not None else "") + "</td>"
            f"<td>{ranks}</td>"
            f"<td><code>{_e(d.describe() if d else '-')}</code>"
            + (f"<br><small>{_e(d.description)}</small>" if d and d.description else "")
            + f"</td><td>{_e(d.outcome if d else '-')}</td>"
            f'<td class="num">{inc.restart_count} / {inc.remaining_restarts}</td>'
            f'<td class="num">{_e(format_elapsed(inc.lost))}</td></tr>')
    return ('<table id="incidents"><tr><th>#</th><th>when</th><th>agent</th><th>cause</th>'
            "<th>failed ranks</th><th>decided by (rule or transition)</th><th>outcome</th>"
            "<th>restarts used / left</th><th>time lost</th></tr>" + "".join(rows) + "</table>")


def _took(took: Any) -> str:
    return format_elapsed(float(took)) if isinstance(took, (int, float)) else "-"


def _drains(a: JobAnalysis) -> str:
    rows = "".join(
        f'<tr class="drain-row"><td>{_e(node)}</td><td>{_e(d.get("reason") or "-")}</td>'
        f'<td>{_e(d.get("signal") or "-")}</td>'
        f'<td>{_e(", ".join(map(str, d.get("ranks") or [])) or "-")}</td>'
        f'<td class="num">{_e(_took(d.get("took_s")))}</td>'
        f'<td>{_e(", ".join(map(str, d.get("killed_at_timeout") or [])) or "-")}</td>'
        f'<td>{_e(d.get("workers") or "-")}</td></tr>'
        for node, d in a.drains)
    return ('<table id="drains"><tr><th>agent</th><th>why</th><th>drain signal</th>'
            "<th>local ranks</th><th>took</th><th>killed at drain_timeout</th><th>workers</th>"
            "</tr>" + rows + "</table>")


def _lost(a: JobAnalysis) -> str:
    if not a.lost_by_cause:
        return "<p>None.</p>"
    top = max(s for _, s, _ in a.lost_by_cause) or 1.0
    rows = "".join(
        f'<tr class="lost-row"><td>{_e(c)}</td><td class="num">{k}</td>'
        f'<td class="num">{_e(format_elapsed(s))}</td><td style="width:45%"><div class="bar" '
        f'style="width:{max(1.0, 100 * s / top):.1f}%"></div></td></tr>'
        for c, s, k in a.lost_by_cause)
    return ('<table id="lost"><tr><th>cause</th><th>incidents</th><th>time lost</th><th></th>'
            f"</tr>{rows}</table>")


def _stack_section(stacks: Sequence[Mapping[str, Any]], log_dirs: Sequence[str]) -> str:
    parts = []
    for s in stacks:
        path = str(s.get("path"))
        try:
            # A trace is untrusted: the path it names is read only under a directory the user
            # named (--log-dir), bounded, and a regular file only.
            raw = read_under(path, log_dirs, MAX_STACK_BYTES, "stack file")
        except OSError as e:
            text = ("(not read; fsm-agent report --log-dir DIR embeds the stacks saved under DIR)"
                    if not log_dirs else f"(cannot read {path}: {e.strerror})")
        else:
            lines = printable_lines(raw.decode("utf-8", "replace"), 1000).splitlines()
            text = "\n".join(lines[:MAX_STACK_LINES])
            if len(lines) > MAX_STACK_LINES:
                text += f"\n... ({len(lines) - MAX_STACK_LINES} more lines in the file)"
        how = "py-spy" if s.get("method") == "py-spy" else f"no Python frames: {s.get('error')}"
        parts.append(f'<details class="stack" open><summary>rank {_e(s.get("rank"))} (pid '
                     f'{_e(s.get("pid"))}, {_e(how)}): <code>{_e(path)}</code></summary>'
                     f"<pre>{_e(text)}</pre></details>")
    return "".join(parts)


def _diagram(diagram_svg: str | None, taken: Sequence[tuple[str, int]]) -> str:
    if diagram_svg:
        return f'<div class="diagram" id="diagram">{diagram_svg}</div>'
    rows = "".join(f"<tr><td><code>{_e(t)}</code></td><td class='num'>{n}</td></tr>"
                   for t, n in taken)
    return ('<p>(The drawing needs Graphviz: <code>pip install \'fsm-agent[diagrams]\'</code>; '
            'the transitions taken:)</p><table id="diagram"><tr><th>transition</th>'
            f"<th>times</th></tr>{rows}</table>")


def _inline_svg(svg: bytes | str) -> str:
    text = svg.decode("utf-8", "replace") if isinstance(svg, bytes) else svg
    start = text.find("<svg")
    return text[start:] if start >= 0 else ""


def render_html(
    a: JobAnalysis,
    *,
    diagram_svg: bytes | str | None = None,
    taken: Sequence[tuple[str, int]] = (),
    sources: Sequence[str] = (),
    title: str | None = None,
    log_dirs: Sequence[str] = (),
) -> str:
    """The report page for ``a``. ``diagram_svg``: the spec's diagram with the path (inlined);
    ``taken``: the transitions taken, shown as a table when there is no drawing; ``log_dirs``:
    the directories whose files (hung workers' stacks, the tail of the root cause's stderr) the
    page may embed; a file the traces name elsewhere is only named."""
    name = title or f"fsm-agent report: {a.spec_name or 'job'}"
    budget = (f"{a.restarts_used} / {a.restart_budget}" if a.restart_budget is not None
              else str(a.restarts_used))
    budget += "".join(f"; {n}: {k}" for n, k in a.budget_restarts)
    cards = [
        ("outcome", a.outcome),
        ("wall time", format_elapsed(max(0.0, a.end - a.start))),
        ("agents", str(len(a.lanes))),
        ("restarts used / budget", budget),
        ("incidents", str(len(a.incidents))),
        ("time lost", format_elapsed(a.lost)),
    ]
    card_html = "".join(f'<div class="card" data-key="{_e(k)}"><div class="v">{_e(v)}</div>'
                        f'<div class="k">{_e(k)}</div></div>' for k, v in cards)
    hang_incidents: list[Incident] = [i for i in a.incidents if i.stacks]
    stacks = [s for i in hang_incidents for s in i.stacks]
    files = "".join(f"<li><code>{_e(p)}</code></li>" for p in a.error_files)
    warn = "".join(f'<p class="warn">warning: {_e(w)}</p>' for w in a.warnings)
    body = [
        f"<h1>{_e(name)} <span class='badge b-{_e(a.outcome)}' id='outcome'>{_e(a.outcome)}"
        "</span></h1>",
        f'<p class="meta">run {_e(a.run_id or "?")} · started {_e(_clock(a.start))} · '
        f"{_e(len(sources))} trace file(s): {_e(', '.join(os.path.basename(s) for s in sources))}"
        + (f" · --log-dir {_e(', '.join(log_dirs))}" if log_dirs else "") + "</p>",
        warn,
        f'<div class="cards">{card_html}</div>',
        "<h2>Root cause</h2>", _root_cause(a, log_dirs),
        "<h2>Timeline</h2>", _timeline(a),
        "<h2>Decisions</h2>", _incidents(a),
        "<h2>Time lost per cause</h2>", _lost(a),
        "<h2>Spec and the path taken</h2>",
        _diagram(_inline_svg(diagram_svg) if diagram_svg else None, taken),
    ]
    if a.drains:
        body += ["<h2>Preemption</h2>", _drains(a)]
    if stacks:
        body += ["<h2>Stacks of hung workers</h2>", _stack_section(stacks, log_dirs)]
    if files:
        body += ["<h2>Error files</h2>", f"<ul id='error-files'>{files}</ul>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(name)}</title><style>{_CSS}</style></head><body><main>"
            + "".join(body) + "</main></body></html>\n")
