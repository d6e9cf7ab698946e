"""The engine's side of the job protocol: ``job_failed`` from a wait or from inside an action
(``TriggerInterrupt``), the job-wide budget through a driver's ``JobDriver`` methods, and the
announcement of a give-up with the spec's exit code."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fsm_agent import ActionError, Lifecycle, TriggerInterrupt, WorkerState
from fsm_agent._core._job import JobChannel, JobOver, MemoryStore
from fsm_agent.testing import RecordingDriver, make_result


class JobDriver(RecordingDriver):
    """A recording driver in a job: its budget and announcements go through a JobChannel."""

    def __init__(self, script: list[Any], channel: JobChannel, round_id: list[str]) -> None:
        super().__init__(script)
        self.channel = channel
        self.round_id = round_id  # shared: the round every agent of the test is in
        self.interrupt_rendezvous = False

    def rendezvous(self) -> None:
        super().rendezvous()
        outcome = self.channel.poll(force=True)
        if self.interrupt_rendezvous and outcome is not None:
            raise JobOver(outcome)

    def job_restart_count(self, window: float) -> int:
        return self.channel.restart_count(window)

    def job_restarts_left(self, max_restarts: int, window: float) -> int:
        return self.channel.restarts_left(self.round_id[0], max_restarts, window)

    def add_job_restart(self, max_restarts: int, window: float) -> int:
        return self.channel.claim_restart(self.round_id[0], max_restarts, window)

    def announce_failure(self, exit_code: int, reason: str) -> None:
        self.channel.announce(exit_code, reason)


def _pair(script_a: list[Any], script_b: list[Any]) -> tuple[JobDriver, JobDriver]:
    store = MemoryStore()
    rnd = ["1"]
    return (JobDriver(script_a, JobChannel(store, "j", "a", poll_interval=0), rnd),
            JobDriver(script_b, JobChannel(store, "j", "b", poll_interval=0), rnd))


def test_a_failure_both_agents_see_is_counted_once() -> None:
    a, b = _pair(["FAILED", "HEALTHY"], ["FAILED", "HEALTHY"])
    la = Lifecycle("resilient", a, max_restarts=1)
    lb = Lifecycle("resilient", b, max_restarts=1)
    for lc, d in ((la, a), (lb, b)):
        lc.start()
        lc.observe(d.monitor())
        assert lc.state_name == "BACKOFF"
    assert [r for r, _ in a.channel.ledger()] == ["1"]
    assert la.remaining_restarts == lb.remaining_restarts == 0


def test_the_next_failure_spends_the_job_budget_and_announces() -> None:
    a, b = _pair(["FAILED"], ["HEALTHY"])
    la = Lifecycle("resilient", a, max_restarts=1)
    la.start()
    la.observe(a.monitor())  # round 1 failed: the job's one restart
    a.round_id[0] = "2"
    la.context.deadline = la.context.clock.now()
    la.poll_timer()  # backoff over: rendezvous, start
    la.observe(make_result("FAILED"))
    assert la.state_name == "FAILED"
    # another agent of the job, whatever its own count, reads the outcome
    assert b.channel.poll(force=True) is not None
    lb = Lifecycle("resilient", b, max_restarts=1)
    assert lb.remaining_restarts == 1  # before it reads the job's count
    lb.start()
    lb.observe(b.monitor())
    assert lb.remaining_restarts == 0


def test_a_late_agent_reads_the_job_count_instead_of_max_restarts() -> None:
    a, b = _pair(["FAILED"], ["HEALTHY"])
    la = Lifecycle("resilient", a, max_restarts=3)
    la.start()
    la.observe(a.monitor())
    lb = Lifecycle("resilient", b, max_restarts=3)
    lb.start()
    lb.observe(b.monitor())
    assert lb.remaining_restarts == 2 and la.remaining_restarts == 2


def test_a_claim_that_finds_the_budget_spent_takes_job_failed() -> None:
    # The guard saw a restart left; another round took it before this agent's claim.
    a, b = _pair(["FAILED"], [])
    steps: list[Any] = []
    la = Lifecycle("resilient", a, max_restarts=1, listeners=[steps.append])
    la.start()
    b.channel.claim_restart("0", 1)  # another round's claim lands first
    a.channel.restarts_left = lambda *args: 1  # type: ignore[method-assign]
    la.observe(a.monitor())
    assert la.state_name == "FAILED" and la.done
    interrupted = [s for s in steps if s.error and "interrupted" in s.error]
    assert [s.trigger for s in interrupted] == ["failed"]
    assert steps[-1].trigger == "job_failed" and steps[-1].dest == "FAILED"
    assert "budget" in (a.channel.outcome.reason if a.channel.outcome else "")


def test_an_announcement_read_in_a_rendezvous_ends_it_through_job_failed() -> None:
    a, b = _pair([], [])
    b.channel.announce(7, "another agent gave up")
    a.interrupt_rendezvous = True
    steps: list[Any] = []
    la = Lifecycle("torchrun", a, max_restarts=3, listeners=[steps.append])
    la.start()  # the first rendezvous reads it
    assert la.state_name == "FAILED" and la.done
    assert [(s.trigger, s.source, s.dest) for s in steps] == [
        ("start", "INIT", "INIT"), ("job_failed", "INIT", "FAILED")]
    assert "interrupted: job_failed" in (steps[0].error or "")
    assert "start_workers" not in a.names()  # the rest of the transition never ran


def test_an_interrupt_where_the_spec_has_no_transition_is_an_action_error() -> None:
    class Driver(RecordingDriver):
        def rendezvous(self) -> None:
            raise TriggerInterrupt("drain", "maintenance")

    with open(Lifecycle("torchrun", RecordingDriver()).spec.path) as f:
        spec_text = f.read()
    spec_text = spec_text.replace("triggers: [job_failed]", "triggers: [job_failed, drain]")
    from fsm_agent import parse_spec

    lc = Lifecycle(parse_spec(spec_text), Driver(), max_restarts=1)
    with pytest.raises(ActionError, match="drain interrupted an action in INIT"):
        lc.start()
    assert lc.state_name == "UNKNOWN" and lc.done


def test_a_wait_that_returns_job_failed_ends_a_backoff() -> None:
    d = RecordingDriver(["FAILED"])
    waits: list[float] = []

    def wait(seconds: float) -> str | None:
        waits.append(seconds)
        return "job_failed" if len(waits) == 2 else None

    lc = Lifecycle("resilient", d, max_restarts=2)
    result = lc.run(0.1, sleep=wait)
    assert lc.state_name == "FAILED" and result is not None
    assert result.state is WorkerState.FAILED
    assert waits[1] > 0.1  # the second wait was the backoff, ended by the announcement


def test_giving_up_announces_the_specs_exit_code() -> None:
    announced: list[tuple[int, str]] = []

    class Driver(RecordingDriver):
        def announce_failure(self, exit_code: int, reason: str) -> None:
            announced.append((exit_code, reason))

    d = Driver([make_result("FAILED", exitcode=17)])
    lc = Lifecycle("resilient", d, max_restarts=2, params={"no_retry_exit_codes": [17]})
    lc.start()
    lc.observe(d.monitor())
    assert lc.state_name == "FAILED"
    assert [code for code, _ in announced] == [93]  # no_requeue_exit_code, set before
    assert d.names().index("stop_workers") > 0


def test_without_job_methods_the_budget_is_counted_by_the_lifecycle() -> None:
    d = RecordingDriver(["FAILED", "FAILED"])
    lc = Lifecycle("resilient", d, max_restarts=1)
    assert lc.context.budget_scope == "job" and lc.context.job_driver() is None
    lc.run(0.0, sleep=lambda s: None)
    assert lc.state_name == "FAILED" and lc.restart_count == 1
    assert math.isinf(lc.context.window)


def test_an_interrupted_transition_replays_against_the_spec(tmp_path: Any) -> None:
    from fsm_agent.trace import TraceWriter, read_trace, replay

    a, b = _pair([], [])
    b.channel.announce(7, "another agent gave up")
    a.interrupt_rendezvous = True
    path = tmp_path / "trace.jsonl"
    spec = Lifecycle("torchrun", a).spec
    writer = TraceWriter(str(path), spec=spec)
    Lifecycle(spec, a, max_restarts=3, listeners=[writer]).start()
    writer.close()
    (trace,) = read_trace(path)
    result = replay(spec, trace)
    assert result.ok, result.divergence
    assert result.final_state == "FAILED" and result.checked == 2
    # an interrupted step that claims to have moved is refused
    text = path.read_text().replace('"dest": "INIT"', '"dest": "HEALTHY"', 1)
    path.write_text(text)
    assert not replay(spec, read_trace(path)[0]).ok
