"""Budgets per cause (``fsm_agent/_core/_budgets.py``): the spec format (``budgets``, a rule's
``budget``), what the engine counts, the job-wide ledger on the store, and what bounds, diagrams,
diff, replay and the report say. Real jobs: tests/resilient/test_budgets_run.py."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Lifecycle, SpecError, Step, VirtualClock, parse_spec
from fsm_agent._core._bounds import Limits, bounds, bounds_json, format_bounds
from fsm_agent._core._job import ANY, JobChannel, JobOver, MemoryStore
from fsm_agent._readers._diff import diff_specs, format_diff
from fsm_agent.diagram._render import to_mermaid
from fsm_agent.testing import RecordingDriver, make_result

MINI = """\
name: mini
description: Two budgets - the default one and infra, each spent by its own rule.
params:
  infra_codes: {type: int_list, default: [75]}
  infra_max: {type: int, default: 2, min: 0}
  infra_window: {type: duration, default: inf, min: 0s}
guards:
  infra_exit: {exit_code_in: infra_codes}
budgets:
  infra: {max: infra_max, window: infra_window, description: failures of the machines}
states:
  INIT: {initial: true}
  HEALTHY: {}
  UNHEALTHY: {}
  STOPPED: {}
  SUCCEEDED: {final: true}
  FAILED: {final: true}
  UNKNOWN: {final: true}
failure_policy:
  applies_to: [{trigger: failed, source: HEALTHY}, {trigger: always, source: UNHEALTHY}]
  rules:
    - {name: infra, when: infra_exit, then: restart, budget: infra}
    - {name: retry, then: restart}
transitions:
  - {trigger: start, source: INIT, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}
  - {trigger: unhealthy, source: HEALTHY, dest: UNHEALTHY}
  - {trigger: healthy, source: HEALTHY, dest: STOPPED, guards: [nodes_waiting],
     actions: [stop_workers]}
  - {trigger: healthy, source: HEALTHY, dest: HEALTHY, unless: [nodes_waiting]}
  - {trigger: always, source: STOPPED, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: [unknown, init, stopped], source: HEALTHY, dest: UNKNOWN,
     after: [raise_invalid_state]}
