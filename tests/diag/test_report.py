"""``fsm-agent report``: a real job's trace, rendered in headless Chromium and read through its
DOM; ``--format text``; the analysis behind both."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser import dom, screenshot
from diag_helpers import FAST, Jobs, trace_records

from fsm_agent import load_spec
from fsm_agent._readers._analysis import analyse
from fsm_agent._readers._summary import format_text
from fsm_agent.trace._reader import read_trace

WORKER = Path(__file__).parents[1] / "reliability" / "scripts" / "worker.py"
REPO = Path(__file__).parents[2]
FSM = [sys.executable, "-m", "fsm_agent"]


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real job: rank 1 raises ValueError (error file), is restarted, then exits 3; no
    restarts left, the agent gives up."""
    tmp = tmp_path_factory.mktemp("report")
    js = Jobs(tmp, shutdown_timeout=3, default_script=WORKER)
    try:
        trace = tmp / "trace.jsonl"
        job = js.start(["--standalone", "--nproc-per-node", "2", *FAST, "--max-restarts", "1",
                        "--log-dir", str(tmp / "logs"), "--trace", str(trace)],
                       env={"FAIL_RANK": "1", "FAIL_HOW": "raise,exit:3",
                            "MESSAGE": "bad batch 17"})
        assert job.wait(90) == 1, job.output
    finally:
        leaked = js.cleanup()
    assert not leaked
    return trace


def test_the_analysis_names_the_root_cause_decisions_and_budget(failed_job: Path) -> None:
    traces = read_trace(failed_job)
    a = analyse(traces, load_spec("torchelastic"))
    assert a.outcome == "FAILED" and len(a.lanes) == 1
    assert (a.restarts_used, a.restart_budget) == (1, 1)
    assert [i.decision.outcome for i in a.incidents if i.decision] == ["restart", "gave up"]
    first, last = a.incidents
    assert first.cause == "exit code 1 (ValueError)" and first.failures[0].exception == \
        "ValueError: bad batch 17"
    assert first.failures[0].error_file and os.path.isfile(first.failures[0].error_file)
    assert a.root_cause is not None and a.root_cause.rank == 1 and a.root_cause.exitcode == 3
    assert last.decision is not None and last.decision.dest == "FAILED"
    assert ("has_restarts_left", False) in last.decision.guards
    # time lost adds up per cause, and a lane's segments cover its time in order
    assert sum(s for _, s, _ in a.lost_by_cause) == pytest.approx(sum(i.lost for i in
                                                                        a.incidents))
    segs = a.lanes[0].segments
    assert all(s.start <= s.end for s in segs)
    assert all(x.start <= y.start + 1e-6 for x, y in itertools.pairwise(segs))
    kinds = {s.kind for s in segs}
    assert {"running", "rendezvous", "starting", "stopping", "barrier"} <= kinds
    text = format_text(a)
    lines = text.splitlines()
    assert lines[0].startswith("fsm-agent: job FAILED (spec 'torchelastic', 1 agent)")
    assert lines[1].startswith("root cause: rank 1 (") and "exit code 3" in lines[1]
    assert lines[2].startswith("decided by: failed HEALTHY -> FAILED") and "gave up" in lines[2]
    assert "restarts: 1 of 1 used" in text and "error files:" in text


