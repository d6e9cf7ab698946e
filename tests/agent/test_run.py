"""``fsm-agent run`` with real agents, workers, c10d rendezvous and gloo on loopback."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from fsm_torch_helpers import (
    ENV_WORKER,
    EXAMPLES,
    FAST,
    RECORD_WORKER,
    Job,
    Jobs,
    alive,
    free_port,
    summary,
)

STANDALONE = ["--standalone", "--nproc-per-node", "2", *FAST]


@pytest.mark.timeout(60)
def test_success_sets_worker_env_and_runs_the_barrier_once(jobs: Jobs) -> None:
    job = jobs.start([*STANDALONE, "--max-restarts", "2", "--role", "trainer"], ENV_WORKER)
    assert job.wait(50) == 0, job.output
    recs = job.records()
    assert len(recs) == 2
    assert sorted(r["RANK"] for r in recs) == ["0", "1"]
    for r in recs:
        assert r["LOCAL_RANK"] == r["RANK"]
        assert r["ROLE_RANK"] == r["RANK"]
        assert r["WORLD_SIZE"] == r["LOCAL_WORLD_SIZE"] == r["ROLE_WORLD_SIZE"] == "2"
        assert r["GROUP_RANK"] == "0" and r["GROUP_WORLD_SIZE"] == "1"
        assert r["ROLE_NAME"] == "trainer"
        assert r["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert r["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert r["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert r["MASTER_ADDR"] and int(str(r["MASTER_PORT"])) > 0
    assert len({r["TORCHELASTIC_RUN_ID"] for r in recs}) == 1
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1
    assert job.barrier_count() == 1, job.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rdzv", ["standalone", "static"])
def test_fail_once_then_recover_sees_restart_count_1(jobs: Jobs, rdzv: str) -> None:
    env = {"FAIL_RANKS": "1", "FAIL_ATTEMPTS": "0", "FAIL_CODE": "4", "PROBE_RANKS": "1"}
    port = free_port()
    if rdzv == "standalone":  # c10d: torch's handler builds each round's store
        args = STANDALONE
    else:  # static: the agent starts each restart's store itself
        args = ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port",
                str(port), "--nproc-per-node", "2", *FAST]
    job = jobs.start([*args, "--max-restarts", "1"], ENV_WORKER, env=env)
    assert job.wait(50) == 0, job.output
    by_attempt: dict[str, list[dict[str, object]]] = {}
    for r in job.records():
        by_attempt.setdefault(str(r["TORCHELASTIC_RESTART_COUNT"]), []).append(r)
    assert sorted(by_attempt) == ["0", "1"]
    assert [r["exit"] for r in by_attempt["0"] if r["RANK"] == "1"] == [4]
    assert sorted(r["RANK"] for r in by_attempt["1"]) == ["0", "1"]
    assert all(r["exit"] == 0 for r in by_attempt["1"])
    # The restart-isolation fix: rank 1 of the second attempt does not see the key rank 1 of the
    # first attempt wrote to the workers' store (torch's shared store would still hold it).
    assert [r["saw_earlier_attempt"] for r in by_attempt["1"] if r["RANK"] == "1"] == [False]
    if rdzv == "static":  # as torchrun, the first attempt uses --master-port; a restart does not
        assert {r["MASTER_PORT"] for r in by_attempt["0"]} == {str(port)}
        assert str(port) not in {r["MASTER_PORT"] for r in by_attempt["1"]}
    assert job.barrier_count() == 1
    assert "worker group FAILED; restart 1 of 1" in job.output
    assert "membership change" not in job.output


@pytest.mark.timeout(60)
def test_shared_worker_store_keeps_the_master_port_on_restart(jobs: Jobs) -> None:
    """``--shared-worker-store``: torchrun's behaviour, the --master-port store on every attempt
    (and so the previous attempt's keys in it)."""
    env = {"FAIL_RANKS": "1", "FAIL_ATTEMPTS": "0", "FAIL_CODE": "4", "PROBE_RANKS": "1"}
    port = free_port()
    args = ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--nproc-per-node", "2", "--max-restarts", "1", "--shared-worker-store", *FAST]
    job = jobs.start(args, ENV_WORKER, env=env)
    assert job.wait(50) == 0, job.output
    recs = job.records()
    assert {r["MASTER_PORT"] for r in recs} == {str(port)}
    assert [r["saw_earlier_attempt"] for r in recs
            if r["RANK"] == "1" and r["TORCHELASTIC_RESTART_COUNT"] == "1"] == [True]


@pytest.mark.timeout(90)
def test_gloo_job_failing_once_recovers(jobs: Jobs) -> None:
    """The example torchrun's shared store breaks: gloo must connect afresh after the restart."""
    job = jobs.start([*STANDALONE, "--max-restarts", "1"], EXAMPLES / "fail_once.py")
    assert job.wait(80) == 0, job.output
    out = job.output
    assert "[rank 1] attempt 0: failing on purpose" in out
    assert "[rank 0] attempt 1: done" in out and "[rank 1] attempt 1: done" in out
    assert "connectFullMesh failed" not in out


@pytest.mark.timeout(90)
def test_restarts_exhausted_torchelastic_names_root_cause_and_error_file(jobs: Jobs) -> None:
    env = {"FAIL_RANK": "1", "MESSAGE": "boom-in-rank-1"}
    job = jobs.start([*STANDALONE, "--max-restarts", "1", "--spec", "torchelastic"],
                     RECORD_WORKER, env=env)
    assert job.wait(80) == 1, job.output
    s = summary(job.output)
    assert s, job.output
    root = s["root"]
    assert isinstance(root, dict)
    assert root["rank"] == "1" and root["exitcode"] == "1"
    error_file = Path(root["error_file"])
    assert error_file.is_file(), root
    assert "boom-in-rank-1" in json.loads(error_file.read_text())["message"]["message"]
    assert "boom-in-rank-1" in root["traceback"] or "Traceback" in root["traceback"]
    # torch's failure block, then fsm-agent's summary end the output: no traceback
    block, sep, ours = job.output.rpartition("=" * 60)
    assert sep and "Root Cause (first observed failure)" in block, job.output
    assert ours.lstrip().startswith("fsm-agent: job FAILED (spec 'torchelastic', 1 agent)")
    assert "root cause: rank 1 (" in ours and "boom-in-rank-1" in ours
    assert "Traceback" not in ours
    assert job.barrier_count() == 1, job.output  # torchelastic: the barrier also on giving up


@pytest.mark.timeout(60)
def test_restarts_exhausted_torchrun_spec_skips_the_barrier(jobs: Jobs) -> None:
    env = {"FAIL_RANKS": "1", "FAIL_CODE": "7"}
    job = jobs.start([*STANDALONE, "--max-restarts", "1", "--spec", "torchrun"], ENV_WORKER,
                     env=env)
    assert job.wait(50) == 1, job.output
    s = summary(job.output)
    root = s["root"]
    assert isinstance(root, dict)
    assert (root["rank"], root["exitcode"], root["error_file"]) == ("1", "7", "<N/A>")
    assert sorted({str(r["TORCHELASTIC_RESTART_COUNT"]) for r in job.records()}) == ["0", "1"]
    assert job.barrier_count() == 0, job.output


@pytest.mark.timeout(90)
def test_two_agents_wait_for_each_other_at_the_exit_barrier(jobs: Jobs) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "two-agents", *FAST]
    env = {"SLEEP": "4", "SLEEP_GROUP_RANK": "1"}
    a = jobs.start(args, ENV_WORKER, env=env, name="a")
    b = jobs.start(args, ENV_WORKER, env=env, name="b")
    deadline = time.monotonic() + 80
    while (a.poll() is None or b.poll() is None) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert a.wait(1) == 0, a.output
    assert b.wait(1) == 0, b.output
    rec = {j: j.records() for j in (a, b)}
    fast, slow = sorted((a, b), key=lambda j: rec[j][0]["GROUP_RANK"])  # type: ignore[index]
    assert rec[fast][0]["GROUP_RANK"] == "0" and rec[slow][0]["GROUP_RANK"] == "1"
    fast_done = float(rec[fast][0]["finished"])  # type: ignore[arg-type]
    slow_done = float(rec[slow][0]["finished"])  # type: ignore[arg-type]
    assert slow_done - fast_done > 3.0  # the premise: one group finished well before the other
    assert fast.ended_at is not None and slow.ended_at is not None
    assert abs(fast.ended_at - slow.ended_at) < 1.0
    assert fast.barrier_count() == slow.barrier_count() == 1


