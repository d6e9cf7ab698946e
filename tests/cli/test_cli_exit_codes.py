"""Every subcommand: exit 0 ok, 1 the checked thing failed, 2 bad input, one line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_agent.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
BAD_SPEC = ROOT / "tests" / "specs" / "bad" / "nondeterministic.yaml"
TRACE = ROOT / "tests" / "tools" / "data" / "fail_once_recover.jsonl"
GIVE_UP = ROOT / "tests" / "tools" / "data" / "give_up_torchrun.jsonl"

pytestmark = pytest.mark.timeout(120)


def one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fsm-agent {command}: error: "), err
    return lines[0]


# A missing spec (file or preset) is bad input for every command that takes one; torch-free ones
# here, `run` below.
MISSING_SPEC = {
    "check": ["nosuch"],
    "demo": ["--spec", "nosuch"],
    "diagram": ["nosuch.yaml"],
    "replay": [str(TRACE), "--spec", "nosuch"],
    "diff": ["torchrun", "nosuch"],
    "report": [str(TRACE), "--spec", "nosuch"],
    "conformance": ["fsm_agent:Lifecycle", "--spec", "nosuch"],
}


@pytest.mark.parametrize("command", sorted(MISSING_SPEC))
def test_missing_spec_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, *MISSING_SPEC[command]]) == 2
    line = one_error_line(capsys, command)
    assert "nosuch" in line and "no such spec file or preset" in line, line


VALID = {
    "check": [],
    "demo": [],
    "diagram": [],
    "replay": [str(TRACE)],
    "diff": ["torchrun", "torchelastic"],
    "report": [str(TRACE), "--format", "text"],
    "conformance": ["fsm_agent:Lifecycle"],
    "store": ["--host", "127.0.0.1"],
}


@pytest.mark.parametrize("command", sorted(VALID))
def test_unknown_flag_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(VALID) == set(COMMANDS) - {"run"}
    assert main([command, *VALID[command], "--no-such-flag"]) == 2
    line = one_error_line(capsys, command)
    assert "--no-such-flag" in line and f"(see fsm-agent {command} --help)" in line


def test_run_missing_spec_and_unknown_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--spec", "nosuch", "--standalone", __file__]) == 2
    assert "--spec nosuch: no such spec file or preset" in one_error_line(capsys, "run")
    assert main(["run", "--no-such-flag", __file__]) == 2
    assert "--no-such-flag" in one_error_line(capsys, "run")


def test_check_missing_file_is_reported_before_any_spec_is_checked(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "torchrun", "nosuch.yaml"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "nosuch.yaml" in err


def test_check_a_spec_with_problems_is_a_failure_not_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "torchrun", str(BAD_SPEC)]) == 1
    out, err = capsys.readouterr()
    assert "torchrun" in out and f"{BAD_SPEC}:21:" in err


def test_findings_exit_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "torchelastic", "torchrun"]) == 1
    assert main(["diff", "torchrun", "torchrun"]) == 0
    assert main(["replay", str(GIVE_UP), "--spec", "torchelastic"]) == 1
    assert main(["replay", str(TRACE)]) == 0
    assert main(["demo", "--max-restarts", "0", "--script", "HEALTHY,FAILED"]) == 1
    assert main(["demo"]) == 0


def test_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["nosuch"]) == 2
    assert "unknown command 'nosuch'" in capsys.readouterr().err
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"  {name}" in out


def test_conformance_on_a_target_it_cannot_build_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["conformance", "tests.cli.unscriptable:NeedsConfig", "--examples", "5",
                 "--seed", "1"]) == 2
    line = one_error_line(capsys, "conformance")
    assert "cannot build tests.cli.unscriptable:NeedsConfig" in line, line
