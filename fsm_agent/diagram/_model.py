"""What a spec's diagram shows, independent of the format it is written in.

Both the Mermaid and the DOT writer draw the same things from here: the edges (a failure-policy
table drawn as one choice point, its rules as the edges leaving it, instead of one edge per rule,
source and budget case), the lines each state shows (what it reports, its timer, its entry and
exit actions), and the legend's tables (parameters, the rule table, the spec's own guards and
actions, the restart budget).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._core._budgets import BUDGET_KINDS
from .._core._params import ParamSpec, Ref, format_param, format_value
from .._core._policy import rule_guard
from .._core._spec import PolicySpec, Spec, StateSpec, TimeoutSpec
from .._core._spec import TransitionSpec as Transition

__all__ = [
    "CHOICE",
    "Edge",
    "Legend",
    "drawn_edges",
    "edge_label",
    "legend",
    "state_lines",
]

#: The id of the node that stands for the failure-policy table (a UML choice point).
CHOICE = "failure_policy"


@attrs.frozen
class Edge:
    """One drawn edge. ``keys``: the (transition index, source) pairs it stands for (their
    counts add up when a trace is drawn); ``kind``: ``plain``, ``policy`` (into the choice
    point) or ``rule`` (out of it)."""

    source: str
    dest: str
    event: str
    effect: str
    keys: tuple[tuple[int, str], ...]
    kind: str = "plain"
    timeout: bool = False

    def label(self, sep: str = " ") -> str:
        return self.event + (sep + self.effect if self.effect else "")


def _conditions(t: Transition) -> list[str]:
    return [*t.guards, *(f"!{g}" for g in t.unless)]


def _effect(actions: Iterable[str], after: Iterable[str] = ()) -> str:
    actions, after = list(actions), list(after)
    effect = ""
    if actions:
        effect = "/ " + ", ".join(actions)
    if after:
        effect = (effect + " " if effect else "/ ") + "then " + ", ".join(after)
    return effect


def edge_label(t: Transition, *, sep: str = " ") -> str:
    """``trigger [guards] / actions then after``; ``sep`` goes between the event and the effect."""
    text = "|".join(t.triggers)
    conds = _conditions(t)
    if conds:
        text += f" [{' & '.join(conds)}]"
    effect = _effect(t.actions, t.after)
    return text + (sep + effect if effect else "")


def _decided(spec: Spec, source: str, t: Transition) -> bool:
    """Whether this edge is one of the failure-policy table's (drawn through the choice)."""
    p = spec.policy
    return p is not None and t.rule is not None and (t.triggers[0], source) in p.on


def drawn_edges(spec: Spec) -> list[Edge]:
    """Every edge to draw, in file order; the failure policy's through one choice point."""
    out: list[Edge] = []
    policy = spec.policy
    rules: dict[tuple[str, bool, str, tuple[str, ...]], list[tuple[int, str]]] = {}
    ins: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for t in spec.transitions:
        for source in t.sources:
            if policy is not None and _decided(spec, source, t):
                assert t.rule is not None
                spent = rule_guard(spec, t.rule) in t.unless
                rules.setdefault((t.rule, spent, t.dest, t.actions), []).append((t.index, source))
                ins.setdefault((t.triggers[0], source), []).append((t.index, source))
                continue
            conds = _conditions(t)
            event = "|".join(t.triggers) + (f" [{' & '.join(conds)}]" if conds else "")
            out.append(Edge(source, t.dest, event, _effect(t.actions, t.after),
                            ((t.index, source),), timeout="timeout" in t.triggers))
    if policy is None or not rules:
        return out
    for (trigger, source), keys in ins.items():
        out.append(Edge(source, CHOICE, trigger, "", tuple(keys), "policy"))
    number = {r.name: i for i, r in enumerate(policy.rules, start=1)}
    when = {r.name: r.when for r in policy.rules}
    for (rule, spent, dest, actions), keys in rules.items():
        conds = list(when[rule])
        outcome = next((r.then for r in policy.rules if r.name == rule), "")
        if policy.outcomes[outcome].restarts:
            conds.append(("!" if spent else "") + rule_guard(spec, rule))
        event = f"{number[rule]}. {rule}" + (f" [{' & '.join(conds)}]" if conds else "")
        out.append(Edge(CHOICE, dest, event, _effect(actions), tuple(keys), "rule"))
    return out


# --------------------------------------------------------------------------------------------
# Values


def _types(spec: Spec) -> dict[str, str]:
    return {p.name: p.type for p in spec.params}


def ref_text(spec: Spec, ref: Ref, values: Mapping[str, Any], type_name: str = "duration"
             ) -> str:
    """A spec value: a literal (``30s``), or a parameter with its value (``pause = 30s``)."""
    if ref.name is None:
        return format_param(type_name, ref.value)
    if ref.name in values:
        return f"{ref.name} = {format_param(_types(spec).get(ref.name, ''), values[ref.name])}"
    return ref.name  # max_restarts, exit_barrier_timeout: the agent's settings


def timer_lines(spec: Spec, timeout: TimeoutSpec, values: Mapping[str, Any]) -> list[str]:
    """What a state's timer says, in a few short lines."""
    if timeout.backoff is None:
        assert timeout.after is not None
        return [f"timeout after {ref_text(spec, timeout.after, values)}"]
    b = timeout.backoff
    lines = ["timeout after an exponential backoff",
             f"initial {ref_text(spec, b.initial, values)}, "
             f"factor {ref_text(spec, b.factor, values, 'float')}",
             f"max {ref_text(spec, b.max, values)}, "
             f"jitter {ref_text(spec, b.jitter, values, 'float')}"]
    if not (b.reset_after.name is None and b.reset_after.value == math.inf):
        lines.append(f"reset after {ref_text(spec, b.reset_after, values)} healthy")
    if not (b.reset_on_progress.name is None and b.reset_on_progress.value is False):
        lines.append(f"reset on progress {ref_text(spec, b.reset_on_progress, values, 'bool')}")
    return lines


