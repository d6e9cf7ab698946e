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
import random
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from ._clock import Clock, SystemClock
from ._errors import WorkerGroupFailureException

if TYPE_CHECKING:
    from ._driver import Driver
    from ._step import Step

__all__ = ["Action", "ActionDef", "Context", "Guard", "Kind", "Vocabulary"]

log = logging.getLogger("fsm_agent")

#: Failed attempts and restart times remembered (for the consecutive-failure and window guards).
MAX_ATTEMPTS_KEPT = 1000


@attrs.define(slots=True, eq=False)
class Context:
    """The model the machine drives: what guards read and actions change.

    ``state`` is the machine's current state name (the spec's name; ``Lifecycle.state`` maps it
    to the ``WorkerState`` it reports); ``observed`` is the last monitor result (torch's
    ``RunResult``), ``None`` before the first tick. Times are on ``clock``'s scale.
    """

    driver: Driver
    role: str = "default"
    max_restarts: int = 3
    remaining_restarts: int = 3
    restart_count: int = 0
    exit_barrier_timeout: float = 300.0
    observed: Any = None
    state: str = "INIT"
    fatal_exceptions: tuple[type[BaseException], ...] = ()
    #: The spec's parameters in force (defaults merged with what the program set).
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    clock: Clock = attrs.field(factory=SystemClock, repr=False)
    rng: random.Random = attrs.field(factory=random.Random, repr=False)
    #: The budget's sliding window in seconds (inf: the whole job, as torch counts).
    window: float = math.inf
    #: When each failure restart was consumed (for windows), most recent last.
    restart_times: list[float] = attrs.field(factory=list, repr=False)
    #: When the workers were last started; None before the first start.
    attempt_started: float | None = None
    #: How long each attempt that ended in a failure had run, most recent last.
    failed_attempts: list[float] = attrs.field(factory=list, repr=False)
    #: Entries into each backoff state since its last reset.
    backoff: dict[str, int] = attrs.field(factory=dict, repr=False)
    #: When the current state's timer fires (clock time), None if it has none.
    deadline: float | None = None
    #: The exit code the job should end with if it fails (``set_exit_code``); None: the default.
    exit_code: int | None = None
    #: The lifecycle's guards by name, bound to its parameters (combinators evaluate through it).
    guard_fns: Mapping[str, Guard] = attrs.field(factory=dict, repr=False)
    # Guard values of the current step: a guard is evaluated at most once per step, because some
    # guards ask the driver (num_nodes_waiting) and torch asks once per tick.
    memo: dict[str, bool] = attrs.field(factory=dict, repr=False)
    # The step being recorded for listeners; None when nobody listens, so untraced runs pay nothing.
    step: Step | None = attrs.field(default=None, repr=False)

    def check(self, name: str) -> bool:
        """The value of guard ``name`` in this step (evaluated once, then remembered)."""
        memo = self.memo
        if name in memo:
            return memo[name]
        value = memo[name] = bool(self.guard_fns[name](self))
        return value

    def refresh_budget(self) -> None:
        """Recount ``remaining_restarts`` for a sliding window (a no-op for the whole job)."""
        if self.window == math.inf:
            return
        horizon = self.clock.now() - self.window
        inside = sum(1 for t in self.restart_times if t > horizon)
        self.remaining_restarts = max(0, self.max_restarts - inside)

    def note_failure(self) -> None:
        """Remember how long the attempt that just failed had run."""
        if self.attempt_started is not None:
            self.failed_attempts.append(self.clock.now() - self.attempt_started)
            del self.failed_attempts[:-MAX_ATTEMPTS_KEPT]


Guard = Callable[[Context], bool]
Action = Callable[[Context], None]


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class ActionDef:
    """An action and whether it is *terminal*: its exception is the spec's outcome, not a fault."""

    fn: Action
    terminal: bool = False


