"""Crash-loop bounds (``fsm_agent._core._bounds``, ``fsm-agent check --bounds``): how long each
preset takes to give up and how many restarts it makes, worked out here from the parameters and
limits (torch's timeouts), never read back from the engine."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from fsm_agent import load_spec, parse_spec
from fsm_agent._core._bounds import Limits, bounds, bounds_json, format_bounds
from fsm_agent._core._health import health_budget
from fsm_agent._core._units import format_duration
from fsm_agent.cli import main

LIMITS = Limits(max_restarts=3, monitor_interval=0.5, rendezvous_timeout=120.0,
                stop_timeout=7.0, exit_barrier_timeout=40.0)


def backoffs(n: int, initial: float = 1.0, factor: float = 2.0, cap: float = 60.0) -> list[float]:
    """The resilient preset's first ``n`` backoffs, from its documented formula (no jitter)."""
    return [min(cap, initial * factor**i) for i in range(n)]


def health_checks(joins: int, params: dict[str, Any] | None = None, *, busy: bool = False) -> float:
    """What the resilient preset's node health checks before every (re)join add to its slowest
    loop: each check's budget; by default only the store and clean-slate checks have something
    to do (no disk paths, no command are configured), with ``busy`` all four do."""
    budget = health_budget(load_spec("resilient"), params)
    return joins * (sum(budget.values()) if busy else budget["store_ok"] + budget["slate_ok"])


def slowest_loop(limits: Limits) -> float:
    """Every attempt: seen at the next tick, the failed group closed within the stop timeout;
    the first rendezvous and each restart's rendezvous at the join timeout."""
    attempts = limits.max_restarts + 1
    return attempts * (limits.monitor_interval + limits.stop_timeout + limits.rendezvous_timeout)


@pytest.mark.parametrize("restarts", [0, 1, 3])
def test_torchrun_gives_up_after_max_restarts_with_nothing_between_them(restarts: int) -> None:
    limits = Limits(max_restarts=restarts, monitor_interval=0.5, rendezvous_timeout=120.0,
                    stop_timeout=7.0)
    fast, slow = bounds(load_spec("torchrun"), None, limits)
    assert (fast.restarts, slow.restarts) == (restarts, restarts)
    assert fast.seconds == 0.0  # no backoff: a crash loop gives up as fast as it can restart
    assert slow.seconds == pytest.approx(slowest_loop(limits))
    assert fast.final_state == slow.final_state == "FAILED"
    attempts = restarts + 1
    assert slow.spent == pytest.approx({"rendezvous": attempts * 120.0,
                                        "closing the failed group": attempts * 7.0,
                                        "monitor ticks": attempts * 0.5})


def test_torchelastic_also_waits_at_the_exit_barrier_when_it_gives_up() -> None:
    fast, slow = bounds(load_spec("torchelastic"), None, LIMITS)
    assert fast.seconds == 0.0 and fast.restarts == 3
    assert slow.seconds == pytest.approx(slowest_loop(LIMITS) + LIMITS.exit_barrier_timeout)
    assert "WorkerGroupFailureException" in slow.outcome


@pytest.mark.parametrize("jitter", [0.0, 0.1, 0.5])
def test_resilient_adds_its_backoffs_drawn_at_each_end_of_the_jitter(jitter: float) -> None:
    fast, slow = bounds(load_spec("resilient"), {"backoff_jitter": jitter}, LIMITS)
    waits = backoffs(LIMITS.max_restarts)
    assert fast.seconds == pytest.approx(sum(waits) * (1 - jitter))
    assert slow.seconds == pytest.approx(slowest_loop(LIMITS) + sum(waits) * (1 + jitter)
                                         + health_checks(LIMITS.max_restarts + 1))
    assert fast.spent == pytest.approx({"waiting in BACKOFF": sum(waits) * (1 - jitter)}
                                       if fast.seconds else {})
    assert (fast.restarts, slow.restarts) == (3, 3)


