"""Diagrams of the restart-policy constructs: timers, reported states, parameters and the
failure-policy table (one choice point, its rules as numbered edges), with and without a trace.

Expected labels are written here from specs/resilient.yaml and the test specs, by hand."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fsm_agent import Lifecycle, SpecError, VirtualClock, load_spec, parse_spec
from fsm_agent.cli.diagram import main as diagram_main
from fsm_agent.diagram._render import highlight_from_replay, render, to_dot, to_mermaid
from fsm_agent.testing import RecordingDriver, make_result
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._replay import replay
from fsm_agent.trace._writer import JsonlTraceWriter

from ._helpers import ROOT

POLICY_SPEC = ROOT / "tests" / "specs" / "good" / "policy.yaml"

# Two conditions on one rule, a custom outcome, and a table deciding in one place only.
TWO_CONDITIONS = """
name: twocond
description: A rule with two conditions.
params:
  codes: {type: int_list, default: [3], description: Codes that give up.}
guards:
  bad_code: {exit_code_in: codes}
  early: {attempt_shorter_than: 30s}
states:
  INIT: {initial: true}
  HEALTHY: {}
  UNHEALTHY: {}
  STOPPED: {}
  SUCCEEDED: {final: true}
  FAILED: {final: true}
  UNKNOWN: {final: true}
failure_policy:
  applies_to: [{trigger: failed, source: HEALTHY}]
  outcomes:
    restart: {dest: STOPPED, actions: [consume_restart, stop_workers]}
  rules:
    - {name: early_bad, when: [bad_code, early], then: give_up}
    - {name: again, then: restart}
transitions:
  - {trigger: start, source: INIT, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}
  - {trigger: unhealthy, source: HEALTHY, dest: UNHEALTHY}
  - {trigger: always, source: UNHEALTHY, dest: FAILED, actions: [stop_workers]}
  - {trigger: healthy, source: HEALTHY, dest: HEALTHY}
  - {trigger: always, source: STOPPED, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: [unknown, init, stopped], source: HEALTHY, dest: UNKNOWN}
