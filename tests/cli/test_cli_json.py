"""``--format json`` of check, diff and replay: the documented shapes, checked against the
library and the text output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import SpecError, load_spec
from fsm_agent.cli import main

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests" / "specs" / "bad").glob("*.yaml"))
DATA = ROOT / "tests" / "tools" / "data"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--format", "json"])
    out, err = capsys.readouterr()
    assert err == ""
    data = json.loads(out)
    assert data["command"] == argv[0] and data["format_version"] == 1
    return code, data


def test_check_json_lists_every_problem_of_every_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "check", "torchrun", *map(str, BAD))
    assert code == 1 and data["ok"] is False
    good, *bad = data["specs"]
    assert good == {"spec": "torchrun", "ok": True, "name": "torchrun",
                    "path": load_spec("torchrun").path, "states": 7,
                    "transitions": len(list(load_spec("torchrun").edges())), "problems": [],
                    "params": {}}
    assert [b["spec"] for b in bad] == list(map(str, BAD))
    for path, entry in zip(BAD, bad, strict=True):
        with pytest.raises(SpecError) as e:
            load_spec(path)
        assert entry["ok"] is False and entry["name"] is None and entry["params"] is None
        assert entry["problems"] == [{"path": p.path, "line": p.line, "element": p.element,
                                      "message": p.message} for p in e.value.problems]


def test_check_json_all_good(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "check")
    assert code == 0 and data["ok"] is True
    assert {s["name"] for s in data["specs"]} >= {"torchelastic", "torchrun"}


def test_diff_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "diff", "torchelastic", "torchrun")
    assert code == 1 and data["same"] is False
    assert data["a"]["name"] == "torchelastic" and data["b"]["name"] == "torchrun"
    # the two presets differ only in how they give up (README, the preset table)
    [change] = data["changes"]
    assert (change["kind"], change["element"], change["name"]) == ("changed", "state", "FAILED")
    assert any("raise_failure" in d for d in change["details"])
    text = main(["diff", "torchelastic", "torchrun"]), capsys.readouterr().out
    for detail in change["details"]:
        assert detail in text[1]
    code, data = run_json(capsys, "diff", "torchrun", "torchrun")
    assert code == 0 and data["same"] is True and data["changes"] == []


def test_replay_json_follows(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(DATA / "fail_once_recover.jsonl")
    code, data = run_json(capsys, "replay", trace)
    assert code == 0 and data["ok"] is True
    assert data["spec"]["name"] == "torchelastic" and data["trace"] == trace
    [lc] = data["lifecycles"]
    with open(trace) as f:
        records = [r for r in map(json.loads, f) if r["kind"] == "step"]
    assert lc["ok"] is True and lc["divergence"] is None
    assert lc["steps_followed"] == len(records)
    assert lc["path"] == [records[0]["source"], *(r["dest"] for r in records)]
    assert lc["final_state"] == records[-1]["dest"] == "SUCCEEDED"
    assert lc["restarts_used"] == records[-1]["restart_count"] == 1
    assert lc["restarts_left"] == records[-1]["remaining_restarts"]
    main(["replay", trace])
    assert " -> ".join(lc["path"]) in capsys.readouterr().out


def test_replay_json_diverges(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(DATA / "give_up_torchrun.jsonl")
    code, data = run_json(capsys, "replay", trace, "--spec", "torchelastic")
    assert code == 1 and data["ok"] is False
    [lc] = data["lifecycles"]
    div = lc["divergence"]
    main(["replay", trace, "--spec", "torchelastic"])
    text = capsys.readouterr().out
    assert div["message"] in text
    assert f"step {div['step']} (line {div['line']})" in div["message"]
    assert lc["steps_followed"] == div["step"] - 1
    assert f"path until then: {lc['steps_followed']} step(s): {' -> '.join(lc['path'])}" in text


def test_usage_error_prints_no_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(DATA / "nosuch.jsonl"), "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "nosuch.jsonl" in err