def test_resilient_backoff_is_capped_by_backoff_max() -> None:
    params = {"backoff_initial": "10s", "backoff_max": "15s", "backoff_jitter": "0"}
    limits = Limits(max_restarts=4)
    fast, _ = bounds(load_spec("resilient"), params, limits)
    assert fast.seconds == pytest.approx(sum(backoffs(4, 10.0, 2.0, 15.0))) == 10 + 15 + 15 + 15


def test_resilient_backoff_starts_again_after_an_attempt_as_long_as_backoff_reset() -> None:
    # In the slowest loop each attempt lasts a monitor tick and the close of the failed group:
    # with backoff_reset no longer than that, every backoff is the first one again.
    attempt = LIMITS.monitor_interval + LIMITS.stop_timeout
    params = {"backoff_jitter": 0, "backoff_reset": attempt}
    fast, slow = bounds(load_spec("resilient"), params, LIMITS)
    assert fast.seconds == pytest.approx(sum(backoffs(3)))  # attempts of 0 s: no reset
    joins = health_checks(LIMITS.max_restarts + 1)
    assert slow.seconds == pytest.approx(slowest_loop(LIMITS) + 3 * 1.0 + joins)
    _, slow = bounds(load_spec("resilient"), {**params, "backoff_reset": attempt + 1}, LIMITS)
    assert slow.seconds == pytest.approx(slowest_loop(LIMITS) + sum(backoffs(3)) + joins)


@pytest.mark.parametrize("restarts", [1, 2, 4])
def test_a_restart_window_shorter_than_the_restarts_never_runs_out(restarts: int) -> None:
    # A constant backoff c: restart k is consumed at k*c, the failure after the last allowed one
    # comes at R*c, and the first restart (at 0) is still inside the window only if W > R*c.
    c = 2.0
    params = {"backoff_initial": c, "backoff_factor": 1, "backoff_jitter": 0}
    limits = Limits(max_restarts=restarts)
    spec = load_spec("resilient")
    fast, _ = bounds(spec, {**params, "restart_window": restarts * c + 0.5}, limits)
    assert (fast.restarts, fast.seconds) == (restarts, pytest.approx(restarts * c))
    fast, _ = bounds(spec, {**params, "restart_window": restarts * c - 0.5}, limits)
    assert fast.restarts is None and fast.seconds is None and fast.final_state is None
    assert fast.outcome.startswith("never gives up")
    assert fast.restarts_made > 10 * restarts  # it went on well past max_restarts


def test_the_slowest_loop_outlasts_a_window_the_fastest_does_not() -> None:
    params = {"restart_window": "5m"}
    fast, slow = bounds(load_spec("resilient"), params, Limits(max_restarts=3))
    assert fast.seconds == pytest.approx(sum(backoffs(3)) * 0.9)  # all within 5 minutes
    assert slow.seconds is None  # each restart takes a 10-minute rendezvous: the window renews


def test_a_no_retry_exit_code_gives_up_at_once_with_its_exit_code() -> None:
    # The crash loop's workers exit with 1.
    fast, slow = bounds(load_spec("resilient"), {"no_retry_exit_codes": "1"}, LIMITS)
    assert (fast.restarts, fast.seconds, fast.exit_code) == (0, 0.0, 93)
    one_attempt = (LIMITS.monitor_interval + LIMITS.stop_timeout + LIMITS.rendezvous_timeout
                   + health_checks(1))
    assert (slow.restarts, slow.seconds) == (0, pytest.approx(one_attempt))
    assert "exit code 93" in slow.outcome
    fast, _ = bounds(load_spec("resilient"), {"no_retry_exit_codes": "2,3"}, LIMITS)
    assert (fast.restarts, fast.exit_code) == (3, None)


