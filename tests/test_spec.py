"""Spec loading and validation: presets load; each rule rejects its broken spec at its line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import fsm_agent
from fsm_agent import SpecError, Vocabulary, load_spec, parse_spec

HERE = Path(__file__).parent
BAD = sorted((HERE / "specs" / "bad").glob("*.yaml"))
ROOT = HERE.parent


def _expectation(path: Path) -> tuple[int, str]:
    header = path.read_text().splitlines()[1]
    m = re.fullmatch(r"# expect: (\d+): (.+)", header)
    assert m, f"{path} lacks an '# expect: LINE: TEXT' header"
    return int(m.group(1)), m.group(2)


def test_presets_load_by_name() -> None:
    assert {"torchelastic", "torchrun"} <= set(fsm_agent.preset_names())
    for name in ("torchelastic", "torchrun"):
        spec = load_spec(name)
        assert spec.name == name
        assert spec.initial == "INIT"
        assert {s.name for s in spec.states} == {
            "UNKNOWN", "INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED"
        }
        assert spec.finals == {"SUCCEEDED", "FAILED", "UNKNOWN"}


def test_the_two_presets_differ_only_on_giving_up() -> None:
    a, b = load_spec("torchelastic"), load_spec("torchrun")
    def unlocated(items):  # line numbers differ: the descriptions differ in length
        return [attrs.evolve(x, line=None) for x in items]

    assert unlocated(a.transitions) == unlocated(b.transitions)
    assert unlocated(a.metrics) == unlocated(b.metrics)
    diff = {s.name for s in a.states if s.enter != b.state(s.name).enter}
    assert diff == {"FAILED"}
    assert a.state("FAILED").enter == ("exit_barrier", "raise_failure")
    assert b.state("FAILED").enter == ()


def test_compact_spec_is_valid() -> None:
    spec = load_spec(HERE / "specs" / "good" / "compact.yaml")
    assert spec.name == "compact"


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_each_broken_spec_is_rejected_at_its_line(path: Path) -> None:
    line, fragment = _expectation(path)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    matching = [p for p in info.value.problems if fragment in p.message]
    assert matching, f"no problem mentions {fragment!r}: {info.value}"
    assert matching[0].line == line, str(info.value)
    assert matching[0].path == str(path)
    assert str(matching[0]).startswith(f"{path}:{line}:")


def test_there_is_a_broken_spec_per_rule() -> None:
    rules = {p.stem for p in BAD}
    assert {
        "yaml_syntax", "unknown_top_key", "unknown_transition_key", "unknown_state",
        "unknown_guard", "unknown_action", "unknown_trigger", "no_initial", "several_initial",
        "unreachable_state", "no_way_out", "final_outgoing", "nondeterministic",
        "python_tag", "missing_state",
    } <= rules


def test_python_tags_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = (HERE / "specs" / "good" / "compact.yaml").read_text().replace(
        "name: compact", f"name: !!python/object/apply:os.system ['touch {marker}']"
    )
    with pytest.raises(SpecError, match="not allowed"):
        parse_spec(text)
    assert not marker.exists()


def test_all_problems_are_reported_at_once() -> None:
    text = (HERE / "specs" / "good" / "compact.yaml").read_text()
    text = text.replace("has_restarts_left]", "no_such_guard]").replace("[stop_workers]", "[oops]")
    with pytest.raises(SpecError) as info:
        parse_spec(text, path="x.yaml")
    messages = [p.message for p in info.value.problems]
    assert any("unknown guard 'no_such_guard'" in m for m in messages)
    assert any("unknown action 'oops'" in m for m in messages)


def test_non_utf8_bytes_name_the_line() -> None:
    data = b"name: x\ndescription: \xff\xfe\n"
    with pytest.raises(SpecError) as info:
        parse_spec(data, path="bin.yaml")
    assert info.value.problems[0].line == 2
    assert "UTF-8" in str(info.value)


def test_missing_file_and_unknown_preset() -> None:
    with pytest.raises(SpecError, match="no such spec file or preset"):
        load_spec("no-such-preset")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec("does/not/exist.yaml")


def test_registered_names_extend_the_vocabulary() -> None:
    text = (HERE / "specs" / "good" / "compact.yaml").read_text().replace(
        "{trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}",
        "{trigger: succeeded, source: HEALTHY, dest: SUCCEEDED, actions: [notify_slack]}",
    )
    with pytest.raises(SpecError, match="unknown action 'notify_slack'"):
        parse_spec(text)
    vocab = Vocabulary.builtin().extend(actions={"notify_slack": lambda ctx: None})
    spec = parse_spec(text, vocabulary=vocab)
    assert spec.outgoing("HEALTHY", "succeeded")[0].actions == ("notify_slack",)


def test_vocabulary_refuses_to_redefine_builtins() -> None:
    with pytest.raises(ValueError, match="already defined"):
        Vocabulary.builtin().extend(guards={"has_restarts_left": lambda ctx: True})
    with pytest.raises(ValueError, match="identifier"):
        Vocabulary.builtin().extend(actions={"not a name": lambda ctx: None})


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent.cli", "check", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )


def test_check_command_passes_presets_and_rejects_broken_specs() -> None:
    ok = _check(str(ROOT / "specs" / "torchelastic.yaml"), str(ROOT / "specs" / "torchrun.yaml"))
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    bad = _check(*map(str, BAD))
    assert bad.returncode == 1
    for path in BAD:
        line, _ = _expectation(path)
        assert f"{path}:{line}:" in bad.stderr, path


def test_a_problem_with_invisible_characters_stays_one_printable_line(tmp_path: Path) -> None:
    # found by tests/reliability/test_input_fuzz.py: a key holding a byte-order mark
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"na\xef\xbb\xbfme: x\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    text = str(info.value)
    assert all(line.isprintable() for line in text.splitlines()), text
    assert "na\\ufeffme" in text


def test_a_spec_binds_given_values_over_its_defaults_and_names_its_file_for_a_bad_one() -> None:
    spec = load_spec("resilient")
    assert spec.bind(None) == spec.bind({}) == spec.defaults
    assert spec.bind({"backoff_max": "90s", "no_retry_exit_codes": "3,4", "backoff_jitter": 0}) \
        == {**spec.defaults, "backoff_max": 90.0, "no_retry_exit_codes": (3, 4),
            "backoff_jitter": 0.0}
    with pytest.raises(SpecError) as e:
        spec.bind({"nope": 1, "backoff_jitter": 1.5})
    line = next(p.line for p in spec.params if p.name == "backoff_jitter")
    assert [(p.path, p.line, p.element) for p in e.value.problems] == [
        (spec.path, None, "params.nope"), (spec.path, line, "params.backoff_jitter")]
    assert e.value.problems[1].message == "bad value 1.5: 1.5 is above the maximum 1"
