"""``fsm-agent diff`` of the restart-policy constructs, on specs derived from the resilient
preset: rules added, removed, renamed, reordered and changed, timers, parameters, the budget,
the spec's own guards and actions, reported states. Expected wording is written here by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsm_agent import load_spec, parse_spec
from fsm_agent._readers._diff import diff_specs, format_diff
from fsm_agent.cli.diff import main as diff_main

from ._helpers import SPECS

RESILIENT = (SPECS / "resilient.yaml").read_text()

# A rule after the first (a crash loop gives up), to reorder and rename.
CRASH_LOOP = """\
    - name: crash_loop
      when: crash_loop
      then: give_up
"""
WITH_CRASH_LOOP = (
    RESILIENT.replace("guards:\n  no_retry_exit:", "guards:\n  crash_loop:\n"
                      "    consecutive_failures_at_least: {count: 3, min_uptime: 1m}\n"
                      "  no_retry_exit:", 1)
    .replace("    - name: quarantine\n", CRASH_LOOP + "    - name: quarantine\n", 1))


def derived(*edits: tuple[str, str], base: str = RESILIENT, name: str = "derived"):
    text = base
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return parse_spec(text, path=f"{name}.yaml")


def changes(a, b) -> list[tuple[str, str, str, tuple[str, ...]]]:
    return [(c.kind, c.element, c.name, c.details) for c in diff_specs(a, b).changes]


def test_resilient_against_itself_and_a_reworded_copy() -> None:
    base = load_spec("resilient")
    assert diff_specs(base, base).same
    reworded = derived(("description: Retrying cannot help; tell the scheduler not to requeue.",
                        "description: Reworded."),
                       ("description: The longest backoff.", "description: Reworded too."))
    assert diff_specs(base, reworded).same


def test_a_rule_added_removed_and_its_outcome_changed() -> None:
    base = load_spec("resilient")
    added = parse_spec(WITH_CRASH_LOOP, path="added.yaml")
    assert changes(base, added) == [
        ("added", "rule", "crash_loop",
         ("rule 3: when crash_loop then give_up (to FAILED / announce_failure, stop_workers)",)),
        ("added", "guard", "crash_loop",
         ("consecutive_failures_at_least(count=3, min_uptime=60s)",)),
    ]
    assert changes(added, base)[0] == (
        "removed", "rule", "crash_loop",
        ("rule 3: when crash_loop then give_up (to FAILED / announce_failure, stop_workers)",))
    plain = derived(("      then: give_up_no_requeue\n", "      then: give_up\n"))
    assert changes(base, plain) == [
        ("changed", "rule", "no_retry",
         ("then: give_up_no_requeue (to FAILED / no_requeue, announce_failure, stop_workers) -> "
          "give_up (to FAILED / announce_failure, stop_workers)",)),
    ]


def test_rules_reordered_renamed_and_their_condition_changed() -> None:
    base = parse_spec(WITH_CRASH_LOOP, path="base.yaml")
    swapped = derived(
        ("    - name: no_retry\n      when: no_retry_exit\n      then: give_up_no_requeue\n"
         "      description: Retrying cannot help; tell the scheduler not to requeue.\n"
         + CRASH_LOOP,
         CRASH_LOOP + "    - name: no_retry\n      when: no_retry_exit\n"
         "      then: give_up_no_requeue\n"),
        base=WITH_CRASH_LOOP)
    assert changes(base, swapped) == [
        ("changed", "policy", "failure_policy",
         ("rules reordered: peer_lost, no_retry, crash_loop, quarantine, no_progress, infra, "
          "retry -> peer_lost, crash_loop, no_retry, quarantine, no_progress, infra, retry (the "
          "first rule that matches decides)",)),
    ]
    renamed = derived(("    - name: crash_loop\n", "    - name: looping\n"),
                      base=WITH_CRASH_LOOP)
    assert changes(base, renamed) == [
        ("changed", "rule", "looping",
         ("renamed: crash_loop -> looping (traces name the rule that matched)",)),
    ]
    # Two conditions compile into a guard of their own: the rule says it, not the guards.
    both = derived(("      when: no_retry_exit\n", "      when: [no_retry_exit, crash_loop]\n"),
                   base=WITH_CRASH_LOOP)
    assert changes(base, both) == [
        ("changed", "rule", "no_retry",
         ("when: no_retry_exit -> no_retry_exit & crash_loop",)),
    ]


def test_where_the_table_decides_and_its_budget_guard() -> None:
    base = load_spec("resilient")
    narrower = derived(
        ("    - {trigger: always, source: UNHEALTHY}\n", ""),
        ("  - trigger: healthy\n    source: HEALTHY\n    dest: STOPPED\n",
         "  - {trigger: always, source: UNHEALTHY, dest: FAILED, actions: [stop_workers]}\n"
         "  - trigger: healthy\n    source: HEALTHY\n    dest: STOPPED\n"))
    got = changes(base, narrower)
    assert ("added", "transition", "UNHEALTHY --always--> FAILED / stop_workers", ()) in got
    assert ("changed", "policy", "failure_policy",
            ("decides on: - always in UNHEALTHY",)) in got
    assert len(got) == 2


def test_timer_changes() -> None:
    base = load_spec("resilient")
    capped = derived(("        max: backoff_max\n", "        max: 120s\n"),
                     ("        jitter: backoff_jitter\n", ""))
    (change,) = [c for c in diff_specs(base, capped).changes if c.element == "state"]
    assert (change.kind, change.name) == ("changed", "BACKOFF")
    assert change.details == (
        "timeout backoff max: backoff_max (default 60s) -> 2m",
        "timeout backoff jitter: backoff_jitter (default 0.1) -> 0",
    )
    fixed = derived(("    timeout:\n      backoff:\n        initial: backoff_initial\n"
                     "        factor: backoff_factor\n        max: backoff_max\n"
                     "        jitter: backoff_jitter\n        reset_after: backoff_reset\n"
                     "        reset_on_progress: backoff_reset_on_progress\n",
                     "    timeout: 30s\n"))
    (change,) = [c for c in diff_specs(base, fixed).changes if c.element == "state"]
    assert change.details == (
        "timeout: backoff: initial backoff_initial (default 1s), factor backoff_factor "
        "(default 2), max backoff_max (default 60s), jitter backoff_jitter (default 0.1), "
        "reset_after backoff_reset (default 10m), reset_on_progress backoff_reset_on_progress "
        "(default false) -> after 30s",)


def test_reported_state_change() -> None:
    other = derived(("    reports: STOPPED\n", "    reports: UNHEALTHY\n"))
    (change,) = diff_specs(load_spec("resilient"), other).changes
    assert change.details == (
        "reports: STOPPED -> UNHEALTHY (the WorkerState torch and metrics see)",)


def test_parameter_changes() -> None:
    base = load_spec("resilient")
    other = derived(
        ("    default: 60s\n", "    default: 90s\n"),
        ("    default: 93\n    min: 1\n    max: 255\n", "    default: 93\n    min: 64\n"
         "    max: 255\n"),
        ("  backoff_factor:\n    type: float\n    default: 2\n",
         "  backoff_factor:\n    type: int\n    default: 2\n"),
        ("params:\n", "params:\n  drain:\n    type: duration\n    default: 5s\n"))
    got = {(c.kind, c.name): c.details for c in diff_specs(base, other).changes
           if c.element == "param"}
    assert got == {
        ("changed", "backoff_max"): ("default: 60s -> 90s",),
        ("changed", "no_requeue_exit_code"): ("min: 1 -> 64",),
        ("changed", "backoff_factor"): ("type: float -> int",),
        ("added", "drain"): ("duration, default 5s",),
    }
    # The timer refers to backoff_max: its default shows there too.
    (state,) = [c for c in diff_specs(base, other).changes if c.element == "state"]
    assert state.details == ("timeout backoff max: backoff_max (default 60s) -> backoff_max "
                             "(default 90s)",)


def test_budget_guard_and_action_instance_changes() -> None:
    base = load_spec("resilient")
    other = derived(
        ("  scope: job\n  window: restart_window\n", "  scope: job\n  window: 2h\n"),
        ("    exit_code_in: no_retry_exit_codes\n",
         "    exit_code_in: {codes: no_retry_exit_codes, ranks: any}\n"),
        ("    set_exit_code: no_requeue_exit_code\n", "    set_exit_code: 94\n"))
    got = {(c.element, c.name): c.details for c in diff_specs(base, other).changes}
    assert got[("budget", "budget")] == (
        "window: restart_window (default inf) -> 2h (--max-restarts failure restarts allowed "
        "within any window this long)",)
    assert got[("guard", "no_retry_exit")] == ("ranks: all -> any",)
    assert got[("action", "no_requeue")] == (
        "code: no_requeue_exit_code (default 93) -> 94",)


def test_torchrun_against_resilient_compares_the_table_edge_by_edge() -> None:
    d = diff_specs(load_spec("torchrun"), load_spec("resilient"))
    names = [(c.kind, c.element, c.name) for c in d.changes]
    # torchrun's restart transitions are gone; the table's compiled ones are new, each naming
    # its rule; the table itself is listed with its rules.
    assert ("removed", "transition", "HEALTHY --failed [has_restarts_left]--> STOPPED / "
            "consume_restart, stop_workers") in names
    # a rule's compiled guard carries the negations of the rules before it
    assert ("added", "transition", "HEALTHY --failed [no_retry_exit & !peer_lost]--> FAILED "
            "(rule no_retry) / no_requeue, announce_failure, stop_workers") in names
    assert ("added", "transition", "HEALTHY --failed [has_node_replacements_restarts_left & "
            "peer_lost]--> STOPPED (rule peer_lost) / consume_node_replacements_restart, "
            "stop_workers") in names
    (policy,) = [c for c in d.changes if c.element == "policy"]
    assert policy.kind == "added"
    assert policy.details == (
        "decides on failed in HEALTHY, always in UNHEALTHY",
        "rule 1: when peer_lost then restart (to STOPPED / consume_node_replacements_restart, "
        "stop_workers), spending budget node_replacements",
        "rule 2: when no_retry_exit then give_up_no_requeue (to FAILED / no_requeue, "
        "announce_failure, stop_workers)",
        "rule 3: when quarantine_due then quarantine (to QUARANTINED / stop_workers)",
        "rule 4: when stalled then give_up_no_requeue (to FAILED / no_requeue, "
        "announce_failure, stop_workers)",
        "rule 5: when infra_exit then restart_after_backoff (to BACKOFF / count_own_failure, "
        "consume_infra_restart, stop_workers), spending budget infra",
        "rule 6: when any failure then restart_after_backoff (to BACKOFF / count_own_failure, "
        "consume_restart, stop_workers)")
    (backoff,) = [c for c in d.changes if (c.element, c.name) == ("state", "BACKOFF")]
    assert backoff.kind == "added" and backoff.details[0] == "reports STOPPED"
    text = format_diff(d)
    for heading in ("transitions:", "failure policy:", "states:", "parameters:", "guards:",
                    "actions:", "restart budget:"):
        assert f"\n{heading}\n" in text


def test_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(WITH_CRASH_LOOP)
    other = tmp_path / "other.yaml"
    other.write_text(WITH_CRASH_LOOP.replace("    - name: crash_loop\n", "    - name: looping\n")
                     .replace("    default: 60s\n", "    default: 90s\n"))
    assert diff_main([str(base), str(other)]) == 1
    out = capsys.readouterr().out
    assert "rules:\n  ~ looping  (resilient line" in out
    assert "      renamed: crash_loop -> looping (traces name the rule that matched)" in out
    assert "parameters:\n  ~ backoff_max" in out
    assert diff_main([str(base), str(other), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["format_version"] == 1
    by_element = {c["element"]: c for c in data["changes"]}
    assert by_element["rule"]["name"] == "looping"
    assert by_element["param"]["details"] == ["default: 60s -> 90s"]
    assert by_element["state"]["details"] == [
        "timeout backoff max: backoff_max (default 60s) -> backoff_max (default 90s)"]
    assert diff_main([str(base), str(base)]) == 0
