"""Budgets per cause in real jobs (``fsm_agent/_core/_budgets.py``, the ``resilient`` preset's
``infra`` budget): a failure whose exit code is one of ``infra_exit_codes`` spends
``infra_restarts``, never ``--max-restarts``, and the other way round; with two agents the job
counts both budgets once, on the rendezvous store. The workers' exit codes are scripted per
attempt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fsm_test_procs import FAST, free_port
from resilient_helpers import ONE, Jobs, resilient, trace_records

pytestmark = pytest.mark.timeout(150)

INFRA = ("backoff_initial=0", "infra_exit_codes=75", "infra_restarts=2")


def _rules(trace: Path) -> list[tuple[object, object]]:
    return [(r["rule"], r["dest"]) for r in trace_records(trace)
            if r.get("kind") == "step" and r.get("rule")]


def _starts(job: object, rank: int = 0) -> list[int]:
    return sorted(int(r["attempt"]) for r in job.records(f"a*_r{rank}_start.json"))  # type: ignore[attr-defined]


def test_infra_and_user_failures_spend_their_own_budgets(jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "budgets.jsonl"
    # two infra failures (the infra budget's 2), one user failure (--max-restarts 1), then an
    # infra failure with the infra budget spent: it gives up, although no user restart is left
    # either way; a run that counted everything against one budget would end after attempt 1
    job = jobs.start([*ONE, "--max-restarts", "1", "--trace", str(trace), *resilient(*INFRA)],
                     env={"EXIT_CODES": "75,75,1,75"})
    assert job.wait(90) == 1, job.output[-3000:]
    assert _starts(job) == [0, 1, 2, 3], job.output[-3000:]
    assert _rules(trace) == [("infra", "BACKOFF"), ("infra", "BACKOFF"), ("retry", "BACKOFF"),
                             ("infra", "FAILED")]
    steps = [r for r in trace_records(trace) if r.get("kind") == "step" and r.get("rule")]
    # restart_count counts every budget (the attempt number); remaining_restarts the user's
    assert [s["restart_count"] for s in steps] == [1, 2, 3, 3]
    assert [s["remaining_restarts"] for s in steps] == [1, 1, 0, 0]
    assert "(budget infra: 1 of 2 used; not counted against max_restarts)" in job.output
    assert "(budget infra: 2 of 2 used; not counted against max_restarts)" in job.output
    assert "restart 1 of 1 (rule 'retry')" in job.output
    # replay and the report tell the budgets apart too
    assert _tool("replay", trace).splitlines()[2].strip() == (
        "restarts used: 1, left: 0; budget infra: 2 used; budget node_replacements: 0 used")
    assert "restarts: 1 of 1 used; budget infra: 2 used;" in _tool("report", trace)


def _tool(name: str, trace: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "fsm_agent", name, str(trace),
                          *(["--format", "text"] if name == "report" else [])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_infra_failure_restarts_with_no_user_restart_allowed(jobs: Jobs) -> None:
    infra = jobs.start([*ONE, "--max-restarts", "0", *resilient(*INFRA)],
                       env={"EXIT_CODES": "75,0"})
    user = jobs.start([*ONE, "--max-restarts", "0", *resilient(*INFRA)],
                      env={"EXIT_CODES": "1,0"})
    assert infra.wait(90) == 0, infra.output[-3000:]
    assert user.wait(90) == 1, user.output[-3000:]
    assert _starts(infra) == [0, 1] and _starts(user) == [0]


def test_two_agents_count_each_budget_once_for_the_job(jobs: Jobs, tmp_path: Path) -> None:
    # attempt 0: a's worker exits 75 (infra, 1 of 1); attempt 1: b's exits 1 (the user's 1 of
    # 1); attempt 2: both succeed. Counted against one budget, attempt 1's failure would end
    # the job; counted by each agent, both budgets would still be whole.
    port = free_port()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "budgets2", *FAST,
            "--max-restarts", "1",
            *resilient("backoff_initial=0", "infra_exit_codes=75", "infra_restarts=1")]
    a = jobs.start([*args, "--trace", str(tmp_path / "a.jsonl")], name="a",
                   env={"EXIT_CODES": "75,0,0", "SLEEPS": "0.5,60,0.5"})
    a.wait_listening(port, 30)
    b = jobs.start([*args, "--trace", str(tmp_path / "b.jsonl")], name="b",
                   env={"EXIT_CODES": "0,1,0", "SLEEPS": "60,0.5,0.5"})
    assert (a.wait(120), b.wait(60)) == (0, 0), (a.output[-3000:], b.output[-3000:])
    ranks = {job: next(int(r["rank"]) for r in job.records("a0_r*_start.json"))
             for job in (a, b)}
    assert [_starts(job, ranks[job]) for job in (a, b)] == [[0, 1, 2], [0, 1, 2]]
    assert ("infra", "BACKOFF") in _rules(tmp_path / "a.jsonl")
    assert ("retry", "BACKOFF") in _rules(tmp_path / "b.jsonl")
    # each survivor says whose failure it restarts with, and against which budget
    assert "counted once for the job: 1 of 1 used of budget infra" in b.output, b.output[-3000:]
    assert "counted once for the job: 1 of 1 used)" in a.output, a.output[-3000:]
