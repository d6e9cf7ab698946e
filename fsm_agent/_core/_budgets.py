"""Restart budgets per cause: a named budget of its own for the failures of one cause.

The default budget is torch's: ``--max-restarts`` failure restarts (within the ``budget``
block's window, counted by each agent or by the job). A spec may declare more under
``budgets`` (``infra: {max: infra_restarts, window: restart_window}``), and a failure-policy
rule names the one it spends (``budget: infra``): a failure of the infrastructure then never
spends the user's restarts, and the other way round (kubernetes-sigs/jobset#976, Ray Train v2's
evict-vs-retry).

Each named budget declares one guard and one action, synthesized from its name so that a rule
(or a transition) names it like any other: ``has_<name>_restarts_left`` and
``consume_<name>_restart``, of the kinds ``budget_left`` and ``consume_budget``. A named budget
shares the default one's scope: with ``budget: {scope: job}`` it is counted once for the whole
job on the rendezvous store (``fsm_agent._core._job``: one ledger, each entry tagged with its
budget, so that a round's failure is counted once, against the budget of the first claim).

The limits (``ctx.budget_limits``: name -> (max, window seconds)) are resolved once by the
engine from the spec's parameters (``fsm_agent._core._policy.budget_limits``, with the other helpers
that read a spec's budgets: this module sits below the spec, beside the vocabulary); the counts
are the lifecycle's (``ctx.budget_times``) or the job's. ``ctx.restart_count`` counts every
failure restart, of any budget (the attempt number torch's workers see);
``ctx.remaining_restarts`` is the default budget's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._context import MAX_ATTEMPTS_KEPT, Kind
from ._context import KindExample as E

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["ACTION_KINDS", "BUDGET_KINDS", "DEFAULT_BUDGET", "GUARD_KINDS", "RESERVED_BUDGETS",
           "budget_left", "budget_used"]

#: The name reports give the default budget (``--max-restarts``); never a named budget's.
DEFAULT_BUDGET = "default"
RESERVED_BUDGETS = frozenset({DEFAULT_BUDGET})
#: The kinds of the synthesized guard and action (the budget block declares them).
BUDGET_KINDS = frozenset({"budget_left", "consume_budget"})


def budget_used(ctx: Context, name: str) -> int:
    """Restarts of budget ``name`` counted within its window (the job's, for a job budget)."""
    _, window = ctx.budget_limits[name]
    job = ctx.job_driver()
    if job is not None:
        return int(job.job_restart_count(window, budget=name))
    times = ctx.budget_times.get(name, ())
    if window == float("inf"):
        return ctx.budget_counts.get(name, 0)
    horizon = ctx.clock.now() - window
    return sum(1 for t in times if t > horizon)


def budget_left(ctx: Context, name: str) -> float:
    """Restarts of budget ``name`` still allowed for the current failure (``inf`` for a
    budget without a maximum)."""
    most, window = ctx.budget_limits[name]
    if ctx.restarts_withdrawn:
        return 0
    if math.isinf(most):
        return math.inf
    job = ctx.job_driver()
    if job is not None:
        # at least 1 when another agent already counted this round's failure (it rides along)
        return int(job.job_restarts_left(int(most), window, budget=name))
    return max(0, int(most) - budget_used(ctx, name))


def _budget_left(budget: str) -> Callable[[Context], bool]:
    return lambda ctx: budget_left(ctx, budget) > 0


def _consume_budget(budget: str) -> Callable[[Context], None]:
    def action(ctx: Context) -> None:
        most, window = ctx.budget_limits[budget]
        job = ctx.job_driver()
        if job is not None:
            # counted once for the job, atomically with the decision; raises TriggerInterrupt
            # (job_failed) when another round took the last restart since the guard looked
            # (a budget without a maximum is still counted: the summary says how often)
            job.add_job_restart(most, window, budget=budget)  # type: ignore[arg-type]
        else:
            times = ctx.budget_times.setdefault(budget, [])
            times.append(ctx.clock.now())
            del times[:-MAX_ATTEMPTS_KEPT]
            ctx.budget_counts[budget] = ctx.budget_counts.get(budget, 0) + 1
        ctx.restart_count += 1

    return action


# Examples: a budget of 2 restarts over the whole job.
_INFRA = {"budgets": {"infra": {"max": 2}}}

GUARD_KINDS: dict[str, Kind] = {
    "budget_left": Kind(
        _budget_left, {"budget": "str"}, "budget",
        description="a restart of the named budget is left (a spec's `budgets` block declares "
        "one `has_NAME_restarts_left` guard of this kind per budget)",
        examples=(E("infra", True, context={"budget_counts": {"infra": 1}}, spec=_INFRA),
                  E("infra", False, context={"budget_counts": {"infra": 2}}, spec=_INFRA))),
}
ACTION_KINDS: dict[str, Kind] = {
    "consume_budget": Kind(_consume_budget, {"budget": "str"}, "budget",
                           description="spend one restart of the named budget (declared as "
                           "`consume_NAME_restart` for each budget)"),
}
