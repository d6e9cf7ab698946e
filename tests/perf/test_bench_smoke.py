"""``python bench/run_all.py --smoke``: the benchmark session CI may run.

It must run real jobs of both launchers end to end, report every target of docs/performance.md as a
row of its summary, write its report and plots away from the published ``docs/performance.md`` and
``docs/performance/``, and leave no process behind. The figures themselves are not asserted:
timing targets are for the benchmark's report, not for tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_ALL = ROOT / "bench" / "run_all.py"
# the targets at or ahead of torchrun, as the summary names them
TARGETS = ("agent CPU, 4 workers sleeping", "warm restart", "start-up, 1 x", "start-up, 8 x",
           "exit barrier release, 8 agents (last arrival", "engine: one observe()")


def _published() -> dict[str, bytes]:
    files = [ROOT / "docs" / "performance.md", *sorted((ROOT / "docs" / "performance").glob("*"))]
    return {str(p): p.read_bytes() for p in files if p.is_file()}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _summary_rows(doc: str) -> list[list[str]]:
    section = doc.split("## Summary", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_runs_both_launchers_reports_every_target_and_leaves_docs_alone(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    before = _published()
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the smoke's default output dir and job dirs
    done = subprocess.run(
        [sys.executable, str(RUN_ALL), "--smoke", "--only", "engine", "warm", "curves"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540, check=False,
    )
    log = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, log
    assert _published() == before, "a smoke run rewrote the published figures"
    assert not _processes_mentioning(str(tmp_path)), "benchmark processes left running"

    out = tmp_path / "fsm-bench-smoke"
    doc = (out / "performance.md").read_text()
    assert "smoke run" in doc
    rows = _summary_rows(doc)
    for target in TARGETS:
        matching = [r for r in rows if r[0].startswith(target)]
        assert len(matching) == 1, (target, [r[0] for r in rows])
        assert matching[0][4].endswith("(#13)"), matching[0]
    # measured in this session: figures, a ratio and a verdict (whichever it is)
    for target in ("warm restart", "engine: one observe()"):
        (row,) = [r for r in rows if r[0].startswith(target)]
        assert re.fullmatch(r"\d+\.\d\d", row[3]), row
        assert row[5] in ("met", "**not met**"), row
    # and real crashes and the preloaded start-up, measured with the warm restart
    for target in ("real crash (`sys.exit(1)`", "real crash (an uncaught exception",
                   "preloaded start-up, 1 x 4 workers importing torch"):
        (row,) = [r for r in rows if r[0].startswith(target)]
        assert row[4].endswith("(#22)") and re.fullmatch(r"\d+\.\d\d", row[3]), row
        assert row[5] in ("met", "**not met**"), row
    # not measured in this session: the row says so instead of vanishing
    (startup_row,) = [r for r in rows if r[0].startswith("start-up, 1 x")]
    assert startup_row[1:4] == ["n/a"] * 3 and startup_row[5] == "n/a"

    # the curves: each point, both launchers, a restart measured, nothing wrong
    curves = doc.split("## Cost as the work grows", 1)[1].split("\n## ", 1)[0]
    lines = [[c.strip() for c in line.strip("|").split("|")]
             for line in curves.splitlines() if re.match(r"\| \d+ x \d+ \|", line)]
    points = {(cells[0], cells[1]) for cells in lines}
    assert points == {(p, L) for p in ("1 x 1", "1 x 4", "2 x 1")
                      for L in ("torchrun", "fsm-agent")}, points
    for cells in lines:
        assert cells[2] == "1" and cells[4].endswith("ms"), cells  # one job, restart measured
        assert re.match(r"\d+\.\d+", cells[7]), cells  # steady store requests per second
        assert cells[9] == "", cells  # no failure, no bad exit code, nothing left running
    pytest.importorskip("matplotlib")
    assert {p.name for p in (out / "performance").glob("*.png")} == {
        "curves.png", "store_requests.png"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_store_scale_smoke_runs_the_real_job_code_and_counts_the_ledger_once_per_round(
    tmp_path: Path,
) -> None:
    # the store's scale harness (bench/store_scale.py), small: every simulated agent learns the
    # announcement, the failure storm leaves one ledger entry per round, and no watch thread
    # outlives its agent
    pytest.importorskip("torch")
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "store_scale.py"), "--smoke", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=280, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {(r["agents"], r["mode"]) for r in rows} == {
        (n, m) for n in (16, 64) for m in ("watch", "poll")}
    for r in rows:
        assert r["learnt"] == r["agents"], r
        assert r["ledger_exact"] and r["ledger"] == ["1", "2"], r
        assert r["threads_left"] == 0, r
        assert not [e for s in r["storm"] for e in s["errors"]], r
    # a healthy watching agent asks the store (almost) nothing; a polling one asks every 0.2 s
    by = {(r["agents"], r["mode"]): r for r in rows}
    assert by[(64, "watch")]["req_per_s"] < by[(64, "poll")]["req_per_s"] / 10, by
