"""Property-based model tests: random monitor results, nodes waiting and barrier outcomes, for
both presets, checked step by step against invariants and an independent reference.

The reference below is written from the behaviour table in MISSION.md, not from the engine or the
spec files: it is the table, tick by tick.
"""

from __future__ import annotations

import os
from typing import Any

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

from fsm_agent import Lifecycle, LifecycleError, WorkerGroupFailureException
from fsm_agent.testing import RecordingDriver, make_result

STATES = [s.name for s in WorkerState]
# Repeats make long runs likely (seven equally likely results would end most runs in 3 ticks);
# HEALTHY first, so that shrinking moves toward the plain healthy tick.
WEIGHTED = ["HEALTHY"] * 4 + ["FAILED", "UNHEALTHY"] * 2 + STATES
TIMEOUT = 42.0
RESTART = [("stop_workers",), ("rendezvous",), ("start_workers",)]

EXAMPLES = int(os.environ.get("FSM_AGENT_MODEL_EXAMPLES", "200"))
STEPS = 50


def reference_tick(
    preset: str, *, role: str, max_restarts: int, remaining: int, observed: str, waiting: int
) -> tuple[list[tuple[Any, ...]], int, tuple[str, Any] | None]:
    """Driver calls of one monitor tick, remaining restarts after it, and the outcome if it ends.

    The outcome is ("return", state name) or ("raise", (exception type, message)).
    """
    calls: list[tuple[Any, ...]] = [
        ("put_metric", f"workers.{role}.remaining_restarts", remaining),
        ("put_metric", f"workers.{role}.{observed.lower()}", 1),
    ]
    if observed == "SUCCEEDED":
        return [*calls, ("exit_barrier", TIMEOUT)], remaining, ("return", "SUCCEEDED")
    if observed in ("FAILED", "UNHEALTHY"):
        if remaining > 0:
            return calls + RESTART, remaining - 1, None
        calls.append(("stop_workers",))
        if preset == "torchelastic":
            calls.append(("exit_barrier", TIMEOUT))
            msg = f"[{role}] exceeded max_restarts={max_restarts}"
            return calls, remaining, ("raise", (WorkerGroupFailureException, msg))
        return calls, remaining, ("return", "FAILED")
    if observed == "HEALTHY":
        calls.append(("num_nodes_waiting",))
        if waiting > 0:
            calls += RESTART
        return calls, remaining, None
    return calls, remaining, ("raise", (Exception, f"[{role}] Worker group in {observed} state"))


class LifecycleModel(RuleBasedStateMachine):
    preset = "torchelastic"

    def __init__(self) -> None:
        super().__init__()
        self.lc: Lifecycle | None = None

    @initialize(
        max_restarts=st.integers(0, 5),
        role=st.sampled_from(["default", "trainer"]),
    )
    def start(self, max_restarts: int, role: str) -> None:
        self.driver = RecordingDriver()
        self.role, self.max_restarts = role, max_restarts
        self.lc = Lifecycle(self.preset, self.driver, role=role, max_restarts=max_restarts,
                            exit_barrier_timeout=TIMEOUT)
        self.remaining = max_restarts
        self.outcome: tuple[str, Any] | None = None
        self.barrier_runs = 0
        self.lc.start()
        assert self.driver.calls == [("rendezvous",), ("start_workers",)]
        self.prev_remaining = max_restarts

    @precondition(lambda self: self.outcome is None)
    @rule(
        observed=st.sampled_from(WEIGHTED),
        waiting=st.integers(0, 2),
        barrier_fails=st.booleans(),
    )
    def tick(self, observed: str, waiting: int, barrier_fails: bool) -> None:
        assert self.lc is not None
        before = len(self.driver.calls)
        self.driver.extend(
            nodes_waiting=[waiting],
            barrier=[TimeoutError("barrier timed out") if barrier_fails else None],
        )
        want_calls, want_remaining, want_outcome = reference_tick(
            self.preset, role=self.role, max_restarts=self.max_restarts,
            remaining=self.remaining, observed=observed, waiting=waiting,
        )
        got_outcome: tuple[str, Any] | None = None
        try:
            self.lc.observe(make_result(observed))
        except LifecycleError:
            raise
        except Exception as e:
            got_outcome = ("raise", (type(e), str(e)))
        else:
            if self.lc.done:
                assert self.lc.result is not None
                got_outcome = ("return", self.lc.result.state.name)
        # Unconsumed script entries would leak into the next tick.
        self.driver.clear_script()
        new_calls = self.driver.calls[before:]
        assert new_calls == want_calls, (observed, waiting)
        assert got_outcome == want_outcome
        assert self.lc.remaining_restarts == want_remaining
        self.prev_remaining, self.remaining = self.remaining, want_remaining
        self.outcome = got_outcome
        self.barrier_runs += sum(1 for c in new_calls if c[0] == "exit_barrier")

        # Only failure-driven restarts consume one; membership restarts never do.
        if self.remaining < self.prev_remaining:
            assert observed in ("FAILED", "UNHEALTHY")
        if observed == "HEALTHY":
            assert self.remaining == self.prev_remaining
        # Workers are stopped before FAILED is reached.
        if self.lc.state is WorkerState.FAILED:
            names = [c[0] for c in new_calls if c[0] != "put_metric"]
            assert "stop_workers" in names
            assert names.index("stop_workers") < len(names) - (1 if "exit_barrier" in names else 0)
        # A barrier failure never changes the outcome: the reference ignores the barrier.
        if observed in ("UNKNOWN", "INIT", "STOPPED"):
            assert got_outcome is not None and got_outcome[0] == "raise"
            assert self.lc.state.name == observed

    @precondition(lambda self: self.outcome is not None)
    @rule(observed=st.sampled_from(STATES))
    def tick_after_the_end(self, observed: str) -> None:
        assert self.lc is not None
        before = len(self.driver.calls)
        with pytest.raises(LifecycleError):
            self.lc.observe(make_result(observed))
        assert len(self.driver.calls) == before  # nothing else happens: no action, no metric

    @invariant()
    def state_is_one_of_the_seven(self) -> None:
        if self.lc is not None:
            assert self.lc.state in set(WorkerState)

    @invariant()
    def restarts_stay_in_range(self) -> None:
        if self.lc is not None:
            assert 0 <= self.lc.remaining_restarts <= self.max_restarts
            assert self.lc.restart_count == self.max_restarts - self.lc.remaining_restarts

    @invariant()
    def every_restart_is_stop_rendezvous_start(self) -> None:
        if self.lc is None:
            return
        names = self.driver.names()
        for i, name in enumerate(names):
            if name == "rendezvous" and i > 0:
                assert names[i - 1] == "stop_workers", names
            if name == "start_workers":
                assert names[i - 1] == "rendezvous", names

    @invariant()
    def barrier_runs_at_most_once_and_when_the_preset_says(self) -> None:
        if self.lc is None:
            return
        assert self.barrier_runs <= 1
        if self.outcome is None:
            assert self.barrier_runs == 0
        elif self.lc.state is WorkerState.SUCCEEDED:
            assert self.barrier_runs == 1
        elif self.lc.state is WorkerState.FAILED:
            assert self.barrier_runs == (1 if self.preset == "torchelastic" else 0)
        else:
            assert self.barrier_runs == 0


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


TestTorchelastic = TorchelasticModel.TestCase
TestTorchelastic.settings = MODEL_SETTINGS
TestTorchrun = TorchrunModel.TestCase
TestTorchrun.settings = MODEL_SETTINGS