def test_declared_action_budgets_count_in_the_slowest_loop() -> None:
    text = load_spec("resilient").path
    with open(text) as f:
        source = f.read()
    budgeted = source.replace("    set_exit_code: no_requeue_exit_code\n",
                              "    set_exit_code: no_requeue_exit_code\n    timeout: 2.5s\n")
    assert budgeted != source
    spec = parse_spec(budgeted)
    fast, slow = bounds(spec, {"no_retry_exit_codes": "1"}, LIMITS)
    assert fast.seconds == 0.0
    one_attempt = (LIMITS.monitor_interval + LIMITS.stop_timeout + LIMITS.rendezvous_timeout
                   + health_checks(1))
    assert slow.seconds == pytest.approx(one_attempt + 2.5)
    assert slow.spent["action no_requeue"] == 2.5


def test_health_checks_are_never_run_and_count_their_budget_when_they_have_work(
        tmp_path: Any) -> None:
    marker = tmp_path / "ran"
    params = {"health_command": f"touch {marker}", "health_disk_paths": str(tmp_path),
              "health_command_timeout": "45s", "backoff_jitter": "0"}
    fast, slow = bounds(load_spec("resilient"), params, LIMITS)
    assert not marker.exists()  # check --bounds never runs a user's command
    assert fast.seconds == pytest.approx(sum(backoffs(3)))
    joins = LIMITS.max_restarts + 1
    expected = health_checks(joins, {**params, "health_command_timeout": 45.0}, busy=True)
    assert slow.spent["health checks"] == pytest.approx(expected) == joins * (10 + 10 + 45 + 10)
    assert slow.seconds == pytest.approx(slowest_loop(LIMITS) + sum(backoffs(3)) + expected)


FOREVER = """\
name: forever
description: Restarts for ever, on purpose.
restart_forever: true
states:
  INIT: {initial: true}
  HEALTHY: {}
  UNHEALTHY: {}
  STOPPED: {}
  SUCCEEDED: {final: true}
  FAILED: {final: true}
  UNKNOWN: {final: true}
transitions:
  - {trigger: start, source: INIT, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}
  - {trigger: failed, source: HEALTHY, dest: UNHEALTHY}
  - {trigger: unhealthy, source: HEALTHY, dest: FAILED, actions: [stop_workers]}
  - {trigger: always, source: UNHEALTHY, dest: STOPPED, actions: [stop_workers]}
  - {trigger: always, source: STOPPED, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: healthy, source: HEALTHY, dest: HEALTHY}
  - {trigger: [unknown, init, stopped], source: HEALTHY, dest: UNKNOWN,
     after: [raise_invalid_state]}
"""


def test_a_spec_that_restarts_for_ever_never_gives_up_and_the_run_still_ends() -> None:
    fast, slow = bounds(parse_spec(FOREVER), None, Limits(max_restarts=3))
    for b in (fast, slow):
        assert b.restarts is None and b.seconds is None, b
        assert b.restarts_made == 0  # never counted against max_restarts
    text = format_bounds(parse_spec(FOREVER), [fast, slow], Limits(max_restarts=3))
    assert "no limit" in text and "never gives up" in text


def test_the_table_shows_the_limits_the_parameters_and_each_run() -> None:
    spec = load_spec("resilient")
    params = {"backoff_max": "90s", "restart_window": "inf"}
    found = bounds(spec, params, LIMITS)
    text = format_bounds(spec, found, LIMITS, params)
    head, _, table = text.partition("\n\n")
    assert all(len(line) <= 100 for line in head.splitlines()), head
    head = " ".join(head.split())  # wrapped at 100 columns
    for shown in ("(500ms)", "each rendezvous 2m", "each stop 7s", "exit barrier 40s",
                  "backoff_max=90s", "backoff_reset=10m", "restart_window=inf",
                  "no_retry_exit_codes=[]", "backoff_jitter=0.1"):
        assert shown in head, (shown, head)
    rows = table.splitlines()
    assert rows[0].split()[:2] == ["scenario", "restarts"]
    for row, b in zip(rows[1:], found, strict=True):
        assert row.split()[:2] == [b.scenario, "3"]
        assert format_duration(b.seconds) in row
    data = bounds_json(spec, found, LIMITS, params)
    json.dumps(data, allow_nan=False)  # valid JSON: no infinity anywhere
    assert data["params"]["restart_window"] == "inf" and data["params"]["backoff_max"] == "90s"
    shown = [s["gives_up_after"] for s in data["scenarios"]]
    assert shown == pytest.approx([b.seconds for b in found])


