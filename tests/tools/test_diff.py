"""Spec differences: the two presets differ in exactly the giving-up outcome."""

from __future__ import annotations

from pathlib import Path

from fsm_agent import load_spec, parse_spec
from fsm_agent._readers._diff import diff_specs
from fsm_agent.cli.diff import main as diff_main

from ._helpers import SPECS

TORCHRUN = (SPECS / "torchrun.yaml").read_text()


def _variant(old: str, new: str):
    assert old in TORCHRUN
    return parse_spec(TORCHRUN.replace(old, new, 1), path="variant.yaml")


def test_torchelastic_against_torchrun_is_the_barrier_and_raise_on_failure() -> None:
    d = diff_specs(load_spec("torchelastic"), load_spec("torchrun"))
    assert [(c.kind, c.element, c.name) for c in d.changes] == [("changed", "state", "FAILED")]
    (change,) = d.changes
    assert change.details[0].startswith("entry: - exit_barrier, - raise_failure")
    assert change.details[1] == "outcome: raises (raise_failure) -> returns the result"
    back = diff_specs(load_spec("torchrun"), load_spec("torchelastic"))
    assert back.changes[0].details[0].startswith("entry: + exit_barrier, + raise_failure")


def test_a_spec_against_itself_and_against_a_regrouped_copy() -> None:
    spec = load_spec("torchrun")
    assert diff_specs(spec, spec).same
    # The same edges grouped into one YAML entry with a list of triggers are the same behaviour.
    regrouped = _variant(
        "  - trigger: unknown\n    source: HEALTHY\n    dest: UNKNOWN\n"
        "    after: [raise_invalid_state]\n",
        "  - trigger: [unknown]\n    source: [HEALTHY]\n    dest: UNKNOWN\n"
        "    after: [raise_invalid_state]\n    description: regrouped, reworded\n",
    )
    assert diff_specs(spec, regrouped).same


def test_changed_actions_destination_and_guards() -> None:
    spec = load_spec("torchrun")
    more = _variant("    actions: [consume_restart, stop_workers]\n    description: Restart after",
                    "    actions: [consume_restart, stop_workers, exit_barrier]\n"
                    "    description: Restart after")
    (c,) = diff_specs(spec, more).changes
    assert (c.kind, c.element, c.name) == ("changed", "transition",
                                           "HEALTHY --failed [has_restarts_left]--> STOPPED")
    assert c.details[0].startswith("actions: + exit_barrier")
    assert c.line_a is not None and c.line_b is not None

    order = _variant("    actions: [consume_restart, stop_workers]\n    description: Restart after",
                     "    actions: [stop_workers, consume_restart]\n    description: Restart after")
    (c,) = diff_specs(spec, order).changes
    assert c.details == ("actions: reordered consume_restart, stop_workers -> stop_workers, "
                         "consume_restart",)

    elsewhere = _variant("  - trigger: unknown\n    source: HEALTHY\n    dest: UNKNOWN\n",
                         "  - trigger: unknown\n    source: HEALTHY\n    dest: FAILED\n")
    (c,) = diff_specs(spec, elsewhere).changes
    assert c.details == ("destination: UNKNOWN -> FAILED",)


def test_added_and_removed_transitions() -> None:
    spec = load_spec("torchrun")
    # HEALTHY --healthy--> HEALTHY split on a new guard: one edge removed, two added.
    split = _variant(
        "  - trigger: healthy\n    source: HEALTHY\n    dest: HEALTHY\n"
        "    unless: [nodes_waiting]\n",
        "  - trigger: healthy\n    source: HEALTHY\n    dest: HEALTHY\n"
        "    unless: [nodes_waiting, has_restarts_left]\n"
        "  - trigger: healthy\n    source: HEALTHY\n    dest: STOPPED\n"
        "    guards: [has_restarts_left]\n    unless: [nodes_waiting]\n",
    )
    kinds = sorted((c.kind, c.name) for c in diff_specs(spec, split).changes)
    assert kinds == [
        ("added", "HEALTHY --healthy [!has_restarts_left & !nodes_waiting]--> HEALTHY"),
        ("added", "HEALTHY --healthy [has_restarts_left & !nodes_waiting]--> STOPPED"),
        ("removed", "HEALTHY --healthy [!nodes_waiting]--> HEALTHY"),
    ]


def test_metric_changes() -> None:
    spec = load_spec("torchrun")
    fewer = _variant('  - {name: "workers.{role}.{observed}", value: 1}\n', "")
    (c,) = diff_specs(spec, fewer).changes
    assert (c.kind, c.element, c.name) == ("removed", "metric", "workers.{role}.{observed} = 1")


def test_cli(tmp_path: Path, capsys) -> None:
    assert diff_main(["torchelastic", "torchrun"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("--- torchelastic (")
    assert "  ~ FAILED  (torchelastic line" in out
    assert "transitions:" not in out
    assert diff_main(["torchrun", "torchrun"]) == 0
    assert "no differences in behaviour" in capsys.readouterr().out
    user = tmp_path / "mine.yaml"
    user.write_text(TORCHRUN.replace("name: torchrun", "name: mine"))
    assert diff_main(["torchrun", str(user)]) == 0
    assert diff_main(["torchrun", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "SPEC_B" in err and "missing.yaml" in err
    assert diff_main(["torchrun"]) == 2
