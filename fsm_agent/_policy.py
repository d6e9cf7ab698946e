"""The failure-policy table, compiled into ordinary transitions.

A table is an ordered list of rules, first match wins (Kubernetes' ``podFailurePolicy``): rule
``i`` holds when its own condition holds and no earlier rule's does. Each rule becomes one
transition per ``(trigger, source)`` the table decides on, guarded by its condition and by the
negation of every earlier condition; an outcome that restarts becomes two, split on the budget
guard (restart while it holds, give up once it does not). The engine, diagrams, diff, replay
and the conformance kit therefore see plain transitions; each carries its rule's name.
"""

from __future__ import annotations

from ._spec import InstanceSpec, OutcomeSpec, PolicySpec, RuleSpec, TransitionSpec

__all__ = ["DEFAULT_OUTCOMES", "compile_policy", "rule_condition"]

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


def compile_policy(
    policy: PolicySpec, *, start_index: int
) -> tuple[tuple[TransitionSpec, ...], tuple[InstanceSpec, ...]]:
    """The table's transitions (numbered from ``start_index``) and the guards it synthesizes.

    Rules that can never match (after the catch-all, or testing a condition an earlier rule
    already took) produce no transitions; the static check reports them at their line.
    """
    out: list[TransitionSpec] = []
    synthesized: list[InstanceSpec] = []
    earlier: list[str] = []
    give_up = policy.outcomes["give_up"]
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
        guards = (cond,) if cond is not None else ()
        for trigger, source in policy.on:
            variants = [(outcome, guards + ((policy.budget_guard,) if outcome.restarts else ()),
                         tuple(earlier))]
            if outcome.restarts:
                variants.append((give_up, guards, (*earlier, policy.budget_guard)))
            for target, req, forbid in variants:
                what = rule.then if target is outcome else f"{rule.then}, budget spent: give_up"
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