"""


def _run(codes: list[int], *, max_restarts: int = 1, spec: str = MINI,
         params: dict[str, Any] | None = None, clock: VirtualClock | None = None,
         gap: float = 0.0) -> tuple[Lifecycle, list[Step]]:
    """Fail with each exit code in turn (``gap`` seconds apart) until the lifecycle ends."""
    clock = clock or VirtualClock()
    steps: list[Step] = []
    lc = Lifecycle(parse_spec(spec), RecordingDriver([]), max_restarts=max_restarts, clock=clock,
                   params=params, listeners=[steps.append], rng=random.Random(0))
    lc.start()
    for code in codes:
        clock.sleep(gap)
        lc.observe(make_result("FAILED", exitcode=code))
        if lc.done:
            break
        lc.observe(make_result("HEALTHY"))  # STOPPED -> HEALTHY ran on the always trigger
    return lc, steps


def _decided(steps: list[Step]) -> list[tuple[str | None, str | None]]:
    return [(s.rule, s.dest) for s in steps if s.rule]


def test_each_rule_spends_its_own_budget_and_gives_up_when_that_one_is_spent() -> None:
    lc, steps = _run([75, 1, 75, 75])
    assert _decided(steps) == [("infra", "STOPPED"), ("retry", "STOPPED"),
                               ("infra", "STOPPED"), ("infra", "FAILED")]
    # every restart counts for the attempt number; the default budget only for its own rule
    assert lc.restart_count == 3
    assert lc.remaining_restarts == 0
    assert lc.context.budget_counts == {"infra": 2}
    spent = [s for s in steps if s.rule == "infra"][-1]
    assert ("has_infra_restarts_left", False) in spent.guards


def test_a_spent_default_budget_leaves_the_named_one_whole() -> None:
    lc, steps = _run([1, 75, 75, 1], max_restarts=1)
    assert _decided(steps) == [("retry", "STOPPED"), ("infra", "STOPPED"),
                               ("infra", "STOPPED"), ("retry", "FAILED")]
    assert lc.context.budget_counts == {"infra": 2}


def test_a_named_budget_has_its_own_window() -> None:
    # infra: 1 restart per 10 s; failures 6 s apart: every other one is outside the window
    _, steps = _run([75] * 4, params={"infra_max": 1, "infra_window": "10s"}, gap=6.0)
    assert [d for _, d in _decided(steps)] == ["STOPPED", "FAILED"]
    _, steps = _run([75] * 4, params={"infra_max": 1, "infra_window": "10s"}, gap=11.0)
    assert [d for _, d in _decided(steps)] == ["STOPPED"] * 4


def test_a_budget_of_zero_gives_up_at_once() -> None:
    lc, steps = _run([75], params={"infra_max": 0}, max_restarts=5)
    assert _decided(steps) == [("infra", "FAILED")] and lc.restart_count == 0


def _bad(old: str, new: str) -> list[str]:
    text = MINI.replace(old, new)
    assert text != MINI
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(("old", "new", "expect"), [
    ("budget: infra}", "budget: infar}", "unknown budget 'infar' (the spec's 'budgets': infra"),
    ("{name: infra, when: infra_exit, then: restart, budget: infra}",
     "{name: infra, when: infra_exit, then: give_up, budget: infra}",
     "outcome 'give_up' does not restart"),
    ("  infra: {max: infra_max,", "  default: {max: infra_max,", "'default' is the default budget"),
    ("{max: infra_max, window: infra_window,", "{window: infra_window,",
     "missing required key 'max'"),
    ("{max: infra_max,", "{max: -1,", "expected a count (an integer >= 0, or inf), got -1"),
    ("{max: infra_max,", "{max: infra_window,", "parameter 'infra_window' is a duration"),
    ("description: failures of the machines}", "size: 3}", "unknown key 'size'"),
    ("guards:\n", "guards:\n  has_infra_restarts_left: {exit_code_in: [1]}\n",
     "guard 'has_infra_restarts_left' is declared by budget 'infra'"),
    ("guards:\n", "guards:\n  has_restarts_left: {exit_code_in: [1]}\n", "already defined"),
    ("guards:\n", "guards:\n  mine: {budget_left: nope}\n", "unknown budget 'nope'"),
])
def test_bad_budgets_are_located_errors(old: str, new: str, expect: str) -> None:
    problems = _bad(old, new)
    assert any(expect in p and ":" in p.split(expect)[0] for p in problems), problems


def test_a_restart_rule_on_a_named_budget_bounds_its_cycle() -> None:
    # the static check sees consume_infra_restart under has_infra_restarts_left: bounded
    parse_spec(MINI)
    problems = _bad("then: restart, budget: infra}", "then: restart}\n    - {name: x, "
                    "when: infra_exit, then: restart}")
    assert any("can never match" in p for p in problems), problems


def test_bounds_list_every_budget() -> None:
    spec = parse_spec(MINI)
    limits = Limits(max_restarts=3)
    out = bounds_json(spec, bounds(spec, limits=limits), limits)
    assert [(b["name"], b["max"], b["rules"]) for b in out["budgets"]] == [
        ("default", 3, ["retry"]), ("infra", 2, ["infra"])]
    text = format_bounds(spec, bounds(spec, limits=limits), limits)
    assert "budget infra: 2 restarts within the whole job" in text
    assert "at most 5 failure restarts in all" in text


def test_diagrams_and_diff_show_budgets() -> None:
    spec = parse_spec(MINI)
    mmd = to_mermaid(spec)
    assert "budget infra - infra_max = 2 within any infra_window = inf" in mmd
    assert "1. infra [infra_exit & has_infra_restarts_left] / consume_infra_restart" in mmd
    assert "has_infra_restarts_left = budget_left" not in mmd  # the budget line says it
    other = parse_spec(MINI.replace("{max: infra_max,", "{max: 5,").replace(
        "then: restart, budget: infra}", "then: restart}"))
    text = format_diff(diff_specs(spec, other))
    assert "infra_max (default 2)" in text and "at most 5" in text, text
    assert "budget: infra -> default" in text, text


def test_the_job_ledger_counts_each_budget_once_for_the_job() -> None:
    store = MemoryStore()
    a, b = (JobChannel(store, "job1", node) for node in ("a", "b"))
    assert a.claim_restart("1", 1, budget="infra") == 1
    # b saw the same round fail with a user failure: it rides along, spending nothing
    assert b.restarts_left("1", 1) == 1 and b.claim_restart("1", 1) == 0
    assert b.claim_restart("2", 1) == 1  # the default budget is still whole
    assert a.restart_count(budget="infra") == 1 and a.restart_count() == 1
    assert a.restart_count(budget=ANY) == 2
    assert [(r, bud) for r, _, bud in a.entries()] == [("1", "infra"), ("2", "")]
    assert a.restarts_left("3", 1, budget="infra") == 0
    with pytest.raises(JobOver) as info:
        a.claim_restart("3", 1, budget="infra")
    assert "infra restart budget is spent (max=1)" in info.value.outcome.reason
    assert b.poll(force=True) is not None  # announced to every agent


def test_a_trace_with_named_budgets_replays_and_reports_them(tmp_path: Path) -> None:
    from fsm_agent._readers._analysis import analyse
    from fsm_agent._readers._summary import format_text
    from fsm_agent.trace import open_trace, read_trace, replay

    path = tmp_path / "t.jsonl"
    spec = parse_spec(MINI)
    clock = VirtualClock()
    with open_trace(path, spec=spec) as writer:
        lc = Lifecycle(spec, RecordingDriver([]), max_restarts=1, clock=clock,
                       listeners=[writer], rng=random.Random(0))
        lc.start()
        for code in (75, 1, 75, 75):
            lc.observe(make_result("FAILED", exitcode=code))
            if lc.done:
                break
            lc.observe(make_result("HEALTHY"))
    [trace] = read_trace(path)
    assert replay(spec, trace).ok
    analysis = analyse([trace], spec)
    assert (analysis.restarts_used, analysis.restart_budget) == (1, 1)
    assert analysis.budget_restarts == (("infra", 2),)
    assert "restarts: 1 of 1 used; budget infra: 2 used" in format_text(analysis)


# -- a count parameter: a budget without a maximum (resilient's node_replacements) -----------


@pytest.mark.parametrize(("text", "value"), [("inf", float("inf")), ("4", 4), ("0", 0)])
def test_a_count_parameter_takes_an_integer_or_inf_from_the_command_line(text: str,
                                                                         value: float) -> None:
    from fsm_agent._core._params import parse_text

    assert parse_text("count", text) == value


@pytest.mark.parametrize("text", ["-1", "2.5", "lots"])
def test_a_count_parameter_refuses_what_is_not_a_count(text: str) -> None:
    from fsm_agent._core._params import parse_text
    from fsm_agent._core._units import BadValue

    with pytest.raises(BadValue, match="expected a count"):
        parse_text("count", text)


def test_a_budget_with_no_maximum_never_runs_out_and_is_still_counted() -> None:
    spec = MINI.replace("infra_max: {type: int, default: 2, min: 0}",
                        "infra_max: {type: count, default: inf}")
    lc, _ = _run([75] * 50, max_restarts=0, spec=spec)
    assert not lc.done
    assert lc.context.budget_counts["infra"] == 50
    assert lc.context.restart_count == 50
    assert lc.context.remaining_restarts == 0
    lc, _ = _run([75] * 5, max_restarts=0, spec=spec, params={"infra_max": 2})
    assert lc.done and lc.context.budget_counts["infra"] == 2
    rows = bounds_json(parse_spec(spec), [], Limits(max_restarts=0), None)["budgets"]
    assert [r["max"] for r in rows if r["name"] == "infra"] == [None]  # JSON: no limit
