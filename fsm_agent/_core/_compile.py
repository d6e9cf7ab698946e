"""Compiling a ``Spec`` into a ``transitions`` machine whose callbacks run the spec's actions.

One machine is built per spec and set of parameter values, and shared by every ``Lifecycle``
using it. Guards and actions are wrapped here: a guard is evaluated once per step (memoised on the
context), an action that raises moves the model to UNKNOWN and becomes an ``ActionError`` naming
the action and the transition, and listeners get a record of each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import attrs
from transitions import EventData, Machine, State

from ._errors import ActionError, TriggerInterrupt
from ._spec import ALWAYS_TRIGGER, ERROR_STATE, OBSERVATION_TRIGGERS, Spec
from ._step import ActionRecord
from ._timers import Timer, make_timer
from ._vocabulary import ActionDef, Context, Guard

__all__ = ["Compiled", "compile_spec", "guard_value"]

log = logging.getLogger("fsm_agent")


def _fault(ctx: Context, edge: tuple[str, str, str], name: str, kind: str,
           err: BaseException) -> BaseException:
    """Move the model to UNKNOWN and build the exception to raise for a failed action or guard."""
    trigger, source, dest = edge
    ctx.state = ERROR_STATE
    if not isinstance(err, Exception) or isinstance(err, ctx.fatal_exceptions):
        # Signals and the driver's fatal errors must reach the supervisor as they are.
        return err
    what = {"enter": f"entry action {name!r} of {dest}", "exit": f"exit action {name!r} of "
            f"{source}", "guard": f"guard {name!r}"}.get(kind, f"action {name!r}")
    msg = (f"[{ctx.role}] {what} failed during transition {trigger!r} {source} -> {dest}: "
           f"{type(err).__name__}: {err}")
    out = ActionError(msg, action=name, trigger=trigger, source=source, dest=dest)
    out.__cause__ = err
    return out


def _edge(ev: EventData) -> tuple[str, str, str]:
    trans = ev.transition
    source = str(trans.source) if trans is not None else cast(Context, ev.model).state
    dest = trans.dest if trans is not None and trans.dest is not None else source
    return ev.event.name if ev.event is not None else "?", source, str(dest)


def _wrap_action(name: str, adef: ActionDef, kind: str,
                 budget: float | None) -> Callable[[EventData], None]:
    fn, terminal = adef.fn, adef.terminal

    def run(ev: EventData) -> None:
        ctx = cast(Context, ev.model)
        step = ctx.step
        t0 = time.perf_counter() if step is not None or budget is not None else 0.0
        try:
            fn(ctx)
        except BaseException as err:
            if step is not None:
                step.actions.append(ActionRecord(name, kind, time.perf_counter() - t0, "raised",
                                                 f"{type(err).__name__}: {err}"))
            if terminal or isinstance(err, TriggerInterrupt):
                raise  # the spec's own outcome, or a redirection the engine takes (_fire)
            raise _fault(ctx, _edge(ev), name, kind, err) from err
        if step is not None or budget is not None:
            took = time.perf_counter() - t0
            if budget is not None and took > budget:
                log.warning("[%s] action %r took %.3f s, over its budget of %.3f s",
                            ctx.role, name, took, budget)
            if step is not None:
                step.actions.append(ActionRecord(name, kind, took, "ok"))

    run.__name__ = f"{kind}_{name}"
    return run


def guard_value(ctx: Context, name: str, edge: Callable[[], tuple[str, str, str]]) -> bool:
    """Guard ``name``'s value in this step, recorded once for listeners; a raise is a fault."""
    try:
        value = ctx.check(name)
    except BaseException as err:
        if ctx.step is not None:
            ctx.step.actions.append(ActionRecord(name, "guard", 0.0, "raised",
                                                 f"{type(err).__name__}: {err}"))
        raise _fault(ctx, edge(), name, "guard", err) from err
    step = ctx.step
    if step is not None and all(n != name for n, _ in step.guards):
        step.guards.append((name, value))
    return value


def _wrap_guard(name: str) -> Callable[[EventData], bool]:
    def check(ev: EventData) -> bool:
        return guard_value(cast(Context, ev.model), name, lambda: _edge(ev))

    check.__name__ = f"guard_{name}"
    return check


