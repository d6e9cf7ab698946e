"""Property-based model tests: random monitor results, nodes waiting, barrier outcomes and (for
``resilient``) exit codes, signals, elapsed time and jitter draws, for the three presets, checked
step by step against invariants and the reference model.

The reference is the conformance kit's (``fsm_agent.testing.ReferenceRun``), written from the
behaviour tables (MISSION.md's for the torch presets, issue 10's for ``resilient``), not from the
engine or the spec files; here it is stepped one tick at a time beside a ``Lifecycle`` driven
through its step API (``start``, ``observe``, ``deadline``, ``poll_timer``) on a virtual clock,
where the kit runs whole scripts through ``Lifecycle.run``.
"""

from __future__ import annotations

import functools
import math
import os

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

from fsm_agent import Lifecycle, LifecycleError, VirtualClock
from fsm_agent.testing import RecordingDriver, ReferenceRun, ScriptedRandom
from fsm_agent.testing._conformance import compare_traces, same_calls
from fsm_agent.testing._reference import RESILIENT_DEFAULTS, Pending, Raised, Returned, Trace
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
        self.driver = RecordingDriver()
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

    def _sleep(self, seconds: float) -> None:
        # The test's own loop waits as Lifecycle.run would; the waits go in the call list.
        self.driver.calls.append(("sleep", seconds))
        self.clock.sleep(seconds)

    def _lifecycle_trace(self, error: BaseException | None) -> Trace:
        assert self.lc is not None
        outcome: Returned | Raised | Pending = Pending()
        if error is not None:
            outcome = Raised(type(error).__name__, str(error))
        elif self.lc.done:
            result = self.lc.result
            assert result is not None
            outcome = Returned(result.state.name, result.return_values,
                               failure_summary(result.failures))
        return Trace(tuple(self.driver.calls), outcome, self.lc.state.name,
                     self.lc.remaining_restarts, self.lc.exit_code)

    # Timed ticks for every preset: the torch presets must ignore elapsed time and draws.
    @precondition(lambda self: self.ref.outcome is None)
    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        assert self.lc is not None
        tick = data.draw(ticks(faults=False, timed=True), label="tick")
        before = len(self.driver.calls)
        remaining_before = self.lc.remaining_restarts
        self.ticks += 1
        barrier = None if tick.barrier == "ok" else barrier_error(tick.barrier)
        self.driver.extend(nodes_waiting=[tick.nodes_waiting], barrier=[barrier])
        self.rng.value = tick.draw
        self._sleep(self.config.monitor_interval)
        self.driver.calls.append(("monitor",))
        self.clock.advance(tick.elapsed)
        error: BaseException | None = None
        try:
            self.lc.observe(tick_result(self.ticks, tick))
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
        want = self.ref.trace() if self.ref.outcome is not None else Trace(
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
        # Workers are stopped before FAILED is reached.
        if self.lc.state is WorkerState.FAILED:
            names = [c[0] for c in new if c[0] != "put_metric"]
            assert "stop_workers" in names
            assert names.index("stop_workers") < len(names) - (1 if "exit_barrier" in names else 0)
        if tick.observed in ("UNKNOWN", "INIT", "STOPPED"):
            assert error is not None
            assert self.lc.state.name == tick.observed

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
            if self.ref.params.get("restart_window", math.inf) == math.inf:
                assert self.lc.restart_count == (self.config.max_restarts
                                                 - self.lc.remaining_restarts)

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
    def no_requeue_code_only_on_a_no_retry_give_up(self) -> None:
        if self.lc is None or self.lc.exit_code is None:
            return
        assert self.preset == "resilient"
        assert self.lc.state is WorkerState.FAILED
        assert self.lc.exit_code == self.ref.params["no_requeue_exit_code"]
        result = self.lc.result
        assert result is not None and result.failures
        listed = {f.exitcode for f in result.failures.values()}
        codes = (listed - {-15}) or listed  # ranks torch stopped are not failed ranks
        assert codes <= set(self.ref.params["no_retry_exit_codes"])


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
