"""What differs in behaviour between two specs: transitions, state actions, outcomes, metrics,
and the restart-policy constructs (``_diff_policy``: rules, timers, parameters, the budget, the
spec's own guards and actions, reported states).

Transitions are compared edge by edge, one (source, trigger, guards) at a time, so two specs
that group the same edges into different YAML entries (a list of triggers against one entry per
trigger) do not differ. When both specs have a failure-policy table, the transitions it compiles
into are compared as rules (by name, in order) instead; when only one has one, they are compared
edge by edge like the others (the same behaviour written as plain transitions does not differ),
and the table is listed as added or removed. Descriptions and line numbers are not behaviour and
are not compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .._core._spec import Spec, StateSpec
from ._diff_policy import Change, other_changes, policy_changes, state_details, state_text

__all__ = ["Change", "SpecDiff", "diff_specs", "format_diff"]


@attrs.frozen
class SpecDiff:
    """The differences from spec ``a`` to spec ``b``, in the order a reader wants them."""

    a: Spec
    b: Spec
    changes: tuple[Change, ...]

    @property
    def same(self) -> bool:
        return not self.changes


@attrs.frozen
class _Edge:
    source: str
    trigger: str
    guards: tuple[str, ...]
    unless: tuple[str, ...]
    dest: str
    actions: tuple[str, ...]
    after: tuple[str, ...]
    line: int | None
    rule: str | None = None

    @property
    def condition(self) -> tuple[frozenset[str], frozenset[str]]:
        return frozenset(self.guards), frozenset(self.unless)

    def cond_text(self) -> str:
        conds = [*sorted(self.guards), *(f"!{g}" for g in sorted(self.unless))]
        return f"[{' & '.join(conds)}]" if conds else ""

    def name(self) -> str:
        cond = f" {self.cond_text()}" if self.guards or self.unless else ""
        rule = f" (rule {self.rule})" if self.rule else ""
        return f"{self.source} --{self.trigger}{cond}--> {self.dest}{rule}"

    def effect(self) -> str:
        parts = []
        if self.actions:
            parts.append("/ " + ", ".join(self.actions))
        if self.after:
            parts.append(("" if self.actions else "/ ") + "then " + ", ".join(self.after))
        return " ".join(parts)


def _edges(spec: Spec, *, rules: bool) -> list[_Edge]:
    """The spec's edges; with ``rules`` false, without those its failure policy compiles into."""
    return [_Edge(source, trigger, t.guards, t.unless, dest, t.actions, t.after, t.line, t.rule)
            for trigger, source, dest, t in spec.edges() if rules or t.rule is None]


def _list_change(what: str, old: Sequence[str], new: Sequence[str]) -> list[str]:
    """``actions: - a, + b`` lines, or an order change, or nothing."""
    if tuple(old) == tuple(new):
        return []
    removed = [x for x in old if x not in new]
    added = [x for x in new if x not in old]
    if not removed and not added:
        return [f"{what}: reordered {', '.join(old)} -> {', '.join(new)}"]
    bits = [f"- {x}" for x in removed] + [f"+ {x}" for x in added]
    return [f"{what}: {', '.join(bits)}  ({', '.join(old) or 'none'} -> "
            f"{', '.join(new) or 'none'})"]


def _edge_details(a: _Edge, b: _Edge) -> list[str]:
    out = []
    if a.condition != b.condition:
        out.append(f"guards: {a.cond_text() or 'none'} -> {b.cond_text() or 'none'}")
    if a.dest != b.dest:
        out.append(f"destination: {a.dest} -> {b.dest}")
    out += _list_change("actions", a.actions, b.actions)
    out += _list_change("after", a.after, b.after)
    return out


def _outcome(spec: Spec, s: StateSpec) -> str:
    raising = [name for name in s.enter
               if (adef := spec.vocabulary.actions.get(name)) is not None and adef.terminal]
    if raising:
        return f"raises ({', '.join(raising)})"
    return "returns the result"


