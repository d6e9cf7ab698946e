"""Quarantine on loopback (docs/spec-format.md, "Quarantine"): real ``fsm-agent run`` agents of a
two-node ``resilient`` job on an ``fsm-agent store``, a spare waiting, the workers of one node
failing with exit code 7 whenever the test opens their gate.

Each node has a rendezvous address of its own (``--local-addr 127.0.0.1``, ``.2``, ``.3``: all
loopback), which is the identity a quarantine mark names (``fsm_agent.torch._job.node_identity``):
an agent started again with node B's address is node B's machine coming back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fsm_test_procs import FAST, Job, Jobs, jobs_fixture, standalone_store, stop_store
from membership_trace import assert_membership_trace
from test_slots import SHUTDOWN_TIMEOUT

WORKER = Path(__file__).parent / "scripts" / "quarantine_worker.py"
REASON = ("quarantined: this node's own workers failed 2 times in this job (quarantine_after=2): "
          "exit 7 (local rank 0); exit 7 (local rank 0)")


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=WORKER))


def _args(port: int, run_id: str, addr: str, spec: str = "resilient", nnodes: str = "2:2",
          params: tuple[str, ...] = ("quarantine_after=2", "backoff_initial=0.2"),
          max_restarts: int = 10, keep_alive_attempts: int = 2) -> list[str]:
    return ["--spec", spec, "--nnodes", nnodes, "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id, "--max-restarts", str(max_restarts), "--local-addr", addr,
            "--rdzv-conf", "is_host=0,join_timeout=120,last_call_timeout=1,"
                           f"keep_alive_interval=1,keep_alive_max_attempt={keep_alive_attempts}",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST,
            *(a for p in params for a in ("--spec-param", p) if spec == "resilient")]


def _latest(job: Job) -> dict[str, object]:
    return max(job.records("slot_*.json"), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]


def _wait_records(job: Job, n: int, timeout: float = 90) -> None:
    job.wait_for("slot_*.json", n, timeout)


@pytest.mark.timeout(240)
def test_a_node_whose_own_workers_keep_failing_is_quarantined_and_a_spare_takes_its_slot(
        jobs: Jobs, tmp_path: Path) -> None:
    store, port = standalone_store(jobs)
    stop, gates = tmp_path / "stop", tmp_path / "gates"
    gates.mkdir()
    env = {"STOP_FILE": str(stop)}
    a = jobs.start(_args(port, "quarantine", "127.0.0.1"), env=env, name="node_a")
    b = jobs.start(_args(port, "quarantine", "127.0.0.2"), name="node_b",
                   env={**env, "FAIL_CODE": "7", "GATE_DIR": str(gates)})
    _wait_records(a, 1)
    _wait_records(b, 1)
    slot_a, slot_b = _latest(a)["group_rank"], _latest(b)["group_rank"]
    # the first failure of B's own workers: restarted (after a backoff), not quarantined
    (gates / "fail_0").touch()
    _wait_records(b, 2)
    _wait_records(a, 2)  # A restarted for B's rejoin (a membership restart)
    assert b.poll() is None, b.output[-4000:]
    spare = jobs.start(_args(port, "quarantine", "127.0.0.3"), env=env, name="node_c")
    time.sleep(3)
    assert not spare.records("slot_*.json"), spare.output[-3000:]  # a spare: no slot yet
    # the second: B is quarantined, leaves with 75 and one line saying why
    (gates / "fail_1").touch()
    assert b.wait(60) == 75, b.output[-4000:]
    assert f"fsm-agent run: left the job: {REASON} (exit 75)" in b.output, b.output[-4000:]
    assert len(b.records("slot_*.json")) == 2
    # the spare takes B's slot, A keeps its own
    _wait_records(spare, 1)
    assert _latest(spare)["group_rank"] == slot_b
    _wait_records(a, 3)
    assert _latest(a)["group_rank"] == slot_a
    # B's machine comes back (its agent started again): refused at once, before any rendezvous
    again = jobs.start(_args(port, "quarantine", "127.0.0.2"), name="node_b_again",
                       env={**env, "FAIL_CODE": "7", "GATE_DIR": str(gates)})
    assert again.wait(60) == 75, again.output[-4000:]
    assert "left the job: not_quarantined: node 127.0.0.2 is quarantined in this job" in \
        again.output, again.output[-4000:]
    assert not again.records("slot_*.json")
    # the job goes on without B and ends 0; neither A nor C was ever quarantined
    stop.touch()
    for job in (a, spare):
        assert job.wait(60) == 0, job.output[-4000:]
        assert "quarantined:" not in job.output
    assert_membership_trace(jobs)
    stop_store(store)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", ["resilient", "torchelastic"])
def test_only_resilient_refuses_a_node_with_a_quarantine_mark(
        jobs: Jobs, tmp_path: Path, spec: str) -> None:
    from torch.distributed import TCPStore

    from fsm_agent._core._job import JobChannel

    store, port = standalone_store(jobs)
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    JobChannel(client, "marked", "someone:1").quarantine("127.0.0.2", "a test's mark")
    stop = tmp_path / "stop"
    stop.touch()  # the workers exit 0 at once
    job = jobs.start(_args(port, "marked", "127.0.0.2", spec=spec, nnodes="1:2"),
                     env={"STOP_FILE": str(stop)}, name="node_b")
    rc = job.wait(90)
    if spec == "resilient":
        assert rc == 75, job.output[-4000:]
        assert "node 127.0.0.2 is quarantined in this job (by someone:1: a test's mark)" in \
            job.output, job.output[-4000:]
        assert not job.records("slot_*.json")
    else:  # torch's behaviour: no such thing as a mark
        assert rc == 0, job.output[-4000:]
        assert len(job.records("slot_*.json")) == 1
        assert "quarantined in this job" not in job.output
    del client
    stop_store(store)


@pytest.mark.timeout(150)
def test_a_failure_that_follows_a_lost_node_does_not_count(jobs: Jobs, tmp_path: Path) -> None:
    from test_peers import ALLREDUCE_WORKER
    from test_slots import spare_takes_rank_0

    # quarantine_after=1: any failure counted as the survivor's own would send it away. Its
    # worker fails in the all_reduce the lost node left (rule peer_lost): restarted with the
    # spare in the lost slot, and the job ends 0 (spare_takes_rank_0 checks all three).
    jobs.default_script = ALLREDUCE_WORKER
    store, port = standalone_store(jobs)
    # The survivor must see its worker fail before the lost node's keep-alive runs out: else a
    # healthy tick finds the node lost first and restarts for it, and no failure is counted or
    # not (a loaded machine took more than the 2 s of two attempts to reap the failed worker).
    args = _args(port, "peer-lost-not-own", "127.0.0.1", params=("quarantine_after=1",),
                 max_restarts=0, keep_alive_attempts=6)
    survivor = spare_takes_rank_0(jobs, args, tmp_path / "stop")
    assert "rule 'peer_lost'" in survivor.output, survivor.output[-4000:]
    assert "quarantined" not in survivor.output, survivor.output[-4000:]
    stop_store(store)


@pytest.mark.timeout(240)
def test_only_the_node_whose_workers_failed_first_counts_a_broken_collective(
        jobs: Jobs, tmp_path: Path) -> None:
    from test_peers import ALLREDUCE_WORKER

    # The workers of both nodes all_reduce together: when one node's fail (exit 7), the
    # other's fail with them (their all_reduce loses its peer: exit 1) while its agent is
    # alive, so the rule peer_lost does not take that failure. B fails twice, then A once:
    # each node has fewer than quarantine_after=3 failures of its own, and neither may leave.
    # Counting every failure, both would reach 3 at the third and be quarantined.
    jobs.default_script = ALLREDUCE_WORKER
    store, port = standalone_store(jobs)
    stop = tmp_path / "stop"
    params = ("quarantine_after=3", "backoff_initial=0.2")
    nodes = {}
    for name, addr in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
        gates = tmp_path / f"gates_{name}"
        gates.mkdir()
        nodes[name] = (jobs.start(_args(port, "collective", addr, params=params),
                                  name=f"node_{name}", env={"STOP_FILE": str(stop),
                                                            "FAIL_CODE": "7",
                                                            "GATE_DIR": str(gates)}), gates)
    (a, gates_a), (b, gates_b) = nodes["a"], nodes["b"]
    for attempt, (culprit, gates, other) in enumerate(
            [(b, gates_b, a), (b, gates_b, a), (a, gates_a, b)]):
        _wait_records(a, attempt + 1)
        _wait_records(b, attempt + 1)
        (gates / f"fail_{attempt}").touch()
        _wait_records(culprit, attempt + 2)
        _wait_records(other, attempt + 2)
        assert a.poll() is None and b.poll() is None, (a.output + b.output)[-6000:]
    for job in (a, b):  # each said so of the failures that followed the other's
        assert "followed another node's in the same round: not counted" in job.output, \
            job.output[-4000:]
    stop.touch()
    for job in (a, b):
        assert job.wait(60) == 0, job.output[-4000:]
        assert "quarantined:" not in job.output, job.output[-4000:]
    assert_membership_trace(jobs)
    stop_store(store)