@attrs.frozen
class Kind:
    """A parameterised guard or action: typed arguments, and a factory that builds it from them.

    ``args`` maps each argument to its type (a parameter type such as ``duration`` or
    ``int_list``, or ``guard``/``guard_list`` for combinators); ``positional`` is the argument
    a bare value fills (``{exit_code_in: [3]}``); ``factory(**args)`` returns the guard or
    action, and may raise ``ValueError`` for a value it cannot use (the spec check reports it).
    """

    factory: Callable[..., Callable[[Context], Any]]
    args: Mapping[str, str] = attrs.field(converter=_frozen)
    positional: str | None = None
    defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    choices: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=_frozen)
    terminal: bool = False
    description: str = ""

    def instantiate(self, args: Mapping[str, Any], values: Mapping[str, Any]) -> Callable[..., Any]:
        """The guard or action for ``args`` (values, or ``Ref``s resolved against ``values``)."""
        resolved = dict(self.defaults)
        for name, arg in args.items():
            resolve = getattr(arg, "resolve", None)
            resolved[name] = resolve(values) if resolve is not None else arg
        return self.factory(**resolved)


# -- built-in guards and actions ------------------------------------------------------------


def _has_restarts_left(ctx: Context) -> bool:
    ctx.refresh_budget()
    return ctx.remaining_restarts > 0


def _nodes_waiting(ctx: Context) -> bool:
    return ctx.driver.num_nodes_waiting() > 0


def _rendezvous(ctx: Context) -> None:
    ctx.driver.rendezvous()


def _start_workers(ctx: Context) -> None:
    ctx.driver.start_workers()
    ctx.attempt_started = ctx.clock.now()


def _stop_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()


def _restart_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()
    ctx.driver.rendezvous()
    _start_workers(ctx)


def _consume_restart(ctx: Context) -> None:
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
    log.info(
        "[%s] Local worker group finished (%s). Waiting %s seconds for other agents to finish",
        ctx.role,
        ctx.state,
        ctx.exit_barrier_timeout,
    )
    start = time.monotonic()
    try:
        ctx.driver.exit_barrier(ctx.exit_barrier_timeout)
    except ctx.fatal_exceptions:
        raise
    except Exception:
        log.exception(
            "[%s] Error waiting on exit barrier. Elapsed: %.3f seconds",
            ctx.role,
            time.monotonic() - start,
        )
    else:
        log.info(
            "[%s] Done waiting for other agents. Elapsed: %.3f seconds",
            ctx.role,
            time.monotonic() - start,
        )


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
}

_BUILTIN_ACTIONS: dict[str, ActionDef] = {
    "rendezvous": ActionDef(_rendezvous),
    "start_workers": ActionDef(_start_workers),
    "stop_workers": ActionDef(_stop_workers),
    "restart_workers": ActionDef(_restart_workers),
    "consume_restart": ActionDef(_consume_restart),
    "exit_barrier": ActionDef(_exit_barrier),
    "raise_failure": ActionDef(_raise_failure, terminal=True),
    "raise_invalid_state": ActionDef(_raise_invalid_state, terminal=True),
}


@attrs.frozen
class Vocabulary:
    """Guards and actions that specs may name, and the parameterised kinds they may instantiate.

    >>> vocab = Vocabulary.builtin().extend(guards={"quota_ok": lambda ctx: True})
    >>> "quota_ok" in vocab.guards and "has_restarts_left" in vocab.guards
    True
    """

    guards: Mapping[str, Guard] = attrs.field(converter=_frozen)
    actions: Mapping[str, ActionDef] = attrs.field(converter=_frozen)
    guard_kinds: Mapping[str, Kind] = attrs.field(factory=dict, converter=_frozen)
    action_kinds: Mapping[str, Kind] = attrs.field(factory=dict, converter=_frozen)

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


_BUILTIN: list[Vocabulary] = []


def _builtin() -> Vocabulary:
    if not _BUILTIN:
        from ._matchers import ACTION_KINDS, GUARD_KINDS

        _BUILTIN.append(Vocabulary(_BUILTIN_GUARDS, _BUILTIN_ACTIONS, GUARD_KINDS, ACTION_KINDS))
    return _BUILTIN[0]
