"""Spec differences in the restart-policy constructs: parameters, the restart budget, the spec's
own guards and actions, the failure-policy table and its rules, states' timers and reported
states. Each is said in plain words; ``_diff`` puts them with the transition and state changes.

Rules are compared by name: a rule added or removed, its ``when`` or ``then`` changed, the order
of the rules both tables have, and a rule renamed (same place, same condition and outcome).
Descriptions are not behaviour and are not compared.
"""

from __future__ import annotations

import attrs

from .._core._params import ParamSpec, Ref, format_param, format_value
from .._core._policy import CONSUME_DEFAULT
from .._core._spec import (
    InstanceSpec,
    NamedBudgetSpec,
    PolicySpec,
    RuleSpec,
    Spec,
    StateSpec,
    TimeoutSpec,
)
from .._core._units import format_seconds

__all__ = ["Change", "other_changes", "policy_changes", "state_details", "state_text"]


@attrs.frozen
class Change:
    """One difference. ``kind`` is ``added``, ``removed`` or ``changed``; ``element`` says of what
    (``transition``, ``state``, ``rule``, ``policy``, ``param``, ``guard``, ``action``,
    ``budget``, ``metric``, ``trigger``); ``details`` are plain-words lines."""

    kind: str
    element: str
    name: str
    details: tuple[str, ...] = ()
    line_a: int | None = None
    line_b: int | None = None


def _ref(spec: Spec, ref: Ref, type_name: str = "duration") -> str:
    """A value as the spec writes it; a parameter with its default (``backoff_max (60s)``)."""
    if ref.name is None:
        if type_name == "duration" and isinstance(ref.value, (int, float)):
            return format_seconds(float(ref.value))
        return format_value(ref.value)
    try:
        p = spec.param(ref.name)
    except KeyError:
        return ref.name  # max_restarts, exit_barrier_timeout: the agent's own settings
    return f"{ref.name} (default {format_param(p.type, p.default)})"


def _same_ref(a: Spec, ra: Ref, b: Spec, rb: Ref, type_name: str = "duration") -> bool:
    return _ref(a, ra, type_name) == _ref(b, rb, type_name)


# --------------------------------------------------------------------------------------------
# States: timers and reported states


_BACKOFF = (("initial", "duration"), ("factor", "float"), ("max", "duration"),
            ("jitter", "float"), ("reset_after", "duration"), ("reset_on_progress", "bool"))


def _timer_text(spec: Spec, t: TimeoutSpec | None) -> str:
    if t is None:
        return "none"
    if t.backoff is None:
        assert t.after is not None
        return f"after {_ref(spec, t.after)}"
    parts = [f"{k} {_ref(spec, getattr(t.backoff, k), ty)}" for k, ty in _BACKOFF]
    return "backoff: " + ", ".join(parts)


def _timer_details(a: Spec, ta: TimeoutSpec | None, b: Spec, tb: TimeoutSpec | None
                   ) -> list[str]:
    if ta is None and tb is None:
        return []
    if ta is None or tb is None or (ta.backoff is None) != (tb.backoff is None):
        old, new = _timer_text(a, ta), _timer_text(b, tb)
        return [] if old == new else [f"timeout: {old} -> {new}"]
    if ta.backoff is None or tb.backoff is None:
        assert ta.after is not None and tb.after is not None
        if _same_ref(a, ta.after, b, tb.after):
            return []
        return [f"timeout: after {_ref(a, ta.after)} -> after {_ref(b, tb.after)}"]
    out = []
    for key, ty in _BACKOFF:
        ra, rb = getattr(ta.backoff, key), getattr(tb.backoff, key)
        if not _same_ref(a, ra, b, rb, ty):
            out.append(f"timeout backoff {key}: {_ref(a, ra, ty)} -> {_ref(b, rb, ty)}")
    return out


def state_text(spec: Spec, s: StateSpec) -> list[str]:
    """What an added or removed state is: what it reports, its timer, its actions."""
    out = []
    if s.reported != s.name:
        out.append(f"reports {s.reported}")
    if s.timeout is not None:
        out.append(f"timeout: {_timer_text(spec, s.timeout)}")
    if s.enter:
        out.append(f"entry: {', '.join(s.enter)}")
    if s.exit:
        out.append(f"exit: {', '.join(s.exit)}")
    if s.final:
        out.append("final")
    return out


