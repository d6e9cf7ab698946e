"""A rank that spins instead of blocking (``fsm_agent/torch/_progress.py``): rank 1 spins in a
Python function while rank 0 waits for it in ``all_reduce``. Before, its CPU time counted as
progress and nothing was detected (the job sat there until killed). Now the spinner's stack
standing still is no progress: the hang is found within hang_timeout plus a sample, the stacks
name rank 1 as the suspect (not in the collective rank 0 waits in), and the restart succeeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from diag_helpers import SCRIPTS, Jobs, trace_records

from fsm_agent.torch._progress import sample_period_for

BUSY = SCRIPTS / "busy.py"
TIMEOUT = 3.0
ARGS = ["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.1", "--spec",
        "resilient", "--spec-param", f"hang_timeout={TIMEOUT:g}s",
        "--spec-param", "backoff_initial=100ms"]


@pytest.mark.timeout(120)
def test_a_spinning_rank_is_a_hang_named_as_the_suspect_and_the_restart_succeeds(
        jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    job = jobs.start([*ARGS, "--max-restarts", "1", "--trace", str(trace)], BUSY)
    assert job.wait(100) == 0, job.output[-3000:]
    [hung] = [r for r in trace_records(trace) if r.get("trigger") == "hung"]
    started = max(float(r["time"]) for r in  # type: ignore[arg-type]
                  job.records("a0_r*_waiting.json") + job.records("a0_r*_spinning.json"))
    latency = float(hung["wall_time"]) - started  # type: ignore[arg-type]
    # within hang_timeout plus one sample (and 0.5 s for a loaded 2-core machine)
    assert TIMEOUT <= latency <= TIMEOUT + sample_period_for(TIMEOUT) + 0.5, latency
    diag = hung["diagnostics"]
    assert isinstance(diag, dict)
    suspects = diag["suspects"]
    assert suspects["waiting"] == {"0": "all_reduce"}, suspects
    assert list(suspects["suspects"]) == ["1"] and \
        suspects["suspects"]["1"].startswith("spin_forever (busy.py:"), suspects
    assert "suspect: rank 1 is not in the all_reduce that rank 0 waits in: spin_forever" \
        in job.output
    assert len(job.records("a1_r*_done.json")) == 2  # the restart succeeded
    print(f"busy hang detected {latency:.2f} s after the spin began")


@pytest.mark.timeout(120)
def test_the_summary_of_a_job_that_gives_up_names_the_spinning_rank_first(
        jobs: Jobs, tmp_path: Path) -> None:
    job = jobs.start([*ARGS, "--max-restarts", "0"], BUSY)
    assert job.wait(100) == 1, job.output[-3000:]
    root = next(line for line in job.output.splitlines() if line.startswith("root cause: "))
    assert root.startswith("root cause: rank 1 "), root
    assert "spin_forever" in root and "suspect" in root, root
