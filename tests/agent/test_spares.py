"""Spares on loopback (docs/job-protocol.md, "Membership"): real ``fsm-agent run`` agents of a
two-node ``resilient`` job on an ``fsm-agent store``, nodes SIGKILLed, ``--max-restarts 0``
throughout.

- two spares, two losses: each lost node's slot goes to a spare, the survivor keeps its own
  all along, the spare never needed ends with the job. Before ``fsm_agent.torch._slots``'s
  ``spares_wait`` this failed: both spares were left on torch's wait list, the group restarted
  for the one that could not join, again and again, until a round's rank 0 never published its
  address and every agent waited out the store's 60 s;
- a node lost during a rendezvous (it waited alone for the round, then died): the nodes that
  come after it should form the job's round without it. This one FAILS today (marked ``long``
  and ``xfail``: run with ``pytest --long``; not part of CI, not counted as done): the dead
  node is still a participant when the next agents complete the round (its keep-alive has not
  expired yet), it is rank 0, never publishes ``MASTER_ADDR``, and the others' rendezvous
  fails after 60 s, which ends the job (docs/job-protocol.md, "Lost peers", limits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsm_test_procs import Job, Jobs, jobs_fixture
from membership_trace import assert_membership_trace
from test_peer_waits import _args
from test_slots import (
    SHUTDOWN_TIMEOUT,
    SLOT_WORKER,
    _kill_node,
    lose_rank_0,
    standalone_store,
    stop_store,
    two_nodes_and_a_spare,
)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=SLOT_WORKER))


def _slot(job: Job) -> tuple[int, int]:
    rec = max(job.records("slot_*.json"), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]
    return int(rec["group_rank"]), int(rec["rank"])  # type: ignore[call-overload]


def _job(jobs: Jobs, tmp_path: Path, run_id: str) -> tuple[Job, list[str], Path, dict[str, str]]:
    """The store, the agents' arguments, the file that ends the workers, their environment."""
    store, port = standalone_store(jobs)
    stop = tmp_path / "stop"
    return store, _args(port, run_id), stop, {"STOP_FILE": str(stop)}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_spares_replace_two_lost_nodes_and_the_survivor_keeps_its_slot(
        jobs: Jobs, tmp_path: Path) -> None:
    store, args, stop, env = _job(jobs, tmp_path, "two-spares")
    first, spare = two_nodes_and_a_spare(jobs, args, env)
    spares = [spare, jobs.start(args, env=env, name="node_d")]
    time.sleep(3)
    assert not any(s.records("slot_*.json") for s in spares)
    # the first loss: one spare (either) takes the lost node's slot
    deadline = time.monotonic() + 90
    ranks = {job: _slot(job) for job in first}
    lost = next(j for j in first if ranks[j][0] == 0)
    survivor = next(j for j in first if j is not lost)
    _kill_node(lost)
    while not any(s.records("slot_*.json") for s in spares) and time.monotonic() < deadline:
        time.sleep(0.1)
    joined = [s for s in spares if s.records("slot_*.json")]
    assert len(joined) == 1, [s.output[-2000:] for s in spares]
    replacement, second = joined[0], next(s for s in spares if s is not joined[0])
    assert _slot(replacement) == ranks[lost]
    # the second loss: the replacement (in slot 0 now) is lost too; the other spare takes it
    _, lost2, survivor2, got, again = lose_rank_0([replacement, survivor], second)
    assert lost2 is replacement and survivor2 is survivor
    assert (got["group_rank"], got["rank"]) == ranks[lost]
    assert (again["group_rank"], again["rank"]) == ranks[survivor]
    stop.touch()
    for job in (survivor, second):
        assert job.wait(60) == 0, job.output[-4000:]
    out = survivor.output
    assert out.count("lost node(s) of the job") >= 2, out[-4000:]
    assert "rule 'retry'" not in out
    assert_membership_trace(jobs)
    stop_store(store)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_node_lost_while_waiting_in_the_rendezvous_is_not_waited_for(
        jobs: Jobs, tmp_path: Path) -> None:
    store, args, stop, env = _job(jobs, tmp_path, "lost-in-rendezvous")
    early = jobs.start(args, env=env, name="node_a")
    early.wait_output("rendezvous", 60)
    time.sleep(1.5)  # A is a participant of the round being formed, alone
    _kill_node(early)
    # B and C come before A's keep-alive expires: the round may complete with the dead A in it
    later = [jobs.start(args, env=env, name=name) for name in ("node_b", "node_c")]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if all(j.records("slot_*.json") for j in later) and \
                {_slot(j)[0] for j in later} == {0, 1}:
            break
        time.sleep(0.1)
    assert {_slot(j)[0] for j in later if j.records("slot_*.json")} == {0, 1}, \
        [j.output[-3000:] for j in later]
    stop.touch()
    for job in later:
        assert job.wait(60) == 0, job.output[-4000:]
        assert "rule '" not in job.output, job.output[-4000:]
    assert_membership_trace(jobs)
    stop_store(store)