def _mark_rule(rule: str) -> Callable[[EventData], None]:
    def mark(ev: EventData) -> None:
        step = cast(Context, ev.model).step
        if step is not None:
            step.rule = rule

    return mark


@attrs.frozen
class Compiled:
    machine: Machine
    events: Mapping[str, Any]
    guards: Mapping[str, Guard]
    always_states: frozenset[str]
    observed: frozenset[str]  # states that watch the workers on every monitor tick
    finals: frozenset[str]
    initial: str
    reported: Mapping[str, str]
    timers: Mapping[str, Timer]
    # (state, trigger) -> (guards, unless) of an action-less transition that stays in the state,
    # when it is the first candidate: a tick that changes nothing skips transitions' machinery.
    fast: Mapping[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]


def compile_spec(spec: Spec, values: Mapping[str, Any] | None = None) -> Compiled:
    """The shared machine for ``spec`` with its parameters bound to ``values`` (cached on the
    spec)."""
    values = dict(spec.defaults if values is None else values)
    key = ("engine", tuple(sorted(values.items())))
    cached = spec._cache.get(key)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    vocab = spec.vocabulary
    guards: dict[str, Guard] = dict(vocab.guards)
    actions: dict[str, ActionDef] = dict(vocab.actions)
    budgets: dict[str, float] = {}
    for g in spec.guard_defs:
        guards[g.name] = vocab.guard_kinds[g.kind].instantiate(g.args, values)
    for a in spec.action_defs:
        kind = vocab.action_kinds[a.kind]
        actions[a.name] = ActionDef(kind.instantiate(a.args, values), kind.terminal)
        if a.timeout is not None:
            budgets[a.name] = float(a.timeout.resolve(values))

    def wrap(names: Iterable[str], kind: str) -> list[Any]:
        return [_wrap_action(n, actions[n], kind, budgets.get(n)) for n in names]

    machine = Machine(
        model=None,
        states=[State(s.name, on_enter=wrap(s.enter, "enter"), on_exit=wrap(s.exit, "exit"))
                for s in spec.states],
        initial=spec.initial, auto_transitions=False, send_event=True,
        ignore_invalid_triggers=False, name=f"{spec.name}: ",
    )
    wrapped = {g: _wrap_guard(g) for g in guards}
    # transitions tries a trigger's candidates in order. The spec guarantees at most one can be
    # taken, so order cannot change behaviour; staying put first makes the commonest tick (healthy,
    # nobody waiting) the first candidate instead of the second.
    edges = sorted(spec.edges(), key=lambda e: e[1] != e[2])
    fast: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for trigger, source, dest, t in edges:
        machine.add_transition(
            trigger, source,
            None if dest == source else dest,  # stays in the state: no exit/entry actions again
            conditions=[wrapped[g] for g in t.guards],
            unless=[wrapped[g] for g in t.unless],
            before=[*([_mark_rule(t.rule)] if t.rule else []), *wrap(t.actions, "action")],
            after=wrap(t.after, "after"),
        )
        if dest == source and not t.actions and not t.after and (source, trigger) not in fast:
            fast[(source, trigger)] = (t.guards, t.unless)
    for trigger, source, dest, _t in edges:  # keep the fast path only for first candidates
        if dest != source and (source, trigger) in fast:
            first = next(e for e in edges if e[0] == trigger and e[1] == source)
            if first[1] != first[2]:
                del fast[(source, trigger)]
    observed = {src for trig, src, _, _ in spec.edges() if trig in OBSERVATION_TRIGGERS}
    compiled = Compiled(
        machine=machine,
        events=dict(machine.events),
        guards=guards,
        always_states=frozenset(src for trig, src, _, _ in spec.edges() if trig == ALWAYS_TRIGGER),
        observed=frozenset(observed),
        finals=spec.finals,
        initial=spec.initial,
        reported={s.name: s.reported for s in spec.states},
        timers={s.name: make_timer(s.name, s.timeout, values) for s in spec.states
                if s.timeout is not None},
        fast=fast,
    )
    spec._cache[key] = compiled
    return compiled
