"""Every subcommand's --help ends with examples that parse, and shows --version."""

from __future__ import annotations

import importlib
import importlib.metadata
import shlex
import subprocess
import sys

import pytest

import fsm_agent
from fsm_agent.cli import COMMANDS, main

pytestmark = pytest.mark.timeout(120)


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
