"""Bad input to ``fsm-agent run``: one clear line on stderr, exit code 2, and nothing started.

Most cases run ``main(argv)`` in-process (torch is imported once) with every way of starting a
process or a launch replaced by a trap; one case runs the real command line end to end.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_helpers import Jobs, descendants

from fsm_agent.cli import run as _run

USAGE_EXIT = 2


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A training script that leaves a marker if it ever runs."""
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return path


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if anything tries to launch the job or start a process."""
    def trap(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process or a launch was started for bad input")

    monkeypatch.setattr(_run, "launch", trap)
    monkeypatch.setattr(subprocess.Popen, "__init__", trap)
    monkeypatch.setattr(multiprocessing.Process, "start", trap)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)


def run_bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    before = descendants(os.getpid())
    rc = _run.main(argv)
    err = capsys.readouterr().err
    assert rc == USAGE_EXIT, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fsm-agent run: error: "), err
    assert descendants(os.getpid()) <= before
    return lines[0]


CASES = {
    "unknown-flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "negative-max-restarts": (["--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
    "max-restarts-not-int": (["--max-restarts", "two"], "invalid int value: 'two'"),
    "zero-monitor-interval": (["--monitor-interval", "0"], "--monitor-interval must be > 0"),
    "negative-monitor-interval": (["--monitor-interval", "-0.5"], "--monitor-interval must be > 0"),
    "nan-monitor-interval": (["--monitor-interval", "nan"], "--monitor-interval must be > 0"),
    "negative-exit-barrier-timeout": (["--exit-barrier-timeout", "-5"], "got -5"),
    "exit-barrier-timeout-not-a-number": (["--exit-barrier-timeout", "5x"],
                                          "--exit_barrier_timeout: invalid float value: '5x'"),
    "preload-not-a-module-name": (["--preload", "json,not-a-module"],
                                  "argument --preload: 'not-a-module' is not a module name"),
    "zero-shutdown-timeout": (["--shutdown-timeout", "0"], "--shutdown-timeout must be > 0"),
    "negative-shutdown-timeout": (["--shutdown-timeout", "-3"], "--shutdown-timeout"),
    "zero-rdzv-timeout": (["--rdzv-conf", "join_timeout=0"], "--rdzv-conf join_timeout"),
    "zero-etcd-timeout": (["--rdzv-backend", "etcd", "--rdzv-conf", "timeout=0"],
                          "--rdzv-conf timeout must be > 0"),
    # static's store timeout: torch's TCPStore then fails to connect after 0 ms
    "zero-static-timeout": (["--nnodes", "2", "--master-addr", "127.0.0.1", "--rdzv-conf",
                             "timeout=0"], "--rdzv-conf timeout must be > 0"),
    "no-python-and-module": (["--no-python", "-m"],
                             "--no-python and -m/--module cannot be used together"),
    "bad-rdzv-conf": (["--rdzv-conf", "oops"], "--rdzv-conf must be KEY=VALUE"),
    "inverted-nnodes": (["--nnodes", "3:2"], "--nnodes must be N or MIN:MAX"),
    "zero-nproc": (["--nproc-per-node", "0"], "--nproc-per-node must be an integer >= 1"),
    "negative-node-rank": (["--node-rank", "-1"], "--node-rank must be >= 0"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_flag_value(case: str, script: Path, no_start: None,
                        capsys: pytest.CaptureFixture[str]) -> None:
    flags, expected = CASES[case]
    line = run_bad([*flags, str(script)], capsys)
    assert expected in line, line
    assert not (script.parent / "ran").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags", [
    ["--rdzv-backend", "c10d"], ["--rdzv-backend", "etcd-v2"], ["--standalone"],
    [],  # one node on the default static backend: torchrun runs it on c10d
])
def test_a_key_only_etcd_and_static_read_is_not_checked_for_another_backend(
        script: Path, flags: list[str]) -> None:
    """``timeout`` is etcd v1's and static's; the dynamic backends ignore it, and torchrun runs
    with ``timeout=0``."""
    from fsm_agent.cli._runargs import parse_args

    args = parse_args(_run.build_parser(), [*flags, "--rdzv-conf", "timeout=0,join_timeout=5",
                                            str(script)])
    assert args.rdzv_conf == "timeout=0,join_timeout=5"


@pytest.mark.timeout(60)
def test_a_zero_exit_barrier_timeout_is_taken_as_torchrun_takes_it(script: Path) -> None:
    """docs/reliability.md: 0 waits for nobody at the exit barrier; only a negative one is
    refused."""
    from fsm_agent.cli._runargs import parse_args

    args = parse_args(_run.build_parser(), ["--exit-barrier-timeout", "0", str(script)])
    assert args.exit_barrier_timeout == 0


@pytest.mark.timeout(60)
def test_missing_script(tmp_path: Path, no_start: None, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.py"
    line = run_bad(["--standalone", str(missing)], capsys)
    assert f"training script {str(missing)!r}: no such file" in line


@pytest.mark.timeout(60)
def test_no_script_at_all(no_start: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert "required: training_script" in run_bad(["--standalone"], capsys)


@pytest.mark.timeout(60)
def test_missing_executable_with_no_python(no_start: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    line = run_bad(["--no-python", "no-such-program-fsm-agent"], capsys)
    assert "--no-python no-such-program-fsm-agent: not found on PATH" in line


@pytest.mark.timeout(60)
def test_missing_module(no_start: None, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_bad(["-m", "no_such_module_fsm_agent.train"], capsys)
    assert "no module named 'no_such_module_fsm_agent'" in line


@pytest.mark.timeout(60)
def test_bad_shutdown_timeout_variable(script: Path, no_start: None,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "3.0")  # torch: int() fails late
    line = run_bad([str(script)], capsys)
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a whole number" in line


@pytest.mark.timeout(60)
def test_unreadable_spec(tmp_path: Path, script: Path, no_start: None,
                         capsys: pytest.CaptureFixture[str]) -> None:
    for spec in (tmp_path / "missing.yaml", tmp_path):  # no such file; a directory
        line = run_bad(["--spec", str(spec), str(script)], capsys)
        assert line.startswith(f"fsm-agent run: error: --spec {spec}") or f"{spec}" in line, line


@pytest.mark.timeout(60)
def test_invalid_spec_names_file_and_line(tmp_path: Path, script: Path, no_start: None,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    good = (Path(_run.__file__).parents[2] / "specs" / "torchrun.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.replace("has_restarts_left", "has_restarts_lef", 1))
    line = run_bad(["--spec", str(bad), str(script)], capsys)
    assert f"{bad}:" in line and "has_restarts_lef" in line, line
    bad.write_bytes(b"name: x\n\xff\xfe\n")
    assert f"{bad}" in run_bad(["--spec", str(bad), str(script)], capsys)


@pytest.mark.timeout(60)
def test_unwritable_trace(tmp_path: Path, script: Path, no_start: None,
                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "no-such-dir" / "trace.jsonl"
    assert "--trace" in run_bad(["--trace", str(trace), str(script)], capsys)


@pytest.mark.timeout(120)
def test_command_line_end_to_end(jobs: Jobs, script: Path) -> None:
    """The real console path: exit code 2, one stderr line, no process and no rendezvous."""
    job = jobs.start(["--standalone", "--max-restarts", "-1"], script)
    assert job.wait(100) == USAGE_EXIT, job.output
    out = job.output.strip().splitlines()
    assert out == ["fsm-agent run: error: --max-restarts must be >= 0, got -1 "
                   "(see fsm-agent run --help)"], out
    assert not (script.parent / "ran").exists()


@pytest.mark.timeout(120)
def test_help_still_works() -> None:
    out = subprocess.run([sys.executable, "-m", "fsm_agent", "run", "--help"],
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0 and "--exit-barrier-timeout" in out.stdout
