"""The engine: a ``transitions`` machine compiled from a ``Spec``, driving a ``Context``.

One ``transitions.Machine`` is built per spec and shared by every ``Lifecycle`` of that spec.
Lifecycles are not registered with ``Machine.add_model`` (whose bookkeeping is quadratic in the
number of models); each fires the machine's events on its own ``Context``. The engine does no I/O
of its own: every effect is an action that calls the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import attrs
from transitions import EventData, Machine, State

from ._errors import ActionError, LifecycleError
from ._spec import ALWAYS_TRIGGER, ERROR_STATE, START_TRIGGER, Spec, load_spec
from ._vocabulary import ActionDef, Context, Guard

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    from ._driver import Driver

__all__ = ["ActionRecord", "Lifecycle", "Listener", "Step"]

log = logging.getLogger("fsm_agent")

_DRIVER_METHODS = (
    "rendezvous",
    "start_workers",
    "stop_workers",
    "monitor",
    "num_nodes_waiting",
    "exit_barrier",
    "put_metric",
)


@attrs.define(slots=True)
class ActionRecord:
    """One action (or guard that raised) run during a step."""

    name: str
    kind: str  # "action", "after", "enter", "exit", "guard"
    duration: float
    outcome: str  # "ok" or "raised"
    error: str | None = None


@attrs.define(slots=True)
class Step:
    """What one transition did; listeners (such as the trace writer) receive one per transition."""

    trigger: str
    source: str
    wall_time: float
    monotonic_time: float
    role: str
    dest: str | None = None
    guards: list[tuple[str, bool]] = attrs.field(factory=list)
    actions: list[ActionRecord] = attrs.field(factory=list)
    remaining_restarts: int = 0
    restart_count: int = 0
    observed: str | None = None
    failures: Mapping[int, Any] = attrs.field(factory=dict)
    error: str | None = None


Listener = Callable[[Step], None]


@cache
def _torch_types() -> Any:
    # torch is imported on first need only: checking or drawing a spec never pays for it.
    from torch.distributed.elastic.agent.server import api

    return api


def _edge(ev: EventData) -> tuple[str, str, str]:
    trans = ev.transition
    source = str(trans.source) if trans is not None else cast(Context, ev.model).state
    dest = trans.dest if trans is not None and trans.dest is not None else source
    return ev.event.name if ev.event is not None else "?", source, str(dest)


def _fault(ev: EventData, name: str, kind: str, err: BaseException) -> BaseException:
    """Move the model to UNKNOWN and build the exception to raise for a failed action or guard."""
    ctx = cast(Context, ev.model)
    trigger, source, dest = _edge(ev)
    ctx.state = ERROR_STATE
    if not isinstance(err, Exception) or isinstance(err, ctx.fatal_exceptions):
        # Signals and the driver's fatal errors must reach the supervisor as they are.
        return err
    what = {
        "enter": f"entry action {name!r} of {dest}",
        "exit": f"exit action {name!r} of {source}",
        "guard": f"guard {name!r}",
    }.get(kind, f"action {name!r}")
    msg = (
        f"[{ctx.role}] {what} failed during transition {trigger!r} {source} -> {dest}: "
        f"{type(err).__name__}: {err}"
    )
    out = ActionError(msg, action=name, trigger=trigger, source=source, dest=dest)
    out.__cause__ = err
    return out


def _wrap_action(name: str, adef: ActionDef, kind: str) -> Callable[[EventData], None]:
    fn = adef.fn
    terminal = adef.terminal

    def run(ev: EventData) -> None:
        ctx = cast(Context, ev.model)
        step = ctx.step
        t0 = time.perf_counter() if step is not None else 0.0
        try:
            fn(ctx)
        except BaseException as err:
            if step is not None:
                step.actions.append(
                    ActionRecord(
                        name,
                        kind,
                        time.perf_counter() - t0,
                        "raised",
                        f"{type(err).__name__}: {err}",
                    )
                )
            if terminal:
                raise
            raise _fault(ev, name, kind, err) from err
        if step is not None:
            step.actions.append(ActionRecord(name, kind, time.perf_counter() - t0, "ok"))

    run.__name__ = f"{kind}_{name}"
    return run


def _wrap_guard(name: str, fn: Guard) -> Callable[[EventData], bool]:
    def check(ev: EventData) -> bool:
        ctx = cast(Context, ev.model)
        memo = ctx.memo
        if name in memo:
            return memo[name]
        try:
            value = bool(fn(ctx))
        except BaseException as err:
            if ctx.step is not None:
                ctx.step.actions.append(
                    ActionRecord(name, "guard", 0.0, "raised", f"{type(err).__name__}: {err}")
                )
            raise _fault(ev, name, "guard", err) from err
        memo[name] = value
        if ctx.step is not None:
            ctx.step.guards.append((name, value))
        return value

    check.__name__ = f"guard_{name}"
    return check


@attrs.frozen
class _Compiled:
    machine: Machine
    events: Mapping[str, Any]
    always_states: frozenset[str]
    finals: frozenset[str]
    initial: str


def compile_spec(spec: Spec) -> _Compiled:
    """The shared ``transitions.Machine`` for ``spec`` (built once, then cached on the spec)."""
    cached = spec._cache.get("engine")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    vocab = spec.vocabulary
    states = [
        State(
            s.name,
            on_enter=[_wrap_action(a, vocab.actions[a], "enter") for a in s.enter],
            on_exit=[_wrap_action(a, vocab.actions[a], "exit") for a in s.exit],
        )
        for s in spec.states
    ]
    machine = Machine(
        model=None,
        states=states,
        initial=spec.initial,
        auto_transitions=False,
        send_event=True,
        ignore_invalid_triggers=False,
        name=f"{spec.name}: ",
    )
    guards = {g: _wrap_guard(g, fn) for g, fn in vocab.guards.items()}
    # transitions tries a trigger's candidates in order. The spec guarantees at most one can be
    # taken, so order cannot change behaviour; staying put first makes the commonest tick (healthy,
    # nobody waiting) the first candidate instead of the second.
    edges = sorted(spec.edges(), key=lambda e: e[1] != e[2])
    for trigger, source, dest, t in edges:
        machine.add_transition(
            trigger,
            source,
            # A transition to its own state stays in it: exit and entry actions do not run again.
            None if dest == source else dest,
            conditions=[guards[g] for g in t.guards],
            unless=[guards[g] for g in t.unless],
            before=[_wrap_action(a, vocab.actions[a], "action") for a in t.actions],
            after=[_wrap_action(a, vocab.actions[a], "after") for a in t.after],
        )
    compiled = _Compiled(
        machine=machine,
        events=dict(machine.events),
        always_states=frozenset(src for trig, src, _, _ in spec.edges() if trig == ALWAYS_TRIGGER),
        finals=spec.finals,
        initial=spec.initial,
    )
    spec._cache["engine"] = compiled
    return compiled


class Lifecycle:
    """One worker group's lifecycle, as its spec says.

    >>> from fsm_agent.testing import RecordingDriver
    >>> lc = Lifecycle("torchrun", RecordingDriver(["SUCCEEDED"]), max_restarts=1)
    >>> lc.run(0.0).state.name
    'SUCCEEDED'

    ``start()`` runs the initial rendezvous and start, ``observe(result)`` one monitor tick, and
    ``run()`` the whole loop of torch's ``_invoke_run``. When an action raises, the machine moves
    to UNKNOWN and ``ActionError`` names the action and the transition; exceptions of the types in
    ``fatal_exceptions`` (and ``BaseException``s such as ``KeyboardInterrupt``) propagate as they
    are. Listeners receive a ``Step`` per transition.
    """

    __slots__ = (
        "_compiled", "_ctx", "_done", "_listeners", "_metrics", "_result", "_started", "spec"
    )

    def __init__(
        self,
        spec: Spec | str,
        driver: Driver,
        *,
        role: str = "default",
        max_restarts: int = 3,
        exit_barrier_timeout: float = 300.0,
        fatal_exceptions: Iterable[type[BaseException]] = (),
        listeners: Iterable[Listener] = (),
    ) -> None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
        # torch accepts 0 (the barrier then waits for nobody: it passes only if every agent is
        # already there); negative and NaN are refused here, not later at the barrier.
        if not exit_barrier_timeout >= 0:
            raise ValueError(
                f"exit_barrier_timeout must be >= 0 seconds, got {exit_barrier_timeout!r}"
            )
        if not isinstance(role, str) or not role:
            raise ValueError(f"role must be a non-empty string, got {role!r}")
        missing = [m for m in _DRIVER_METHODS if not callable(getattr(driver, m, None))]
        if missing:
            raise TypeError(f"driver {type(driver).__name__} lacks {', '.join(missing)}")
        self.spec: Spec = load_spec(spec)
        self._compiled = compile_spec(self.spec)
        self._ctx = Context(
            driver=driver,
            role=role,
            max_restarts=max_restarts,
            remaining_restarts=max_restarts,
            exit_barrier_timeout=float(exit_barrier_timeout),
            state=self._compiled.initial,
            fatal_exceptions=tuple(fatal_exceptions),
        )
        self._listeners: tuple[Listener, ...] = tuple(listeners)
        # Metric names per observed state, formatted on first use (the role is fixed).
        self._metrics: dict[str, tuple[tuple[str, int | str], ...]] = {}
        self._started = False
        self._done = False
        self._result: Any = None

    # -- what the machine holds --------------------------------------------------------------

    @property
    def context(self) -> Context:
        """The model the guards and actions see."""
        return self._ctx

    @property
    def state(self) -> WorkerState:
        """The current state, as torch's ``WorkerState``."""
        obs = self._ctx.observed
        # The observed result's own enum when there is one: a driver with its own result types
        # never makes the engine import torch.
        states = type(obs.state) if obs is not None else _torch_types().WorkerState
        return states[self._ctx.state]  # type: ignore[no-any-return]

    @property
    def state_name(self) -> str:
        """The current state's name (no torch import needed)."""
        return self._ctx.state

    @property
    def remaining_restarts(self) -> int:
        """Failure restarts still allowed."""
        return self._ctx.remaining_restarts

    @property
    def restart_count(self) -> int:
        """Failure restarts done so far (membership restarts are not counted)."""
        return self._ctx.restart_count

    @property
    def done(self) -> bool:
        """True once the machine is final or an exception ended the lifecycle."""
        return self._done

    @property
    def result(self) -> RunResult | None:
        """The run's result once a final state is reached (state FAILED whenever it gave up)."""
        return self._result  # type: ignore[no-any-return]

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(step)`` after every transition from now on."""
        self._listeners = (*self._listeners, listener)

    # -- driving it --------------------------------------------------------------------------

    def start(self) -> None:
        """Leave INIT: the first rendezvous and start, as the spec's ``start`` transition says."""
        if self._started:
            raise LifecycleError(f"[{self._ctx.role}] lifecycle already started")
        self._started = True
        self._fire(START_TRIGGER)

    def observe(self, result: RunResult) -> None:
        """One monitor tick: put the spec's metrics, then take the transition of ``result``."""
        ctx = self._ctx
        if self._done:
            raise LifecycleError(f"[{ctx.role}] lifecycle already finished in {ctx.state}")
        if not self._started:
            raise LifecycleError(f"[{ctx.role}] call start() before observe()")
        ctx.observed = result
        trigger = result.state.name.lower()
        plan = self._metrics.get(trigger)
        if plan is None:
            plan = self._metrics[trigger] = tuple(
                (m.name.format(role=ctx.role, observed=trigger), m.value)
                for m in self.spec.metrics
            )
        put = ctx.driver.put_metric
        for name, value in plan:
            put(name, value if isinstance(value, int) else getattr(ctx, value))
        self._fire(trigger)

    def fire(self, trigger: str) -> None:
        """Fire one of the spec's own ``triggers`` (for embedding programs)."""
        if trigger not in self.spec.triggers:
            raise LifecycleError(
                f"{trigger!r} is not one of the spec's own triggers "
                f"({', '.join(self.spec.triggers) or 'none declared'})"
            )
        if self._done:
            raise LifecycleError(f"[{self._ctx.role}] lifecycle already finished")
        self._fire(trigger)

    def run(
        self, monitor_interval: float, sleep: Callable[[float], object] = time.sleep
    ) -> RunResult:
        """The whole loop: start, then sleep, monitor and observe until a final state.

        Returns the result, or raises as the spec says (``WorkerGroupFailureException`` for the
        ``torchelastic`` preset on giving up).
        """
        if not self._started:
            self.start()
        monitor = self._ctx.driver.monitor
        while not self._done:
            sleep(monitor_interval)
            self.observe(monitor())
        return self._result  # type: ignore[no-any-return]

    def _fire(self, trigger: str) -> None:
        compiled = self._compiled
        ctx = self._ctx
        while True:
            event = compiled.events.get(trigger)
            if event is None or ctx.state not in event.transitions:
                raise LifecycleError(
                    f"[{ctx.role}] spec {self.spec.name!r} has no transition on "
                    f"{trigger!r} from {ctx.state}"
                )
            ctx.memo.clear()
            step = None
            if self._listeners:
                step = Step(
                    trigger=trigger,
                    source=ctx.state,
                    wall_time=time.time(),
                    monotonic_time=time.monotonic(),
                    role=ctx.role,
                )
                obs = ctx.observed
                if obs is not None:
                    step.observed = obs.state.name
                    step.failures = getattr(obs, "failures", None) or {}
                ctx.step = step
            try:
                taken = event.trigger(ctx)
            except BaseException as err:
                self._done = True
                self._settle()
                if step is not None:
                    step.error = f"{type(err).__name__}: {err}"
                    self._notify(step)
                raise
            if step is not None:
                self._notify(step)
            if not taken:
                raise LifecycleError(
                    f"[{ctx.role}] no transition on {trigger!r} from "
                    f"{ctx.state} is enabled (guards: {step.guards if step else '?'})"
                )
            if ctx.state in compiled.always_states:
                trigger = ALWAYS_TRIGGER
                continue
            if ctx.state in compiled.finals:
                self._done = True
                self._settle()
            return

    def _settle(self) -> None:
        ctx = self._ctx
        ctx.step = None
        if ctx.state not in self._compiled.finals:
            return
        obs = ctx.observed
        if obs is not None and ctx.state == "FAILED" and obs.state.name != "FAILED":
            # Giving up always reports FAILED: torch 2.13 returns the raw UNHEALTHY result here,
            # which its launcher then reports as a success.
            failed = type(obs.state)["FAILED"]
            obs = (
                dataclasses.replace(obs, state=failed)
                if dataclasses.is_dataclass(obs) and not isinstance(obs, type)
                else _torch_types().RunResult(
                    state=failed, return_values=dict(obs.return_values), failures=dict(obs.failures)
                )
            )
        self._result = obs

    def _notify(self, step: Step) -> None:
        ctx = self._ctx
        step.dest = ctx.state
        step.remaining_restarts = ctx.remaining_restarts
        step.restart_count = ctx.restart_count
        ctx.step = None
        for listener in self._listeners:
            try:
                listener(step)
            except Exception:
                # An observer (a trace file on a full disk, say) must not change the job's outcome.
                log.exception("[%s] lifecycle listener %r failed", ctx.role, listener)
