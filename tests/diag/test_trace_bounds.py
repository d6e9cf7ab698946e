"""Bounded traces: ticks that change nothing fold into one record (updated in place, so a crash
keeps the count), files rotate by size; replay and the diagram's edge counts stay exact."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from diag_helpers import Jobs, trace_records

from fsm_agent import Lifecycle, load_spec
from fsm_agent._core._units import parse_size
from fsm_agent.testing import RecordingDriver
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._replay import replay, summary
from fsm_agent.trace._writer import JsonlTraceWriter, step_record

SCRIPT = ["HEALTHY"] * 400 + ["FAILED"] + ["HEALTHY"] * 250 + ["UNHEALTHY"] + \
    ["HEALTHY"] * 100 + ["SUCCEEDED"]


def _run(path: Path | io.StringIO, script: list[str], *, spec: str = "torchelastic",
         max_restarts: int = 3, **kw: object) -> list[object]:
    steps: list[object] = []
    writer = JsonlTraceWriter(path, spec=load_spec(spec), **kw)  # type: ignore[arg-type]
    lc = Lifecycle(spec, RecordingDriver(script), max_restarts=max_restarts,
                   listeners=[writer, steps.append])
    with contextlib.suppress(Exception):  # the torchelastic preset raises on giving up
        lc.run(0.0)
    writer.close()
    return steps


def _unfolded(steps: list[object], path: Path, spec: str = "torchelastic") -> None:
    """The same steps, one line each (what the writer wrote before folding)."""
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "header", "format": "fsm-agent-trace", "version": 1,
                            "spec": spec}) + "\n")
        for i, step in enumerate(steps, 1):
            f.write(json.dumps(step_record(step, i), default=repr) + "\n")  # type: ignore[arg-type]


def test_folded_trace_replays_and_counts_exactly_like_the_unfolded_one(tmp_path: Path) -> None:
    folded, plain = tmp_path / "folded.jsonl", tmp_path / "plain.jsonl"
    steps = _run(folded, SCRIPT)
    _unfolded(steps, plain)
    spec = load_spec("torchelastic")
    [a], [b] = read_trace(folded), read_trace(plain)
    assert len(b.records) == len(steps) == 757
    assert len(a.records) < 15, [r.data.get("count") for r in a.records]
    ra, rb = replay(spec, a), replay(spec, b)
    assert ra.ok and rb.ok, (ra.divergence, rb.divergence)
    assert ra.edge_counts == rb.edge_counts  # what diagram --trace draws
    assert ra.final_state == rb.final_state == "SUCCEEDED"
    assert sum(r.count for r in a.records) == len(steps)
    assert "HEALTHY (x400)" in summary(ra) and summary(ra).startswith("757 step(s)")
    fold = next(r for r in a.records if r.count == 400)
    first = next(s for s in steps if s.trigger == "healthy")  # type: ignore[attr-defined]
    assert fold.data["wall_time"] == first.wall_time  # type: ignore[attr-defined]
    assert fold.data["last_wall_time"] > fold.data["wall_time"]
    # a stream folds too (written when the fold ends)
    out = io.StringIO()
    _run(out, SCRIPT)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x.get("count", 1) for x in lines[1:]] == [r.count for r in a.records]


def test_the_diagram_draws_the_folded_counts(tmp_path: Path) -> None:
    folded = tmp_path / "t.jsonl"
    _run(folded, SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "fsm_agent", "diagram", "--trace", str(folded)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    # 400 + 250 + 100 healthy ticks
    assert "HEALTHY --> HEALTHY : healthy [!nodes_waiting] ✔ 750×" in proc.stdout, proc.stdout


CRASH = r"""
import sys, time
from fsm_agent import Lifecycle
from fsm_agent.trace._writer import JsonlTraceWriter
from fsm_agent.testing import RecordingDriver

class Driver(RecordingDriver):
    ticks = 0
    def monitor(self):
        self.ticks += 1
        if self.ticks > 300:
            print("ticked", flush=True)
            time.sleep(3600)
        return super().monitor()

