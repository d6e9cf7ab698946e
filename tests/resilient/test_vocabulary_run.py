"""A spec with a guard of the program's own, run by ``fsm-agent run --vocabulary MODULE:ATTR``:
the agent imports the module the user named and the guard decides the job's restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from resilient_helpers import ONE, Jobs

ROOT = Path(__file__).resolve().parents[2]
QUOTA_SPEC = ROOT / "tests" / "specs" / "vocabulary" / "quota.yaml"

# The cluster's quota allows one restart; every time the guard is asked it leaves a line.
VOCAB = """\
import os

import fsm_agent


def quota_ok(ctx):
    with open(os.path.join(os.environ["OUT_DIR"], "quota_asked.txt"), "a") as f:
        f.write(f"{ctx.restart_count}\\n")
    return ctx.restart_count < 1


VOCABULARY = fsm_agent.Vocabulary.builtin().extend(guards={"quota_ok": quota_ok})
"""


@pytest.mark.timeout(120)
def test_a_custom_guard_decides_the_restarts_of_a_real_job(jobs: Jobs, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "quota_vocab.py").write_text(VOCAB)
    spec = tmp_path / "quota.yaml"
    spec.write_text(QUOTA_SPEC.read_text())
    args = [*ONE, "--max-restarts", "3", "--spec", str(spec)]
    trace = tmp_path / "quota.jsonl"
    job = jobs.start([*args, "--vocabulary", "quota_vocab:VOCABULARY", "--trace", str(trace)],
                     env={"PYTHONPATH": str(lib)})
    # --max-restarts 3, but the quota allows one restart: two attempts, then the job fails.
    assert job.wait(90) == 1, job.output
    assert len(job.records("a*_r0_start.json")) == 2, job.output
    asked = (job.out_dir / "quota_asked.txt").read_text().split()
    assert asked == ["0", "1"]  # at each failure, with the restarts done so far
    # Without the vocabulary the spec cannot be used: refused before anything starts.
    refused = jobs.start(args, env={"PYTHONPATH": str(lib)})
    assert refused.wait(60) == 2, refused.output
    assert "unknown guard 'quota_ok'" in refused.output
    assert not refused.records("a*_r0_start.json")

    # The trace names the vocabulary it ran with; a reader never imports it, but says what to
    # pass, and with it the trace replays.
    assert json.loads(trace.read_text().splitlines()[0])["vocabulary"] == "quota_vocab:VOCABULARY"
    env = {**os.environ, "PYTHONPATH": str(lib)}

    def replay(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fsm_agent", "replay", str(trace), *extra],
                              capture_output=True, text=True, timeout=60, env=env)

    alone = replay()
    assert alone.returncode == 2
    assert f"pass --spec {spec} and --vocabulary quota_vocab:VOCABULARY if you trust that " \
        "file and module" in alone.stderr, alone.stderr
    half = replay("--spec", str(spec))
    assert half.returncode == 2 and "unknown guard 'quota_ok'" in half.stderr, half.stderr
    assert "recorded with --vocabulary quota_vocab:VOCABULARY: pass it too" in half.stderr
    both = replay("--spec", str(spec), "--vocabulary", "quota_vocab:VOCABULARY")
    assert both.returncode == 0, both.stdout + both.stderr
    assert "follows spec" in both.stdout
