"""The ``resilient`` preset in real jobs through ``fsm-agent run``: a no-retry exit code gives up
at once with exit code 93, a crash loop restarts after growing backoffs (measured from the
workers' own clocks) until the budget of its window is spent, and SIGTERM during a backoff stops
everything at once. Expected times are worked out from the parameters given on the command
line."""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

import pytest
from resilient_helpers import (
    LAUNCH_SCRIPT,
    ONE,
    SHUTDOWN_TIMEOUT,
    WORKER,
    Job,
    Jobs,
    alive,
    resilient,
    summary,
    trace_records,
    wait_gone,
)

pytestmark = pytest.mark.timeout(120)

# What a restart may add to its backoff on a loaded 2-core machine: noticing the exit, stopping,
# the rendezvous, spawning the worker and its interpreter's start (measured: ~0.1-0.4 s).
SLACK = 3.0


def attempts(job: Job, rank: int = 0) -> list[dict[str, object]]:
    """The start (and exit, if any) record of each attempt of ``rank``, in order."""
    starts = {int(r["attempt"]): r for r in job.records(f"a*_r{rank}_start.json")}  # type: ignore[call-overload]
    exits = {int(r["attempt"]): r for r in job.records(f"a*_r{rank}_exit.json")}  # type: ignore[call-overload]
    assert sorted(starts) == list(range(len(starts))), sorted(starts)
    return [{"start": starts[a]["time"], "exit": exits.get(a, {}).get("time"), **starts[a]}
            for a in sorted(starts)]


def gaps(runs: list[dict[str, object]]) -> list[float]:
    """From each attempt's exit to the next attempt's start, on the workers' own clocks."""
    return [float(b["start"]) - float(a["exit"])  # type: ignore[arg-type]
            for a, b in itertools.pairwise(runs)]


def steps(trace: Path) -> list[dict[str, object]]:
    return [r for r in trace_records(trace) if r.get("kind") == "step"]


def test_a_no_retry_exit_code_gives_up_at_once_with_93(jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "no_retry.jsonl"
    no_retry = jobs.start([*ONE, "--max-restarts", "3", "--trace", str(trace),
                           *resilient("no_retry_exit_codes=3,4")], env={"EXIT_CODES": "3"})
    # The same failure with an exit code that may be retried, and no restart left: exit 1.
    plain = jobs.start([*ONE, "--max-restarts", "0", *resilient("no_retry_exit_codes=3,4")],
                       env={"EXIT_CODES": "1"})
    assert no_retry.wait(90) == 93, no_retry.output
    assert plain.wait(90) == 1, plain.output
    [only] = attempts(no_retry)  # no restart: a single attempt ever started
    assert only["attempt"] == 0
    assert summary(no_retry.output)["root"]["exitcode"] == "3"  # type: ignore[index]
    assert "exit code 93" in no_retry.output
    [*_, last] = steps(trace)
    assert (last["source"], last["trigger"], last["dest"]) == ("HEALTHY", "failed", "FAILED")
    assert last["restart_count"] == 0 and last["remaining_restarts"] == 3
    assert len(attempts(plain)) == 1 and "exit code 93" not in plain.output


def test_a_crash_loop_backs_off_longer_each_time_then_gives_up(jobs: Jobs, tmp_path: Path) -> None:
    initial, factor, restarts = 0.3, 2.0, 3
    trace = tmp_path / "loop.jsonl"
    job = jobs.start([*ONE, "--max-restarts", str(restarts), "--trace", str(trace),
                      *resilient(f"backoff_initial={initial}s", f"backoff_factor={factor}",
                                 "backoff_jitter=0")])
    assert job.wait(90) == 1, job.output
    runs = attempts(job)
    assert len(runs) == restarts + 1, runs  # max_restarts restarts, then it gave up
    # Each gap: the backoff (initial * factor**n) and the restart's own work.
    waited = gaps(runs)
    backoffs = [initial * factor**n for n in range(restarts)]
    for n, (gap, backoff) in enumerate(zip(waited, backoffs, strict=True)):
        assert backoff <= gap < backoff + SLACK, (n, waited, backoffs)
    assert waited[-1] - waited[0] > (backoffs[-1] - backoffs[0]) / 2, waited  # they grow
    into_backoff = [s for s in steps(trace) if s["dest"] == "BACKOFF"]
    assert [s["restart_count"] for s in into_backoff] == [1, 2, 3]
    assert steps(trace)[-1]["dest"] == "FAILED"


def test_a_restart_window_lets_restarts_older_than_it_go(jobs: Jobs) -> None:
    # One restart allowed per 0.5 s window; each restart waits a 0.8 s backoff, so the previous
    # one has always left the window: three failures are restarted and the fourth attempt wins.
    params = ["backoff_initial=0.8s", "backoff_factor=1", "backoff_jitter=0"]
    env = {"EXIT_CODES": "1,1,1,0"}
    windowed = jobs.start([*ONE, "--max-restarts", "1",
                           *resilient(*params, "restart_window=0.5s")], env=env)
    # The same job with a window longer than the job: one restart, then it gives up.
    whole = jobs.start([*ONE, "--max-restarts", "1", *resilient(*params, "restart_window=1m")],
                       env=env)
    assert windowed.wait(90) == 0, windowed.output
    assert whole.wait(90) == 1, whole.output
    runs = attempts(windowed)
    assert len(runs) == 4
    assert all(0.8 <= g < 0.8 + SLACK for g in gaps(runs)), gaps(runs)
    assert len(attempts(whole)) == 2


def test_sigterm_during_a_backoff_stops_everything_at_once(jobs: Jobs, tmp_path: Path) -> None:
    # drain_on=[]: SIGTERM is torch's stop, not a preemption (test_preemption.py drains in one)
    trace = tmp_path / "term.jsonl"
    # The launcher's trace writer takes 0.5 s over the step into BACKOFF (slow_trace_run.py).
    job = jobs.start([*ONE, "--max-restarts", "3", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT),
                      "--trace", str(trace), *resilient("backoff_initial=60s", "drain_on=[]")],
                     env={"SPAWN_CHILD": "1"}, launcher="slow trace")
    [first] = job.wait_for("a0_r0_start.json", 1, 60)
    job.wait_output("restarting in", 60)  # the failure was counted: the backoff has begun
    # The line is logged after the trace recorded the step: a user who
    # reads the trace when the log says so finds the step there.
    into = [s for s in steps(trace) if s["dest"] == "BACKOFF"]
    assert len(into) == 1, steps(trace)
    # The workers were stopped before the backoff: nothing of the attempt runs during it.
    pids = [int(first["pid"]), int(first["child_pid"])]  # type: ignore[call-overload]
    assert not wait_gone(pids, SHUTDOWN_TIMEOUT + 2), pids
    sent = time.monotonic()
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(30) == 128 + signal.SIGTERM, job.output
    took = time.monotonic() - sent
    assert took < 20, took  # the 60 s backoff was not waited out
    assert "received SIGTERM" in job.output
    assert len(attempts(job)) == 1  # no restart after the signal
    last = trace_records(trace)[-1]
    assert last["source"] == "BACKOFF" and str(last["error"]).startswith("SignalException"), last
    assert not alive(job.pid)


