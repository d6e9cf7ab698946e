"""The names a spec may use for guards and actions, and what they do.

A spec only ever names guards and actions; this module is where names meet code. The built-in
vocabulary covers torch's agent; an embedding program extends it with ``Vocabulary.extend``
(XState's ``setup({guards, actions})``). Parameterised *kinds* (``exit_code_in``,
``set_exit_code``, ...) are instantiated by a spec under names of its own, with arguments that
are values or parameter names; nothing from a spec file is ever imported or evaluated.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import attrs

from ._budgets import ACTION_KINDS as BUDGET_ACTION_KINDS
from ._budgets import GUARD_KINDS as BUDGET_GUARD_KINDS
from ._context import (
    MAX_ATTEMPTS_KEPT,
    Action,
    ActionDef,
    Context,
    Guard,
    Kind,
    KindExample,
    frozen_mapping,
)
from ._drain import ACTION_KINDS as DRAIN_ACTION_KINDS
from ._drain import ACTIONS as DRAIN_ACTIONS
from ._driver import JobDriver, StackDriver, capability
from ._errors import WorkerGroupFailureException
from ._health import ACTION_KINDS as HEALTH_ACTION_KINDS
from ._health import GUARD_KINDS as HEALTH_GUARD_KINDS
from ._matchers import ACTION_KINDS, GUARD_KINDS
from ._peers import GUARDS as PEER_GUARDS
from ._progress import GUARD_KINDS as PROGRESS_GUARD_KINDS
from ._progress import note_attempt_start
from ._quarantine import ACTION_KINDS as QUARANTINE_ACTION_KINDS
from ._quarantine import ACTIONS as QUARANTINE_ACTIONS
from ._quarantine import GUARD_KINDS as QUARANTINE_GUARD_KINDS

__all__ = ["Action", "ActionDef", "Context", "Guard", "Kind", "KindExample", "Vocabulary"]

log = logging.getLogger("fsm_agent")

# -- built-in guards and actions ------------------------------------------------------------


def _has_restarts_left(ctx: Context) -> bool:
    job = ctx.job_driver()
    if job is not None:
        # The job's ledger decides; a failure another agent already counted for this round
        # leaves at least this restart (it rides along on that count).
        ctx.refresh_budget()
        return int(job.job_restarts_left(ctx.max_restarts, ctx.window)) > 0
    ctx.refresh_budget()
    return ctx.remaining_restarts > 0


def _nodes_waiting(ctx: Context) -> bool:
    return ctx.driver.num_nodes_waiting() > 0


def _rendezvous(ctx: Context) -> None:
    ctx.driver.rendezvous()


def _start_workers(ctx: Context) -> None:
    ctx.driver.start_workers()
    ctx.attempt_started = ctx.clock.now()
    note_attempt_start(ctx)


def _stop_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()


def _restart_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()
    ctx.driver.rendezvous()
    _start_workers(ctx)


def _consume_restart(ctx: Context) -> None:
    job = ctx.job_driver()
    if job is not None:
        # Counted once for the job, atomically with the decision; raises TriggerInterrupt
        # (job_failed) if another round took the last restart since the guard looked.
        used = int(job.add_job_restart(ctx.max_restarts, ctx.window))
        ctx.restart_count += 1
        ctx.remaining_restarts = max(0, ctx.max_restarts - used)
        return
    ctx.restart_count += 1
    ctx.restart_times.append(ctx.clock.now())
    del ctx.restart_times[:-MAX_ATTEMPTS_KEPT]
    if ctx.window == math.inf:
        ctx.remaining_restarts -= 1
    else:
        ctx.refresh_budget()


def _exit_barrier(ctx: Context) -> None:
    # As torch's SimpleElasticAgent._exit_barrier: a barrier failure is logged, never raised,
    # because it must not change the job's outcome; a termination signal still propagates.
    # torch's lines, word for word (fsm-agent run's output reads as torchrun's)
    timeout = ctx.exit_barrier_timeout
    log.info(
        "Local worker group finished (WorkerState.%s). Waiting %s seconds for other agents to "
        "finish",
        ctx.state,
        int(timeout) if float(timeout).is_integer() else timeout,
    )
    start = time.monotonic()
    try:
        ctx.driver.exit_barrier(ctx.exit_barrier_timeout)
    except ctx.fatal_exceptions:
        raise
    except Exception:
        log.exception(
            "Error waiting on exit barrier. Elapsed: %s seconds", time.monotonic() - start
        )
    else:
        log.info("Done waiting for other agents. Elapsed: %s seconds", time.monotonic() - start)


def _announce_failure(ctx: Context) -> None:
    # Tell the other agents of the job, before anything else, that this one gives up; a driver
    # without a job (a single agent, a test driver) has nobody to tell.
    announce = capability(ctx.driver, JobDriver.announce_failure)
    if announce is None:
        return
    observed = ctx.observed.state.name if ctx.observed is not None else "no observation"
    announce(1 if ctx.exit_code is None else ctx.exit_code,
             f"[{ctx.role}] gave up in {ctx.state} on {observed} after {ctx.restart_count} "
             f"failure restart(s) (max_restarts={ctx.max_restarts})")


def _raise_failure(ctx: Context) -> None:
    failures = getattr(ctx.observed, "failures", None) or {}
    raise WorkerGroupFailureException(
        f"[{ctx.role}] exceeded max_restarts={ctx.max_restarts}", failures
    )


def _raise_invalid_state(ctx: Context) -> None:
    state = ctx.observed.state.name if ctx.observed is not None else ctx.state
    raise Exception(f"[{ctx.role}] Worker group in {state} state")


#: Guards that bound a restart cycle when a transition consuming a restart requires them.
BUDGET_GUARDS = frozenset({"has_restarts_left"})

_BUILTIN_GUARDS: dict[str, Guard] = {
    "has_restarts_left": _has_restarts_left,
    "nodes_waiting": _nodes_waiting,
    **PEER_GUARDS,
}

def _capture_stacks(ctx: Context) -> None:
    # Diagnostics only: a driver that cannot take stacks, or fails to, never changes the outcome.
    capture = capability(ctx.driver, StackDriver.capture_stacks)
    if capture is None:
        log.warning("[%s] capture_stacks: driver %s cannot capture stacks", ctx.role,
                    type(ctx.driver).__name__)
        return
    try:
        capture()
    except ctx.fatal_exceptions:
        raise
    except Exception:
        log.exception("[%s] capture_stacks failed; the workers are stopped without them", ctx.role)


_BUILTIN_ACTIONS: dict[str, ActionDef] = {
    "rendezvous": ActionDef(_rendezvous),
    "start_workers": ActionDef(_start_workers),
    "stop_workers": ActionDef(_stop_workers),
    "restart_workers": ActionDef(_restart_workers),
    "consume_restart": ActionDef(_consume_restart),
    "exit_barrier": ActionDef(_exit_barrier),
    "announce_failure": ActionDef(_announce_failure),
    "raise_failure": ActionDef(_raise_failure, terminal=True),
    "raise_invalid_state": ActionDef(_raise_invalid_state, terminal=True),
    "capture_stacks": ActionDef(_capture_stacks),
    **DRAIN_ACTIONS,
    **QUARANTINE_ACTIONS,
}


@attrs.frozen
class Vocabulary:
    """Guards and actions that specs may name, and the parameterised kinds they may instantiate.

    >>> vocab = Vocabulary.builtin().extend(guards={"quota_ok": lambda ctx: True})
    >>> "quota_ok" in vocab.guards and "has_restarts_left" in vocab.guards
    True
    """

    guards: Mapping[str, Guard] = attrs.field(converter=frozen_mapping)
    actions: Mapping[str, ActionDef] = attrs.field(converter=frozen_mapping)
    guard_kinds: Mapping[str, Kind] = attrs.field(factory=dict, converter=frozen_mapping)
    action_kinds: Mapping[str, Kind] = attrs.field(factory=dict, converter=frozen_mapping)

    @classmethod
    def builtin(cls) -> Vocabulary:
        """The engine's own guards, actions and kinds."""
        return _builtin()

    def extend(
        self,
        *,
        guards: Mapping[str, Guard] | None = None,
        actions: Mapping[str, Action] | None = None,
        terminal_actions: Mapping[str, Action] | None = None,
        guard_kinds: Mapping[str, Kind] | None = None,
        action_kinds: Mapping[str, Kind] | None = None,
    ) -> Vocabulary:
        """A new vocabulary with more names. Built-in names cannot be redefined.

        ``terminal_actions`` raise the spec's intended outcome (like ``raise_failure``): their
        exception ends the lifecycle unchanged instead of being reported as an action fault.
        """
        new_guards = dict(self.guards)
        new_actions = dict(self.actions)
        new_gk = dict(self.guard_kinds)
        new_ak = dict(self.action_kinds)
        for name, guard in (guards or {}).items():
            _check_new(name, guard, (new_guards, new_gk), "guard")
            new_guards[name] = guard
        for terminal, extra in ((False, actions), (True, terminal_actions)):
            for name, action in (extra or {}).items():
                _check_new(name, action, (new_actions, new_ak), "action")
                new_actions[name] = ActionDef(action, terminal=terminal)
        for table, names, kinds, what in (
            (new_gk, new_guards, guard_kinds, "guard kind"),
            (new_ak, new_actions, action_kinds, "action kind"),
        ):
            for name, kind in (kinds or {}).items():
                if not isinstance(kind, Kind):
                    raise TypeError(f"{what} {name!r} must be a fsm_agent.Kind")
                _check_new(name, kind.factory, (table, names), what)
                table[name] = kind
        return Vocabulary(new_guards, new_actions, new_gk, new_ak)


def _check_new(
    name: str, fn: object, existing: tuple[Mapping[str, object], ...], kind: str
) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{kind} name must be an identifier, got {name!r}")
    if any(name in table for table in existing):
        raise ValueError(f"{kind} {name!r} is already defined")
    if not callable(fn):
        raise TypeError(f"{kind} {name!r} must be callable, got {type(fn).__name__}")


_BUILTIN = Vocabulary(_BUILTIN_GUARDS, _BUILTIN_ACTIONS,
                      {**GUARD_KINDS, **HEALTH_GUARD_KINDS, **PROGRESS_GUARD_KINDS,
                       **BUDGET_GUARD_KINDS, **QUARANTINE_GUARD_KINDS},
                      {**ACTION_KINDS, **HEALTH_ACTION_KINDS, **DRAIN_ACTION_KINDS,
                       **BUDGET_ACTION_KINDS, **QUARANTINE_ACTION_KINDS})


def _builtin() -> Vocabulary:
    return _BUILTIN
