"""State diagrams drawn from a ``Spec`` (never from a running machine).

``transitions``' GraphMachine re-styles its graph on every trigger, which is fine for drawing and
wrong for a runtime; here the diagram is a pure function of the spec (and, optionally, of a
trace whose path is highlighted). Every edge reads ``trigger [guards] / actions`` (``!g`` for an
``unless`` guard, ``then x`` for an ``after`` action), states show their entry and exit actions,
the ``WorkerState`` they report (when not their own name) and their timer, the initial state has
the start dot and final states are marked (transitions' flat backends ignore ``final``). A
failure-policy table is one choice point whose outgoing edges are its rules, numbered in the
order they are tried; the legend lists the parameters, the rule table and the spec's own guards
and actions (``_model`` decides what is drawn, this module how).

Mermaid and DOT are text and need nothing installed. SVG and PNG are rendered by Graphviz through
the ``pygraphviz`` wheel, which bundles it (``pip install 'fsm-agent[diagrams]'``); without it
they raise ``DiagramEngineMissing`` rather than fall back to another format.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .._core._spec import Spec, StateSpec
from ._model import CHOICE, Edge, drawn_edges, edge_label, legend, state_lines

if TYPE_CHECKING:
    from ..trace._replay import ReplayResult

__all__ = [
    "FORMATS",
    "DiagramEngineMissing",
    "Highlight",
    "edge_label",
    "highlight_from_replay",
    "render",
    "to_dot",
    "to_mermaid",
]

Format = Literal["mermaid", "dot", "svg", "png"]
FORMATS: tuple[str, ...] = ("mermaid", "dot", "svg", "png")
EXTENSIONS: Mapping[str, str] = {".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot",
                                 ".gv": "dot", ".svg": "svg", ".png": "png"}
EXTRA = "diagrams"
SOURCE_MARK = "fsm-agent diagram source sha256:"


class DiagramEngineMissing(RuntimeError):
    """The format asked for needs an optional package that is not installed."""


@attrs.frozen
class Highlight:
    """The path a trace took, to draw on the spec's diagram.

    ``counts``: (transition index, source) -> times taken. ``extra``: moves the spec has no
    transition for (an action raised, say), as (source, trigger, dest) -> (times, why).
    ``final``: the state the trace ended in. ``note``: a line for the diagram's title (the
    divergence, if any).
    """

    counts: Mapping[tuple[int, str], int] = attrs.field(factory=dict)
    extra: Mapping[tuple[str, str, str], tuple[int, str]] = attrs.field(factory=dict)
    visited: frozenset[str] = frozenset()
    final: str | None = None
    note: str = ""
    #: The spec's parameters in force during the run (a trace header's, in spec syntax).
    params: Mapping[str, Any] = attrs.field(factory=dict)


def highlight_from_replay(res: ReplayResult) -> Highlight:
    """The ``Highlight`` of a replayed trace: its edge counts, extra moves and final state."""
    visited = {res.spec.initial}
    for rec in res.trace.records[: res.checked]:
        visited.add(rec.source)
        if rec.dest:
            visited.add(rec.dest)
    note = "" if res.ok else f"diverges: {res.divergence}"
    return Highlight(dict(res.edge_counts), dict(res.extra_moves), frozenset(visited),
                     res.final_state, note, dict(res.params))


def _state_lines(spec: Spec, s: StateSpec, values: Mapping[str, Any]) -> list[str]:
    return [text for _, text in state_lines(spec, s, values)]


def _layout_hints(spec: Spec) -> list[str]:
    """DOT statements that keep the outcomes on the bottom row.

    Left to ``dot`` alone, a state reached both directly and through a detour (STOPPED) shares
    the outcomes' row, and its edges' labels then sit on top of each other. An invisible edge
    from each working state that has no transition into a final state pushes the finals below
    it (states that do have one are above the finals already; more hints only widen the
    drawing). They cannot make a cycle: final states have no outgoing transitions.
    """
    finals = [s.name for s in spec.states if s.final]
    out = []
    if finals:
        out.append("    { rank=same; " + " ".join(_q(n) for n in finals) + " }")
    for s in spec.states:
        to_final = any(t.dest in finals for t in spec.outgoing(s.name))
        if not s.final and not s.initial and not to_final:
            for f in finals:
                out.append(f"    {_q(s.name)} -> {_q(f)} [style=invis, weight=0];")
    return out


def _ordered_states(spec: Spec) -> list[StateSpec]:
    # Initial first, final last: both backends place earlier declarations first when they can.
    return sorted(spec.states, key=lambda s: (not s.initial, s.final))


def _values(spec: Spec, params: Mapping[str, Any] | None,
            highlight: Highlight | None) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The parameter values to show, and the ones given (None: the defaults are shown)."""
    given = params if params is not None else (highlight.params if highlight is not None
                                               and highlight.params else None)
    return spec.bind(given), given