def state_details(a: Spec, sa: StateSpec, b: Spec, sb: StateSpec) -> list[str]:
    """What changed in a state's reported ``WorkerState`` and its timer."""
    out = []
    if sa.reported != sb.reported:
        out.append(f"reports: {sa.reported} -> {sb.reported} (the WorkerState torch and "
                   "metrics see)")
    out += _timer_details(a, sa.timeout, b, sb.timeout)
    return out


# --------------------------------------------------------------------------------------------
# Parameters, budget, instances


def _param_text(p: ParamSpec) -> str:
    bounds = []
    if p.min is not None:
        bounds.append(f"min {_bound(p, p.min)}")
    if p.max is not None:
        bounds.append(f"max {_bound(p, p.max)}")
    if p.choices:
        bounds.append(f"one of {', '.join(p.choices)}")
    return f"{p.type}, default {format_param(p.type, p.default)}" + (
        f", {', '.join(bounds)}" if bounds else "")


def _bound(p: ParamSpec, value: float | None) -> str:
    return "none" if value is None else format_param(p.type, value)


def _param_changes(a: Spec, b: Spec) -> list[Change]:
    out = []
    pa, pb = {p.name: p for p in a.params}, {p.name: p for p in b.params}
    for name, p in pa.items():
        q = pb.get(name)
        if q is None:
            out.append(Change("removed", "param", name, (_param_text(p),), p.line, None))
            continue
        details = []
        if p.type != q.type:
            details.append(f"type: {p.type} -> {q.type}")
        old, new = format_param(p.type, p.default), format_param(q.type, q.default)
        if old != new:
            details.append(f"default: {old} -> {new}")
        for bound in ("min", "max"):
            va, vb = getattr(p, bound), getattr(q, bound)
            if _bound(p, va) != _bound(q, vb):
                details.append(f"{bound}: {_bound(p, va)} -> {_bound(q, vb)}")
        if p.choices != q.choices:
            details.append(f"choices: {', '.join(p.choices) or 'any'} -> "
                           f"{', '.join(q.choices) or 'any'}")
        if details:
            out.append(Change("changed", "param", name, tuple(details), p.line, q.line))
    for name, q in pb.items():
        if name not in pa:
            out.append(Change("added", "param", name, (_param_text(q),), None, q.line))
    return out


def _budget_changes(a: Spec, b: Spec) -> list[Change]:
    details = []
    if a.budget.scope != b.budget.scope:
        details.append(f"scope: {a.budget.scope} -> {b.budget.scope} (who counts the failure "
                       "restarts: each agent, or the whole job)")
    if not _same_ref(a, a.budget.window, b, b.budget.window):
        details.append(f"window: {_ref(a, a.budget.window)} -> {_ref(b, b.budget.window)} "
                       "(--max-restarts failure restarts allowed within any window this long)")
    if a.restart_forever != b.restart_forever:
        details.append(f"restart_forever: {str(a.restart_forever).lower()} -> "
                       f"{str(b.restart_forever).lower()}")
    if not details:
        return []
    return [Change("changed", "budget", "budget", tuple(details), a.budget.line, b.budget.line)]


def _named_budget_text(spec: Spec, b: NamedBudgetSpec) -> str:
    window = _ref(spec, b.window) if b.window is not None else "the default budget's window"
    return f"at most {_ref(spec, b.max, 'int')} restarts within any {window}"


def _named_budget_changes(a: Spec, b: Spec) -> list[Change]:
    na, nb = {x.name: x for x in a.budgets}, {x.name: x for x in b.budgets}
    out = []
    for name, x in na.items():
        y = nb.get(name)
        if y is None:
            out.append(Change("removed", "budget", name, (_named_budget_text(a, x),), x.line,
                              None))
        elif _named_budget_text(a, x) != _named_budget_text(b, y):
            out.append(Change("changed", "budget", name, (
                f"{_named_budget_text(a, x)} -> {_named_budget_text(b, y)}",), x.line, y.line))
    for name, y in nb.items():
        if name not in na:
            out.append(Change("added", "budget", name, (_named_budget_text(b, y),), None,
                              y.line))
    return out