def _state_changes(a: Spec, b: Spec) -> list[Change]:
    out = []
    names = [s.name for s in a.states] + [s.name for s in b.states if s.name not in
                                          {x.name for x in a.states}]
    for name in names:
        sa = next((s for s in a.states if s.name == name), None)
        sb = next((s for s in b.states if s.name == name), None)
        if sa is None or sb is None:
            what = state_text(b, sb) if sb is not None else state_text(a, sa) if sa else []
            out.append(Change("added" if sa is None else "removed", "state", name,
                              tuple(what), sa.line if sa else None, sb.line if sb else None))
            continue
        details = []
        for flag in ("initial", "final"):
            if getattr(sa, flag) != getattr(sb, flag):
                details.append(f"{flag}: {getattr(sa, flag)} -> {getattr(sb, flag)}")
        details += _list_change("entry", sa.enter, sb.enter)
        details += _list_change("exit", sa.exit, sb.exit)
        if sa.final and sb.final:
            oa, ob = _outcome(a, sa), _outcome(b, sb)
            if oa != ob:
                details.append(f"outcome: {oa} -> {ob}")
        details += state_details(a, sa, b, sb)
        if details:
            out.append(Change("changed", "state", name, tuple(details), sa.line, sb.line))
    return out


def _transition_changes(a: Spec, b: Spec) -> list[Change]:
    # Two tables are compared rule by rule (policy_changes); a table on one side only, edge by
    # edge with the other side's transitions.
    by_rule = a.policy is not None and b.policy is not None
    ea, eb = _edges(a, rules=not by_rule), _edges(b, rules=not by_rule)
    out: list[Change] = []
    unmatched_b = list(eb)
    pending_a: list[_Edge] = []
    for x in ea:
        same = next((y for y in unmatched_b if (y.source, y.trigger, y.condition)
                     == (x.source, x.trigger, x.condition)), None)
        if same is None:
            pending_a.append(x)
            continue
        unmatched_b.remove(same)
        details = _edge_details(x, same)
        if details:
            out.append(Change("changed", "transition", x.name(), tuple(details), x.line,
                              same.line))
    for x in pending_a:
        # One edge on the same source and trigger left on each side: its guards changed.
        mine = [y for y in pending_a if (y.source, y.trigger) == (x.source, x.trigger)]
        theirs = [y for y in unmatched_b if (y.source, y.trigger) == (x.source, x.trigger)]
        if len(mine) == 1 and len(theirs) == 1:
            unmatched_b.remove(theirs[0])
            out.append(Change("changed", "transition", x.name(),
                              tuple(_edge_details(x, theirs[0])), x.line, theirs[0].line))
        else:
            out.append(Change("removed", "transition", f"{x.name()} {x.effect()}".strip(),
                              (), x.line, None))
    for y in unmatched_b:
        out.append(Change("added", "transition", f"{y.name()} {y.effect()}".strip(), (), None,
                          y.line))
    return out


def _named(kind: str, old: Iterable[str], new: Iterable[str]) -> list[Change]:
    old_l, new_l = list(old), list(new)
    return ([Change("removed", kind, x) for x in old_l if x not in new_l]
            + [Change("added", kind, x) for x in new_l if x not in old_l])


def diff_specs(a: Spec, b: Spec) -> SpecDiff:
    """Every behavioural difference from ``a`` to ``b``."""
    changes = (_transition_changes(a, b) + policy_changes(a, b) + _state_changes(a, b)
               + other_changes(a, b))
    changes += _named("trigger", a.triggers, b.triggers)
    changes += _named("metric", (f"{m.name} = {m.value}" for m in a.metrics),
                      (f"{m.name} = {m.value}" for m in b.metrics))
    return SpecDiff(a, b, tuple(changes))


_MARK = {"added": "+", "removed": "-", "changed": "~"}
#: The order a reader wants the elements in, and their headings.
_HEADINGS = {"transition": "transitions", "policy": "failure policy", "rule": "rules",
             "state": "states", "param": "parameters", "guard": "guards", "action": "actions",
             "budget": "restart budget", "trigger": "triggers", "metric": "metrics"}


def format_diff(d: SpecDiff, paths: tuple[str, str] | None = None) -> str:
    """The diff as text: a header, then one block per changed element.

    ``paths``: how to show the two files (default: the specs' own paths).
    """
    pa, pb = paths or (d.a.path, d.b.path)
    lines = [f"--- {d.a.name} ({pa})", f"+++ {d.b.name} ({pb})"]
    if d.same:
        lines.append("no differences in behaviour")
        return "\n".join(lines) + "\n"
    for element, heading in _HEADINGS.items():
        group = [c for c in d.changes if c.element == element]
        if not group:
            continue
        lines.append(f"{heading}:")
        for c in group:
            where = ", ".join(p for p in (
                f"{d.a.name} line {c.line_a}" if c.line_a else "",
                f"{d.b.name} line {c.line_b}" if c.line_b else "") if p)
            lines.append(f"  {_MARK[c.kind]} {c.name}" + (f"  ({where})" if where else ""))
            lines += [f"      {text}" for text in c.details]
    return "\n".join(lines) + "\n"