def _taken(highlight: Highlight | None, e: Edge) -> int:
    if highlight is None:
        return 0
    return sum(highlight.counts.get(k, 0) for k in e.keys)


# --------------------------------------------------------------------------------------------
# Mermaid


def _mermaid_text(text: str) -> str:
    # Mermaid ends a label at a newline, and ';' or '#' can start a statement or an entity.
    return re.sub(r"[\n;#:]", " ", text).strip()


def _mermaid_legend(spec: Spec, values: Mapping[str, Any],
                    given: Mapping[str, Any] | None) -> list[str]:
    leg = legend(spec, values, given)
    out = []
    if leg.params:
        shown = "in force" if given is not None else "default"
        out.append(f"parameters ({shown})")
        for row in leg.params:
            value = row[4] if given is not None else row[2]  # in force, else the default
            out.append(f"{row[0]} = {value}")
    for role, name, what, _ in leg.vocabulary:
        out.append(f"{role} {name} = {what}")
    if leg.budget:
        out.append(f"restart budget - {leg.budget_short}")
    for name, short, _ in leg.named_budgets:
        out.append(f"budget {name} - {short}")
    if leg.policy:
        out.append("failure policy (the diamond) - rules numbered in the order they are tried, "
                   "the first that matches decides")
    return [_mermaid_text(x) for x in out]