def state_lines(spec: Spec, s: StateSpec, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, text) lines a state shows under its name: ``reports``, ``timer``, ``action``."""
    out: list[tuple[str, str]] = []
    if s.reported != s.name:
        out.append(("reports", f"reports {s.reported}"))
    if s.timeout is not None:
        out += [("timer", line) for line in timer_lines(spec, s.timeout, values)]
    if s.enter:
        out.append(("action", "entry / " + ", ".join(s.enter)))
    if s.exit:
        out.append(("action", "exit / " + ", ".join(s.exit)))
    return out


# --------------------------------------------------------------------------------------------
# Legend


@attrs.frozen
class Legend:
    """The tables under a diagram's title. Each row is a tuple of cells; empty when unused."""

    params: tuple[tuple[str, ...], ...] = ()
    params_head: tuple[str, ...] = ()
    policy: tuple[tuple[str, ...], ...] = ()
    policy_note: str = ""
    vocabulary: tuple[tuple[str, ...], ...] = ()
    budget: str = ""
    budget_short: str = ""
    #: The spec's named budgets: (name, short text, long text).
    named_budgets: tuple[tuple[str, str, str], ...] = ()


def _range_text(p: ParamSpec) -> str:
    if p.choices:
        return " | ".join(p.choices)
    if p.min is not None and p.max is not None:
        return f"{format_param(p.type, p.min)} to {format_param(p.type, p.max)}"
    if p.min is not None:
        return f">= {format_param(p.type, p.min)}"
    if p.max is not None:
        return f"<= {format_param(p.type, p.max)}"
    return ""


def _arg_text(spec: Spec, value: Any, values: Mapping[str, Any]) -> str:
    if isinstance(value, Ref):
        if value.name is None:
            return format_value(value.value)
        return value.name
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _policy_rows(spec: Spec, policy: PolicySpec) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for i, r in enumerate(policy.rules, start=1):
        o = policy.outcomes[r.then]
        then = f"{r.then} → {o.dest}"
        if o.restarts:
            give_up = policy.outcomes["give_up"]
            then += f" while {rule_guard(spec, r.name)}, else give_up → {give_up.dest}"
        rows.append((str(i), r.name, " & ".join(r.when) or "any failure", then, r.description))
    return rows


def legend(spec: Spec, values: Mapping[str, Any], given: Mapping[str, Any] | None = None
           ) -> Legend:
    """The legend's tables. ``given``: when parameters were set (a trace's header, the command
    line), the values in force get a column of their own."""
    head: tuple[str, ...] = ("parameter", "type", "default", "range")
    params: list[tuple[str, ...]] = []
    for p in spec.params:
        row: tuple[str, ...] = (p.name, p.type, format_param(p.type, p.default), _range_text(p))
        if given is not None:
            row = (*row, format_param(p.type, values[p.name]))
        params.append((*row, p.description))
    if given is not None:
        head = (*head, "in force")
    head = (*head, "meaning")
    policy_rows: list[tuple[str, ...]] = []
    note = ""
    if spec.policy is not None:
        policy_rows = _policy_rows(spec, spec.policy)
        where = ", ".join(f"{trig} in {src}" for trig, src in spec.policy.on)
        note = f"first matching rule wins, decides on {where}"
    vocab: list[tuple[str, ...]] = []
    for inst in (*spec.guard_defs, *spec.action_defs):
        if inst.kind == "all_of" and inst.name.startswith("rule_"):
            continue  # synthesized for a rule with several conditions: the rule table says it
        if inst.kind in BUDGET_KINDS:
            continue  # declared by a named budget: the budget line says it
        args = ", ".join(_arg_text(spec, v, values) if len(inst.args) == 1
                         else f"{k}={_arg_text(spec, v, values)}" for k, v in inst.args.items())
        vocab.append((inst.role, inst.name, f"{inst.kind}({args})", inst.description))
    budget = short = ""
    window = spec.budget.window
    if not (window.name is None and window.value == math.inf) or spec.budget.scope != "agent":
        counted = "by the whole job" if spec.budget.scope == "job" else "by each agent"
        try:
            whole = math.isinf(float(window.resolve(values)))
        except (KeyError, TypeError, ValueError):
            whole = False
        budget = (f"at most --max-restarts failure restarts within any window of "
                  f"{ref_text(spec, window, values)}"
                  + (" (inf: the whole job)" if whole else "")
                  + f", counted {counted}; membership restarts never count")
        short = f"--max-restarts within any {ref_text(spec, window, values)}"
    named: list[tuple[str, str, str]] = []
    for b in spec.budgets:
        within = ref_text(spec, b.window if b.window is not None else window, values)
        rules = [r.name for r in spec.policy.rules if r.budget == b.name] if spec.policy else []
        spent = f"rule {', '.join(rules)}" if rules else "no rule spends it"
        most = ref_text(spec, b.max, values, "int")
        named.append((b.name, f"{most} within any {within}",
                      f"at most {most} failure restarts within any window of {within} "
                      f"({spent}), apart from --max-restarts"))
    return Legend(tuple(params), head if params else (), tuple(policy_rows), note, tuple(vocab),
                  budget, short, tuple(named))
