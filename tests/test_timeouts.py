"""Timeouts checked across layers (``fsm_agent/_core/_timeouts.py``, ``fsm-agent check --bounds``):
every rule catches the broken spec of ``tests/specs/bad/timeouts/`` at the line its header names,
and only that rule fails there; the same spec unbroken and the shipped presets pass every rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fsm_agent import load_spec
from fsm_agent._core._params import bind_params
from fsm_agent._core._timeouts import RULES, Layers, check_timeouts
from fsm_agent.cli.check import main

HERE = Path(__file__).parent
BAD = sorted((HERE / "specs" / "bad" / "timeouts").glob("*.yaml"))
GOOD = HERE / "specs" / "good" / "timeouts.yaml"


def _header(path: Path) -> tuple[str, list[str], int, str]:
    text = path.read_text()
    rule = re.search(r"^# rule: (\S+)$", text, re.M).group(1)  # type: ignore[union-attr]
    flags = re.search(r"^# flags: ?(.*)$", text, re.M).group(1).split()  # type: ignore[union-attr]
    line, element = re.search(r"^# expect: (\d+): (\S+)$", text, re.M).groups()  # type: ignore[union-attr]
    return rule, flags, int(line), element


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["--bounds", "--max-restarts", "2", *argv])
    return rc, capsys.readouterr().out


def test_every_rule_has_a_broken_spec() -> None:
    assert sorted(_header(p)[0] for p in BAD) == sorted(RULES)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_each_rule_catches_its_broken_spec_and_names_the_line(
        path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rule, flags, line, element = _header(path)
    rc, out = _check(capsys, *flags, str(path))
    assert rc == 1, out
    failed = re.findall(r"^  FAIL ([\w-]+): (\S+?):(\d+): (\S+):", out, re.M)
    assert [(r, int(n), e) for r, _, n, e in failed] == [(rule, line, element)], out
    # the same flags on the spec unbroken: every rule holds
    rc, out = _check(capsys, *flags, str(GOOD))
    assert rc == 0 and "  FAIL " not in out, out


def test_the_presets_pass_every_rule_that_applies(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys)
    assert rc == 0 and "  FAIL " not in out, out
    # resilient has a drain, hang detection, backoffs and health checks: six rules apply
    resilient = out.split("specs/resilient.yaml")[1].split("specs/torchelastic.yaml")[0]
    assert len(re.findall(r"^  (?:ok  |--  ) [\w-]+:", resilient, re.M)) == 6, resilient


def test_the_checks_read_the_surrounding_timeouts_from_the_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    # NCCL's default collective timeout (10 min) is below resilient's default hang_timeout
    rc, out = _check(capsys, "--collective-timeout", "10m", "resilient")
    assert rc == 1 and "FAIL hang-below-collective" in out, out
    rc, out = _check(capsys, "--collective-timeout", "10m", "--spec-param", "hang_timeout=5m",
                     "resilient")
    assert rc == 0, out
    rc, out = _check(capsys, "--format", "json", "--grace", "10", "resilient")
    data = json.loads(out)
    [entry] = data["specs"]
    verdicts = {f["rule"]: f["ok"] for f in entry["timeouts"]}
    assert verdicts["drain-fits-grace"] is False and verdicts["drain-fits-signal-lead"] is None
    assert rc == 1 and entry["ok"] is False


@pytest.mark.parametrize("flag", ["--grace", "--collective-timeout", "--signal-lead"])
def test_a_layer_flag_without_bounds_is_a_usage_error(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag, "30", "resilient"]) == 2
    assert f"{flag} goes with --bounds" in capsys.readouterr().err


def test_a_rule_whose_parameters_a_spec_lacks_does_not_apply() -> None:
    spec = load_spec("torchrun")
    found = check_timeouts(spec, bind_params(spec.params, None), Layers(grace=1.0,
                                                                          stop_timeout=5.0))
    assert [(f.rule, f.ok) for f in found] == [("stop-fits-grace", False)]
