"""The failure-policy table, compiled into ordinary transitions.

A table is an ordered list of rules, first match wins (Kubernetes' ``podFailurePolicy``): rule
``i`` holds when its own condition holds and no earlier rule's does. Each rule becomes one
transition per ``(trigger, source)`` the table decides on, guarded by its condition and by the
negation of every earlier condition; an outcome that restarts becomes two, split on the budget
guard (restart while it holds, give up once it does not). A rule that names a budget of its own
(``budget: infra``) splits on that budget's guard and spends it with that budget's action in
place of ``consume_restart`` (``fsm_agent._core._budgets``). The engine, diagrams, diff, replay and
the conformance kit therefore see plain transitions; each carries its rule's name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._budgets import DEFAULT_BUDGET
from ._spec import (
    InstanceSpec,
    NamedBudgetSpec,
    OutcomeSpec,
    PolicySpec,
    RuleSpec,
    Spec,
    TransitionSpec,
)

__all__ = ["CONSUME_DEFAULT", "DEFAULT_OUTCOMES", "budget_limits", "compile_policy",
           "rule_budgets", "rule_condition", "rule_guard"]

DEFAULT_OUTCOMES: dict[str, OutcomeSpec] = {
    o.name: o
    for o in (
        OutcomeSpec("restart", "STOPPED", ("consume_restart", "stop_workers"), restarts=True),
        OutcomeSpec("restart_after_backoff", "BACKOFF", ("consume_restart", "stop_workers"),
                    restarts=True),
        # Giving up tells the other agents of the job first (a no-op for a single agent), with
        # the exit code the job ends with.
        OutcomeSpec("give_up", "FAILED", ("announce_failure", "stop_workers"), restarts=False),
        OutcomeSpec("give_up_no_requeue", "FAILED",
                    ("no_requeue", "announce_failure", "stop_workers"), restarts=False),
    )
}


def rule_condition(rule: RuleSpec) -> str | None:
    """The one guard a rule's transitions test: its only ``when`` guard, a synthesized
    ``rule_<name>`` for several, or None for the catch-all."""
    if not rule.when:
        return None
    return rule.when[0] if len(rule.when) == 1 else f"rule_{rule.name}"


#: The action of the default budget, which a rule with a budget of its own replaces.
CONSUME_DEFAULT = "consume_restart"


def compile_policy(
    policy: PolicySpec, *, start_index: int, budgets: Sequence[NamedBudgetSpec] = ()
) -> tuple[tuple[TransitionSpec, ...], tuple[InstanceSpec, ...]]:
    """The table's transitions (numbered from ``start_index``) and the guards it synthesizes.

    Rules that can never match (after the catch-all, or testing a condition an earlier rule
    already took) produce no transitions; the static check reports them at their line.
    """
    out: list[TransitionSpec] = []
    synthesized: list[InstanceSpec] = []
    earlier: list[str] = []
    give_up = policy.outcomes["give_up"]
    named = {b.name: b for b in budgets}
    for rule in policy.rules:
        cond = rule_condition(rule)
        if cond is not None and cond in earlier:
            continue
        if cond is not None and len(rule.when) > 1:
            synthesized.append(InstanceSpec(name=cond, kind="all_of",
                                            args={"guards": rule.when}, role="guard",
                                            description=f"rule {rule.name}: all of "
                                            f"{', '.join(rule.when)}", line=rule.line))
        outcome = policy.outcomes[rule.then]
        budget_guard = policy.budget_guard
        if rule.budget is not None:
            spent = named[rule.budget]
            budget_guard = spent.guard
            outcome = OutcomeSpec(outcome.name, outcome.dest, tuple(
                spent.action if a == CONSUME_DEFAULT else a for a in outcome.actions),
                outcome.restarts)
        guards = (cond,) if cond is not None else ()
        for trigger, source in policy.on:
            variants = [(outcome, guards + ((budget_guard,) if outcome.restarts else ()),
                         tuple(earlier))]
            if outcome.restarts:
                variants.append((give_up, guards, (*earlier, budget_guard)))
            for target, req, forbid in variants:
                spent_what = f"budget {rule.budget}" if rule.budget else "budget"
                what = (rule.then if target is outcome
                        else f"{rule.then}, {spent_what} spent: give_up")
                out.append(TransitionSpec(
                    triggers=(trigger,), sources=(source,), dest=target.dest, guards=req,
                    unless=forbid, actions=target.actions,
                    description=f"rule {rule.name}: {what}", index=start_index + len(out),
                    line=rule.line, rule=rule.name,
                    where=("failure_policy", "rules", rule.index)))
        if cond is None:
            break
        earlier.append(cond)
    return tuple(out), tuple(synthesized)


# -- a spec's budgets (fsm_agent._core._budgets) ---------------------------------------------------


def budget_limits(spec: Spec, values: Mapping[str, Any], default_window: float
                  ) -> dict[str, tuple[float, float]]:
    """Each named budget's (max, window seconds) with ``values`` in force; a max of ``inf``
    is a budget that never runs out."""
    out = {}
    for b in spec.budgets:
        window = default_window if b.window is None else float(b.window.resolve(values))
        most = b.max.resolve(values)
        out[b.name] = (math.inf if math.isinf(most) else int(most), window)
    return out


def rule_guard(spec: Spec, rule: str) -> str:
    """The budget guard rule ``rule``'s restarts are split on (the policy's, or its budget's)."""
    assert spec.policy is not None
    spends = next((r.budget for r in spec.policy.rules if r.name == rule), None)
    if spends is None:
        return spec.policy.budget_guard
    return next(b.guard for b in spec.budgets if b.name == spends)


def rule_budgets(spec: Spec) -> dict[str, str]:
    """Rule name -> the budget its restarts spend (:data:`DEFAULT_BUDGET` for the default)."""
    if spec.policy is None:
        return {}
    return {r.name: r.budget or DEFAULT_BUDGET for r in spec.policy.rules}
