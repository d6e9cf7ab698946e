"""The agent gets SIGTERM, SIGINT or SIGHUP while its workers run, while it restarts them, and
while it waits at the exit barrier: every worker and worker child is gone within the shutdown
timeout, the exit code is 128 + the signal, and the trace ends with a record naming it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    FAST,
    SHUTDOWN_TIMEOUT,
    STANDALONE,
    Jobs,
    free_port,
    trace_records,
    wait_gone,
)

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
# Leaving takes the shutdown timeout at most, plus the agent's own exit (a loaded 2-core box).
GRACE = SHUTDOWN_TIMEOUT + 4.0


def slow_unless(sig: signal.Signals, fast: signal.Signals) -> list[pytest.MarkDecorator]:
    return [] if sig == fast else [pytest.mark.slow]


def pids_of(recs: list[dict[str, object]]) -> list[int]:
    return [int(r[k]) for r in recs for k in ("pid", "child_pid") if r.get(k)]  # type: ignore[call-overload]


def check_ending(job, sig: signal.Signals, trace: Path, pids: list[int], sent: float) -> None:
    rc = job.wait(GRACE + 10)
    assert rc == 128 + sig, job.output
    assert f"received {sig.name}" in job.output, job.output
    left = wait_gone(pids, max(0.0, sent + GRACE - time.monotonic()))
    assert not left, f"still alive {GRACE} s after {sig.name}: {left}\n{job.output[-3000:]}"
    last = trace_records(trace)[-1]
    assert last["kind"] == "step" and last["error"], last
    assert str(last["error"]).startswith("SignalException") and str(last["error"]).endswith(
        f"got signal: {int(sig)}"), last


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_signal_while_workers_run(jobs: Jobs, tmp_path: Path, sig: signal.Signals) -> None:
    trace = tmp_path / "trace.jsonl"
    env = {"SLEEP": "120", "SPAWN_CHILD": "1"}
    job = jobs.start([*STANDALONE, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--trace",
                      str(trace)], env=env)
    pids = pids_of(job.wait_for("a0_*_start.json", 2, 80))
    sent = time.monotonic()
    job.proc.send_signal(sig)
    check_ending(job, sig, trace, pids, sent)
    last = trace_records(trace)[-1]
    # Mostly between two monitor ticks: no transition ran, the agent's final record says so.
    # A signal during a tick's own transition (its guard asks the store) is that step's error:
    # before the machine moved (UNKNOWN), or once the stay-put had set HEALTHY again.
    assert last["source"] == "HEALTHY", last
    assert (last["trigger"], last["dest"]) in {("signal", "HEALTHY"), ("healthy", "UNKNOWN"),
                                               ("healthy", "HEALTHY")}, last


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "sig", [pytest.param(s, marks=slow_unless(s, signal.SIGTERM)) for s in SIGNALS],
    ids=lambda s: s.name,
)
def test_signal_while_restarting(jobs: Jobs, tmp_path: Path, sig: signal.Signals) -> None:
    trace = tmp_path / "trace.jsonl"
    # Rank 1 fails; rank 0 ignores the SIGTERM the agent sends to stop it, so the agent is still
    # stopping the group when the signal arrives. torch stops the survivors of a failure inside
    # the monitor call that sees it (PContext._poll closes the context, waiting up to 30 s), before
    # the lifecycle takes its restart transition.
    env = {"FAIL_RANK": "1", "FAIL_HOW": "exit:3", "TRAP_TERM": "ignore", "SLEEP": "120",
           "SPAWN_CHILD": "1"}
    job = jobs.start([*STANDALONE, "--max-restarts", "2", "--shutdown-timeout",
                      str(SHUTDOWN_TIMEOUT), "--trace", str(trace)], env=env)
    pids = pids_of(job.wait_for("a0_*_start.json", 2, 80))
    job.wait_for("a0_r0_term.json", 1, 20)
    sent = time.monotonic()
    job.proc.send_signal(sig)
    check_ending(job, sig, trace, pids, sent)
    assert not job.records("a1_*"), "no new attempt may start after the signal"
    last = trace_records(trace)[-1]
    assert (last["trigger"], last["source"], last["dest"]) == ("signal", "HEALTHY", "HEALTHY")
    assert "Sending process" in job.output.partition(f"received {sig.name}")[0]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "sig", [pytest.param(s, marks=slow_unless(s, signal.SIGHUP)) for s in SIGNALS],
    ids=lambda s: s.name,
)
def test_signal_while_waiting_at_the_exit_barrier(
    jobs: Jobs, tmp_path: Path, sig: signal.Signals
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", "barrier", "--exit-barrier-timeout", "60",
              "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST]
    # Group rank 0's worker finishes at once (its child stays behind in its process group);
    # group rank 1's sleeps, so the group-rank-0 agent waits at the barrier.
    env = {"SLEEP": "120", "SLEEP_GROUP_RANK": "1", "SPAWN_CHILD": "1"}
    agents = [jobs.start([*common, "--trace", str(tmp_path / f"{n}.jsonl")], env=env, name=n)
              for n in ("a", "b")]
    for job in agents:
        job.wait_for("*_start.json", 1, 80)
    # Which agent gets group rank 0 is the rendezvous' choice.
    early, late = sorted(agents, key=lambda j: str(j.records("*_start.json")[0]["GROUP_RANK"]))
    trace = tmp_path / f"{early.workdir.name}.jsonl"
    early.wait_output("Waiting 60 seconds for other agents", 60)
    pids = pids_of(early.records("*_start.json"))
    sent = time.monotonic()
    early.proc.send_signal(sig)
    check_ending(early, sig, trace, pids, sent)
    last = trace_records(trace)[-1]
    assert last["dest"] in ("SUCCEEDED", "UNKNOWN") and last["observed"] == "SUCCEEDED", last
    assert any(a["name"] == "exit_barrier" and a["outcome"] == "raised"
               for a in last["actions"]), last  # type: ignore[union-attr]
    # The other agent lost its store with the first one (test_store_loss.py); just end it.
    late.proc.send_signal(signal.SIGTERM)
    late.wait(GRACE + 10)


@pytest.mark.timeout(120)
def test_signal_while_in_a_restarts_rendezvous(jobs: Jobs, tmp_path: Path) -> None:
    # Two nodes: A's worker fails (its family left: a child, a forked child, a setsid daemon)
    # and A waits in the restart's rendezvous for B, whose agent is stopped (SIGSTOP).
    import os

    from reliability_helpers import alive

    family = Path(__file__).parent / "scripts" / "family_worker.py"
    trace = tmp_path / "a.jsonl"
    port = free_port()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-backend",
            "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "rdzv",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST]
    a = jobs.start([*args, "--trace", str(trace)], family,
                   env={"FAIL_ATTEMPT": "0", "GATE": "1"}, name="a")
    a.wait_listening(port, 60)
    b = jobs.start(args, family, name="b")
    a.wait_for("a0_r*.json", 1, 60)
    b.wait_for("a0_r*.json", 1, 60)
    os.kill(b.pid, signal.SIGSTOP)
    try:
        (a.out_dir / "gate").touch()
        a.wait_output("restart 1 of 1", 30)
        time.sleep(1.0)
        rec = a.records("a0_r*.json")[0]
        pids = [int(rec["pid"]), *(int(p) for p in rec["family"])]  # type: ignore[call-overload, union-attr]
        assert alive(pids[-1]) and not a.records("a1_r*.json")
        sent = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        check_ending(a, signal.SIGTERM, trace, pids, sent)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    b.proc.send_signal(signal.SIGTERM)
    b.wait(GRACE + 30)