def test_the_group_reports_stopped_during_the_backoff(jobs: Jobs) -> None:
    # fsm_agent.torch.launch in a program of its own; torch's worker_group.state, sampled every
    # 5 ms by a thread of that program, must read STOPPED whenever the lifecycle is in BACKOFF.
    job = jobs.start([], LAUNCH_SCRIPT, [str(WORKER), "backoff_initial=0.4s", "backoff_jitter=0"],
                     launcher="python")
    assert job.wait(90) == 1, job.output
    [watch] = job.records("watch.json")
    steps_ = watch["steps"]  # type: ignore[index]
    moves = [dest for dest, _ in itertools.groupby(s["dest"] for s in steps_)]  # healthy ticks
    assert moves == ["HEALTHY", "BACKOFF", "HEALTHY", "BACKOFF", "HEALTHY", "FAILED"], steps_
    for s in steps_:
        shown = "STOPPED" if s["dest"] == "BACKOFF" else s["dest"]
        assert (s["group"], s["reported"]) == (shown, shown), s
    # At rest in BACKOFF: a sample taken while a transition's actions run (the way out of
    # BACKOFF starts the workers before the state changes) reads a group on its way.
    moving = [(s["start"], s["time"]) for s in steps_]
    in_backoff = [smp for smp in watch["samples"]  # type: ignore[index]
                  if smp[1] == "BACKOFF" and not any(a <= smp[0] <= b for a, b in moving)]
    assert len(in_backoff) > 20, len(in_backoff)  # two backoffs of >= 0.4 s, sampled every 5 ms
    assert {(group, reported) for _, _, group, reported in in_backoff} == {("STOPPED",
                                                                           "STOPPED")}


def test_a_no_retry_exit_of_one_rank_while_the_others_run_gives_up(jobs: Jobs) -> None:
    # torch lists rank 1, which it stopped with SIGTERM, among the failures: not a failed rank
    # for the no-retry rule (docs/spec-format.md, failure matchers)
    job = jobs.start(["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.05",
                      "--max-restarts", "1", *resilient("no_retry_exit_codes=3",
                                                        "backoff_initial=0.1s")],
                     env={"EXIT_RANKS": "0", "EXIT_CODES": "3", "SLEEP": "0.5"})
    rc = job.wait(90)
    assert len(attempts(job)) == 1, job.output
    assert rc == 93, job.output
