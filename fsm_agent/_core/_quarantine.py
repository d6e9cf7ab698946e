"""Quarantine: a node whose own workers keep failing leaves the job, and stays out of it
(docs/spec-format.md, "Quarantine"; the ``resilient`` preset's ``quarantine_after``).

A machine with a flaky GPU or a bad link fails its workers again and again; every failure
restarts the whole job. Counting a node's *own* failures and sending the node away after a few
lets a spare take its slot instead. Three pieces of vocabulary, all spec data:

- the action ``count_own_failure``: one more failure of this node's own workers (put on the
  outcomes of the failure rules whose failures are the node's own: in ``resilient`` every rule's
  but ``peer_lost``, whose failure followed another node's loss);
- the guard kind ``own_failures_at_least`` (``count``; 0: never): this failure, with the
  node's own failures counted before it, reaches ``count``. A failure the guard ``peer_lost``
  classifies as caused by a lost node (a spec that has it) is never the node's own, whatever
  the rule order; an agent alone (a driver without a true ``has_job``: a single-node run) is
  never quarantined, as no other node could take its slot;
- the action kind ``quarantine_node`` (``{exit_code, after}``, terminal): the driver writes the
  quarantine mark (the torch driver: on the rendezvous store, ``fsm_agent._core._job``), the agent
  logs one line with the count and the failures, and leaves the job as a failed health check
  does (``fsm_agent._core._health.LeftJob``, exit code ``exit_code``), without closing the
  rendezvous: the others go on without it.

The health check kind ``not_quarantined`` (``fsm_agent._core._health``) is the other half: a node
carrying the mark fails it before every (re)join, so a quarantined node's agent started again
never joins a round of that job.

The count is this agent's (``ctx.own_failures``); it starts again with a new agent process.
The mark is what keeps the node out for the rest of the job.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._context import ActionDef, Kind
from ._context import KindExample as E
from ._driver import HAS_JOB, QuarantineDriver, capability
from ._health import LeftJob
from ._peers import PEER_LOST_GUARD

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["ACTIONS", "ACTION_KINDS", "COUNT_ACTION", "GUARD_KINDS", "describe_failure",
           "quarantine_reason"]

log = logging.getLogger("fsm_agent")

#: The built-in action that counts one failure of this node's own workers.
COUNT_ACTION = "count_own_failure"


def _code(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit {exitcode}"


def describe_failure(failures: Mapping[int, Any]) -> str:
    """One failure in a few words: ``exit 7 (local rank 0)``. The ranks torch stopped with
    SIGTERM after the first failure are left out, unless every listed rank ended by it."""
    # keyed by global rank (torch's RunResult); each failure knows its local rank
    codes = {int(getattr(f, "local_rank", rank)): int(getattr(f, "exitcode", 1))
             for rank, f in failures.items()}
    failed = {r: c for r, c in codes.items() if c != -signal.SIGTERM} or codes
    if not failed:
        return "a failure with no failed rank listed"
    by_code: dict[int, list[int]] = {}
    for rank, code in sorted(failed.items()):
        by_code.setdefault(code, []).append(rank)
    return ", ".join(f"{_code(code)} (local rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))})" for code, ranks in by_code.items())


def quarantine_reason(failures: list[str], after: int) -> str:
    """The one line a quarantined node leaves with (its log, ``fsm-agent run``'s last line)."""
    return (f"quarantined: this node's own workers failed {len(failures)} times in this job "
            f"(quarantine_after={after}): {'; '.join(failures)}")


def _current(ctx: Context) -> str:
    observed = ctx.observed
    return describe_failure(getattr(observed, "failures", None) or {})


def _count_own_failure(ctx: Context) -> None:
    if _followed_lost_node(ctx):
        return
    if not _failed_first(ctx):
        log.info("[%s] this failure followed another node's in the same round: not counted "
                 "as this node's own", ctx.role)
        return
    ctx.own_failures.append(_current(ctx))


def _followed_lost_node(ctx: Context) -> bool:
    return PEER_LOST_GUARD in ctx.guard_fns and ctx.check(PEER_LOST_GUARD)


def _failed_first(ctx: Context) -> bool:
    """Whether no other node's failure came first in this round: workers that talk to each
    other all fail when one node's do; the driver's optional ``failed_first()`` says whose
    failure reached the job first (a driver without it: this one's)."""
    first = capability(ctx.driver, QuarantineDriver.failed_first)
    return first is None or bool(first())


def _own(ctx: Context) -> bool:
    """Whether the failure at hand is this node's own: not one that followed a lost node, nor
    one that followed another node's failure in the same round."""
    return not _followed_lost_node(ctx) and _failed_first(ctx)


def _alone(ctx: Context) -> bool:
    """Whether this agent is alone: its driver does not say ``has_job`` (the torch driver of a
    rendezvous of several nodes does; a single-node run, the recording and the kit's drivers,
    ``check --bounds`` do not). Nobody could take its slot: its failures are for the restart
    budget to judge, as they were before quarantine."""
    return not getattr(ctx.driver, HAS_JOB, False)


def _own_failures_at_least(count: int) -> Callable[[Context], bool]:
    if count < 0:
        raise ValueError(f"count must be >= 0 (0 turns quarantine off), got {count}")
    # _own before the count: its first call of a round is the store's claim of the round's
    # first failure, to be made as soon as this agent sees the failure
    return lambda ctx: (count > 0 and not _alone(ctx) and _own(ctx)
                        and len(ctx.own_failures) + 1 >= count)


def _quarantine_node(exit_code: int, after: int) -> Callable[[Context], None]:
    if not 0 < exit_code < 256:
        raise ValueError(f"an exit code is between 1 and 255, got {exit_code}")

    def action(ctx: Context) -> None:
        failures = [*ctx.own_failures, _current(ctx)]
        reason = quarantine_reason(failures, after)
        ctx.exit_code = exit_code
        mark = capability(ctx.driver, QuarantineDriver.quarantine)
        if mark is not None:
            mark(reason)  # the mark that keeps this node out of the job's later rounds
        log.error("[%s] %s; leaving the job (exit %d)", ctx.role, reason, exit_code)
        raise LeftJob(reason, exit_code)

    return action


# Examples: a failure of rank 0, seen by an agent in a job of several nodes.
_EXIT_1 = ({"exitcode": 1},)
_JOB = {"has_job": True}

#: ``own_failures_at_least``: this failure is the node's own `count`-th in the job.
GUARD_KINDS: dict[str, Kind] = {
    "own_failures_at_least": Kind(
        _own_failures_at_least, {"count": "int"}, "count",
        # a larger count implies a smaller one; 0 is "never", which implies nothing
        implies=lambda mine, earlier: bool(mine["count"] >= earlier["count"] > 0),
        description="this failure of the node's own workers (not one that followed a lost "
        "node) is its `count`-th in a job of several nodes (0: never)",
        examples=(E(2, True, _EXIT_1, {"own_failures": ["exit 1 (local rank 0)"]}, driver=_JOB),
                  E(3, False, _EXIT_1, {"own_failures": ["exit 1 (local rank 0)"]}, driver=_JOB),
                  E(1, False, _EXIT_1, driver={}),  # alone in its job
                  E(0, False, _EXIT_1, driver=_JOB),
                  E(1, False, _EXIT_1, driver={**_JOB, "lost_peers": lambda: ["node-b"]}),
                  E(1, False, _EXIT_1, driver={**_JOB, "failed_first": lambda: False}))),
}

#: ``quarantine_node``: the terminal action of a quarantined node.
ACTION_KINDS: dict[str, Kind] = {
    "quarantine_node": Kind(
        _quarantine_node, {"exit_code": "int", "after": "int"}, "exit_code",
        {"exit_code": 75, "after": 0}, terminal=True,
        description="mark this node quarantined for the rest of the job, then leave it (the "
        "others go on) with this exit code, as `leave_job` does; `after` is the count the "
        "reason names (`quarantine_after`)"),
}

#: ``count_own_failure``: one more failure of this node's own workers.
ACTIONS: dict[str, ActionDef] = {COUNT_ACTION: ActionDef(_count_own_failure)}