def _synthesized(spec: Spec) -> set[str]:
    """The guards a rule with several conditions compiles into, and a named budget's guard and
    action: the rule and budget diffs cover them."""
    named = {n for x in spec.budgets for n in (x.guard, x.action)}
    if spec.policy is None:
        return named
    return named | {f"rule_{r.name}" for r in spec.policy.rules if len(r.when) > 1}


def _args_text(spec: Spec, inst: InstanceSpec, *, defaults: bool = False) -> dict[str, str]:
    """Each argument as written (``defaults``: with the kind's defaults for those not given)."""
    kinds = spec.vocabulary.guard_kinds if inst.role == "guard" else spec.vocabulary.action_kinds
    kind = kinds.get(inst.kind)
    types = kind.args if kind is not None else {}
    args = dict(inst.args)
    if defaults and kind is not None:
        args = {**{k: v for k, v in kind.defaults.items() if k in kind.args}, **args}
    out = {}
    for k, v in args.items():
        if isinstance(v, Ref):
            out[k] = _ref(spec, v, types.get(k, ""))
        elif isinstance(v, (tuple, list)):
            out[k] = "[" + ", ".join(str(x) for x in v) + "]"
        else:
            out[k] = str(v)
    return out


def _instance_text(spec: Spec, inst: InstanceSpec) -> str:
    args = _args_text(spec, inst)
    shown = ", ".join(args.values()) if len(args) == 1 else ", ".join(
        f"{k}={v}" for k, v in args.items())
    text = f"{inst.kind}({shown})"
    if inst.timeout is not None:
        text += f", time budget {_ref(spec, inst.timeout)}"
    return text


def _instance_changes(a: Spec, b: Spec, role: str) -> list[Change]:
    skip_a, skip_b = _synthesized(a), _synthesized(b)
    ia = {i.name: i for i in (a.guard_defs if role == "guard" else a.action_defs)
          if i.name not in skip_a}
    ib = {i.name: i for i in (b.guard_defs if role == "guard" else b.action_defs)
          if i.name not in skip_b}
    out = []
    for name, x in ia.items():
        y = ib.get(name)
        if y is None:
            out.append(Change("removed", role, name, (_instance_text(a, x),), x.line, None))
            continue
        details = []
        if x.kind != y.kind:
            details.append(f"kind: {_instance_text(a, x)} -> {_instance_text(b, y)}")
        else:
            xa, ya = _args_text(a, x, defaults=True), _args_text(b, y, defaults=True)
            for k in dict.fromkeys([*xa, *ya]):
                if xa.get(k) != ya.get(k):
                    details.append(f"{k}: {xa.get(k, 'none')} -> {ya.get(k, 'none')}")
        ta = _ref(a, x.timeout) if x.timeout is not None else "none"
        tb = _ref(b, y.timeout) if y.timeout is not None else "none"
        if ta != tb:
            details.append(f"time budget: {ta} -> {tb}")
        if details:
            out.append(Change("changed", role, name, tuple(details), x.line, y.line))
    for name, y in ib.items():
        if name not in ia:
            out.append(Change("added", role, name, (_instance_text(b, y),), None, y.line))
    return out


# --------------------------------------------------------------------------------------------
# The failure policy


def _outcome_text(policy: PolicySpec, name: str) -> str:
    o = policy.outcomes[name]
    text = f"{name} (to {o.dest}" + (f" / {', '.join(o.actions)}" if o.actions else "") + ")"
    return text


def _rule_text(policy: PolicySpec, r: RuleSpec, number: int) -> str:
    when = " & ".join(r.when) or "any failure"
    then = _outcome_text(policy, r.then)
    if r.budget:  # the rule spends its own budget's action in place of the default's
        then = then.replace(CONSUME_DEFAULT, f"consume_{r.budget}_restart") \
            + f", spending budget {r.budget}"
    return f"rule {number}: when {when} then {then}"


