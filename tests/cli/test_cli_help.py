"""Every subcommand's --help ends with examples that parse, and shows --version."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent.cli import COMMANDS, main

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _examples(help_text: str) -> list[str]:
    _, sep, tail = help_text.rstrip().rpartition("\nexamples:\n")
    assert sep, f"no examples at the end of:\n{help_text}"
    return [line.strip() for line in tail.splitlines()]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_ends_with_examples_that_parse(command: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--version" in out
    examples = _examples(out)
    assert 2 <= len(examples) <= 3, examples
    module = importlib.import_module(f"fsm_agent.cli.{command}")
    for example in examples:
        # the first command of the line, without its comment
        words = shlex.split(example.split(";")[0], comments=True)
        assert words[:2] == ["fsm-agent", command], example
        module.build_parser().parse_args(words[2:])  # raises (exit 2) if an example is stale


def test_version_is_the_installed_distributions() -> None:
    installed = importlib.metadata.version("fsm-agent")
    assert fsm_agent.__version__ == installed
    for argv in (["--version"], ["check", "--version"], ["diff", "--version"]):
        proc = subprocess.run([sys.executable, "-m", "fsm_agent", *argv], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"fsm-agent {installed}"


def _run_help(env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "fsm_agent", "run", "--help"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _flag_help(help_text: str, flag: str) -> str:
    """What ``run --help`` says under ``flag`` (its option line and the lines indented under
    it), in one line: argparse wraps where it likes."""
    lines = help_text.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith(f"  {flag}")), None)
    assert start is not None, f"{flag} not in run --help:\n{help_text}"
    said = [lines[start][len(flag) + 2:]]
    for line in lines[start + 1:]:
        if not line.startswith("   "):
            break
        said.append(line)
    return " ".join(" ".join(said).split())


def test_run_help_lists_every_built_in_spec_and_how_to_set_its_parameters(
        tmp_path: Path) -> None:
    """--spec names every preset the package carries, from its specs
    directory (one added there is listed too), and --spec-param and --vocabulary are shown."""
    from fsm_agent._core._load import PRESETS_DIR_ENV, _spec_dirs

    shipped = {p.stem for d in _spec_dirs() for p in d.glob("*.yaml")}
    assert {"torchelastic", "torchrun", "resilient"} <= shipped
    help_text = _run_help()
    spec_help = _flag_help(help_text, "--spec NAME|PATH")
    for name in shipped:
        assert re.search(rf"\b{name}\b", spec_help), (name, spec_help)
    assert "--spec-param" in spec_help, spec_help
    assert "spec parameter" in _flag_help(help_text, "--spec-param NAME=VALUE")
    assert "Vocabulary" in _flag_help(help_text, "--vocabulary MODULE:ATTR")
    # not a list written into the help: a spec put in a presets directory is listed
    (tmp_path / "mylab.yaml").write_text((ROOT / "specs" / "torchrun.yaml").read_text())
    extra = _run_help({**os.environ, PRESETS_DIR_ENV: str(tmp_path)})
    assert re.search(r"\bmylab\b", _flag_help(extra, "--spec NAME|PATH")), extra


def test_the_run_flag_table_in_docs_cli_is_the_parsers() -> None:
    from fsm_agent.cli.run import own_flags_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = own_flags_table()
    assert table.count("\n| `--") >= 9
    assert table in doc, "regenerate docs/cli.md's table: python tools/generated_docs.py"


def test_every_flag_an_agent_option_declares_is_in_run_help_and_docs_cli() -> None:
    """A flag declared on an ``AgentOptions`` field is the whole of a new option's flag: it is
    in ``run --help`` under every name with its help text, has its row in docs/cli.md's table,
    and its value reaches the options the agent gets under the field's name."""
    from fsm_agent.cli.run import _agent_options, build_parser
    from fsm_agent.torch import AgentOptions

    flags = AgentOptions.flags()
    assert {"exit_barrier_timeout", "isolate_worker_store", "preload"} <= set(flags), flags
    help_text = _run_help()
    doc = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    for name, flag in flags.items():
        shown = flag.names[0] + (f" {flag.metavar}" if flag.metavar else "")
        said = " ".join(flag.help.split())
        assert said in _flag_help(help_text, shown), (name, shown)
        for alias in flag.names[1:]:
            assert f"{shown}, {alias}" in help_text, (name, alias)
        assert f"| `{shown.replace('|', chr(92) + '|')}` | {said} |" in doc, (name, shown)
        default = AgentOptions.default(name)
        if flag.parse is None:  # a switch: given, the option is the opposite of its default
            args = parser.parse_args([flag.names[-1], "train.py"])
            assert getattr(_agent_options(args, "torchrun", None, ()), name) is not default
        else:
            args = parser.parse_args(["train.py"])
            assert getattr(_agent_options(args, "torchrun", None, ()), name) == default, name