"""


def _edges(text: str) -> list[str]:
    return [x.strip() for x in text.splitlines() if " --> " in x]


def _lines(text: str) -> list[str]:
    return [x.strip() for x in text.splitlines()]


def test_resilient_policy_is_one_choice_point_with_numbered_rules() -> None:
    spec = load_spec("resilient")
    text = to_mermaid(spec)
    edges = _edges(text)
    assert "state failure_policy <<choice>>" in _lines(text)
    # Into the choice: the table's two (trigger, source) pairs.
    assert "HEALTHY --> failure_policy : failed" in edges
    assert "UNHEALTHY --> failure_policy : always" in edges
    # Out of it: each rule once (not once per source), the restart split on the budget guard,
    # without the negations of earlier rules (the numbers say the order).
    # a lost peer restarts at once (no backoff) while node_replacements lasts
    assert ("failure_policy --> STOPPED : 1. peer_lost [peer_lost & "
            "has_node_replacements_restarts_left] / consume_node_replacements_restart, "
            "stop_workers") in edges
    assert ("failure_policy --> FAILED : 1. peer_lost [peer_lost & "
            "!has_node_replacements_restarts_left] / announce_failure, stop_workers") in edges
    assert ("failure_policy --> FAILED : 2. no_retry [no_retry_exit] / no_requeue, "
            "announce_failure, stop_workers") in edges
    # a node whose own workers failed quarantine_after times leaves the job
    assert ("failure_policy --> QUARANTINED : 3. quarantine [quarantine_due] / stop_workers"
            ) in edges
    assert ("failure_policy --> FAILED : 4. no_progress [stalled] / no_requeue, "
            "announce_failure, stop_workers") in edges
    # a rule with a budget of its own splits on that budget's guard and spends its action
    # (a restart after a backoff counts a failure of this node's own workers)
    assert ("failure_policy --> BACKOFF : 5. infra [infra_exit & has_infra_restarts_left] / "
            "count_own_failure, consume_infra_restart, stop_workers") in edges
    assert ("failure_policy --> FAILED : 5. infra [infra_exit & !has_infra_restarts_left] / "
            "announce_failure, stop_workers") in edges
    assert ("failure_policy --> BACKOFF : 6. retry [has_restarts_left] / count_own_failure, "
            "consume_restart, stop_workers") in edges
    assert ("failure_policy --> FAILED : 6. retry [!has_restarts_left] / announce_failure, "
            "stop_workers") in edges
    # The compiled transitions are drawn as eleven edges, none straight from a source.
    # (HEALTHY's other ways to FAILED are job_failed, another agent of the job gave up, and a
    # lost node noticed on a healthy tick with node_replacements spent: spec transitions.)
    assert sorted(e for e in edges if e.startswith((
        "HEALTHY --> FAILED", "UNHEALTHY --> FAILED", "HEALTHY --> BACKOFF",
        "UNHEALTHY --> BACKOFF"))) == [
        "HEALTHY --> FAILED : healthy [peer_lost & !has_node_replacements_restarts_left] / "
        "announce_failure, stop_workers",
        "HEALTHY --> FAILED : job_failed / stop_workers"]
    assert len([e for e in edges if "failure_policy" in e]) == 11


def test_resilient_states_show_their_timer_and_reported_state() -> None:
    lines = _lines(to_mermaid(load_spec("resilient")))
    assert 'state "BACKOFF" as BACKOFF' in lines
    for expected in [
        "BACKOFF : reports STOPPED",
        "BACKOFF : timeout after an exponential backoff",
        "BACKOFF : initial backoff_initial = 1s, factor backoff_factor = 2",
        "BACKOFF : max backoff_max = 60s, jitter backoff_jitter = 0.1",
        "BACKOFF : reset after backoff_reset = 10m healthy",
    ]:
        assert expected in lines
    # torch's own states report themselves: no "reports" line.
    assert not any(x.startswith("HEALTHY : reports") for x in lines)
    assert "BACKOFF --> HEALTHY : timeout [node_healthy] / rendezvous, start_workers" in lines


def test_mermaid_legend_lists_parameters_vocabulary_and_budget() -> None:
    text = to_mermaid(load_spec("resilient"))
    note = text[text.index("note left of INIT"):text.index("end note")]
    for expected in ["parameters (default)", "no_retry_exit_codes = []",
                     "no_requeue_exit_code = 93", "backoff_initial = 1s", "backoff_factor = 2",
                     "backoff_max = 60s", "backoff_jitter = 0.1", "backoff_reset = 10m",
                     "restart_window = inf",
                     "guard no_retry_exit = exit_code_in(no_retry_exit_codes)",
                     "action no_requeue = set_exit_code(no_requeue_exit_code)",
                     "restart budget - --max-restarts within any restart_window = inf"]:
        assert expected in _lines(note)


def test_values_in_force_replace_the_defaults() -> None:
    spec = load_spec("resilient")
    text = to_mermaid(spec, params={"backoff_max": "90s", "no_retry_exit_codes": "3,4"})
    lines = _lines(text)
    assert "parameters (in force)" in lines
    assert "backoff_max = 90s" in lines and "no_retry_exit_codes = [3, 4]" in lines
    assert "BACKOFF : max backoff_max = 90s, jitter backoff_jitter = 0.1" in lines
    dot = to_dot(spec, params={"backoff_max": "90s"})
    # The table gets an "in force" column; the changed value is bold.
    assert "<b>in force</b>" in dot and "<b>90s</b>" in dot
    with pytest.raises(SpecError, match="unknown parameter 'nope'"):
        to_dot(spec, params={"nope": 1})


def test_dot_of_resilient() -> None:
    pgv = pytest.importorskip("pygraphviz")
    spec = load_spec("resilient")
    graph = pgv.AGraph(string=to_dot(spec))
    choice = graph.get_node("failure_policy")
    assert choice.attr["shape"] == "diamond"
    assert "failure" in choice.attr["xlabel"]
    out = {(e[1], e.attr["label"]) for e in graph.out_edges("failure_policy")}
    assert out == {
        ("STOPPED", "1. peer_lost [peer_lost & has_node_replacements_restarts_left]\\n"
                    "/ consume_node_replacements_restart, stop_workers"),
        ("FAILED", "1. peer_lost [peer_lost & !has_node_replacements_restarts_left]\\n"
                   "/ announce_failure, stop_workers"),
        ("FAILED", "2. no_retry [no_retry_exit]\\n/ no_requeue, announce_failure, stop_workers"),
        ("QUARANTINED", "3. quarantine [quarantine_due]\\n/ stop_workers"),
        ("FAILED", "4. no_progress [stalled]\\n/ no_requeue, announce_failure, stop_workers"),
        ("BACKOFF", "5. infra [infra_exit & has_infra_restarts_left]\\n/ count_own_failure, "
                    "consume_infra_restart, stop_workers"),
        ("FAILED", "5. infra [infra_exit & !has_infra_restarts_left]\\n/ announce_failure, "
                   "stop_workers"),
        ("BACKOFF", "6. retry [has_restarts_left]\\n/ count_own_failure, consume_restart, "
                    "stop_workers"),
        ("FAILED", "6. retry [!has_restarts_left]\\n/ announce_failure, stop_workers"),
    }
    assert {(e[0], e.attr["label"]) for e in graph.in_edges("failure_policy")} == {
        ("HEALTHY", "failed"), ("UNHEALTHY", "always")}
    backoff = graph.get_node("BACKOFF").attr["label"]
    assert "reports STOPPED" in backoff
    assert "initial backoff_initial = 1s, factor backoff_factor = 2" in backoff
    timeout = graph.get_edge("BACKOFF", "HEALTHY")
    assert timeout.attr["style"] == "dashed"
    legend = graph.graph_attr["label"]
    # The rule table, in order, with the outcome's destination and the rule's description.
    for expected in ["<b>no_retry</b>", "give_up_no_requeue → FAILED", "<b>retry</b>",
                     "any failure", "restart_after_backoff → BACKOFF",
                     "Retrying cannot help; tell the", "first matching rule wins",
                     "failed in HEALTHY, always in UNHEALTHY",
                     "<b>restart_window</b>", "exit_code_in(no_retry_exit_codes)"]:
        assert expected in legend
    assert legend.index("<b>no_retry</b>") < legend.index("<b>retry</b>")


def test_a_fixed_timer_and_a_rule_with_two_conditions() -> None:
    text = to_mermaid(load_spec(POLICY_SPEC))
    assert "BACKOFF : timeout after pause = 1s" in _lines(text)
    spec = parse_spec(TWO_CONDITIONS, path="twocond.yaml")
    edges = _edges(to_mermaid(spec))
    assert "HEALTHY --> failure_policy : failed" in edges
    assert ("failure_policy --> FAILED : 1. early_bad [bad_code & early] / announce_failure, "
            "stop_workers") in edges
    assert ("failure_policy --> STOPPED : 2. again [has_restarts_left] / consume_restart, "
            "stop_workers") in edges
    # UNHEALTHY is not in the table's applies_to: its own transition is drawn as written.
    assert "UNHEALTHY --> FAILED : always / stop_workers" in edges
    # The guard the two conditions compile into is the rule table's business, not the legend's.
    assert "rule_early_bad" not in to_dot(spec)


def _traced_resilient(path: Path) -> None:
    lc = Lifecycle("resilient", RecordingDriver(
        ["HEALTHY", "FAILED", "UNHEALTHY", make_result("FAILED", exitcode=3)]),
        clock=VirtualClock(), rng=random.Random(0), max_restarts=3,
        params={"no_retry_exit_codes": [3], "backoff_max": "90s"})
    with JsonlTraceWriter(path, spec=lc.spec, params=lc.params) as writer:
        lc.add_listener(writer)
        lc.run(1.0)


def test_trace_highlights_rule_and_timeout_edges(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    _traced_resilient(path)
    assert diagram_main(["--trace", str(path)]) == 0
    out = capsys.readouterr().out
    edges = _edges(out)
    # failed twice from HEALTHY, always once from UNHEALTHY; the rule edges add up across both.
    assert "HEALTHY --> failure_policy : failed ✔ 2×" in edges
    assert "UNHEALTHY --> failure_policy : always ✔ 1×" in edges
    assert ("failure_policy --> BACKOFF : 6. retry [has_restarts_left] / count_own_failure, "
            "consume_restart, stop_workers ✔ 2×") in edges
    assert ("failure_policy --> FAILED : 2. no_retry [no_retry_exit] / no_requeue, "
            "announce_failure, stop_workers ✔ 1×") in edges
    assert ("failure_policy --> FAILED : 6. retry [!has_restarts_left] / announce_failure, "
            "stop_workers") in edges
    assert "BACKOFF --> HEALTHY : timeout [node_healthy] / rendezvous, start_workers ✔ 2×" in edges
    # The legend shows the values the run used, from the trace's header.
    assert "parameters (in force)" in _lines(out)
    assert "no_retry_exit_codes = [3]" in _lines(out) and "backoff_max = 90s" in _lines(out)


def test_trace_highlight_in_dot_marks_the_choice_taken(tmp_path: Path) -> None:
    pgv = pytest.importorskip("pygraphviz")
    path = tmp_path / "t.jsonl"
    _traced_resilient(path)
    spec = load_spec("resilient")
    (trace,) = read_trace(path)
    graph = pgv.AGraph(string=to_dot(spec, highlight_from_replay(replay(spec, trace))))
    assert graph.get_node("failure_policy").attr["color"] == "#c2410c"
    spent = [e for e in graph.out_edges("failure_policy") if "!has_restarts_left" in
             e.attr["label"]]
    assert len(spent) == 1 and "taken" not in spent[0].attr["label"]
    timeout = graph.get_edge("BACKOFF", "HEALTHY")
    assert "✔ taken 2×" in timeout.attr["label"] and timeout.attr["style"] == "dashed"
    assert "ended here" in graph.get_node("FAILED").attr["label"]


def test_png_of_resilient_renders() -> None:
    pytest.importorskip("pygraphviz")
    png = render(load_spec("resilient"), "png")
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG")


def test_cli_spec_param_draws_the_values_given(capsys) -> None:
    assert diagram_main(["resilient", "--spec-param", "backoff_max=2m",
                         "--spec-param", "restart_window=2h"]) == 0
    lines = _lines(capsys.readouterr().out)
    assert "parameters (in force)" in lines
    assert "backoff_max = 2m" in lines and "restart_window = 2h" in lines
    assert "restart budget - --max-restarts within any restart_window = 2h" in lines
    assert diagram_main(["resilient", "--spec-param", "backoff_max=soon"]) == 2
    assert "expected a duration" in capsys.readouterr().err
