"""Property-based model tests: random monitor results, nodes waiting, barrier outcomes and (for
``resilient``) exit codes, signals, elapsed time, jitter draws, preemptions with every end of the
drain, and progress steps, for the three presets, checked step by step against invariants and
the reference model.

The reference is the conformance kit's (``fsm_agent.testing.ReferenceRun``), written from the
behaviour tables (the README's preset table), not from the
engine or the spec files; here it is stepped one tick at a time beside a ``Lifecycle`` driven
through its step API (``start``, ``observe``, ``deadline``, ``poll_timer``) on a virtual clock,
where the kit runs whole scripts through ``Lifecycle.run``.
"""

from __future__ import annotations

import functools
import math
import os
import signal

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from torch.distributed.elastic.agent.server.api import WorkerState

from fsm_agent import Lifecycle, LifecycleError, Preemption, VirtualClock
from fsm_agent._core._progress import Mark
from fsm_agent.testing import RecordingDriver, ReferenceRun, ScriptedRandom
from fsm_agent.testing._compare import compare_traces, same_calls
from fsm_agent.testing._reference import (
    RESILIENT_DEFAULTS,
    ConformanceTrace,
    Pending,
    Raised,
    Returned,
)
from fsm_agent.testing._strategies import (
    RESILIENT_PARAM_VALUES,
    RunConfig,
    Tick,
    barrier_error,
    failure_summary,
    params,
    run_configs,
    tick_result,
    ticks,
)

STATES = [s.name for s in WorkerState]
TIMEOUT = 42.0

EXAMPLES = int(os.environ.get("FSM_AGENT_MODEL_EXAMPLES", "120"))
STEPS = 50


@functools.cache
def configs(preset: str) -> st.SearchStrategy[RunConfig]:
    """The kit's run settings for ``preset`` (for resilient: its parameters, exact intervals)."""
    if preset != "resilient":
        return run_configs(init_faults=(None,))
    return run_configs(init_faults=(None,), monitor_intervals=(0.5, 4.0),
                       param_sets=params(RESILIENT_PARAM_VALUES, RESILIENT_DEFAULTS))