def test_text_format_prints_the_summary(failed_job: Path) -> None:
    proc = subprocess.run([*FSM, "report", str(failed_job), "--format", "text"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("root cause: rank 1")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    for args in ([str(tmp_path / "missing.jsonl")], [str(bad)],
                 [str(bad), "--format", "text", "-o", "x.html"]):
        proc = subprocess.run([*FSM, "report", *args], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 2, proc
        assert proc.stderr.startswith("fsm-agent report: error: ") and \
            proc.stderr.count("\n") == 1, proc.stderr


def test_the_report_renders_in_chromium(failed_job: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    proc = subprocess.run([*FSM, "report", str(failed_job), "-o", str(page)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    # self-contained: nothing is fetched (no script, no external reference)
    assert "<script" not in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    doc = dom(page)
    assert doc.one(id="outcome").text == "FAILED"
    cause = doc.one(id="root-cause").text
    assert "first failing rank 1" in cause and "exit code 3" in cause and "gave up" in cause
    rows = doc.find_all("tr", cls="incident-row")
    assert len(rows) == 2
    assert "ValueError" in rows[0].text and "restart" in rows[0].text
    assert "has_restarts_left=false" in rows[1].text and "gave up" in rows[1].text
    timeline = doc.one("svg", id="timeline")
    lanes = timeline.find_all("g", cls="lane")
    assert len(lanes) == 1 and lanes[0].attrs["data-final"] == "FAILED"
    assert lanes[0].find_all("rect", cls="seg-running")
    assert len(timeline.find_all("g", cls="incident")) == 2
    assert len(doc.find_all("tr", cls="lost-row")) == 2
    diagram = doc.one(id="diagram")
    assert diagram.find_all("svg") or diagram.tag == "table"
    assert "bad batch 17" in doc.text  # the error file's message, via the failures
    shot = screenshot(page, tmp_path / "report.png")
    target = os.environ.get("FSM_AGENT_REPORT_SCREENSHOT")
    if target:
        shutil.copy(shot, target)
    # the job's own records are all there
    assert len(trace_records(failed_job)) > 5


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_readme_example_two_agents_hang_crash_and_recover(tmp_path: Path) -> None:
    """examples/report_demo.py, which made docs/report-example.png, still does what it says."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "report_demo.py"),
                           str(tmp_path / "demo")], capture_output=True, text=True,
                          timeout=380, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = dom(tmp_path / "demo" / "report.html")
    assert doc.one(id="outcome").text == "SUCCEEDED"
    assert len(doc.one("svg", id="timeline").find_all("g", cls="lane")) == 2
    causes = [r.find_all("td")[3].text for r in doc.find_all("tr", cls="incident-row")]
    assert "hang" in causes and "exit code 1 (ValueError)" in causes, causes
    assert doc.find_all("details", cls="stack")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_demo_traces_replay_and_the_root_cause_is_the_first_failure(tmp_path: Path) -> None:
    """On a real two-agent run: the job-wide budget one agent spent is
    no divergence in the other's trace, and the hang that came first is the root cause, not the
    peer's "connection closed" or the later ValueError."""
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "report_demo.py"), str(out)],
                          capture_output=True, text=True, timeout=380, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    fsm = [sys.executable, "-m", "fsm_agent"]
    for node in ("node0", "node1"):
        res = subprocess.run([*fsm, "replay", str(out / f"{node}.jsonl")], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run([*fsm, "report", "--format", "text", str(out / "node0.jsonl"),
                          str(out / "node1.jsonl")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    first = next(line for line in res.stdout.splitlines() if line.startswith("first failure"))
    assert "rank 0" in first and "hung" in first, res.stdout


CRASH_NO_RECORD = """\
import sys
for i in range(30):
    print(f"stderr line {i}", file=sys.stderr)
print("\\x1b[31mCUDA error: an illegal memory access\\x1b[0m", file=sys.stderr)
sys.exit(1)
"""


def test_the_root_cause_names_the_log_dir_and_shows_its_stderr_tail(jobs: Jobs,
                                                                       tmp_path: Path) -> None:
    # A crash without torch's @record: no error file is written, only exit code 1. The report
    # names the run's log directory and, under a --log-dir given, the end of its stderr.
    script = tmp_path / "crash.py"
    script.write_text(CRASH_NO_RECORD)
    logs, trace = tmp_path / "logs", tmp_path / "t.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST, "--max-restarts", "0",
                      "--log-dir", str(logs), "--redirects", "2", "--trace", str(trace)],
                     script=script)
    assert job.wait(60) == 1, job.output
    [stderr_log] = logs.glob("*/attempt_0/0/stderr.log")
    run_log_dir = str(stderr_log.parents[2])
    plain, given = tmp_path / "plain.html", tmp_path / "given.html"
    for page, extra in ((plain, []), (given, ["--log-dir", str(logs)])):
        proc = subprocess.run([*FSM, "report", str(trace), *extra, "-o", str(page)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
    # without --log-dir: nothing is read (the trace names no file: no error file was written)
    cause = dom(plain).one(id="root-cause")
    assert "--log-dir DIR (the run's --log-dir) shows its last 20" in cause.text
    assert "stderr line" not in plain.read_text()
    # with it: the run's log directory, the last 20 lines, the escape sequence made harmless
    cause = dom(given).one(id="root-cause")
    assert cause.one(id="log-dir").text == run_log_dir and str(stderr_log) in cause.text
    tail = "".join(cause.one("pre", id="stderr-tail")._texts()).splitlines()
    assert len(tail) == 20 and tail[0] == "stderr line 11"
    assert "CUDA error: an illegal memory access" in tail[-1] and "\x1b" not in given.read_text()
    # the text summary says the same, after the root cause
    for extra in ([], ["--log-dir", str(logs)]):
        text = subprocess.run([*FSM, "report", str(trace), *extra, "--format", "text"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
        lines = text.splitlines()
        if not extra:
            assert "stderr of rank 0: not read; fsm-agent report --log-dir DIR" in text, text
            assert "stderr line" not in text
            continue
        at = lines.index(f"last 20 line(s) of rank 0's stderr ({stderr_log}):")
        assert lines[at + 1] == "  stderr line 11", text
        assert "CUDA error: an illegal memory access" in lines[at + 20] and "\x1b" not in text


def test_attempts_are_labelled_and_no_label_overlaps_a_bar(failed_job: Path,
                                                          tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    subprocess.run([*FSM, "report", str(failed_job), "-o", str(page)], capture_output=True,
                   text=True, timeout=60, check=True)
    lane = dom(page).one("svg", id="timeline").find_all("g", cls="lane")[0]
    attempts = lane.find_all("g", cls="attempt")
    assert [g.attrs["data-attempt"] for g in attempts] == ["0", "1"]  # one restart
    assert all(g.find_all("text")[0].text in (f"attempt {n}", str(n))
               for n, g in enumerate(attempts))
    bars = [(float(r.attrs["x"]), float(r.attrs["y"]), float(r.attrs["x"]) +
             float(r.attrs["width"]), float(r.attrs["y"]) + float(r.attrs["height"]))
            for r in lane.find_all("rect", cls="seg")]
    assert bars
    for text in lane.find_all("text"):
        # a label's box: its baseline up to the font size, its characters at most 0.6 em wide
        size = float(text.attrs.get("font-size", 11))
        x0, base = float(text.attrs["x"]), float(text.attrs["y"])
        label = "".join(text.parts)  # its own text, not its tooltip
        box = (x0, base - size, x0 + 0.6 * size * len(label), base + 2)
        for b in bars:
            apart = box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1]
            assert apart, (label, box, b)
