"""``--spec-param NAME=VALUE`` and ``--vocabulary MODULE:ATTR``, shared by every command that
loads a spec (``fsm_agent/cli/_common.py``): values checked against each spec before anything
starts, one line and exit 2 for anything wrong; a vocabulary the user names, never one a spec
file names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsm_agent import Lifecycle, load_spec
from fsm_agent._core._params import bind_params, format_param
from fsm_agent.cli import main
from fsm_agent.testing import RecordingDriver
from fsm_agent.trace import open_trace

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

# A spec whose restart also needs a guard of the embedding program's own (``quota_ok``).
QUOTA_SPEC = ROOT / "tests" / "specs" / "vocabulary" / "quota.yaml"

VOCAB_MODULE = """\
import fsm_agent

VOCABULARY = fsm_agent.Vocabulary.builtin().extend(guards={"quota_ok": lambda ctx: True})
NOT_A_VOCABULARY = {"quota_ok": lambda ctx: True}
"""


@pytest.fixture
def custom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``quota.yaml`` and the module ``my_vocab`` in the working directory (as a user has them)."""
    (tmp_path / "quota.yaml").write_text(QUOTA_SPEC.read_text())
    (tmp_path / "my_vocab.py").write_text(VOCAB_MODULE)
    (tmp_path / "my_broken_vocab.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    for name in ("my_vocab", "my_broken_vocab"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    out, err = capsys.readouterr()
    assert out == "", out  # nothing was checked, drawn or started
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fsm-agent {command}: error: "), err
    return lines[0]


# -- --spec-param ----------------------------------------------------------------------------


def test_check_reports_the_values_in_force(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    given = {"backoff_max": "90s", "no_retry_exit_codes": "3,4", "restart_window": "10m"}
    argv = ["check", "resilient", *[a for k, v in given.items()
                                    for a in ("--spec-param", f"{k}={v}")]]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # the ok line names what was given, in the spec's syntax
    for k in given:
        assert f"; {k}=" in out, out
    assert "; backoff_max=90s;" in out and "; no_retry_exit_codes=[3, 4];" in out, out
    assert "; restart_window=10m)" in out, out
    assert main([*argv, "--format", "json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["specs"]
    spec = load_spec("resilient")
    expected = bind_params(spec.params, given)
    assert entry["params"] == {p.name: format_param(p.type, expected[p.name])
                               for p in spec.params}
    assert (expected["backoff_max"], expected["no_retry_exit_codes"],
            expected["restart_window"]) == (90.0, (3, 4), 600.0)


@pytest.mark.parametrize(("argv", "wanted"), [
    (["resilient", "--spec-param", "backoff_max=soon"],
     ["--spec-param backoff_max=soon", "'resilient'", "expected a duration"]),
    (["resilient", "--spec-param", "nosuch=1"],
     ["--spec-param nosuch=1", "unknown parameter 'nosuch'", "backoff_max"]),
    (["resilient", "--spec-param", "no_retry_exit_codes=3,x"],
     ["--spec-param no_retry_exit_codes=3,x", "list of integers"]),
    (["resilient", "--spec-param", "no_retry_exit_codes=[3,256]"],
     ["no_retry_exit_codes", "256 is above the maximum 255"]),
    (["resilient", "--spec-param", "backoff_jitter=1.5"],
     ["--spec-param backoff_jitter=1.5", "above the maximum 1"]),
    (["resilient", "--spec-param", "backoff_max"], ["--spec-param backoff_max", "NAME=VALUE"]),
    (["resilient", "--spec-param", "=3"], ["NAME=VALUE"]),
    (["resilient", "--spec-param", "backoff_max=1m", "--spec-param", "backoff_max=2m"],
     ["--spec-param backoff_max", "given twice"]),
    # checked against every spec given: torchrun has no parameters
    (["resilient", "torchrun", "--spec-param", "backoff_max=1m"],
     ["--spec-param backoff_max=1m", "spec 'torchrun'", "unknown parameter"]),
], ids=["type", "unknown", "list", "list-range", "range", "no-equals", "no-name", "twice",
        "other-spec"])
def test_check_refuses_bad_parameters(argv: list[str], wanted: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *argv]) == 2
    line = one_error_line(capsys, "check")
    for text in wanted:
        assert text in line, line


def test_a_value_a_guard_or_action_cannot_use_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # resilient without the bounds on its exit code: the set_exit_code action itself refuses 300
    text = (ROOT / "specs" / "resilient.yaml").read_text()
    unbounded = text.replace("    default: 93\n    min: 1\n    max: 255\n", "    default: 93\n")
    assert unbounded != text
    path = tmp_path / "unbounded.yaml"
    path.write_text(unbounded.replace("name: resilient", "name: unbounded"))
    assert main(["check", str(path), "--spec-param", "no_requeue_exit_code=42"]) == 0
    capsys.readouterr()
    assert main(["check", str(path), "--spec-param", "no_requeue_exit_code=300"]) == 2
    line = one_error_line(capsys, "check")
    assert "--spec-param no_requeue_exit_code=300" in line, line
    assert "action 'no_requeue' (set_exit_code)" in line and "between 1 and 255" in line, line


def test_run_refuses_bad_parameters_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--spec", "resilient", "--spec-param", "backoff_max=soon",
                 "--standalone", __file__]) == 2
    assert "--spec-param backoff_max=soon" in one_error_line(capsys, "run")
    assert main(["run", "--spec", "torchrun", "--spec-param", "backoff_max=1m",
                 "--standalone", __file__]) == 2
    assert "unknown parameter 'backoff_max'" in one_error_line(capsys, "run")


def test_demo_runs_with_the_parameters_given(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo's failures exit with 1: a no-retry code makes the failure give up at once.
    base = ["demo", "--spec", "resilient", "--max-restarts", "3", "--spec-param",
            "backoff_initial=0", "--script", "HEALTHY,FAILED,HEALTHY,SUCCEEDED"]
    assert main(base) == 0
    assert "restarts used 1/3" in capsys.readouterr().out
    assert main([*base, "--spec-param", "no_retry_exit_codes=1"]) == 1
    out = capsys.readouterr().out
    assert "HEALTHY --failed--> FAILED" in out and "restarts used 0/3" in out, out


def test_commands_that_never_use_values_do_not_take_spec_param(
        capsys: pytest.CaptureFixture[str]) -> None:
    # (conformance takes it: it fixes a parameter for every generated run)
    for argv in (["diff", "resilient", "resilient"],):
        assert main([*argv, "--spec-param", "backoff_max=1m"]) == 2
        assert "unrecognized arguments: --spec-param" in one_error_line(capsys, argv[0])


# -- --vocabulary ----------------------------------------------------------------------------


def test_a_spec_with_a_guard_of_its_own_is_checked_with_the_vocabulary_named(
        custom: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "quota.yaml"]) == 1
    err = capsys.readouterr().err
    assert "quota.yaml:" in err and "quota_ok" in err, err
    assert "my_vocab" not in sys.modules  # nothing imported unless the user names it
    assert main(["check", "quota.yaml", "--vocabulary", "my_vocab:VOCABULARY"]) == 0
    assert "ok (quota:" in capsys.readouterr().out
    assert main(["check", "quota.yaml", "--vocabulary", "my_vocab:VOCABULARY", "--bounds",
                 "--max-restarts", "2"]) == 0
    assert "fastest   2" in capsys.readouterr().out  # quota_ok holds: both restarts happen


def test_diagram_diff_and_replay_take_the_vocabulary(
        custom: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = ["--vocabulary", "my_vocab:VOCABULARY"]
    assert main(["diagram", "quota.yaml", *vocab]) == 0
    assert "quota_ok" in capsys.readouterr().out
    assert main(["diagram", "quota.yaml"]) == 2
    assert "unknown guard 'quota_ok'" in capsys.readouterr().err
    assert main(["diff", "quota.yaml", "quota.yaml", *vocab]) == 0
    capsys.readouterr()
    # a trace of the spec, run by the engine with the same vocabulary
    import my_vocab  # type: ignore[import-not-found]

    spec = load_spec("quota.yaml", vocabulary=my_vocab.VOCABULARY)
    with open_trace("run.jsonl", spec=spec) as writer:
        Lifecycle(spec, RecordingDriver(["FAILED", "SUCCEEDED"]), max_restarts=1,
                  listeners=[writer]).run(0.0)
    assert main(["replay", "run.jsonl", "--spec", "quota.yaml", *vocab]) == 0
    assert "follows spec 'quota'" in capsys.readouterr().out
    assert main(["replay", "run.jsonl", "--spec", "quota.yaml"]) == 2
    assert "unknown guard 'quota_ok'" in capsys.readouterr().err


@pytest.mark.parametrize(("ref", "wanted"), [
    ("my_vocab", "--vocabulary must be MODULE:ATTR"),
    ("no_such_module_xyz:V", "cannot import module 'no_such_module_xyz': ModuleNotFoundError"),
    ("my_broken_vocab:V", "cannot import module 'my_broken_vocab': RuntimeError: boom"),
    ("my_vocab:NOPE", "module 'my_vocab' has no attribute 'NOPE'"),
    ("my_vocab:NOT_A_VOCABULARY", "expected a fsm_agent.Vocabulary"),
], ids=["form", "missing", "raises", "attribute", "type"])
@pytest.mark.parametrize("command", ["check", "diagram", "run"])
def test_vocabulary_errors_are_one_line(command: str, ref: str, wanted: str, custom: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    argv = {"check": ["check", "quota.yaml"], "diagram": ["diagram", "quota.yaml"],
            "run": ["run", "--spec", "quota.yaml", "--standalone"]}[command]
    script = [__file__] if command == "run" else []  # run: what follows the script is its own
    assert main([*argv, "--vocabulary", ref, *script]) == 2
    line = one_error_line(capsys, command)
    assert f"--vocabulary {ref}" in line or "--vocabulary must be" in line, line
    assert wanted in line, line


def test_check_names_every_guard_of_a_custom_spec_and_how_to_register_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A spec written for a program's own guards, checked without them."""
    import re

    count = iter(range(1, 100))
    text = re.sub(r"\bhas_restarts_left\b", lambda _: f"mine_{next(count)}",
                  (ROOT / "specs" / "torchrun.yaml").read_text())
    (tmp_path / "mine.yaml").write_text(text)
    assert main(["check", str(tmp_path / "mine.yaml")]) == 1
    captured = capsys.readouterr()
    lines = [x for x in (captured.out + captured.err).splitlines() if "unknown guard" in x]
    used = next(count) - 1
    assert used >= 3 and len(lines) == used, lines
    for n, line in enumerate(lines, 1):
        assert f"unknown guard 'mine_{n}'" in line and "--vocabulary MODULE:ATTR" in line, line


def test_check_of_a_spec_with_unregistered_names_shows_its_other_problems_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown guard or action hides none of the machine's own problems."""
    text = (ROOT / "specs" / "torchrun.yaml").read_text()
    edits = [
        # a guard and an action of the program's own, not registered
        ("guards: [nodes_waiting]", "guards: [my_guard]"),
        ("actions: [rendezvous, start_workers]\n    description: Before",
         "actions: [my_action, start_workers]\n    description: Before"),
        # and a state nothing leads to, whatever the names mean
        ("  UNKNOWN:\n", "  ORPHAN:\n    reports: STOPPED\n  UNKNOWN:\n"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    spec = tmp_path / "mine.yaml"
    spec.write_text(text)
    lines = text.splitlines()
    assert main(["check", str(spec)]) == 1
    captured = capsys.readouterr()
    out = (captured.out + captured.err).splitlines()

    def line_of(needle: str) -> int:
        return next(n for n, x in enumerate(lines, 1) if needle in x)

    wanted = [(line_of("my_guard"), "unknown guard 'my_guard'"),
              (line_of("my_action"), "unknown action 'my_action'"),
              (line_of("ORPHAN:"), "state ORPHAN cannot be reached")]
    for line, what in wanted:
        assert any(x.startswith(f"{spec}:{line}: ") and what in x for x in out), (what, out)
    assert sum("--vocabulary MODULE:ATTR" in x for x in out) == 2, out
