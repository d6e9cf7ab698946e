"""Files never change a job's outcome: a trace that cannot be written, untrusted traces and specs,
paths that name FIFOs, devices or regular files where a directory is expected.

The first part starts real ``fsm-agent`` processes (each case of the adversarial report); the
second checks the writer's and reader's failure handling in process, where a failing disk can be
simulated exactly.
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from reliability_helpers import FAST, Jobs

from fsm_agent import Lifecycle, load_spec
from fsm_agent._core._files import FileRefused, open_regular, read_bounded
from fsm_agent.testing import RecordingDriver
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._replay import UntrustedSpec, trace_spec
from fsm_agent.trace._schema import TraceError
from fsm_agent.trace._writer import JsonlTraceWriter

ROOT = Path(__file__).resolve().parents[2]
GOOD_TRACE = ROOT / "tests" / "tools" / "data" / "fail_once_recover.jsonl"
# A job whose only output is one line on stdout from rank 0: what must not change.
TINY = textwrap.dedent("""
    import os, time
    time.sleep(float(os.environ.get("SLEEP", "0.3")))
    open(os.path.join(os.environ["OUT_DIR"], "ran"), "w").close()
    if os.environ["RANK"] == "0":
        print("rank 0 of", os.environ["WORLD_SIZE"], "done", flush=True)
""")
TRACEBACK_WORDS = ("Traceback", "RecursionError", "lifecycle listener")


def _tiny(tmp_path: Path) -> Path:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    return script


def _limit_file_size(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        # As `ulimit -f`: a full disk or a quota, for the trace only (the job writes nothing).
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def run_tool(jobs: Jobs, name: str, args: Sequence[str], *, timeout: float = 120,
             preexec: Callable[[], None] | None = None, env: dict[str, str] | None = None,
             during: Callable[[Path], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m fsm_agent ARGS`` in its own directory, stdout and stderr apart; the ``jobs``
    fixture's token is in its environment, so a process it leaves behind fails the test."""
    workdir = jobs.tmp_path / name
    (workdir / "out").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-m", "fsm_agent", *args], cwd=workdir,
                            env=jobs.env(workdir, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=preexec)
    try:
        if during is not None:
            during(workdir)
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} did not finish in {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def one_error_line(res: subprocess.CompletedProcess[str], prog: str, code: int = 2) -> str:
    """The single line a refused input gives: exit 2, ``PROG: error: ...``, nothing else (exit 1
    and the problem's line for ``check``, to which a spec's problem is a finding)."""
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == code, res.stderr[-3000:]
    assert len(lines) == 1, res.stderr[-3000:]
    if code == 2:
        assert lines[0].startswith(f"fsm-agent {prog}: error: "), lines
    assert "Traceback" not in res.stderr
    return lines[0]


# --------------------------------------------------------------------------------------------
# 1. A trace that cannot be written changes nothing


@pytest.mark.timeout(300)
def test_a_trace_hitting_the_file_size_limit_changes_nothing(jobs: Jobs, tmp_path: Path) -> None:
    script = _tiny(tmp_path)
    args = ["run", "--standalone", "--nproc-per-node", "2", *FAST]
    limit = 1024
    plain = run_tool(jobs, "plain", [*args, str(script)], preexec=_limit_file_size(limit))
    trace = tmp_path / "t.jsonl"
    traced = run_tool(jobs, "traced", [*args, "--trace", str(trace), str(script)],
                      preexec=_limit_file_size(limit))
    # Exactly what the job does without --trace: exit code and output.
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert traced.returncode == plain.returncode, traced.stderr[-3000:]
    assert traced.stdout == plain.stdout == "rank 0 of 2 done\n"
    # One warning naming the file and the error; no traceback, no error per transition.
    warnings = [x for x in traced.stderr.splitlines() if str(trace) in x]
    assert len(warnings) == 1, traced.stderr[-3000:]
    assert "cannot write record" in warnings[0] and "File too large" in warnings[0]
    assert not any(w in traced.stderr for w in TRACEBACK_WORDS), traced.stderr[-3000:]
    # The limit cut a record short (no room for the marker): the reader says so.
    assert trace.stat().st_size == limit
    with pytest.raises(TraceError, match=r"cut short .* file size limit"):
        read_trace(trace)


@pytest.mark.timeout(300)
def test_a_trace_whose_directory_is_removed_mid_run_changes_nothing(jobs: Jobs,
                                                                     tmp_path: Path) -> None:
    script = _tiny(tmp_path)
    trace = tmp_path / "traces" / "t.jsonl"
    trace.parent.mkdir()

    def remove_once_written(_: Path) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if trace.exists() and trace.read_text().count("\n") >= 3:
                break
            time.sleep(0.02)
        shutil.rmtree(trace.parent)

    res = run_tool(jobs, "job", ["run", "--standalone", "--nproc-per-node", "2", *FAST,
                                 "--trace", str(trace), str(script)],
                   env={"SLEEP": "3"}, during=remove_once_written)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "rank 0 of 2 done\n"
    warnings = [x for x in res.stderr.splitlines() if str(trace) in x]
    assert len(warnings) == 1, res.stderr[-3000:]
    assert "deleted while being written" in warnings[0]
    assert not any(w in res.stderr for w in TRACEBACK_WORDS), res.stderr[-3000:]


def _ignored_signals(output: str) -> list[int]:
    return [int(m.split()[1], 16) for m in output.splitlines() if m.startswith("SigIgn:")]


@pytest.mark.timeout(300)
def test_workers_keep_the_default_sigxfsz_disposition_as_under_torchrun(jobs: Jobs) -> None:
    """Python ignores SIGXFSZ (so the agent gets EFBIG, not death, at a file size limit);
    torch's Popen restores the default for workers. Both launchers must agree."""
    masks = {}
    for launcher in ("fsm-agent", "torchrun"):
        job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST, "--no-python"],
                         "sh", ["-c", "grep SigIgn /proc/self/status"], launcher=launcher)
        assert job.wait(120) == 0, job.output[-3000:]
        (masks[launcher],) = _ignored_signals(job.output)
    bit = 1 << (signal.SIGXFSZ - 1)
    assert not masks["fsm-agent"] & bit
    assert masks["fsm-agent"] & bit == masks["torchrun"] & bit