def test_bounds_never_import_torch() -> None:
    import subprocess

    code = ("import sys; from fsm_agent import load_spec;"
            " from fsm_agent._core._bounds import bounds;"
            "bounds(load_spec('resilient')); bounds(load_spec('torchelastic'));"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"


# -- fsm-agent check --bounds ----------------------------------------------------------------


def check_json(capsys: pytest.CaptureFixture[str], *argv: str, rc: int = 0) -> dict[str, Any]:
    assert main(["check", "--bounds", *argv, "--format", "json"]) == rc
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)  # type: ignore[no-any-return]


def test_check_bounds_uses_torchruns_defaults_unless_told(
        capsys: pytest.CaptureFixture[str]) -> None:
    [entry] = check_json(capsys, "torchrun")["specs"]
    # torchrun's defaults: --max-restarts 0, --monitor-interval 0.1, join timeout 600 s, 30 s
    assert entry["bounds"]["limits"] == {"max_restarts": 0, "monitor_interval": 0.1,
                                         "rendezvous_timeout": 600.0, "stop_timeout": 30.0,
                                         "exit_barrier_timeout": 300.0}
    slow = entry["bounds"]["scenarios"][1]
    assert (slow["restarts"], slow["gives_up_after"]) == (0, pytest.approx(0.1 + 30 + 600))


def test_check_bounds_flags_set_the_limits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["torchelastic", "--max-restarts", "2", "--monitor-interval", "1", "--rdzv-timeout",
            "1m", "--stop-timeout", "5s", "--exit-barrier-timeout", "500ms"]
    [entry] = check_json(capsys, *argv)["specs"]
    limits = Limits(max_restarts=2, monitor_interval=1.0, rendezvous_timeout=60.0,
                    stop_timeout=5.0, exit_barrier_timeout=0.5)
    expected = slowest_loop(limits) + 0.5
    fast, slow = entry["bounds"]["scenarios"]
    assert (fast["gives_up_after"], slow["gives_up_after"]) == (0.0, pytest.approx(expected))
    assert main(["check", "--bounds", *argv]) == 0
    out = capsys.readouterr().out
    assert f"slowest   2         {format_duration(expected)}" in out, out


def test_check_bounds_with_parameters_and_a_window_that_never_runs_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a window that never runs out breaks the rule restarts-give-up: the check exits 1
    data = check_json(capsys, "resilient", "--max-restarts", "3", "--spec-param",
                      "restart_window=5m", rc=1)
    fast, slow = data["specs"][0]["bounds"]["scenarios"]
    assert fast["gives_up_after"] == pytest.approx(sum(backoffs(3)) * 0.9)
    assert slow["gives_up_after"] is None and slow["restarts"] is None
    assert data["specs"][0]["params"]["restart_window"] == "5m"
    failed = [f["rule"] for f in data["specs"][0]["timeouts"] if f["ok"] is False]
    assert failed == ["restarts-give-up"]


@pytest.mark.parametrize(("argv", "wanted"), [
    (["--max-restarts", "3"], "--max-restarts goes with --bounds"),
    (["--bounds", "--max-restarts", "-1"], "argument --max-restarts"),
    (["--bounds", "--monitor-interval", "0"], "more than 0 seconds"),
    (["--bounds", "--rdzv-timeout", "inf"], "finite"),
    (["--bounds", "--stop-timeout", "soon"], "expected a duration"),
])
def test_check_bounds_bad_limits_are_usage_errors(argv: list[str], wanted: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "resilient", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and wanted in err, err


def test_check_bounds_of_a_bad_spec_reports_its_problems(
        capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(FOREVER.replace("restart_forever: true\n", ""))
    assert main(["check", "--bounds", "torchrun", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert "slowest" in out and "bad.yaml" in err and "restart" in err
