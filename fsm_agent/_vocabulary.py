"""The names a spec may use for guards and actions, and what they do.

A spec only ever names guards and actions; this module is where names meet code. The built-in
vocabulary covers torch's agent; an embedding program extends it with ``Vocabulary.extend``
(XState's ``setup({guards, actions})``). Nothing from a spec file is ever imported or evaluated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import WorkerGroupFailureException

if TYPE_CHECKING:
    from ._driver import Driver
    from ._engine import Step

__all__ = ["Action", "Context", "Guard", "Vocabulary"]

log = logging.getLogger("fsm_agent")


@attrs.define(slots=True, eq=False)
class Context:
    """The model the machine drives: what guards read and actions change.

    ``state`` is the machine's current state name (one of torch's ``WorkerState`` names);
    ``observed`` is the last monitor result (torch's ``RunResult``), ``None`` before the first tick.
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
    # Guard values of the current step: a guard is evaluated at most once per step, because some
    # guards ask the driver (num_nodes_waiting) and torch asks once per tick.
    memo: dict[str, bool] = attrs.field(factory=dict, repr=False)
    # The step being recorded for listeners; None when nobody listens, so untraced runs pay nothing.
    step: Step | None = attrs.field(default=None, repr=False)


Guard = Callable[[Context], bool]
Action = Callable[[Context], None]


@attrs.frozen
class ActionDef:
    """An action and whether it is *terminal*: its exception is the spec's outcome, not a fault."""

    fn: Action
    terminal: bool = False


def _has_restarts_left(ctx: Context) -> bool:
    return ctx.remaining_restarts > 0


def _nodes_waiting(ctx: Context) -> bool:
    return ctx.driver.num_nodes_waiting() > 0


def _rendezvous(ctx: Context) -> None:
    ctx.driver.rendezvous()


def _start_workers(ctx: Context) -> None:
    ctx.driver.start_workers()


def _stop_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()


def _restart_workers(ctx: Context) -> None:
    ctx.driver.stop_workers()
    ctx.driver.rendezvous()
    ctx.driver.start_workers()


def _consume_restart(ctx: Context) -> None:
    ctx.remaining_restarts -= 1
    ctx.restart_count += 1


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


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class Vocabulary:
    """Guards and actions that specs may name.

    >>> vocab = Vocabulary.builtin().extend(guards={"quota_ok": lambda ctx: True})
    >>> "quota_ok" in vocab.guards and "has_restarts_left" in vocab.guards
    True
    """

    guards: Mapping[str, Guard] = attrs.field(converter=_frozen)
    actions: Mapping[str, ActionDef] = attrs.field(converter=_frozen)

    @classmethod
    def builtin(cls) -> Vocabulary:
        """The engine's own guards and actions."""
        return _BUILTIN

    def extend(
        self,
        *,
        guards: Mapping[str, Guard] | None = None,
        actions: Mapping[str, Action] | None = None,
        terminal_actions: Mapping[str, Action] | None = None,
    ) -> Vocabulary:
        """A new vocabulary with more names. Built-in names cannot be redefined.

        ``terminal_actions`` raise the spec's intended outcome (like ``raise_failure``): their
        exception ends the lifecycle unchanged instead of being reported as an action fault.
        """
        new_guards = dict(self.guards)
        new_actions = dict(self.actions)
        for name, guard in (guards or {}).items():
            _check_new(name, guard, new_guards, "guard")
            new_guards[name] = guard
        for terminal, extra in ((False, actions), (True, terminal_actions)):
            for name, action in (extra or {}).items():
                _check_new(name, action, new_actions, "action")
                new_actions[name] = ActionDef(action, terminal=terminal)
        return Vocabulary(new_guards, new_actions)


def _check_new(name: str, fn: object, existing: Mapping[str, object], kind: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{kind} name must be an identifier, got {name!r}")
    if name in existing:
        raise ValueError(f"{kind} {name!r} is already defined")
    if not callable(fn):
        raise TypeError(f"{kind} {name!r} must be callable, got {type(fn).__name__}")


_BUILTIN = Vocabulary(_BUILTIN_GUARDS, _BUILTIN_ACTIONS)
