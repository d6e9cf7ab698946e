"""Give up when restarts make no progress (``fsm_agent/_core/_progress.py``, the ``resilient``
preset's
``no_progress`` rule): real ``fsm-agent run`` jobs whose workers report steps with
``fsm_agent.progress(step)`` or write a checkpoint, then crash. After exactly
``no_progress_restarts`` restarts in a row without progress the job ends with
``no_requeue_exit_code``; without any source of progress the whole budget is used, as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from resilient_helpers import ONE, Job, Jobs, resilient, trace_records

PROGRESS = Path(__file__).parent / "scripts" / "progress_worker.py"


def _attempts(job: Job) -> list[int]:
    return sorted({int(r["attempt"]) for r in job.records("a*_r0.json")})  # type: ignore[call-overload]


def _verdicts(trace: Path) -> list[dict[str, object]]:
    return [r["diagnostics"]["progress"] for r in trace_records(trace)  # type: ignore[index]
            if r.get("kind") == "step" and "progress" in (r.get("diagnostics") or {})]


def _run(jobs: Jobs, tmp_path: Path, *params: str, env: dict[str, str] | None = None,
         max_restarts: int = 10) -> tuple[Job, Path]:
    trace = tmp_path / "trace.jsonl"
    job = jobs.start([*ONE, "--max-restarts", str(max_restarts), "--trace", str(trace),
                      *resilient("backoff_initial=0", *params)], PROGRESS, env=env)
    return job, trace


@pytest.mark.timeout(120)
@pytest.mark.parametrize("limit", [1, 2])
def test_steps_that_stop_advancing_give_up_after_exactly_no_progress_restarts(
        jobs: Jobs, tmp_path: Path, limit: int) -> None:
    # attempts 0 and 1 report steps; from attempt 2 on, every restart fails where it started
    job, trace = _run(jobs, tmp_path, f"no_progress_restarts={limit}",
                      env={"PROGRESS_ATTEMPTS": "0,1"})
    assert job.wait(90) == 93, job.output[-3000:]
    assert _attempts(job) == list(range(2 + limit)), job.output[-3000:]
    verdicts = _verdicts(trace)
    assert [v["progressed"] for v in verdicts] == [True, True] + [False] * limit
    assert verdicts[-1]["stalled_restarts"] == limit
    assert verdicts[1]["end"]["step"] == 103  # type: ignore[index]  # attempt 1's last step
    assert "rule 'no_progress'" in job.output
    # the run summary, replay and the report say where progress stopped
    said = f"step 103 -> step 103: no progress ({limit} restart{'s' if limit > 1 else ''} in a row)"
    assert f"progress (attempt {1 + limit}, node " in job.output and said in job.output
    for tool in (["replay"], ["report", "--format", "text"]):
        out = subprocess.run([sys.executable, "-m", "fsm_agent", *tool, str(trace)],
                             capture_output=True, text=True, timeout=60)
        assert said in out.stdout, (tool, out.stdout, out.stderr)
    page = trace.with_suffix(".html")
    subprocess.run([sys.executable, "-m", "fsm_agent", "report", str(trace), "-o", str(page)],
                   check=True, capture_output=True, timeout=60)
    assert page.read_text().count('<small class="progress">progress: ') == 2 + limit


@pytest.mark.timeout(120)
def test_a_checkpoint_that_stops_changing_gives_up_too(jobs: Jobs, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "run"
    ckpt.mkdir(parents=True)
    job, trace = _run(jobs, tmp_path, "no_progress_restarts=2",
                      f"checkpoint_path={tmp_path / 'ckpt'}",
                      env={"PROGRESS_ATTEMPTS": "0", "CHECKPOINT": str(ckpt / "latest.txt")})
    assert job.wait(90) == 93, job.output[-3000:]
    assert _attempts(job) == [0, 1, 2]
    assert [v["progressed"] for v in _verdicts(trace)] == [True, False, False]


@pytest.mark.timeout(120)
def test_without_a_source_of_progress_the_whole_budget_is_used(
        jobs: Jobs, tmp_path: Path) -> None:
    job, trace = _run(jobs, tmp_path, "no_progress_restarts=1", max_restarts=3,
                      env={"PROGRESS_ATTEMPTS": ""})
    assert job.wait(90) == 1, job.output[-3000:]
    assert _attempts(job) == [0, 1, 2, 3]
    assert "no_progress" not in job.output
    assert [v["progressed"] for v in _verdicts(trace)] == [None] * 4  # unknown, not a stall


@pytest.mark.timeout(120)
def test_the_first_attempt_is_not_a_restart(jobs: Jobs, tmp_path: Path) -> None:
    # A requeued job resumes from a checkpoint that no attempt gets past: the first attempt's
    # failure is not a restart without progress; the next two are, and end it.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step_100.pt").write_text("weights")
    job, trace = _run(jobs, tmp_path, "no_progress_restarts=2", f"checkpoint_path={ckpt}/*.pt",
                      env={"PROGRESS_ATTEMPTS": ""})
    assert job.wait(90) == 93, job.output[-3000:]
    assert _attempts(job) == [0, 1, 2]
    assert [v["stalled_restarts"] for v in _verdicts(trace)] == [0, 1, 2]


@pytest.mark.timeout(120)
def test_a_hung_restart_without_progress_counts_too(jobs: Jobs, tmp_path: Path) -> None:
    # attempt 0 reports steps and crashes; attempt 1 hangs where it started: detected as hung,
    # and a restart without progress, so with no_progress_restarts=1 the job ends there
    job, trace = _run(jobs, tmp_path, "no_progress_restarts=1", "hang_timeout=1s",
                      env={"PROGRESS_ATTEMPTS": "0", "HANG_ATTEMPTS": "1"})
    assert job.wait(90) == 93, job.output[-3000:]
    assert _attempts(job) == [0, 1]
    assert "worker group hung" in job.output
    assert [v["progressed"] for v in _verdicts(trace)] == [True, False]
