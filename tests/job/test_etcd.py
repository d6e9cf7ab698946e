"""The job protocol on torch's etcd rendezvous backends (docs/job-protocol.md, "On etcd"): two
``fsm-agent run`` agents as two nodes of one job, a real etcd 3.4 on loopback (``etcd`` fixture),
python-etcd 0.4.5. Without etcd the tests skip, except where ``FSM_AGENT_REQUIRE_ETCD=1`` (CI)."""

from __future__ import annotations

import pytest
from etcd_server import EtcdServer
from fsm_test_procs import FAST
from job_helpers import SHUTDOWN_TIMEOUT, Job, Jobs


def etcd_nodes(server: EtcdServer, backend: str, run_id: str, *extra: str) -> list[str]:
    """Launcher arguments for one of two nodes of a job on ``server``."""
    return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend,
            "--rdzv-endpoint", server.endpoint, "--rdzv-id", run_id,
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST, *extra]


def _two(jobs: Jobs, args: list[str]) -> tuple[Job, Job]:
    # node 1's worker always fails; the other would run for two minutes
    env = {"FAIL_GROUP_RANK": "1", "SLEEP": "120"}
    return jobs.start(args, env=env, name="node_a"), jobs.start(args, env=env, name="node_b")


def _by_group_rank(a: Job, b: Job) -> dict[int, Job]:
    return {int(r["group_rank"]): j for j in (a, b)  # type: ignore[call-overload]
            for r in j.records("start_a0_*.json")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_a_give_up_on_etcd_ends_both_nodes_with_its_code(jobs: Jobs, etcd: EtcdServer,
                                                         backend: str) -> None:
    # Before the fix the node that gave up exited 1, the other ran on and exited 0 after its
    # exit barrier (torchelastic preset: torch's agent decides alone on etcd); on etcd-v2 the
    # announcement itself failed ("could not announce it: Not implemented").
    args = etcd_nodes(etcd, backend, f"give-up-{backend}", "--max-restarts", "0",
                      "--exit-barrier-timeout", "300")
    a, b = _two(jobs, args)
    rc_a, rc_b = a.wait(45), b.wait(45)
    out = a.output + b.output
    assert rc_a == rc_b == 1, out[-4000:]
    assert "Not implemented" not in out, out[-4000:]
    node = _by_group_rank(a, b)
    assert "announced to every agent" in node[1].output, node[1].output[-3000:]
    # the healthy node ended through the announcement, with the job's code
    assert node[0].final_message().startswith("fsm-agent run: the job failed:"), \
        node[0].output[-3000:]
    assert "(announced by" in node[0].final_message(), node[0].output[-3000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_resilient_on_etcd_restarts_once_for_the_job(jobs: Jobs, etcd: EtcdServer,
                                                     backend: str) -> None:
    # Before the fix the job-wide budget called EtcdStore.compare_set, which torch does not
    # implement: the failing node aborted (UNKNOWN) at its first failure, nothing restarted.
    # On etcd (v1) the round a claim counts is the rendezvous version: with none, every
    # failure would ride along on the first claim and the job restart for ever.
    args = etcd_nodes(etcd, backend, f"resilient-{backend}", "--max-restarts", "1",
                      "--spec", "resilient")
    a, b = _two(jobs, args)
    rc_a, rc_b = a.wait(45), b.wait(45)
    out = a.output + b.output
    assert "Not implemented" not in out, out[-4000:]
    assert "ActionError" not in out, out[-4000:]
    assert rc_a == rc_b == 1, out[-4000:]
    # both nodes ran the restarted round (attempt 1), and the job gave up after it
    starts = {(int(r["group_rank"]), int(r["attempt"]))  # type: ignore[call-overload]
              for j in (a, b) for r in j.records("start_*.json")}
    assert starts == {(g, n) for g in (0, 1) for n in (0, 1)}, (starts, out[-4000:])
    node = _by_group_rank(a, b)
    assert "restarting the worker group with it (counted once for the job: 1 of 1 used)" in \
        node[0].output, node[0].output[-3000:]
    # (etcd v1 numbers the nodes afresh every round: either may fail the restarted round)
    gave_up = [j for j in (a, b) if "announced to every agent" in j.output]
    assert len(gave_up) == 1, out[-4000:]
    other = b if gave_up[0] is a else a
    assert other.final_message().startswith("fsm-agent run: the job failed:"), \
        other.output[-3000:]