@pytest.mark.timeout(120)
def test_membership_change_restarts_without_consuming_restarts(jobs: Jobs) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    # max_restarts=0: a restart counted against it would end the job with a failure.
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "grow", "--max-restarts", "0",
            "--rdzv-conf", "last_call_timeout=1", "--monitor-interval", "0.2"]
    env = {"UNTIL_WORLD_SIZE": "2"}
    first = jobs.start(args, ENV_WORKER, env=env, name="first")
    [alone] = first.wait_for("*.json", 1, 60)
    assert alone["WORLD_SIZE"] == "1"
    second = jobs.start(args, ENV_WORKER, env=env, name="second")
    assert first.wait(80) == 0, first.output
    assert second.wait(20) == 0, second.output
    recs = first.records()
    assert [r["WORLD_SIZE"] for r in recs] == ["1", "2"]
    assert all(r["TORCHELASTIC_RESTART_COUNT"] == "0" for r in recs)
    [joined] = second.records()
    assert joined["WORLD_SIZE"] == "2" and joined["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert not alive(int(alone["pid"]))  # type: ignore[call-overload]
    assert "membership change, not counted" in first.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_worker_and_child(jobs: Jobs, sig: signal.Signals) -> None:
    env = {"SLEEP": "120", "SPAWN_CHILD": "1"}
    job = jobs.start([*STANDALONE, "--shutdown-timeout", "5"], ENV_WORKER, env=env)
    recs = job.wait_for("*.json", 2, 40)
    pids = [int(r[k]) for r in recs for k in ("pid", "child_pid")]  # type: ignore[call-overload]
    assert all(alive(p) for p in pids)
    job.proc.send_signal(sig)
    rc = job.wait(15)
    assert rc == 128 + sig, job.output
    assert f"received {sig.name}" in job.output
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]


