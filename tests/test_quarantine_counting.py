"""Quarantine's counting (``fsm_agent/_core/_quarantine.py``, the ``resilient`` preset's rule
``quarantine``), on the engine with the recording driver and virtual time; the mark on the job's
store (``fsm_agent._core._job``). Which rule the guard kind shadows: ``tests/test_policy.py``. Real
agents on loopback are in ``tests/agent/test_quarantine.py``."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")


from fsm_agent import Lifecycle
from fsm_agent._core._clock import VirtualClock
from fsm_agent._core._health import LeftJob
from fsm_agent._core._job import JobChannel, MemoryStore
from fsm_agent.testing import RecordingDriver
from fsm_agent.testing._recording import make_result

FAIL7 = make_result("FAILED", exitcode=7)


class Driver(RecordingDriver):
    """The recording driver in a job of several nodes, with a lost peer on the ticks listed in
    ``lost_on`` (by monitor call, from 1), a quarantine mark it keeps, and the health checks
    run with it."""

    has_job = True  # in a job of several nodes: alone, nobody could take the slot

    def __init__(self, script: list[Any], lost_on: set[int] = frozenset(),  # type: ignore[assignment]
                 mark: str | None = None) -> None:
        super().__init__(script)
        self.lost_on = lost_on
        self.marks: list[str] = []
        self.mark = mark

    def lost_peers(self) -> tuple[str, ...]:
        return ("node_x",) if self.names().count("monitor") in self.lost_on else ()

    def quarantine(self, reason: str) -> None:
        self.marks.append(reason)

    def check_health(self, check: Any) -> Any:
        self.last = check.run(quarantined=lambda: self.mark)
        return self.last

    def health_reason(self) -> str | None:
        return f"{self.last.name}: {self.last.reason}"


def _run(driver: Driver, spec: str = "resilient", **params: Any) -> tuple[Lifecycle, Any]:
    clock = VirtualClock()
    lc = Lifecycle(spec, driver, max_restarts=20, clock=clock, params=params or None)
    try:
        return lc, lc.run(0.1, sleep=clock.sleep)
    except LeftJob as e:
        return lc, e


@pytest.mark.parametrize("after", [1, 2, 3])
def test_a_node_is_quarantined_at_exactly_its_quarantine_after_th_own_failure(after: int) -> None:
    driver = Driver([FAIL7] * 5 + ["SUCCEEDED"])
    lc, left = _run(driver, quarantine_after=after)
    assert isinstance(left, LeftJob) and left.exit_code == 75
    assert lc.state_name == "QUARANTINED" and lc.context.exit_code == 75
    assert driver.names().count("start_workers") == after  # restarted after-1 times
    words = "; ".join(["exit 7 (local rank 0)"] * after)
    assert left.reason == (f"quarantined: this node's own workers failed {after} times in this "
                           f"job (quarantine_after={after}): {words}")
    assert driver.marks == [left.reason]  # the mark is written before it leaves


def test_failures_that_follow_a_lost_node_do_not_count() -> None:
    # ticks 1 and 3 fail with a peer lost (rule peer_lost), 2, 4 and 5 are the node's own
    driver = Driver([FAIL7, make_result("FAILED", exitcode=1), FAIL7, FAIL7, FAIL7,
                     "SUCCEEDED"], lost_on={1, 3})
    lc, left = _run(driver)
    assert isinstance(left, LeftJob), left
    assert driver.names().count("monitor") == 5  # not at the third failure: the fifth
    assert lc.context.own_failures == ["exit 1 (local rank 0)", "exit 7 (local rank 0)"]
    assert "failed 3 times" in left.reason


def test_quarantine_after_0_never_quarantines_and_the_budget_decides() -> None:
    driver = Driver([FAIL7] * 5 + ["SUCCEEDED"])
    lc, _ = _run(driver, quarantine_after=0)
    assert lc.state_name == "SUCCEEDED" and not driver.marks
    assert len(lc.context.own_failures) == 5


def test_an_agent_alone_in_its_job_is_never_quarantined() -> None:
    # a single-node run (the torch driver without a job): nobody could take its slot
    driver = Driver([FAIL7] * 5 + ["SUCCEEDED"])
    driver.has_job = False
    lc, _ = _run(driver)
    assert lc.state_name == "SUCCEEDED" and not driver.marks


@pytest.mark.parametrize("spec", ["torchelastic", "torchrun"])
def test_the_torch_presets_never_quarantine(spec: str) -> None:
    driver = Driver([FAIL7] * 5 + ["SUCCEEDED"], mark="node b is quarantined")
    lc, _ = _run(driver, spec=spec)
    assert lc.state_name == "SUCCEEDED" and not driver.marks and not lc.context.own_failures


def test_a_node_with_a_mark_leaves_before_its_first_rendezvous() -> None:
    driver = Driver(["SUCCEEDED"], mark="node 127.0.0.2 is quarantined in this job (by a: b)")
    lc, left = _run(driver)
    assert isinstance(left, LeftJob) and left.exit_code == 75
    assert left.reason == "not_quarantined: node 127.0.0.2 is quarantined in this job (by a: b)"
    assert "rendezvous" not in driver.names() and lc.state_name == "LEFT"


def test_the_mark_is_kept_by_node_on_the_jobs_store() -> None:
    store = MemoryStore()
    one, other = JobChannel(store, "run1", "host:1"), JobChannel(store, "run2", "host:2")
    assert one.quarantined("10.0.0.2") is None
    one.quarantine("10.0.0.2", "exit 7 three times")
    assert one.quarantined("10.0.0.2") == \
        "node 10.0.0.2 is quarantined in this job (by host:1: exit 7 three times)"
    assert one.quarantined("10.0.0.3") is None
    assert other.quarantined("10.0.0.2") is None  # another job: not marked there
    store.set("fsm_agent/job/run1/quarantined/x", b"\x00junk")
    assert "unreadable mark" in (one.quarantined("x") or "")