w = JsonlTraceWriter(sys.argv[1], spec="torchrun")
Lifecycle("torchrun", Driver(["HEALTHY"] * 1000), listeners=[w]).run(0.0)
"""


def test_a_killed_writer_leaves_the_count_and_time_of_the_last_tick(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CRASH, str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ticked"
        killed_at = time.time()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    [trace] = read_trace(path)
    fold = trace.records[-1]
    assert fold.trigger == "healthy" and fold.count == 300
    assert killed_at - 5 < fold.data["last_wall_time"] <= killed_at
    assert replay(load_spec("torchrun"), trace).ok


def test_rotation_keeps_the_newest_records_and_each_file_replays_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # every tick a failure and a restart: nothing folds, the trace grows
    script = ["FAILED", "HEALTHY"] * 40 + ["SUCCEEDED"]
    steps = _run(path, script, max_restarts=100, max_bytes=8192, backups=2)
    files = [path, Path(f"{path}.1"), Path(f"{path}.2")]
    assert all(f.is_file() and f.stat().st_size <= 8192 for f in files)
    assert not Path(f"{path}.3").exists()
    spec = load_spec("torchelastic")
    total = 0
    for f in files:
        [trace] = read_trace(f)
        res = replay(spec, trace)
        assert res.ok, (f, res.divergence)
        assert "continues" in trace.header
        total += sum(r.count for r in trace.records)
    [newest] = read_trace(path)
    assert newest.records[-1].dest == "SUCCEEDED"  # the last records are never the ones dropped
    assert newest.records[-1].data["seq"] == len(steps)
    assert total < len(steps)  # the oldest file was dropped
    # backups=0: one file, capped
    capped = tmp_path / "c.jsonl"
    _run(capped, script, max_restarts=100, max_bytes=4096, backups=0)
    assert capped.stat().st_size <= 4096 and not Path(f"{capped}.1").exists()
    [trace] = read_trace(capped)
    assert replay(spec, trace).ok and trace.records[-1].dest == "SUCCEEDED"


def test_sizes_and_bad_arguments() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("10MB") == 10_000_000 and parse_size("1.5 KiB") == 1536
    for bad in ("", "x", "10XB", "-1"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError, match="max_bytes"):
        JsonlTraceWriter(io.StringIO(), max_bytes=100)
    with pytest.raises(ValueError, match="backups"):
        JsonlTraceWriter(io.StringIO(), backups=-1)


def test_run_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsm_agent.cli import main

    script = tmp_path / "s.py"
    script.write_text("pass\n")
    trace = str(tmp_path / "t.jsonl")
    for args, needle in ((["--trace", trace, "--trace-max-size", "1k"], "4096"),
                         (["--trace", trace, "--trace-max-size", "lots"], "size"),
                         (["--trace-backups", "3"], "go with --trace"),
                         (["--trace", trace, "--trace-backups", "-1"], ">= 0")):
        assert main(["run", *args, str(script)]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err


HEALTHY_JOB = "import os, time; time.sleep(float(os.environ['RUN_FOR']))\n"


@pytest.mark.timeout(120)
def test_a_healthy_job_at_a_tenth_of_a_second_writes_a_constant_size_trace(
    jobs: Jobs, tmp_path: Path
) -> None:
    script = tmp_path / "sleep.py"
    script.write_text(HEALTHY_JOB)
    trace = tmp_path / "t.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                      "--trace", str(trace)], script, env={"RUN_FOR": "6"})
    sizes = []
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline:
        if trace.exists():
            sizes.append((time.monotonic(), trace.stat().st_size))
        time.sleep(0.25)
    assert job.wait(30) == 0, job.output
    # once the workers run, the file does not grow: every tick rewrites the same fold in place
    steady = [s for t, s in sizes if sizes[0][0] + 2.5 < t < sizes[0][0] + 5]
    assert len(steady) >= 6 and len(set(steady)) == 1, sizes
    records = trace_records(trace)
    fold = [r for r in records if r.get("count", 1) > 1]
    assert len(fold) == 1 and fold[0]["count"] > 30, records  # about 10 ticks a second
    assert trace.stat().st_size < 10_000
    assert subprocess.run([sys.executable, "-m", "fsm_agent", "replay", str(trace)],
                          capture_output=True, timeout=60, check=False).returncode == 0


HUGE_ERROR = """\
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("x" * int(os.environ.get("SIZE", "20000000")))

main()
"""


@pytest.mark.timeout(120)
def test_a_20_mb_error_message_gives_a_trace_that_replay_and_report_read(
        jobs: Jobs, tmp_path: Path) -> None:
    # torch keeps the message twice in its failure (message, error_file_data): the record was
    # 40 MB, past what the reader takes (16 MiB a line), and replay and report refused it whole.
    from fsm_agent.trace._reader import MAX_LINE_BYTES

    script = tmp_path / "huge_error.py"
    script.write_text(HUGE_ERROR)
    trace = tmp_path / "t.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.05",
                      "--trace", str(trace)], script)
    assert job.wait(90) == 1, job.output[-2000:]
    longest = max(len(line) for line in trace.read_bytes().splitlines())
    assert longest <= MAX_LINE_BYTES, longest
    [failed] = [r for r in trace_records(trace) if r.get("observed") == "FAILED"]
    message = failed["failures"]["0"]["error_file_data"]["message"]  # type: ignore[index]
    message = message["message"]  # @record's: {"message": "ValueError: ...", "extraInfo": ...}
    assert message.startswith("ValueError: " + "x" * 1000), message[:200]
    assert "characters cut" in message, message[-200:]
    for argv in (["replay", str(trace)], ["report", str(trace), "--format", "text"]):
        done = subprocess.run([sys.executable, "-m", "fsm_agent", *argv], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, (argv, done.stderr[-2000:])


@pytest.mark.timeout(120)
def test_a_worker_error_message_is_written_once_in_the_trace(jobs: Jobs, tmp_path: Path) -> None:
    # torch's failure holds the error file's message twice (message, error_file_data): a 3 MB
    # message, which @record's file holds twice already (the message, the traceback's last
    # line), made a 12 MB record; the error file is written once, and the summary still names
    # the exception.
    script = tmp_path / "huge_error.py"
    script.write_text(HUGE_ERROR)
    trace = tmp_path / "t.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.05",
                      "--trace", str(trace)], script, env={"SIZE": "3000000"})
    assert job.wait(90) == 1, job.output[-2000:]
    [line] = [x for x in trace.read_text().splitlines() if '"observed": "FAILED"' in x]
    assert line.count("ValueError: " + "x" * 100) == 2, len(line)
    assert 6_000_000 < len(line) < 6_100_000, len(line)
    assert "characters cut" not in line  # under the cap: nothing is lost
    done = subprocess.run([sys.executable, "-m", "fsm_agent", "report", str(trace), "--format",
                           "text"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0 (" in done.stdout and ": ValueError: xxxx" in done.stdout, done.stdout[:3000]