def _outcome(job: Job, rc: int) -> tuple[int, int, list[str], str | None]:
    s = summary(job.output)
    root = s.get("root") if s else None
    others = s.get("others", []) if s else []
    assert isinstance(root, dict | None) and isinstance(others, list)
    failed = sorted({f["rank"] for f in [*others, *([root] if root else [])]})
    restarts = max(int(str(r["TORCHELASTIC_RESTART_COUNT"])) for r in job.records())
    return rc, restarts, failed, root["rank"] if root else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"FAIL_RANKS": "1", "FAIL_ATTEMPTS": "0", "FAIL_CODE": "3", "FAIL_LAST": "1"},
        {"FAIL_RANKS": "0", "FAIL_CODE": "5", "FAIL_LAST": "1"},
    ],
    ids=["success", "fail-once", "always-fails"],
)
def test_parity_with_torchrun(jobs: Jobs, env: dict[str, str]) -> None:
    args = [*STANDALONE, "--max-restarts", "1"]
    ours = jobs.start([*args, "--spec", "torchrun"], ENV_WORKER, env=env, name="ours")
    theirs = jobs.start(args, ENV_WORKER, env=env, launcher="torchrun", name="torchrun")
    got = _outcome(ours, ours.wait(100))
    want = _outcome(theirs, theirs.wait(100))
    assert got == want, (ours.output[-3000:], theirs.output[-3000:])


@pytest.mark.timeout(60)
def test_bad_spec_is_one_clear_error_and_help_lists_torchrun_flags(jobs: Jobs) -> None:
    bad = jobs.tmp_path / "bad.yaml"
    bad.write_text("name: broken\n")
    job = jobs.start(["--standalone", "--spec", str(bad)], ENV_WORKER)
    assert job.wait(50) == 2
    lines = job.output.strip().splitlines()
    assert lines[0] == f"fsm-agent run: error: --spec: {bad}:1: missing required key 'description'"
    assert "Traceback" not in job.output
    assert job.records() == []
    helped = jobs.start(["--help"], "", name="help")
    assert helped.wait(50) == 0
    for flag in ("--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "--standalone",
                 "--spec", "--exit-barrier-timeout", "--trace"):
        assert flag in helped.output
