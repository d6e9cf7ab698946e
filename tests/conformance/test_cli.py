"""``fsm-agent conformance``: exit codes, the printed counterexample, clear usage errors."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fsm_agent.cli.conformance import main

from .unscriptable import UNSCRIPTABLE

pytestmark = pytest.mark.timeout(120)

MUTANTS = "tests.conformance.mutants"
RESILIENT = "tests.conformance.resilient_mutants"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # MODULE:ATTR is imported as `python -m` would, from the current directory.
    monkeypatch.chdir(Path(__file__).resolve().parents[2])


def test_conforming_agent_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["torch.distributed.elastic.agent.server.api:SimpleElasticAgent",
                 "--spec", "torchrun", "--examples", "40", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "conforms to spec 'torchrun' (40 scripts, seed 1)" in out


def test_default_spec_is_torchelastic(capsys: pytest.CaptureFixture[str]) -> None:
    # the same default as every other subcommand: torch 2.x's own agent gives up without the
    # seed's exit barrier, so it does not conform to torchelastic
    assert main(["fsm_agent:Lifecycle", "--examples", "20", "--seed", "2"]) == 0
    assert "conforms to spec 'torchelastic'" in capsys.readouterr().out
    code = main(["torch.distributed.elastic.agent.server.api:SimpleElasticAgent",
                 "--examples", "200", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "--spec torchelastic" in out


def test_lifecycle_against_a_preset_and_a_spec_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsm_agent:Lifecycle", "--spec", "torchelastic", "--examples", "30"]) == 0
    assert main(["fsm_agent:Lifecycle", "--spec", "specs/torchrun.yaml", "--examples", "20"]) == 0
    assert "conforms to spec 'specs/torchrun.yaml'" in capsys.readouterr().out


def test_counterexample_exits_one_with_table_and_reproduction(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main([f"{MUTANTS}:OffByOneMaxRestarts", "--spec", "torchrun", "--examples", "300",
                 "--seed", "5"])
    out = capsys.readouterr().out
    assert code == 1
    assert "COUNTEREXAMPLE (300 scripts, seed 5)" in out
    assert "tick  | observed" in out and "<-- differs" in out
    assert f"reproduce with: fsm-agent conformance {MUTANTS}:OffByOneMaxRestarts --spec " \
           "torchrun --examples 300 --seed 5" in out


def test_the_reproduction_line_reproduces_a_stateful_search(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The line once dropped --stateful, so it ran the other mode's search (other scripts,
    # another counterexample, or none).
    argv = [f"{MUTANTS}:OffByOneMaxRestarts", "--spec", "torchrun", "--examples", "60",
            "--seed", "7", "--stateful"]
    assert main(argv) == 1
    first = capsys.readouterr().out
    line = next(x for x in first.splitlines() if x.startswith("reproduce with: "))
    again = shlex.split(line.removeprefix("reproduce with: "))
    assert again[:2] == ["fsm-agent", "conformance"] and "--stateful" in again
    assert main(again[2:]) == 1
    assert capsys.readouterr().out == first


def test_factory_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"{MUTANTS}:good_lifecycle", "--spec", "torchrun", "--examples", "20"]) == 0
    assert main([f"{MUTANTS}:lifecycle_without_sleep", "--spec", "torchrun",
                 "--examples", "50"]) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nocolon"], "TARGET must be MODULE:ATTR"),
        (["no_such_module_xyz:X"], "cannot import module 'no_such_module_xyz'"),
        (["fsm_agent:NoSuchThing"], "'fsm_agent' has no attribute 'NoSuchThing'"),
        (["fsm_agent:__version__"], "SimpleElasticAgent shape (any package's) or a callable"),
        (["fsm_agent:Lifecycle", "--spec", "missing.yaml"],
         "--spec missing.yaml: no such spec file or preset"),
        (["fsm_agent:Lifecycle", "--examples", "0"], "--examples must be at least 1"),
    ],
)
def test_usage_errors_exit_two_with_one_line(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_bad_flag_is_argparse_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsm_agent:Lifecycle", "--examples", "many"]) == 2
    assert "invalid int value" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(UNSCRIPTABLE))
def test_a_target_the_kit_cannot_script_exits_two_with_one_line(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    # torch agents, which conform to torchrun: only the harness error can end the search
    assert main([f"tests.conformance.unscriptable:{name}", "--spec", "torchrun", "--examples",
                 "300", "--seed", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no counterexample, no hypothesis report
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsm-agent conformance: error: ")
    assert UNSCRIPTABLE[name][1] in lines[0]


def test_resilient_preset_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsm_agent:Lifecycle", "--spec", "resilient", "--examples", "40", "--seed",
                 "1"]) == 0
    assert "conforms to spec 'resilient' (40 scripts, seed 1)" in capsys.readouterr().out
    # a parameter fixed for every run: the kit passes it to a factory that takes params=
    assert main([f"{RESILIENT}:good_resilient", "--spec", "resilient", "--spec-param",
                 "no_retry_exit_codes=3,4", "--spec-param", "backoff_max=2s", "--examples", "40",
                 "--seed", "1"]) == 0


def test_resilient_counterexample_reproduces_with_its_parameters(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main([f"{RESILIENT}:ignores_no_retry_codes", "--spec", "resilient", "--spec-param",
                 "no_retry_exit_codes=[3]", "--examples", "300", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "no_retry_exit_codes=[3]" in out  # the run's parameters, in the table's header
    assert "exit code 93" in out
    assert (f"reproduce with: fsm-agent conformance {RESILIENT}:ignores_no_retry_codes --spec "
            "resilient --spec-param 'no_retry_exit_codes=[3]' --examples 300 --seed 1") in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fsm_agent:Lifecycle", "--spec", "resilient", "--spec-param", "backoff=1s"],
         "--spec-param backoff=1s: spec 'resilient': unknown parameter 'backoff'"),
        (["fsm_agent:Lifecycle", "--spec", "resilient", "--spec-param", "backoff_max=soon"],
         "--spec-param backoff_max=soon: spec 'resilient'"),
        (["fsm_agent:Lifecycle", "--spec", "torchrun", "--spec-param", "backoff_max=1"],
         "unknown parameter 'backoff_max'"),
        (["tests.conformance.test_resilient:MixinResilient", "--spec", "resilient",
          "--spec-param", "backoff_max=1"], "takes no params="),
    ],
)
def test_bad_spec_params_exit_two_with_one_line(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_a_parameter_the_resilient_reference_does_not_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    # hang detection is a parameter of the spec, not of the reference's table: checked against
    # the file
    assert main(["fsm_agent:Lifecycle", "--spec", "resilient", "--spec-param",
                 "hang_timeout=1m", "--examples", "5"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter 'hang_timeout'" in err and "specs/resilient.yaml" in err
    assert main(["fsm_agent:Lifecycle", "--spec", "specs/resilient.yaml", "--spec-param",
                 "hang_timeout=1m", "--examples", "20", "--seed", "1"]) == 0