class LifecycleModel(RuleBasedStateMachine):
    preset = "torchelastic"

    def __init__(self) -> None:
        super().__init__()
        self.lc: Lifecycle | None = None

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        config = data.draw(configs(self.preset), label="config")
        self.config = attrs.evolve(config, exit_barrier_timeout=TIMEOUT)
        self.driver = RecordingDriver(mark=Mark())
        self.clock = VirtualClock()
        self.rng = ScriptedRandom()
        self.lc = Lifecycle(self.preset, self.driver, role=config.role,
                            max_restarts=config.max_restarts, exit_barrier_timeout=TIMEOUT,
                            params=self.config.param_values(), clock=self.clock, rng=self.rng)
        self.ref = ReferenceRun(self.preset, self.config)
        self.ref.start()
        self.lc.start()
        assert self.driver.calls == self.ref.events == [("rendezvous",), ("start_workers",)]
        self.ticks = 0
        self.barrier_runs = 0
        self.waits: list[float] = []
        self.best_step: int | None = None
        self.preempted: str | None = None  # the signal of the preemption, once delivered

    def _sleep(self, seconds: float) -> None:
        # The test's own loop waits as Lifecycle.run would; the waits go in the call list.
        self.driver.calls.append(("sleep", seconds))
        self.clock.sleep(seconds)

    def _lifecycle_trace(self, error: BaseException | None) -> ConformanceTrace:
        assert self.lc is not None
        outcome: Returned | Raised | Pending = Pending()
        if error is not None:
            outcome = Raised(type(error).__name__, str(error),
                             exit_code=getattr(error, "exit_code", None))
        elif self.lc.done:
            result = self.lc.result
            assert result is not None
            outcome = Returned(result.state.name, result.return_values,
                               failure_summary(result.failures))
        return ConformanceTrace(tuple(self.driver.calls), outcome, self.lc.state.name,
                     self.lc.remaining_restarts, self.lc.exit_code)

    # Timed ticks for every preset: the torch presets must ignore elapsed time and draws.
    @precondition(lambda self: self.ref.outcome is None)
    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        assert self.lc is not None
        resilient = self.preset == "resilient"
        tick = data.draw(ticks(faults=False, timed=True, drains=resilient, progress=resilient),
                         label="tick")
        before = len(self.driver.calls)
        remaining_before = self.lc.remaining_restarts
        self.ticks += 1
        barrier = None if tick.barrier == "ok" else barrier_error(tick.barrier)
        self.driver.extend(nodes_waiting=[tick.nodes_waiting], barrier=[barrier])
        self.rng.value = tick.draw
        self._sleep(self.config.monitor_interval)
        self.driver.calls.append(("monitor",))
        self.clock.advance(tick.elapsed)
        if tick.step is not None:
            self.best_step = (tick.step if self.best_step is None
                              else max(self.best_step, tick.step))
        self.driver.mark = Mark(self.best_step)
        error: BaseException | None = None
        try:
            self.lc.observe(tick_result(self.ticks, tick))
            if tick.preempt is not None and not self.lc.done:
                self._preempt(tick)
            # A waiting state (resilient's BACKOFF): wait for its timer, as Lifecycle.run does.
            while not self.lc.done and self.lc.deadline is not None:
                wait = self.lc.deadline - self.clock.now()
                self.waits.append(wait)
                self._sleep(wait)
                assert self.lc.poll_timer()
        except LifecycleError:
            raise
        except Exception as e:
            error = e
        # Unconsumed script entries would leak into the next tick.
        self.driver.clear_script()
        self.ref.tick(tick)

        new = self.driver.calls[before:]
        assert same_calls(self.ref.events[before:], new), (tick, self.ref.events[before:], new)
        ours = self._lifecycle_trace(error)
        want = self.ref.trace() if self.ref.outcome is not None else ConformanceTrace(
            tuple(self.ref.events), Pending(), self.ref.state, self.ref.remaining_restarts,
            self.ref.exit_code)
        assert not compare_traces(want, ours), (compare_traces(want, ours), want, ours)
        assert self.clock.now() == pytest.approx(self.ref.now)
        self.barrier_runs += sum(1 for c in new if c[0] == "exit_barrier")

        # Only failure-driven restarts consume one; membership restarts never do.
        if self.lc.restart_count > 0 and self.lc.remaining_restarts < remaining_before:
            assert tick.observed in ("FAILED", "UNHEALTHY")
        if tick.observed == "HEALTHY" and self.ref.params.get("restart_window",
                                                              math.inf) == math.inf:
            assert self.lc.remaining_restarts == remaining_before
        # Workers are stopped (or, at a drain's deadline, killed) before FAILED is reached.
        if self.lc.state is WorkerState.FAILED:
            names = [c[0] for c in new if c[0] != "put_metric"]
            stops = [i for i, n in enumerate(names) if n in ("stop_workers", "kill_workers")]
            assert stops
            assert stops[0] < len(names) - (1 if "exit_barrier" in names else 0)
        if tick.observed in ("UNKNOWN", "INIT", "STOPPED"):
            assert error is not None
            assert self.lc.state.name == tick.observed

    def _preempt(self, tick: Tick) -> None:
        """The first wait after the tick (the backoff's, or the next monitor wait) is woken by
        the preemption; then the drain's wait, woken once the workers exited, or to its end."""
        assert self.lc is not None and tick.preempt is not None
        deadline = self.lc.deadline
        self.driver.calls.append(("sleep", self.config.monitor_interval if deadline is None
                                  else deadline - self.clock.now()))
        self.driver.calls.append(("woken", "preempted"))
        self.preempted = tick.preempt
        self.driver.preempted = Preemption(int(signal.Signals[tick.preempt]),
                                           f"received {tick.preempt}")
        self.lc.fire("preempted")
        assert self.lc.state_name == "DRAINING" and self.lc.deadline is not None
        wait = self.lc.deadline - self.clock.now()
        self.driver.calls.append(("sleep", wait))
        hooks = [c[0] for c in self.driver.calls
                 if c[0] in ("start_workers", "stop_workers", "kill_workers")]
        running = bool(hooks) and hooks[-1] == "start_workers"
        if not running or tick.drain != "ignore":
            self.driver.calls.append(("woken", "drained"))
            self.lc.fire("drained")
        else:
            self.clock.advance(wait)
            self.lc.poll_timer()
        raise AssertionError("the drain did not end the run")  # pragma: no cover

    @precondition(lambda self: self.ref.outcome is not None)
    @rule(observed=st.sampled_from(STATES))
    def tick_after_the_end(self, observed: str) -> None:
        assert self.lc is not None
        before = len(self.driver.calls)
        with pytest.raises(LifecycleError):
            self.lc.observe(tick_result(self.ticks + 1, Tick(observed)))
        assert len(self.driver.calls) == before  # nothing else happens: no action, no metric

    @invariant()
    def state_is_one_of_the_seven(self) -> None:
        if self.lc is not None:
            assert self.lc.state in set(WorkerState)

    @invariant()
    def restarts_stay_in_range(self) -> None:
        if self.lc is not None:
            assert 0 <= self.lc.remaining_restarts <= self.config.max_restarts
            ctx = self.lc.context
            if self.ref.params.get("restart_window", math.inf) == math.inf:
                # every budget's restarts count for the attempt number; each budget stays
                # within its own maximum (the infra budget: infra_restarts)
                assert self.lc.restart_count == (self.config.max_restarts
                                                 - self.lc.remaining_restarts
                                                 + sum(ctx.budget_counts.values()))
                for name, used in ctx.budget_counts.items():
                    assert used <= ctx.budget_limits[name][0], (name, used)

    @invariant()
    def every_restart_is_stop_rendezvous_start(self) -> None:
        if self.lc is None:
            return
        names = [c[0] for c in self.driver.calls if c[0] not in ("put_metric", "sleep")]
        for i, name in enumerate(names):
            if name == "rendezvous" and i > 0:
                assert names[i - 1] == "stop_workers", names
            if name == "start_workers":
                assert names[i - 1] == "rendezvous", names

    @invariant()
    def backoffs_wait_within_their_jitter(self) -> None:
        if self.lc is None or not self.waits:
            return
        p = self.ref.params
        for wait in self.waits:
            assert 0 <= wait <= p["backoff_max"] * (1 + p["backoff_jitter"]) + 1e-9

    @invariant()
    def barrier_runs_at_most_once_and_when_the_preset_says(self) -> None:
        if self.lc is None:
            return
        assert self.barrier_runs <= 1
        if self.ref.outcome is None:
            assert self.barrier_runs == 0
        elif self.lc.state is WorkerState.SUCCEEDED:
            assert self.barrier_runs == 1
        elif self.lc.state is WorkerState.FAILED:
            assert self.barrier_runs == (1 if self.preset == "torchelastic" else 0)
        else:
            assert self.barrier_runs == 0

    @invariant()
    def exit_codes_only_on_a_no_retry_or_no_progress_give_up_or_a_drain(self) -> None:
        if self.lc is None or self.lc.exit_code is None:
            return
        assert self.preset == "resilient"
        assert self.lc.state is WorkerState.FAILED
        p = self.ref.params
        if self.preempted is not None:  # a drain: the preemption's code, never a success
            assert self.lc.state_name == "PREEMPTED"
            assert self.lc.exit_code == (p["preempted_exit_code"]
                                         or 128 + int(signal.Signals[self.preempted]))
            return
        assert self.lc.exit_code == p["no_requeue_exit_code"]
        result = self.lc.result
        assert result is not None
        if 0 < p["no_progress_restarts"] <= self.ref.stalled_restarts:
            return  # gave up after no_progress_restarts restarts in a row without progress
        assert result.failures
        listed = {f.exitcode for f in result.failures.values()}
        codes = (listed - {-15}) or listed  # ranks torch stopped are not failed ranks
        assert codes <= set(p["no_retry_exit_codes"])

    @invariant()
    def a_drain_ends_preempted_and_never_at_the_barrier(self) -> None:
        if self.lc is None or self.preempted is None:
            return
        assert self.lc.done and self.lc.state_name == "PREEMPTED", self.lc.state_name
        names = [c[0] for c in self.driver.calls]
        drained = names.index("drain_workers")
        assert "exit_barrier" not in names
        assert {"stop_workers", "kill_workers"} & set(names[drained:])


MODEL_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class TorchelasticModel(LifecycleModel):
    preset = "torchelastic"


class TorchrunModel(LifecycleModel):
    preset = "torchrun"


class ResilientModel(LifecycleModel):
    preset = "resilient"


TestTorchelastic = TorchelasticModel.TestCase
TestTorchelastic.settings = MODEL_SETTINGS
TestTorchrun = TorchrunModel.TestCase
TestTorchrun.settings = MODEL_SETTINGS
TestResilient = ResilientModel.TestCase
TestResilient.settings = MODEL_SETTINGS
