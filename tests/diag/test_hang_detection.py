"""An unmodified deadlocking script (two ranks waiting on each other), run by ``fsm-agent run``
with a spec that asks for hang detection: detected within hang_timeout plus one sample period,
both ranks' stacks saved before the kill, then the spec's outcome."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from diag_helpers import SCRIPTS, Jobs, trace_records

from fsm_agent.torch._progress import sample_period_for
from fsm_agent.torch._stacks import stack_functions

SPEC = Path(__file__).parent / "specs" / "hang.yaml"
DEADLOCK = SCRIPTS / "deadlock.py"
TIMEOUT = 3.0  # the spec's hang_timeout default
ARGS = ["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.1", "--spec", str(SPEC)]


def _hung_steps(trace: Path) -> list[dict[str, object]]:
    return [r for r in trace_records(trace) if r.get("trigger") == "hung"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("log_dir", ["absolute", "relative"])
def test_a_deadlock_is_detected_its_stacks_saved_and_the_group_restarted(
    jobs: Jobs, tmp_path: Path, log_dir: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    # the job runs in tmp_path/job0: a relative --log-dir is below it (its stacks went to a
    # temporary directory, never removed)
    logs = tmp_path / "logs" if log_dir == "absolute" else tmp_path / "job0" / "logs"
    job = jobs.start([*ARGS, "--max-restarts", "1", "--log-dir",
                      str(logs) if log_dir == "absolute" else "logs",
                      "--trace", str(trace)], DEADLOCK, env={"DEADLOCK_ATTEMPTS": "0"})
    assert job.wait(150) == 0, job.output
    [hung] = _hung_steps(trace)
    waiting = job.records("a0_r*_waiting.json")
    assert len(waiting) == 2
    # detected within hang_timeout + one sample period of the later rank starting to wait
    # (plus 0.5 s: the agent's wake-ups and the step's start run late on a busy 2-core machine;
    # measured 3.0 to 3.3 s when quiet, docs/diagnosis.md)
    started = max(float(w["time"]) for w in waiting)  # type: ignore[arg-type]
    latency = float(hung["wall_time"]) - started  # type: ignore[arg-type]
    period = sample_period_for(TIMEOUT)
    assert TIMEOUT <= latency <= TIMEOUT + period + 0.5, latency
    assert hung["source"] == "HEALTHY" and hung["dest"] == "UNHEALTHY"
    actions = hung["actions"]
    assert isinstance(actions, list) and [a["name"] for a in actions] == ["capture_stacks"]
    diag = hung["diagnostics"]
    assert isinstance(diag, dict)
    assert sorted(w["rank"] for w in diag["hang"]["workers"]) == [0, 1]
    pids = {int(w["pid"]) for w in waiting}  # type: ignore[call-overload]
    stacks = diag["stacks"]
    assert {s["pid"] for s in stacks} == pids and all(s["method"] == "py-spy" for s in stacks)
    for s in stacks:
        path = Path(s["path"])
        # saved under the run's log directory, one file per rank
        assert path.is_relative_to(logs) and path.name == f"rank_{s['rank']}.txt", path
        assert "wait_for_peer_forever" in stack_functions(path.read_text())
    failures = hung["failures"]
    assert isinstance(failures, dict) and sorted(failures) == ["0", "1"]
    assert all("stacks: " in f["message"] for f in failures.values())
    # then the spec's outcome: UNHEALTHY --always [has_restarts_left]--> STOPPED --> HEALTHY
    path = [(r["source"], r["dest"]) for r in trace_records(trace) if r.get("kind") == "step"]
    i = path.index(("HEALTHY", "UNHEALTHY"))
    assert path[i + 1:i + 3] == [("UNHEALTHY", "STOPPED"), ("STOPPED", "HEALTHY")]
    assert path[-1] == ("HEALTHY", "SUCCEEDED")
    assert len(job.records("a1_r*_done.json")) == 2


@pytest.mark.timeout(120)
def test_a_rank_that_computes_while_its_peer_waits_is_not_a_hang(jobs: Jobs,
                                                                 tmp_path: Path) -> None:
    # Half the hang_timeout in one loop of one function: a rank whose stack stays in one place
    # for the whole hang_timeout spins (test_busy_hang.py), one that moves on before is working.
    trace = tmp_path / "trace.jsonl"
    job = jobs.start([*ARGS, "--max-restarts", "0", "--trace", str(trace)], DEADLOCK,
                     env={"DEADLOCK_ATTEMPTS": "", "BUSY_SECONDS": str(0.5 * TIMEOUT)})
    assert job.wait(100) == 0, job.output
    assert not _hung_steps(trace)
    assert len(job.records("a0_r*_done.json")) == 2


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_deadlock_every_attempt_gives_up_with_a_summary_naming_the_stacks(
    jobs: Jobs, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    job = jobs.start([*ARGS, "--max-restarts", "1", "--log-dir", str(tmp_path / "logs"),
                      "--trace", str(trace)], DEADLOCK, env={"DEADLOCK_ATTEMPTS": "0,1"})
    assert job.wait(200) == 1, job.output
    assert len(_hung_steps(trace)) == 2
    out = job.output
    summary = out[out.index("fsm-agent: job FAILED"):]
    lines = summary.splitlines()
    assert re.match(r"root cause: rank [01] \(.*\): hung: its main thread made no progress",
                    lines[1]), summary
    assert lines[3].startswith("decided by: always UNHEALTHY -> FAILED") and "gave up" in lines[3]
    assert "restarts: 1 of 1 used" in summary and "time lost:" in summary
    listed = re.findall(r"rank (\d): (\S+/stacks/attempt_1/rank_\d\.txt)", summary)
    assert sorted(r for r, _ in listed) == ["0", "1"], summary
    # torch's own failure block names the stacks too
    assert out.count("; stacks: ") >= 2
    records = trace_records(trace)
    assert records[-1]["dest"] == "FAILED"
    json.dumps(records)


RELIABILITY_WORKER = Path(__file__).parents[1] / "reliability" / "scripts" / "worker.py"


@pytest.mark.timeout(180)
def test_torchs_timer_api_delivers_hung_too_stacks_before_the_kill(
    jobs: Jobs, tmp_path: Path
) -> None:
    # The worker arms torch's own deadline around each step; rank 1 blocks inside one.
    trace = tmp_path / "trace.jsonl"
    env = {"HANG_RANK": "1", "HANG_ATTEMPTS": "0", "STEPS": "40", "STEP_TIMEOUT": "1",
           "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
           "TORCHELASTIC_TIMER_FILE": str(tmp_path / "timer.fifo")}
    job = jobs.start([*ARGS, "--max-restarts", "1", "--log-dir", str(tmp_path / "logs"),
                      "--trace", str(trace)], RELIABILITY_WORKER, env=env)
    assert job.wait(150) == 0, job.output
    [hung] = _hung_steps(trace)
    diag = hung["diagnostics"]
    assert isinstance(diag, dict) and diag["hang"]["source"] == "timer"
    assert [w["rank"] for w in diag["hang"]["workers"]] == [1]
    assert "timer" in diag["hang"]["workers"][0]["why"]
    stacks = {s["rank"]: s for s in diag["stacks"]}
    assert 1 in stacks and stacks[1]["method"] == "py-spy"
    assert "main" in stack_functions(Path(stacks[1]["path"]).read_text())
    path = [(r["source"], r["dest"]) for r in trace_records(trace) if r.get("kind") == "step"]
    assert path[-1] == ("HEALTHY", "SUCCEEDED") and ("UNHEALTHY", "STOPPED") in path