# --------------------------------------------------------------------------------------------
# 2. Reads and writes are bounded and never block


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:  # 4 GiB of zero bytes without a newline, on no disk space
        f.truncate(4 << 30)
    return {"fifo": str(fifo), "zero": "/dev/zero", "dir": str(tmp_path), "sparse": str(sparse)}


TOOL_CASES = [
    ("check", ["{fifo}"], 2, "{fifo}: not a file"),
    ("check", ["{zero}"], 2, "{zero}: not a file"),
    ("check", ["{sparse}"], 1, "{sparse}: file is 4294967296 bytes; a spec may be at most 1048576"),
    ("replay", ["{fifo}"], 2, "{fifo}: cannot read: not a regular file (a FIFO)"),
    ("replay", ["{zero}"], 2, "{zero}: cannot read: not a regular file (a character device)"),
    ("replay", ["{dir}"], 2, "{dir}: cannot read: not a regular file (a directory)"),
    ("replay", ["{sparse}"], 2, "{sparse}:1: line longer than 16777216 bytes"),
    ("replay", ["{sparse}", "--spec", "{fifo}"], 2, "{sparse}:1: line longer than"),
    ("replay", ["--spec", "{fifo}", "{dir}"], 2, "not a regular file (a directory)"),
    ("diagram", ["--trace", "{fifo}"], 2, "{fifo}: cannot read: not a regular file (a FIFO)"),
    ("diagram", ["{fifo}"], 2, "SPEC {fifo}: not a file"),
    ("diff", ["{zero}", "torchrun"], 2, "SPEC_A {zero}: not a file"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tool", "args", "code", "message"), TOOL_CASES,
                         ids=[f"{t}-{'-'.join(a).replace('{', '').replace('}', '')}"
                              for t, a, _, _ in TOOL_CASES])
def test_tools_refuse_unbounded_and_blocking_files(jobs: Jobs, specials: dict[str, str],
                                                   tool: str, args: list[str], code: int,
                                                   message: str) -> None:
    res = run_tool(jobs, tool, [tool, *(a.format(**specials) for a in args)], timeout=60)
    line = one_error_line(res, tool, code)
    assert message.format(**specials) in line


RUN_CASES = [
    (["--spec", "{fifo}"], "--spec {fifo}: not a file"),
    (["--spec", "{zero}"], "--spec {zero}: not a file"),
    (["--trace", "{fifo}"], "--trace {fifo}: not a regular file (a FIFO)"),
    (["--trace", "{zero}"], "--trace {zero}: not a regular file (a character device)"),
    (["--trace", "{dir}"], "--trace {dir}: not a regular file (a directory)"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("args", "message"), RUN_CASES, ids=[a[0] + "-" + a[1].strip("{}")
                                                               for a, _ in RUN_CASES])
def test_run_refuses_unbounded_and_blocking_files_before_anything_starts(
        jobs: Jobs, specials: dict[str, str], tmp_path: Path, args: list[str],
        message: str) -> None:
    script = _tiny(tmp_path)
    res = run_tool(jobs, "job", ["run", "--standalone", "--nproc-per-node", "1", *FAST,
                                 *(a.format(**specials) for a in args), str(script)],
                   timeout=120)
    line = one_error_line(res, "run")
    assert message.format(**specials) in line
    assert not (tmp_path / "job" / "out" / "ran").exists()  # no worker ever started


# --------------------------------------------------------------------------------------------
# 3. A trace is untrusted input

AUDIT = textwrap.dedent("""
    import sys
    opened = []
    def hook(event, args):
        if event == "open" and isinstance(args[0], str):
            opened.append(args[0])
    sys.addaudithook(hook)
    from fsm_agent.cli import main
    try:
        code = main(sys.argv[1:])
    finally:
        with open(sys.argv[0] + ".opened", "w") as f:
            f.write("\\n".join(opened))
    sys.exit(code)
""")


def run_audited(tmp_path: Path, args: Sequence[str]) -> tuple[subprocess.CompletedProcess[str],
                                                              list[str]]:
    """Run ``fsm-agent ARGS`` with an audit hook; also return every path the process opened."""
    hook = tmp_path / "audited.py"
    hook.write_text(AUDIT)
    res = subprocess.run([sys.executable, str(hook), *args], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    opened = Path(str(hook) + ".opened").read_text().splitlines()
    return res, [os.path.realpath(p) for p in opened]


def _header_then_good(tmp_path: Path, name: str, header: dict[str, object]) -> Path:
    records = [json.loads(x) for x in GOOD_TRACE.read_text().splitlines() if x.strip()]
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in [header, *records[1:]]))
    return path


@pytest.mark.parametrize("tool", ["replay", "diagram"])
def test_replay_and_diagram_never_open_a_file_a_trace_names(tmp_path: Path, tool: str) -> None:
    secret = tmp_path / "secret.yaml"
    # A valid spec (a copy of a preset): opening it would even succeed.
    secret.write_text((ROOT / "specs" / "torchelastic.yaml").read_text())
    headers = {
        "path.jsonl": {"kind": "header", "spec": "mine", "spec_path": str(secret)},
        "name.jsonl": {"kind": "header", "spec": str(secret)},
        # A preset's name, but recorded from another file: not silently swapped for the preset.
        "preset.jsonl": {"kind": "header", "spec": "torchelastic", "spec_path": str(secret)},
    }
    trace_arg = ["--trace"] if tool == "diagram" else []
    for name, header in headers.items():
        trace = _header_then_good(tmp_path, name, header)
        res, opened = run_audited(tmp_path, [tool, *trace_arg, str(trace)])
        assert res.returncode == 2, res.stderr
        (line,) = res.stderr.splitlines()
        assert "a trace may not choose a file to read" in line
        assert str(secret) not in opened
    # The positive control: the user passes the file, and then it is read (the hook sees it).
    spec_arg = [str(secret)] if tool == "diagram" else ["--spec", str(secret)]
    res, opened = run_audited(tmp_path, [tool, *spec_arg, *trace_arg, str(trace)])
    assert res.returncode == 0, res.stderr
    assert str(secret) in opened
    # A built-in preset named in the header needs no --spec.
    preset = _header_then_good(tmp_path, "ok.jsonl", {"kind": "header", "spec": "torchelastic"})
    res, _ = run_audited(tmp_path, [tool, *trace_arg, str(preset)])
    assert res.returncode == 0, res.stderr


NESTED = {
    "brackets": "[" * 100_000,
    "balanced": "[" * 100_000 + "]" * 100_000,
    "objects": '{"a": ' * 100_000 + "1" + "}" * 100_000,
    "in_a_field": '{"kind": "step", "observed": ' + "[" * 5000 + "]" * 5000 + "}",
}


@pytest.mark.parametrize("tool", ["replay", "diagram"])
@pytest.mark.parametrize("bomb", sorted(NESTED))
def test_a_nesting_bomb_is_one_line_and_exit_2(tmp_path: Path, tool: str, bomb: str) -> None:
    lines = GOOD_TRACE.read_text().splitlines()
    trace = tmp_path / "bomb.jsonl"
    trace.write_text("\n".join([*lines[:2], NESTED[bomb], *lines[2:]]) + "\n")
    args = [tool, "--trace", str(trace)] if tool == "diagram" else [tool, str(trace)]
    res = subprocess.run([sys.executable, "-m", "fsm_agent", *args], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = res.stderr.splitlines()
    assert line == (f"fsm-agent {tool}: error: {trace}:3: JSON nested more than 64 levels deep "
                    "(no trace record is)")


def test_trace_text_cannot_reach_the_terminal_raw(tmp_path: Path) -> None:
    records = [json.loads(x) for x in GOOD_TRACE.read_text().splitlines() if x.strip()]
    records[-1]["error"] = "\x1b]0;owned\x07\x1b[2J" + "x" * 100_000
    trace = tmp_path / "esc.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    res = subprocess.run([sys.executable, "-m", "fsm_agent", "replay", str(trace)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert "\\x1b]0;owned\\x07" in res.stdout
    assert max(len(x) for x in res.stdout.splitlines()) < 2100


# --------------------------------------------------------------------------------------------
# 4. Unusable directories for run


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("log_dir", "message"), [
    ("{file}", "--log-dir {file}: not a directory (a file)"),
    ("{file}/sub", "--log-dir {file}/sub: not a directory ({file} is not a directory)"),
    ("/proc/fsm-agent-logs", "--log-dir /proc/fsm-agent-logs: cannot create directories in "
     "/proc"),
], ids=["regular-file", "below-a-file", "no-new-entries"])
def test_run_refuses_an_unusable_log_dir_before_anything_starts(
        jobs: Jobs, tmp_path: Path, log_dir: str, message: str) -> None:
    script = _tiny(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    res = run_tool(jobs, "job", ["run", "--standalone", "--nproc-per-node", "1", *FAST,
                                 "--log-dir", log_dir.format(file=afile), "--redirects", "3",
                                 str(script)])
    line = one_error_line(res, "run")
    assert message.format(file=afile) in line
    assert not (tmp_path / "job" / "out" / "ran").exists()
    assert afile.read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "job", "tiny.py"]


