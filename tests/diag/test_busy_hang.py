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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_false_alarm_over_100_steps_of_a_third_of_hang_timeout_each(
        jobs: Jobs, tmp_path: Path) -> None:
    # Steps in one C call, in a Python loop, in a collective (steps.py), each a third of
    # hang_timeout (half, less the slack a loaded 2-core machine needs); 100 steps.
    trace = tmp_path / "trace.jsonl"
    timeout = 1.0
    args = [a if a != f"hang_timeout={TIMEOUT:g}s" else f"hang_timeout={timeout:g}s"
            for a in ARGS]
    job = jobs.start([*args, "--max-restarts", "0", "--trace", str(trace)], SCRIPTS / "steps.py",
                     env={"STEP_SECONDS": str(timeout / 3), "STEPS": "100"})
    assert job.wait(200) == 0, job.output[-3000:]
    assert not [r for r in trace_records(trace) if r.get("trigger") == "hung"]
    assert [r["steps"] for r in job.records("a0_r*_done.json")] == [100, 100]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_nodes_name_the_rank_that_spins_on_either_node(jobs: Jobs, tmp_path: Path) -> None:
    # 4 ranks on 2 nodes, rank 3 spins: the node whose ranks all wait in the all_reduce names
    # it too (each node shares its ranks' part on the store)
    from diag_helpers import free_port

    port = free_port()
    args = [a for a in ARGS if a not in ("--standalone",)]
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "busy", *args, "--max-restarts", "1"]
    agents = [jobs.start([*args, "--trace", str(tmp_path / f"{n}.jsonl")], BUSY,
                         env={"SPIN_RANK": "3"}, name=n) for n in ("a", "b")]
    for job in agents:
        assert job.wait(150) == 0, job.output[-3000:]
    for job in agents:
        assert "suspect: rank 3 is not in the all_reduce that ranks 0, 1, 2 wait in: " \
            "spin_forever (busy.py:" in job.output, job.output[-3000:]
        [hung] = [r for r in trace_records(tmp_path / f"{job.workdir.name}.jsonl")
                  if r.get("trigger") == "hung"]
        assert list(hung["diagnostics"]["suspects"]["suspects"]) == ["3"]  # type: ignore[index]
    assert len(agents[0].records("a1_r*_done.json") + agents[1].records("a1_r*_done.json")) == 4
