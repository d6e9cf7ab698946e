"""The engine: a ``transitions`` machine compiled from a ``Spec``, driving a ``Context``.

One ``transitions.Machine`` is built per spec (and per set of parameter values) and shared by
every ``Lifecycle`` using it. Lifecycles are not registered with ``Machine.add_model`` (whose
bookkeeping is quadratic in the number of models); each fires the machine's events on its own
``Context``. The engine does no I/O of its own: every effect is an action that calls the driver,
and time comes from the lifecycle's clock.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from ._clock import Clock, SystemClock
from ._compile import compile_spec, guard_value
from ._errors import ActionError, LifecycleError, TriggerInterrupt
from ._load import load_spec
from ._params import check_settings
from ._policy import budget_limits
from ._progress import note_attempt_end
from ._spec import (
    ALWAYS_TRIGGER,
    FAILURE_TRIGGERS,
    START_TRIGGER,
    TIMEOUT_TRIGGER,
    Spec,
)
from ._step import Listener, Step, failed_result
from ._vocabulary import Context

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    from ._driver import Driver

__all__ = ["Lifecycle"]

log = logging.getLogger("fsm_agent")

# Shared defaults: seeding a Random per lifecycle would cost more than the rest of building one.
_CLOCK = SystemClock()
_RNG = random.Random()
#: What a wait function passed to ``Lifecycle.run`` returns: None, or a trigger to fire.
Wait = Callable[[float], object]


@cache
def _torch_types() -> Any:
    # torch is imported on first need only: checking or drawing a spec never pays for it.
    from torch.distributed.elastic.agent.server import api

    return api


class Lifecycle:
    """One worker group's lifecycle, as its spec says.

    >>> from fsm_agent.testing import RecordingDriver
    >>> lc = Lifecycle("torchrun", RecordingDriver(["SUCCEEDED"]), max_restarts=1)
    >>> lc.run(0.0).state.name
    'SUCCEEDED'

    ``start()`` runs the initial rendezvous and start, ``observe(result)`` one monitor tick,
    ``run()`` the whole loop of torch's ``_invoke_run`` (with the spec's timers). When an action
    raises, the machine moves to UNKNOWN and ``ActionError`` names the action and the transition;
    exceptions of the types in ``fatal_exceptions`` (and ``BaseException``s such as
    ``KeyboardInterrupt``) propagate as they are. Listeners receive a ``Step`` per transition.
    ``params`` sets the spec's parameters; ``clock`` and ``rng`` make timers deterministic.
    """

    __slots__ = ("_compiled", "_ctx", "_done", "_listeners", "_metrics", "_result", "_started",
                 "spec")

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
        params: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        check_settings(driver, role=role, max_restarts=max_restarts,
                       exit_barrier_timeout=exit_barrier_timeout)
        self.spec: Spec = load_spec(spec)
        bound = self.spec.bind(params)
        values = {**bound, "max_restarts": max_restarts,
                  "exit_barrier_timeout": float(exit_barrier_timeout)}
        self._compiled = compile_spec(self.spec, values)
        window = float(self.spec.budget.window.resolve(values))
        self._ctx = Context(
            driver=driver, role=role, max_restarts=max_restarts, remaining_restarts=max_restarts,
            exit_barrier_timeout=float(exit_barrier_timeout), state=self._compiled.initial,
            fatal_exceptions=tuple(fatal_exceptions), params=bound,
            clock=clock if clock is not None else _CLOCK, rng=rng if rng is not None else _RNG,
            window=window, budget_scope=self.spec.budget.scope,
            budget_limits=budget_limits(self.spec, values, window),
            guard_fns=self._compiled.guards,
        )
        self._listeners: tuple[Listener, ...] = tuple(listeners)
        # Metric names and values per observed state, made on first use (role and params fixed).
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
        """The current state as torch's ``WorkerState`` (the one a spec's own state reports)."""
        obs = self._ctx.observed
        # The observed result's own enum when there is one: a driver with its own result types
        # never makes the engine import torch.
        states = type(obs.state) if obs is not None else _torch_types().WorkerState
        return states[self._compiled.reported[self._ctx.state]]  # type: ignore[no-any-return]

    @property
    def state_name(self) -> str:
        """The current state's name in the spec (no torch import needed)."""
        return self._ctx.state

    @property
    def params(self) -> Mapping[str, Any]:
        """The spec's parameters in force."""
        return self._ctx.params

    @property
    def remaining_restarts(self) -> int:
        """Failure restarts still allowed (within the budget's window)."""
        return self._ctx.remaining_restarts

    @property
    def restart_count(self) -> int:
        """Failure restarts done so far (membership restarts are not counted)."""
        return self._ctx.restart_count

    @property
    def deadline(self) -> float | None:
        """When the current state's timer fires, on the clock's scale (None: no timer)."""
        return self._ctx.deadline

    @property
    def exit_code(self) -> int | None:
        """The exit code the spec asked for (``set_exit_code``), None for the default."""
        return self._ctx.exit_code

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
        if trigger in FAILURE_TRIGGERS:
            ctx.note_failure()
            note_attempt_end(ctx)
        ctx.refresh_budget()
        plan = self._metrics.get(trigger)
        if plan is None:
            plan = self._metrics[trigger] = tuple(
                (m.name.format(role=ctx.role, observed=trigger), ctx.params.get(m.value, m.value)
                 if isinstance(m.value, str) else m.value) for m in self.spec.metrics)
        put = ctx.driver.put_metric
        for name, value in plan:
            put(name, value if isinstance(value, int) else getattr(ctx, value))
        self._fire(trigger)

    def fire(self, trigger: str) -> None:
        """Fire one of the spec's own ``triggers`` (for embedding programs)."""
        if trigger not in self.spec.triggers:
            raise LifecycleError(f"{trigger!r} is not one of the spec's own triggers "
                                 f"({', '.join(self.spec.triggers) or 'none declared'})")
        if self._done:
            raise LifecycleError(f"[{self._ctx.role}] lifecycle already finished")
        self._fire(trigger)

    def poll_timer(self) -> bool:
        """Fire ``timeout`` if the current state's timer has expired; whether it fired.

        ``run()`` does this itself; a program with its own loop calls it after waiting until
        ``deadline`` (on the lifecycle's clock)."""
        ctx = self._ctx
        if self._done or ctx.deadline is None or ctx.clock.now() < ctx.deadline:
            return False
        self._fire(TIMEOUT_TRIGGER)
        return True

    def run(self, monitor_interval: float, sleep: Wait | None = None) -> RunResult:
        """The whole loop: start, then wait, monitor and observe until a final state.

        In a state that watches the workers, each turn waits ``monitor_interval`` (less if the
        state's timer fires first) and observes ``driver.monitor()``; in a waiting state it waits
        for the timer and fires ``timeout``. ``sleep(seconds)`` does the waiting (default: the
        clock's); it may return early, and may return the name of one of the spec's own triggers,
        which is then fired (a state without a transition on it ignores it). Returns the result,
        or raises as the spec says (``WorkerGroupFailureException`` for ``torchelastic``).
        """
        ctx = self._ctx
        wait = sleep if sleep is not None else ctx.clock.sleep
        if not self._started:
            self.start()
        compiled, clock, monitor = self._compiled, ctx.clock, ctx.driver.monitor
        while not self._done:
            state, deadline = ctx.state, ctx.deadline
            observes = state in compiled.observed
            delay = monitor_interval
            if deadline is not None:
                left = deadline - clock.now()
                delay = min(delay, left) if observes else left
            event = wait(max(0.0, delay))
            if isinstance(event, str):
                self._offer(event)
            elif not (ctx.state == state and self.poll_timer()) and observes:
                self.observe(monitor())
        return self._result  # type: ignore[no-any-return]

    def _offer(self, trigger: str) -> None:
        if trigger not in self.spec.triggers:
            raise LifecycleError(f"the wait returned {trigger!r}, which is not one of the spec's "
                                 f"own triggers ({', '.join(self.spec.triggers) or 'none'})")
        event = self._compiled.events.get(trigger)
        if event is None or self._ctx.state not in event.transitions:
            log.debug("[%s] %s ignored in %s", self._ctx.role, trigger, self._ctx.state)
            return
        self._fire(trigger)

    def _fire(self, trigger: str) -> None:
        compiled, ctx = self._compiled, self._ctx
        # A tick that may stay put, with nobody recording it, is decided before any of the
        # step's bookkeeping (a stay-put needs none); its guard values are kept for the machine.
        stay = None if self._listeners else self._fast(trigger, fresh=True)
        if stay:
            return
        evaluated = stay is not None  # the fast path said no: the machine decides, same guards
        while True:
            source, started = ctx.state, ctx.clock.now()
            event = compiled.events.get(trigger)
            if event is None or ctx.state not in event.transitions:
                raise LifecycleError(f"[{ctx.role}] spec {self.spec.name!r} has no transition on "
                                     f"{trigger!r} from {ctx.state}")
            fresh_step, evaluated = not evaluated, False
            if fresh_step:
                ctx.memo.clear()
            step = None
            if self._listeners:
                step = ctx.step = Step(trigger=trigger, source=ctx.state, wall_time=time.time(),
                                       monotonic_time=time.monotonic(), role=ctx.role)
                obs = ctx.observed
                if obs is not None:
                    step.observed = obs.state.name
                    step.failures = getattr(obs, "failures", None) or {}
            try:
                taken = (fresh_step and self._fast(trigger)) or event.trigger(ctx)
            except TriggerInterrupt as err:
                # An action ended early on purpose (the job is over): the machine takes the
                # interrupt's trigger from where it stands, if it can.
                trigger = self._redirect(err, source, step)
                continue
            except BaseException as err:
                self._done = True
                self._settle()
                if step is not None:
                    step.error = f"{type(err).__name__}: {err}"
                    self._notify(step)
                raise
            if ctx.state != source:
                timer = compiled.timers.get(ctx.state)
                delay = timer(ctx) if timer is not None else None
                ctx.deadline = None if delay is None else started + delay
                if step is not None:
                    step.timer = delay
            if step is not None:
                self._notify(step)
            if not taken:
                raise LifecycleError(f"[{ctx.role}] no transition on {trigger!r} from "
                                     f"{ctx.state} is enabled (guards: "
                                     f"{step.guards if step else '?'})")
            if ctx.state in compiled.always_states:
                trigger = ALWAYS_TRIGGER
                continue
            if ctx.state in compiled.finals:
                self._done = True
                self._settle()
            return

    def _redirect(self, err: TriggerInterrupt, source: str, step: Step | None) -> str:
        """The trigger to take after ``err`` interrupted an action; a fault if none can be."""
        ctx, compiled = self._ctx, self._compiled
        if step is not None:
            step.error = f"interrupted: {err}"
            self._notify(step)
        event = compiled.events.get(err.trigger)
        if ctx.state == source and event is not None and source in event.transitions:
            log.info("[%s] %s during %s: %s", ctx.role, err.trigger, source, err.reason or err)
            return err.trigger
        dest = ctx.state
        ctx.state = "UNKNOWN"
        self._done = True
        self._settle()
        raise ActionError(f"[{ctx.role}] {err.trigger} interrupted an action in {dest}, which has "
                          f"no transition on it: {err}", action="?", trigger=err.trigger,
                          source=source, dest=dest) from err

    def _fast(self, trigger: str, fresh: bool = False) -> bool | None:
        """Take an action-less stay-put transition without transitions' machinery, if enabled
        (None: there is none; ``fresh``: a new step, and a guard's fault ends the lifecycle).
        Guard values stay memoised for the machine (the driver is asked once, as torch does)."""
        ctx = self._ctx
        state = ctx.state
        plan = self._compiled.fast.get((state, trigger))
        if plan is None:
            return None
        if fresh:
            ctx.memo.clear()

        def edge() -> tuple[str, str, str]:
            return trigger, state, state

        try:  # loops, not all()/any(): the generators cost a third of a healthy tick
            for g in plan[0]:
                if not guard_value(ctx, g, edge):
                    return False
            for g in plan[1]:  # noqa: SIM110
                if guard_value(ctx, g, edge):
                    return False
            return True
        except BaseException:
            if fresh:
                self._done = True
                self._settle()
            raise

    def _settle(self) -> None:
        ctx = self._ctx
        ctx.step = None
        ctx.deadline = None
        if ctx.state not in self._compiled.finals:
            return
        obs = ctx.observed
        if self._compiled.reported[ctx.state] == "FAILED":
            obs = failed_result(obs, _torch_types)
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
            except ctx.fatal_exceptions:  # a signal that came during a trace write: the agent's
                raise
            except Exception:
                # An observer (a trace file on a full disk, say) must not change the job's outcome.
                log.exception("[%s] lifecycle listener %r failed", ctx.role, listener)

