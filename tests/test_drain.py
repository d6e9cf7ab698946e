"""The drain's spec pieces on the engine alone (``fsm_agent/_core/_drain.py``): the ``resilient``
preset's DRAINING and PREEMPTED with a recording driver. The torch agent's side, with real
processes, is ``tests/reliability/test_preemption.py``."""

from __future__ import annotations

import signal

import pytest

from fsm_agent import Lifecycle, Preempted, Preemption, SpecError, parse_spec
from fsm_agent.testing import RecordingDriver


def _healthy(driver: RecordingDriver, **params: object) -> Lifecycle:
    lc = Lifecycle("resilient", driver, max_restarts=1, params=params or None)
    lc.start()
    lc.observe(driver.monitor())
    assert lc.state_name == "HEALTHY"
    return lc


def _drain(lc: Lifecycle, driver: RecordingDriver, end: str = "drained") -> Preempted:
    lc.fire("preempted")
    assert lc.state_name == "DRAINING"
    with pytest.raises(Preempted) as caught:
        if end == "drained":
            lc.fire("drained")
        else:
            lc.poll_timer()
    assert lc.state_name == "PREEMPTED" and lc.done
    return caught.value


def test_a_drain_signals_the_workers_then_ends_with_128_plus_the_signal() -> None:
    driver = RecordingDriver(["HEALTHY"], preemption=Preemption(signal.SIGUSR1,
                                                                "received SIGUSR1"))
    lc = _healthy(driver, drain_signal="SIGUSR2")
    err = _drain(lc, driver)
    assert (err.exit_code, err.reason) == (128 + signal.SIGUSR1, "received SIGUSR1")
    names = driver.names()
    # the code is settled and announced first, then the workers get the drain signal; once
    # they exited, the group is closed (stop_workers), never judged a success
    assert names[names.index("announce_preemption"):] == [
        "announce_preemption", "drain_workers", "stop_workers"]
    assert ("drain_workers", signal.SIGUSR2) in driver.calls
    assert ("announce_preemption", 138, "received SIGUSR1") in driver.calls
    assert lc.result is not None and lc.result.state.name == "FAILED"


def test_the_deadline_kills_what_is_left() -> None:
    driver = RecordingDriver(["HEALTHY"], preemption=Preemption(signal.SIGTERM, "x"))
    lc = _healthy(driver, drain_timeout=0)
    err = _drain(lc, driver, end="timeout")
    assert err.exit_code == 143
    assert driver.names()[-2:] == ["drain_workers", "kill_workers"]


@pytest.mark.parametrize(("params", "preemption", "announced", "code"), [
    ({"preempted_exit_code": 99}, Preemption(signal.SIGTERM, "x"), None, 99),
    # another agent already announced its preemption: its code is everyone's
    ({}, Preemption(None, "n1 received SIGUSR1", exit_code=138), None, 138),
    # this agent's announcement lost the race to another one's
    ({}, Preemption(signal.SIGTERM, "x"), 150, 150),
    # a driver that knows nothing of the signal: SIGTERM's code
    ({}, None, None, 143),
])
def test_one_job_one_exit_code(params: dict[str, object], preemption: Preemption | None,
                               announced: int | None, code: int) -> None:
    driver = RecordingDriver(["HEALTHY"], preemption=preemption, announced=announced)
    lc = _healthy(driver, **params)
    assert _drain(lc, driver).exit_code == code
    if preemption is not None and preemption.exit_code is not None:
        assert "announce_preemption" not in driver.names()  # nothing to announce again


def test_a_preemption_in_a_backoff_drains_nothing_and_ends_preempted() -> None:
    driver = RecordingDriver(["HEALTHY", "FAILED"])
    lc = _healthy(driver, backoff_initial=60)
    lc.observe(driver.monitor())
    assert lc.state_name == "BACKOFF"
    assert _drain(lc, driver).exit_code == 143
    assert "start_workers" not in driver.names()[driver.names().index("drain_workers"):]


def test_drain_parameters_are_checked() -> None:
    with pytest.raises(SpecError, match=r"drain_on.*'SIGKILL' is not one of"):
        Lifecycle("resilient", RecordingDriver(), params={"drain_on": ["SIGKILL"]})
    with pytest.raises(SpecError, match=r"preempted_exit_code.*above the maximum"):
        Lifecycle("resilient", RecordingDriver(), params={"preempted_exit_code": 256})
    # a spec may only drain with a signal a worker can handle
    text = """
name: bad
triggers: [preempted, drained]
actions:
  drain: {drain_workers: SIGSTOP}
states:
  INIT: {initial: true}
  HEALTHY: {}
  DRAINING: {enter: [drain], timeout: 1s}
  DONE: {final: true}
transitions:
  - {trigger: start, source: INIT, dest: HEALTHY}
  - {trigger: preempted, source: HEALTHY, dest: DRAINING}
  - {trigger: drained, source: DRAINING, dest: DONE}
  - {trigger: timeout, source: DRAINING, dest: DONE}
"""
    with pytest.raises(SpecError, match=r"actions\.drain\.drain_workers.*'SIGSTOP'") as e:
        parse_spec(text)
    assert "SIGUSR1" in str(e.value)  # the signals it may use are named