# --------------------------------------------------------------------------------------------
# The writer and reader in process


class FailingStream(io.StringIO):
    """A text stream whose writes fail with ``err`` from the ``fail_from``-th one on, until
    ``recover()``: a disk that fills up (and is freed again)."""

    def __init__(self, fail_from: int, err: int) -> None:
        super().__init__()
        self.name = "disk.jsonl"
        self.writes = 0
        self.fail_from = fail_from
        self.err = err
        self.failing = True

    def recover(self) -> None:
        self.failing = False

    def write(self, s: str) -> int:
        self.writes += 1
        if self.failing and self.writes >= self.fail_from:
            raise OSError(self.err, os.strerror(self.err))
        return super().write(s)


SCRIPT = ["HEALTHY", "FAILED", "HEALTHY", "HEALTHY", "SUCCEEDED"]


def _run(listeners: Sequence[Callable[..., None]]) -> tuple[str, int]:
    lc = Lifecycle("torchrun", RecordingDriver(SCRIPT), max_restarts=1, listeners=listeners)
    result = lc.run(0.0)
    assert result is not None
    return result.state.name, lc.restart_count


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG])
def test_a_failing_disk_is_one_warning_and_an_incomplete_marker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, err: int) -> None:
    expected = _run([])
    stream = FailingStream(fail_from=3, err=err)
    writer = JsonlTraceWriter(stream, spec="torchrun")
    with caplog.at_level("WARNING", logger="fsm_agent"):
        assert _run([writer]) == expected  # the lifecycle does exactly the same
        stream.recover()  # space was freed: close() marks the trace incomplete
        writer.close()
        writer.close()
    (record,) = caplog.records
    assert record.getMessage().startswith(f"trace disk.jsonl: cannot write record 2: "
                                          f"{os.strerror(err)}")
    path = tmp_path / "t.jsonl"
    path.write_text(stream.getvalue())
    (trace,) = read_trace(path)
    assert len(trace.records) == 1  # the header and record 1 were written
    assert trace.incomplete == (f"the writer could not write record 2 or any later one "
                                f"({os.strerror(err)})")


