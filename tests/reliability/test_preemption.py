"""Preemption under the ``resilient`` preset (``fsm_agent/_core/_drain.py``, its torch side in
``fsm_agent/torch/_drain.py``): a drain signal sends every worker ``drain_signal``, waits up to
``drain_timeout`` for them, and every agent of the job exits with the same
``preempted_exit_code``. Real ``fsm-agent run`` jobs; c10d rendezvous on loopback for two agents.
The torch presets keep torch's behaviour (a signal stops the workers at once, ``test_signals.py``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import FAST, Job, Jobs, alive, free_port

DRAIN = Path(__file__).parent / "scripts" / "drain_worker.py"
RESILIENT = ["--spec", "resilient", "--spec-param", "drain_signal=SIGUSR1"]


def _standalone(*params: str, nproc: int = 2) -> list[str]:
    extra = [a for p in params for a in ("--spec-param", p)]
    return ["--standalone", "--nproc-per-node", str(nproc), *FAST, *RESILIENT, *extra]


def _pids(job: Job, n: int) -> list[int]:
    return [int(r["pid"]) for r in job.wait_for("start_r*.json", n, 60)]  # type: ignore[call-overload]


def _exits(job: Job, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    rc = job.wait(timeout)
    return rc, time.monotonic() - t0


@pytest.mark.timeout(90)
def test_sigterm_drains_every_worker_and_exits_with_the_preempted_code(
        jobs: Jobs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "drain.jsonl"
    job = jobs.start([*_standalone("drain_timeout=20s"), "--trace", str(trace)], DRAIN)
    pids = _pids(job, 2)
    job.proc.send_signal(signal.SIGTERM)
    rc, took = _exits(job, 30)
    # The workers exit 0 after their checkpoint: the job was preempted, it did not succeed.
    assert rc == 128 + signal.SIGTERM, job.output[-3000:]
    drained = job.records("drained_r*.json")
    assert [d["signal"] for d in drained] == [signal.SIGUSR1] * 2, job.output[-3000:]
    assert len(job.records("checkpointed_r*.json")) == 2  # each handler ran to its end
    assert took < 20, took
    assert not [p for p in pids if alive(p)]
    assert job.final_message() == ("fsm-agent run: preempted (received SIGTERM); workers "
                                   "drained (exit 143)")
    assert "worker group SUCCEEDED" not in job.output
    # what the trace says of it: replay follows the spec through DRAINING, the report says
    # PREEMPTED
    from fsm_agent.cli.replay import main as replay
    from fsm_agent.cli.report import main as report

    capsys.readouterr()
    assert replay([str(trace)]) == 0
    out = capsys.readouterr().out
    assert "-> DRAINING -> PREEMPTED" in out and "ended with: Preempted: received SIGTERM" in out
    # the drain itself: its signal, the workers it reached and how long they took, in the
    # trace's last step and in each tool that reads it
    drain = _drain_record(trace)
    assert drain["signal"] == "SIGUSR1" and drain["ranks"] == [0, 1], drain
    assert drain["reason"] == "received SIGTERM" and drain["killed_at_timeout"] == [], drain
    assert drain["exit_codes"] == {"0": 0, "1": 0} and 0 < drain["took_s"] < 20, drain
    assert "drain (node " in out and "SIGUSR1 to local ranks 0, 1 (received SIGTERM): workers " \
        "drained in" in out, out
    assert report([str(trace), "--format", "text"]) == 0
    assert "SIGUSR1 to local ranks 0, 1 (received SIGTERM): workers drained" in \
        capsys.readouterr().out
    page = tmp_path / "report.html"
    assert report([str(trace), "-o", str(page)]) == 0
    html = page.read_text()
    assert "id='outcome'>PREEMPTED" in html
    assert html.count('<tr class="drain-row">') == 1 and "<td>SIGUSR1</td>" in html


def _drain_record(trace: Path) -> dict[str, object]:
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    found = [s["diagnostics"]["drain"] for s in steps if "drain" in s.get("diagnostics", {})]
    assert len(found) == 1, found  # once, on the step that ended the drain
    assert steps[-1]["diagnostics"]["drain"] is found[0]
    return found[0]  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_one_agent_preempted_drains_the_whole_job_with_one_exit_code(jobs: Jobs) -> None:
    port = free_port()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "drain2", *FAST, *RESILIENT,
            "--spec-param", "drain_timeout=20s"]
    first = jobs.start(args, DRAIN, name="a")
    first.wait_listening(port, 30)
    second = jobs.start(args, DRAIN, name="b")
    _pids(first, 1)
    _pids(second, 1)
    os.kill(second.pid, signal.SIGTERM)  # the agent that does not host the store
    rc_b, took = _exits(second, 30)
    rc_a = first.wait(30)
    assert (rc_a, rc_b) == (143, 143), (first.output[-2000:], second.output[-2000:])
    for job in (first, second):
        assert [d["signal"] for d in job.records("drained_r*.json")] == [signal.SIGUSR1], \
            job.output[-3000:]
        assert len(job.records("checkpointed_r*.json")) == 1
    assert "preempted (received SIGTERM)" in second.final_message()
    # the other agent says whose signal it was
    assert "preempted (" in first.final_message() and "received SIGTERM" in first.final_message()
    assert took < 20


@pytest.mark.timeout(90)
def test_a_worker_that_ignores_the_drain_signal_is_killed_at_drain_timeout(
        jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "drain.jsonl"
    job = jobs.start([*_standalone("drain_timeout=2s", nproc=1), "--trace", str(trace)], DRAIN,
                     env={"IGNORE_DRAIN": "1"})
    pids = _pids(job, 1)
    job.proc.send_signal(signal.SIGTERM)
    rc, took = _exits(job, 30)
    assert rc == 143, job.output[-3000:]
    assert 2 <= took < 2 + 8, took  # the deadline, plus the kill and the agent's exit
    assert "the drain's time is up: killing 1 worker(s)" in job.output
    assert job.final_message() == ("fsm-agent run: preempted (received SIGTERM); not every "
                                   "worker drained: local rank 0 killed at drain_timeout "
                                   "(exit 143)")
    assert not [p for p in pids if alive(p)]
    drain = _drain_record(trace)
    assert drain["killed_at_timeout"] == [0] and drain["exit_codes"] == {}, drain
    assert 2 <= drain["took_s"] < 10, drain  # type: ignore[operator]


@pytest.mark.timeout(90)
def test_a_worker_killed_by_the_schedulers_own_signal_is_not_reported_drained(
        jobs: Jobs) -> None:
    """As Slurm's scancel and scontrol requeue do under proctrack/cgroup or linuxproc: SIGTERM
    to the agent and to every worker at once, while the workers handle only the drain signal
    (SIGUSR1). The drain ends (the workers are gone), with the preemption's code; the agent says
    which rank was killed and by what instead of "workers drained"
    (tests/slurm/test_slurm.py runs it under a real Slurm)."""
    job = jobs.start(_standalone("drain_timeout=20s", nproc=2), DRAIN)
    pids = _pids(job, 2)
    job.proc.send_signal(signal.SIGTERM)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    rc, took = _exits(job, 30)
    assert rc == 143, job.output[-3000:]
    assert took < 10, took  # a drain's end, not its deadline
    assert job.records("checkpointed_r*.json") == []
    assert job.final_message() == ("fsm-agent run: preempted (received SIGTERM); not every "
                                   "worker drained: local ranks 0, 1 killed by SIGTERM "
                                   "(exit 143)"), job.output[-3000:]
    assert "SIGTERM is not the drain signal (SIGUSR1)" in job.output
    assert "drained: every worker exited" not in job.output
    assert not [p for p in pids if alive(p)]


@pytest.mark.timeout(90)
def test_workers_that_handle_the_schedulers_signal_drain_when_it_reaches_them_too(
        jobs: Jobs) -> None:
    """The remedy: drain_signal is the scheduler's own (SIGTERM, the default) and the workers
    handle it; the signal reaches them twice (the scheduler's and the drain's) and they
    checkpoint."""
    job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST, "--spec", "resilient",
                      "--spec-param", "drain_timeout=20s"], DRAIN,
                     env={"DRAIN_SIGNAL": "SIGTERM"})
    pids = _pids(job, 1)
    job.proc.send_signal(signal.SIGTERM)
    os.kill(pids[0], signal.SIGTERM)
    rc, _ = _exits(job, 30)
    assert rc == 143, job.output[-3000:]
    assert len(job.records("checkpointed_r*.json")) == 1
    assert job.final_message() == ("fsm-agent run: preempted (received SIGTERM); workers "
                                   "drained (exit 143)")
    assert not [p for p in pids if alive(p)]


@pytest.mark.timeout(90)
def test_a_second_sigterm_during_the_drain_stops_at_once(jobs: Jobs) -> None:
    # a checkpoint that never ends and holds off SIGTERM; torch's shutdown would give it 30 s
    job = jobs.start(_standalone("drain_timeout=60s", nproc=1), DRAIN,
                     env={"DRAIN_TAKES": "1000", "HOLD_TERM": "1",
                          "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30"})
    pids = _pids(job, 1)
    job.proc.send_signal(signal.SIGTERM)
    job.wait_output("drain: sent SIGUSR1", 20)
    job.wait_for("drained_r*.json", 1, 20)
    job.proc.send_signal(signal.SIGTERM)
    rc, took = _exits(job, 30)
    assert rc == 143, job.output[-3000:]
    assert took < 10, took  # not the drain's 60 s, nor torch's shutdown timeout
    assert not [p for p in pids if alive(p)]
    assert job.final_message() == "fsm-agent run: received SIGTERM; workers stopped"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("params", "sig", "code"), [
    (("drain_on=SIGUSR1",), signal.SIGUSR1, 128 + signal.SIGUSR1),
    (("preempted_exit_code=99",), signal.SIGTERM, 99),
])
def test_which_signal_drains_and_the_code_it_ends_with_are_spec_parameters(
        jobs: Jobs, params: tuple[str, ...], sig: signal.Signals, code: int) -> None:
    job = jobs.start(_standalone(*params, nproc=1), DRAIN)
    _pids(job, 1)
    job.proc.send_signal(sig)
    assert job.wait(30) == code, job.output[-3000:]
    assert len(job.records("drained_r*.json")) == 1


@pytest.mark.timeout(90)
def test_a_signal_not_in_drain_on_stops_at_once_as_under_torch(jobs: Jobs) -> None:
    job = jobs.start(_standalone("drain_on=SIGUSR1", nproc=1), DRAIN)
    _pids(job, 1)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(30) == 143, job.output[-3000:]
    assert job.records("drained_r*.json") == []  # no drain signal: torch's SIGTERM stop
    assert job.final_message() == "fsm-agent run: received SIGTERM; workers stopped"


@pytest.mark.timeout(90)
def test_a_preemption_in_a_backoff_or_a_rendezvous_ends_at_once(jobs: Jobs) -> None:
    # in the backoff after a failure: no workers to drain
    backoff = jobs.start([*_standalone("backoff_initial=60s", "backoff_jitter=0", nproc=1),
                          "--max-restarts", "1"], DRAIN, env={"FAIL_ATTEMPT": "0"},
                         name="backoff")
    backoff.wait_output("restarting in", 60)
    # waiting in the rendezvous for a second node that never comes
    port = free_port()
    rdzv = jobs.start(["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lonely", *FAST,
                       *RESILIENT], DRAIN, name="rdzv")
    rdzv.wait_listening(port, 30)
    time.sleep(1)  # inside the join loop
    for job in (backoff, rdzv):
        job.proc.send_signal(signal.SIGTERM)
    for job in (backoff, rdzv):
        rc, took = _exits(job, 30)
        assert rc == 143, job.output[-3000:]
        assert took < 5, (took, job.output[-2000:])
        assert "workers drained (exit 143)" in job.final_message()
    assert rdzv.records("start_r*.json") == []
