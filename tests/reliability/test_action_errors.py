"""An action raises mid-transition (a rendezvous timeout, a start failure during a restart): the
machine moves to UNKNOWN, the workers are stopped, and the error names the transition and the
action that failed. Real agents; the trace shows the machine's side."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from reliability_helpers import FAST, STANDALONE, Jobs, alive, free_port, trace_records


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.mark.timeout(120)
def test_rendezvous_timeout(jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "alone",
            "--rdzv-conf", "join_timeout=3", "--trace", str(trace), *FAST]
    job = jobs.start(args)  # the second node never comes
    assert job.wait(100) == 1, job.output
    line = last_line(job.output)
    assert line.startswith("fsm-agent run: error: ActionError: [default] action 'rendezvous' "
                           "failed during transition 'start' INIT -> HEALTHY: "
                           "RendezvousTimeoutError"), line
    last = trace_records(trace)[-1]
    assert (last["trigger"], last["source"], last["dest"]) == ("start", "INIT", "UNKNOWN"), last
    assert [(a["name"], a["outcome"]) for a in last["actions"]] == [  # type: ignore[union-attr]
        ("rendezvous", "raised")]
    assert "RendezvousTimeoutError" in str(last["error"])
    assert not job.records("*_start.json")


START_FAILS = """#!/bin/sh
# Rank 1 fails on the first attempt and takes the execute bit off this very file, so starting the
# workers again (the restart) fails in the agent, with a PermissionError from exec.
out="$OUT_DIR/a${TORCHELASTIC_RESTART_COUNT}_r${RANK}_start.json"
printf '{"pid": %s, "RANK": "%s"}' $$ "$RANK" > "$out"
if [ "$RANK" = 1 ]; then chmod a-x "$0"; exit 3; fi
exec sleep 120
"""


@pytest.mark.timeout(120)
def test_start_failure_during_a_restart(jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    script = tmp_path / "job.sh"
    script.write_text(START_FAILS)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    job = jobs.start([*STANDALONE, "--max-restarts", "2", "--no-python", "--trace", str(trace)],
                     script)
    assert job.wait(100) == 1, job.output
    line = last_line(job.output)
    assert line.startswith("fsm-agent run: error: ActionError: [default] action 'start_workers' "
                           "failed during transition 'always' STOPPED -> HEALTHY: "
                           "PermissionError"), line
    records = [r for r in trace_records(trace) if r.get("kind") == "step"]
    last = records[-1]
    assert (last["trigger"], last["source"], last["dest"]) == ("always", "STOPPED", "UNKNOWN")
    assert [(a["name"], a["outcome"]) for a in last["actions"]] == [  # type: ignore[union-attr]
        ("rendezvous", "ok"), ("start_workers", "raised")], last
    assert records[-2]["trigger"] == "failed" and records[-2]["restart_count"] == 1
    # The first attempt's workers were stopped (rank 0 was sleeping), no second attempt runs.
    first = job.records("a0_*_start.json")
    assert len(first) == 2 and not any(alive(int(r["pid"])) for r in first)  # type: ignore[call-overload]
    assert not job.records("a1_*")