def _policy_whole(spec: Spec, policy: PolicySpec) -> tuple[str, ...]:
    where = ", ".join(f"{t} in {s}" for t, s in policy.on)
    return (f"decides on {where}",
            *(_rule_text(policy, r, i) for i, r in enumerate(policy.rules, start=1)))


def _rule_changes(a: Spec, pa: PolicySpec, b: Spec, pb: PolicySpec) -> list[Change]:
    ra = {r.name: (i, r) for i, r in enumerate(pa.rules, start=1)}
    rb = {r.name: (i, r) for i, r in enumerate(pb.rules, start=1)}
    removed = [n for n in ra if n not in rb]
    added = [n for n in rb if n not in ra]
    out: list[Change] = []
    # A rule renamed: in the same place, with the same condition and outcome.
    for old in list(removed):
        i, r = ra[old]
        twin = next((n for n in added if rb[n][0] == i and rb[n][1].when == r.when
                     and _outcome_text(pb, rb[n][1].then) == _outcome_text(pa, r.then)), None)
        if twin is not None:
            removed.remove(old)
            added.remove(twin)
            out.append(Change("changed", "rule", twin, (f"renamed: {old} -> {twin} (traces "
                                                         "name the rule that matched)",),
                              r.line, rb[twin][1].line))
    for name in removed:
        i, r = ra[name]
        out.append(Change("removed", "rule", name, (_rule_text(pa, r, i),), r.line, None))
    for name, (_, r) in ra.items():
        if name not in rb:
            continue
        _, s = rb[name]
        details = []
        if set(r.when) != set(s.when):
            details.append(f"when: {' & '.join(r.when) or 'any failure'} -> "
                           f"{' & '.join(s.when) or 'any failure'}")
        old, new = _outcome_text(pa, r.then), _outcome_text(pb, s.then)
        if old != new:
            details.append(f"then: {old} -> {new}")
        if r.budget != s.budget:
            details.append(f"budget: {r.budget or 'default'} -> {s.budget or 'default'} (the "
                           "budget its restarts spend)")
        if details:
            out.append(Change("changed", "rule", name, tuple(details), r.line, s.line))
    for name in added:
        j, s = rb[name]
        out.append(Change("added", "rule", name, (_rule_text(pb, s, j),), None, s.line))
    return out


def _policy_details(pa: PolicySpec, pb: PolicySpec) -> list[str]:
    details = []
    on_a, on_b = list(pa.on), list(pb.on)
    gone = [f"- {t} in {s}" for t, s in on_a if (t, s) not in on_b]
    new = [f"+ {t} in {s}" for t, s in on_b if (t, s) not in on_a]
    if gone or new:
        details.append("decides on: " + ", ".join(gone + new))
    if pa.budget_guard != pb.budget_guard:
        details.append(f"budget guard: {pa.budget_guard} -> {pb.budget_guard}")
    common = [r.name for r in pa.rules if r.name in {x.name for x in pb.rules}]
    order_b = [r.name for r in pb.rules if r.name in common]
    if common != order_b:
        details.append(f"rules reordered: {', '.join(common)} -> {', '.join(order_b)} (the "
                       "first rule that matches decides)")
    return details


def policy_changes(a: Spec, b: Spec) -> list[Change]:
    """The failure policy's changes: the table as a whole, then rule by rule."""
    pa, pb = a.policy, b.policy
    if pa is None and pb is None:
        return []
    if pa is None or pb is None:
        policy = pb if pa is None else pa
        assert policy is not None
        return [Change("added" if pa is None else "removed", "policy", "failure_policy",
                       _policy_whole(b if pa is None else a, policy),
                       None if pa is None else pa.line, None if pb is None else pb.line)]
    out = []
    details = _policy_details(pa, pb)
    if details:
        out.append(Change("changed", "policy", "failure_policy", tuple(details), pa.line,
                          pb.line))
    return out + _rule_changes(a, pa, b, pb)


def other_changes(a: Spec, b: Spec) -> list[Change]:
    """Parameters, the spec's guards and actions, and the restart budget."""
    return (_param_changes(a, b) + _instance_changes(a, b, "guard")
            + _instance_changes(a, b, "action") + _budget_changes(a, b)
            + _named_budget_changes(a, b))