def test_a_short_write_at_the_size_limit_then_the_marker_once_room_is_back(
        tmp_path: Path) -> None:
    """The real descriptor path: a record cut by ``RLIMIT_FSIZE`` mid-line (the process ignores
    SIGXFSZ, as every Python process does), then, with the limit raised again before ``close()``,
    the marker on a line of its own; the reader accepts the cut line before it."""
    path = tmp_path / "t.jsonl"
    script = textwrap.dedent(f"""
        import resource
        from fsm_agent import Step
        from fsm_agent.trace._writer import JsonlTraceWriter

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, hard))
        writer = JsonlTraceWriter({str(path)!r}, spec="torchelastic")
        writer(Step("start", "INIT", 1.0, 1.0, "default", dest="HEALTHY"))
        for i in range(20):
            # alternating guard values: steps that differ are never folded into one record
            writer(Step("healthy", "HEALTHY", 2.0 + i, 2.0 + i, "default", dest="HEALTHY",
                        guards=[("nodes_waiting", i % 2 == 0)], observed="HEALTHY"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        writer.close()
        print(writer.failure)
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "File too large\n"
    assert proc.stderr.count("cannot write record") == 1, proc.stderr
    raw = path.read_bytes()
    cut = raw[:1500].rsplit(b"\n", 1)[1]
    assert cut and not cut.endswith(b"}")  # a record really was cut mid-line
    (trace,) = read_trace(path)
    assert trace.incomplete is not None and "(File too large)" in trace.incomplete
    assert [r.trigger for r in trace.records][:2] == ["start", "healthy"]
    assert f"record {len(trace.records) + 1} or any later one" in trace.incomplete


def test_the_reader_accepts_the_partial_line_before_a_marker_only(tmp_path: Path) -> None:
    lines = GOOD_TRACE.read_text().splitlines(keepends=True)
    marker = json.dumps({"kind": "incomplete", "seq": 3, "error": "File too large"}) + "\n"
    cut = lines[3][:40]
    ok = tmp_path / "ok.jsonl"
    # What the writer leaves: a short write, then the marker on a line of its own.
    ok.write_text("".join(lines[:3]) + cut + "\n" + marker)
    (trace,) = read_trace(ok)
    assert len(trace.records) == 2
    assert trace.incomplete is not None and "record 3" in trace.incomplete
    # Without the marker the cut line is an error, as is a bad line in the middle.
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:3]) + cut)
    with pytest.raises(TraceError, match=":4: the last record is cut short"):
        read_trace(bad)
    bad.write_text("".join(lines[:3]) + cut + "\n" + "".join(lines[3:]))
    with pytest.raises(TraceError, match=":4: not valid JSON"):
        read_trace(bad)


def test_replay_reports_an_incomplete_trace(tmp_path: Path) -> None:
    lines = GOOD_TRACE.read_text().splitlines(keepends=True)
    marker = json.dumps({"kind": "incomplete", "seq": 3, "error": "No space left on device"})
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(lines[:3]) + lines[3][:10] + "\n" + marker + "\n")
    for args in ([], ["-q"]):
        res = subprocess.run([sys.executable, "-m", "fsm_agent", "replay", str(trace), *args],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert ("incomplete trace: the writer could not write record 3 or any later one (No "
                "space left on device); only the steps before it were checked") in res.stdout


def test_close_never_raises(tmp_path: Path) -> None:
    writer = JsonlTraceWriter(tmp_path / "t.jsonl", spec="torchrun")
    assert writer._fd is not None
    os.close(writer._fd)  # the descriptor is gone under the writer (EBADF from here on)
    writer.close()
    writer.close()


def test_a_header_that_cannot_be_written_fails_up_front(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No space left"):
        JsonlTraceWriter(FailingStream(fail_from=1, err=errno.ENOSPC))
    with pytest.raises(FileRefused, match="not a regular file"):
        JsonlTraceWriter("/dev/full")


def test_opening_a_fifo_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def attempt() -> None:
        for call in (lambda: open_regular(fifo, os.O_RDONLY),
                     lambda: open_regular(fifo, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                     lambda: JsonlTraceWriter(fifo),
                     lambda: read_trace(fifo),
                     lambda: load_spec(fifo)):
            try:
                call()
            except (OSError, ValueError) as e:
                done.append(e)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "an open of a FIFO blocked"
    assert len(done) == 5 and all("FIFO" in str(e) for e in done), done


def test_bounded_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1000)
    assert read_bounded(big, 1000) == b"x" * 1000
    with pytest.raises(FileRefused, match="larger than 999 bytes"):
        read_bounded(big, 999)
    import fsm_agent.trace._reader as trace_mod

    lines = GOOD_TRACE.read_text()
    path = tmp_path / "t.jsonl"
    path.write_text(lines)
    monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", len(lines.encode()) - 1)
    with pytest.raises(TraceError, match=rf":{lines.count(chr(10))}: trace larger than"):
        read_trace(path)
    monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", 1 << 30)
    monkeypatch.setattr(trace_mod, "MAX_LINE_BYTES", 100)
    with pytest.raises(TraceError, match=":1: line longer than 100 bytes"):
        read_trace(path)


def test_a_trace_chooses_only_among_presets() -> None:
    (good,) = read_trace(GOOD_TRACE)
    spec = load_spec("torchrun")

    def header(**fields: object) -> object:
        return type(good)(good.path, fields, 1, good.records)

    assert trace_spec(header(spec="torchrun")) is spec  # type: ignore[arg-type]
    assert trace_spec(header(spec="torchrun", spec_path=spec.path)) is spec  # type: ignore[arg-type]
    # Recorded on another machine: the header says it was the preset.
    assert trace_spec(header(spec="torchrun", spec_path="/elsewhere/specs/torchrun.yaml",  # type: ignore[arg-type]
                             preset=True)) is spec
    for fields in ({"spec": "torchrun", "spec_path": "/elsewhere/mine.yaml"},
                   {"spec": "../specs/torchrun.yaml"}, {"spec": "mine", "spec_path": spec.path},
                   {}, {"spec": ""}):
        with pytest.raises(UntrustedSpec):
            trace_spec(header(**fields))  # type: ignore[arg-type]


def test_the_writer_marks_presets_in_the_header(tmp_path: Path) -> None:
    for spec, preset in ((load_spec("torchrun"), True),
                         (load_spec(ROOT / "tests" / "specs" / "good" / "compact.yaml"), False)):
        out = io.StringIO()
        JsonlTraceWriter(out, spec=spec)
        header = json.loads(out.getvalue())
        assert header.get("preset", False) is preset