def to_mermaid(spec: Spec, highlight: Highlight | None = None,
               params: Mapping[str, Any] | None = None) -> str:
    """The spec as a Mermaid ``stateDiagram-v2`` (renders on GitHub).

    ``params``: parameter values to show instead of the defaults (a replayed trace's header
    gives its own through ``highlight``)."""
    values, given = _values(spec, params, highlight)
    lines = ["---", f"title: {_mermaid_text(spec.name)}", "---", "stateDiagram-v2",
             "    direction TB"]
    lines += ["    classDef initial font-weight:bold,stroke-width:2px",
              "    classDef final stroke-width:3px,font-weight:bold"]
    if highlight is not None:
        lines += ["    classDef visited fill:#fde9c9,stroke:#d97706",
                  "    classDef ended fill:#d97706,color:#ffffff,stroke:#7c2d12,stroke-width:3px"]
    for s in _ordered_states(spec):
        texts = _state_lines(spec, s, values)
        if texts:
            # Declared with its name first: a state with only `ID : text` lines shows the
            # text *instead of* its name.
            lines.append(f'    state "{s.name}" as {s.name}')
        for text in texts:
            lines.append(f"    {s.name} : {_mermaid_text(text)}")
    edges = drawn_edges(spec)
    if any(e.dest == CHOICE for e in edges):
        lines.append(f"    state {CHOICE} <<choice>>")
    lines.append(f"    [*] --> {spec.initial}")
    for e in edges:
        label = _mermaid_text(e.label())
        n = _taken(highlight, e)
        if n:
            label += f" ✔ {n}×"
        lines.append(f"    {e.source} --> {e.dest} : {label}")
    if highlight is not None:
        for (source, trigger, dest), (n, why) in sorted(highlight.extra.items()):
            lines.append(f"    {source} --> {dest} : {_mermaid_text(f'{trigger} ({why})')} "
                         f"✔ {n}×")
    for s in _ordered_states(spec):
        if s.final:
            lines.append(f"    {s.name} --> [*]")
    notes = _mermaid_legend(spec, values, given)
    if notes:
        lines.append(f"    note left of {spec.initial}")
        lines += [f"        {x}" for x in notes]
        lines.append("    end note")
    lines.append(f"    class {spec.initial} initial")
    finals = [s.name for s in _ordered_states(spec) if s.final]
    if finals:
        lines.append(f"    class {','.join(finals)} final")
    if highlight is not None:
        visited = sorted(highlight.visited - {highlight.final or ""})
        if visited:
            lines.append(f"    class {','.join(visited)} visited")
        if highlight.final:
            lines.append(f"    class {highlight.final} ended")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Graphviz


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _html(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _wrap(text: str, width: int = 34) -> list[str]:
    words, out, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            out.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    if line:
        out.append(line)
    return out


_FONT = "Helvetica"
_TAKEN = "#c2410c"
_IDLE = "#9ca3af"
_RULE = "#7c3aed"
_TIMER = "#b45309"
_GREY = "#4b5563"
_LINE_COLORS = {"reports": _GREY, "timer": _TIMER, "action": "#1e3a8a"}


def _table(head: tuple[str, ...], rows: tuple[tuple[str, ...], ...], title: str, *,
           note: str = "", bold: int | None = 0, wrap: int = 44,
           strong: frozenset[tuple[int, int]] = frozenset()) -> str:
    """An HTML-like Graphviz table: a title row, a header row, the rows (long cells wrapped,
    column ``bold`` and the (row, column) cells in ``strong`` in bold)."""
    width = len(head)
    cell = '<td align="left" balign="left">{}</td>'

    def shown(i: int, c: str) -> str:
        if i == bold:
            return f"<b>{_html(c)}</b>"
        return "<br/>".join(_html(x) for x in _wrap(c, wrap)) or " "
    out = ['<table border="0" cellborder="1" cellspacing="0" cellpadding="3" '
           'color="#d1d5db">',
           f'<tr><td colspan="{width}" align="left" border="0"><b>{_html(title)}</b>'
           + (f' <font color="{_GREY}">{_html(note)}</font>' if note else "") + "</td></tr>",
           "<tr>" + "".join(f'<td align="left" bgcolor="#f3f4f6"><b>{_html(h)}</b></td>'
                            for h in head) + "</tr>"]
    for r, row in enumerate(rows):
        out.append("<tr>" + "".join(cell.format(f"<b>{shown(i, c)}</b>" if (r, i) in strong
                                                else shown(i, c)) for i, c in enumerate(row))
                   + "</tr>")
    out.append("</table>")
    return "".join(out)


def _legend_html(spec: Spec, values: Mapping[str, Any], given: Mapping[str, Any] | None) -> str:
    leg = legend(spec, values, given)
    blocks = []
    if leg.params:
        note, strong = "", frozenset[tuple[int, int]]()
        if given is not None:
            # The values that differ from the default stand out.
            note = "(in force: the values this diagram was drawn with, changed ones in bold)"
            strong = frozenset((r, 4) for r, row in enumerate(leg.params) if row[4] != row[2])
        blocks.append(_table(leg.params_head, leg.params, "parameters", note=note,
                             strong=strong))
    right = []
    if leg.policy:
        right.append(_table(("#", "rule", "when", "then", "why"), leg.policy,
                            "failure policy", note=leg.policy_note, bold=1, wrap=36))
    if leg.vocabulary:
        right.append(_table(("kind", "name", "is", "meaning"), leg.vocabulary,
                            "this spec's guards and actions", bold=1, wrap=36))
    if leg.budget:
        budget = "<br/>".join(_html(x) for x in _wrap(leg.budget, 90))
        right.append(f'<table border="0"><tr><td align="left" balign="left"><b>restart budget'
                     f"</b><br/>{budget}</td></tr></table>")
    for name, _, long in leg.named_budgets:
        text = "<br/>".join(_html(x) for x in _wrap(long, 90))
        right.append(f'<table border="0"><tr><td align="left" balign="left"><b>budget '
                     f"{_html(name)}</b><br/>{text}</td></tr></table>")
    if right:
        blocks.append('<table border="0" cellspacing="6">' + "".join(
            f"<tr><td>{b}</td></tr>" for b in right) + "</table>")
    if not blocks:
        return ""
    return ('<font point-size="10"><table border="0" cellspacing="10"><tr>'
            + "".join(f'<td valign="top">{b}</td>' for b in blocks) + "</tr></table></font>")


def to_dot(spec: Spec, highlight: Highlight | None = None,
           params: Mapping[str, Any] | None = None) -> str:
    """The spec as Graphviz DOT text (``dot`` layout, top to bottom).

    ``params``: parameter values to show instead of the defaults (a replayed trace's header
    gives its own through ``highlight``)."""
    values, given = _values(spec, params, highlight)
    title = f"<b>{_html(spec.name)}</b>"
    if spec.path and spec.path != "<string>":
        # The file name only: a committed diagram must not depend on where the checkout lives.
        title += f'<br/><font point-size="9">{_html(os.path.basename(spec.path))}</font>'
    title += (f'<br/><font point-size="9" color="{_GREY}">edges: trigger [guard &amp; !unless] '
              "/ actions, then after-actions · always: taken on entering the state · "
              "double border: final state")
    edges = drawn_edges(spec)
    if any(e.dest == CHOICE for e in edges):
        title += (" · ◇: the failure policy, its rules numbered in the order they are "
                  "tried")
    if any(s.timeout is not None for s in spec.states):
        title += " · timeout: fired when the state's timer expires"
    title += "</font>"
    if highlight is not None and highlight.note:
        title += f'<br/><font point-size="10" color="#b91c1c">{_html(highlight.note)}</font>'
    leg = _legend_html(spec, values, given)
    label = (f'<table border="0"><tr><td>{title}</td></tr><tr><td>{leg}</td></tr></table>'
             if leg else title)
    out = [
        f"digraph {_q(spec.name)} {{",
        f'    graph [rankdir=TB, fontname="{_FONT}", fontsize=16, labelloc=t, nodesep=0.5, '
        f'ranksep=0.6, newrank=true, label=<{label}>];',
        f'    node [shape=box, style="rounded,filled", fillcolor="#eef2ff", color="#3730a3", '
        f'fontname="{_FONT}", fontsize=12, margin="0.15,0.08"];',
        f'    edge [fontname="{_FONT}", fontsize=10, color="#374151", arrowsize=0.8];',
        '    "__start" [shape=circle, style=filled, fillcolor=black, color=black, label="", '
        "width=0.18, height=0.18, fixedsize=true];",
    ]
    for s in _ordered_states(spec):
        parts = [f"<b>{_html(s.name)}</b>"]
        tags = [w for w, on in (("initial", s.initial), ("final", s.final)) if on]
        if tags:
            parts.append(f'<font point-size="9"><i>{" · ".join(tags)} state</i></font>')
        for kind, text in state_lines(spec, s, values):
            text_html = f"<i>{_html(text)}</i>" if kind == "reports" else _html(text)
            parts.append(f'<font point-size="10" color="{_LINE_COLORS[kind]}">{text_html}'
                         "</font>")
        for text in _wrap(s.description):
            parts.append(f'<font point-size="9" color="{_GREY}">{_html(text)}</font>')
        attrs_ = [f"label=<{'<br/>'.join(parts)}>"]
        if s.final:
            attrs_ += ["peripheries=2", 'fillcolor="#ecfdf5"' if s.name == "SUCCEEDED"
                       else 'fillcolor="#fef2f2"']
        if s.timeout is not None:
            attrs_.append(f'color="{_TIMER}"')
        if highlight is not None:
            if s.name == highlight.final:
                attrs_ += [f'fillcolor="{_TAKEN}"', 'fontcolor="white"', "penwidth=3"]
                parts_final = [re.sub(r'color="#[0-9a-f]{6}"', 'color="white"', p)
                               for p in parts]
                parts_final.append('<font point-size="10"><b>ended here</b></font>')
                attrs_[0] = f"label=<{'<br/>'.join(parts_final)}>"
            elif s.name in highlight.visited:
                attrs_ += ['color="#c2410c"', "penwidth=2"]
            else:
                attrs_ += [f'color="{_IDLE}"', f'fontcolor="{_IDLE}"']
                idle = [re.sub(r'color="#[0-9a-f]{6}"', f'color="{_IDLE}"', p) for p in parts]
                attrs_[0] = f"label=<{'<br/>'.join(idle)}>"
        out.append(f"    {_q(s.name)} [{', '.join(attrs_)}];")
    if any(e.dest == CHOICE for e in edges):
        used = highlight is not None and any(_taken(highlight, e) for e in edges
                                             if e.dest == CHOICE)
        color = _TAKEN if used else _IDLE if highlight is not None else _RULE
        out.append(f'    {_q(CHOICE)} [shape=diamond, style=filled, fillcolor="#f5f3ff", '
                   f'color="{color}", label="", width=0.35, height=0.35, fixedsize=true, '
                   f'xlabel=<<font point-size="9" color="{_RULE}">failure<br/>policy</font>>];')
    out += _layout_hints(spec)
    out.append(f"    \"__start\" -> {_q(spec.initial)};")
    for e in edges:
        label = e.label("\n")
        eattrs: list[str] = []
        if e.kind == "rule":
            eattrs += [f'color="{_RULE}"', f'fontcolor="{_RULE}"']
        if e.timeout:
            eattrs += [f'color="{_TIMER}"', f'fontcolor="{_TIMER}"', "style=dashed"]
        if highlight is not None:
            n = _taken(highlight, e)
            eattrs = [a for a in eattrs if a.startswith("style=")]
            if n:
                label += f"\n✔ taken {n}×"
                eattrs += [f'color="{_TAKEN}"', f'fontcolor="{_TAKEN}"', "penwidth=2.5"]
            else:
                eattrs += [f'color="{_IDLE}"', f'fontcolor="{_IDLE}"']
        eattrs.insert(0, f"label={_q(label)}")
        out.append(f"    {_q(e.source)} -> {_q(e.dest)} [{', '.join(eattrs)}];")
    if highlight is not None:
        for (source, trigger, dest), (n, why) in sorted(highlight.extra.items()):
            label = f"{trigger}\n({why})\n✔ taken {n}×"
            out.append(f"    {_q(source)} -> {_q(dest)} [label={_q(label)}, style=dashed, "
                       f'color="#b91c1c", fontcolor="#b91c1c", penwidth=2];')
    out.append("}")
    return "\n".join(out) + "\n"


def source_digest(dot: str) -> str:
    """The digest an SVG carries of the DOT it was rendered from (for the staleness check)."""
    return hashlib.sha256(dot.encode("utf-8")).hexdigest()


def _graphviz(dot: str, fmt: str) -> bytes:
    try:
        import pygraphviz  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as e:
        raise DiagramEngineMissing(
            f"{fmt.upper()} output needs Graphviz through pygraphviz, which is not installed "
            f"({e}); install it with: pip install 'fsm-agent[{EXTRA}]' (the pygraphviz wheel "
            "bundles Graphviz), or ask for --format mermaid or dot"
        ) from None
    graph = pygraphviz.AGraph(string=dot)
    with _without_fontconfig_noise():
        data = graph.draw(format=fmt, prog="dot")
    assert isinstance(data, bytes)
    return data


@contextlib.contextmanager
def _without_fontconfig_noise() -> Iterator[None]:
    """Drop the Fontconfig warnings Graphviz's C code prints, keep anything else it says.

    The wheel's bundled fontconfig is older than many systems' configuration files and warns
    about elements it does not know on every render; the warning is harmless but reads like an
    error on every ``fsm-agent diagram`` call.
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield  # stderr is not a real file (captured): nothing reaches a terminal anyway
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode("utf-8", "replace").splitlines(True)
                    if not line.startswith("Fontconfig warning")]
            if kept:
                sys.stderr.write("".join(kept))


def render(
    spec: Spec, fmt: str = "mermaid", highlight: Highlight | None = None,
    params: Mapping[str, Any] | None = None,
) -> str | bytes:
    """The spec's diagram: ``str`` for mermaid and dot, ``bytes`` for svg and png.

    ``params``: values of the spec's parameters to show as in force (the legend shows the
    defaults otherwise, or the trace's when ``highlight`` comes from one); ``SpecError`` for an
    unknown name or a bad value."""
    if fmt == "mermaid":
        return to_mermaid(spec, highlight, params)
    if fmt == "dot":
        return to_dot(spec, highlight, params)
    if fmt in ("svg", "png"):
        dot = to_dot(spec, highlight, params)
        data = _graphviz(dot, fmt)
        if fmt == "svg":
            # The digest lets a test tell a stale SVG without Graphviz (whose version shows in
            # the bytes) being installed.
            mark = f"<!-- {SOURCE_MARK} {source_digest(dot)} -->\n".encode()
            head, sep, rest = data.partition(b"?>\n")
            data = head + sep + mark + rest if sep else mark + data
        return data
    raise ValueError(f"unknown diagram format {fmt!r} (formats: {', '.join(FORMATS)})")


def svg_source_digest(svg: bytes | str) -> str | None:
    """The DOT digest recorded in an SVG made by ``render``, or None."""
    text = svg.decode("utf-8", "replace") if isinstance(svg, bytes) else svg
    m = re.search(re.escape(SOURCE_MARK) + r" ([0-9a-f]{64})", text)
    return m.group(1) if m else None


def regenerate(
    specs: Sequence[Spec], outdir: str, *, check: bool = False
) -> list[str]:
    """Write ``NAME.mmd`` and ``NAME.svg`` for every spec into ``outdir``.

    With ``check``, write nothing and return the files that are missing or stale (the SVG is
    compared by the digest of its DOT source, so the check does not need Graphviz). Without it,
    return the files written.
    """
    touched: list[str] = []
    for spec in specs:
        mmd_path = os.path.join(outdir, f"{spec.name}.mmd")
        svg_path = os.path.join(outdir, f"{spec.name}.svg")
        mmd = to_mermaid(spec)
        if check:
            if _read(mmd_path) != mmd.encode("utf-8"):
                touched.append(mmd_path)
            old = _read(svg_path)
            if old is None or svg_source_digest(old) != source_digest(to_dot(spec)):
                touched.append(svg_path)
            continue
        svg = render(spec, "svg")
        os.makedirs(outdir, exist_ok=True)
        for path, data in ((mmd_path, mmd.encode("utf-8")), (svg_path, svg)):
            assert isinstance(data, bytes)
            if _read(path) != data:
                with open(path, "wb") as f:
                    f.write(data)
                touched.append(path)
    return touched


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
