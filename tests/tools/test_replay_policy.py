"""Traces of the restart-policy constructs: the rule that matched, the timers set, the parameters
in force and budget windows, recorded by the engine in virtual time and replayed; each kind of
tampering is rejected with a plain message."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Lifecycle, Spec, SpecError, VirtualClock, load_spec
from fsm_agent.cli.replay import main as replay_main
from fsm_agent.testing import RecordingDriver, make_result
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._replay import replay
from fsm_agent.trace._writer import JsonlTraceWriter

from ._helpers import ROOT, lines, write_lines

POLICY_SPEC = ROOT / "tests" / "specs" / "good" / "policy.yaml"


def record(path: Path, script: Sequence[Any], *, spec: str | Path = "resilient",
           params: Mapping[str, Any] | None = None, max_restarts: int = 3,
           monitor_interval: float = 1.0, seed: int = 0) -> Lifecycle:
    """Run ``spec`` on a RecordingDriver in virtual time, traced into ``path``."""
    lc = Lifecycle(load_spec(spec), RecordingDriver(script), clock=VirtualClock(),
                   rng=random.Random(seed), params=params, max_restarts=max_restarts)
    with JsonlTraceWriter(path, spec=lc.spec, params=lc.params, group_rank=0) as writer:
        lc.add_listener(writer)
        lc.run(monitor_interval)
    return lc


def replayed(path: Path, spec: str | Path | Spec = "resilient"):
    (trace,) = read_trace(path)
    return replay(load_spec(spec), trace)


def steps(path: Path) -> list[dict[str, Any]]:
    return [r for r in lines(path) if r["kind"] == "step"]


def mutate(path: Path, change: Callable[[list[dict[str, Any]]], None]) -> Path:
    records = lines(path)
    change(records)
    return write_lines(path.with_name("mutated.jsonl"), records)


def step_where(records: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    return next(r for r in records if r["kind"] == "step"
                and all(r.get(k) == v for k, v in match.items()))


def test_crash_loop_records_rules_and_the_backoff_sequence(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["HEALTHY", "FAILED", "FAILED", "FAILED", "FAILED"],
           params={"backoff_jitter": 0, "backoff_initial": "2s", "backoff_factor": 3,
                   "backoff_max": "10s"})
    header = lines(path)[0]
    # Every parameter in force, in the spec's syntax: the defaults and the three set.
    assert header["params"] == {"no_retry_exit_codes": "[]", "no_requeue_exit_code": "93",
                                "backoff_initial": "2s", "backoff_factor": "3",
                                "backoff_max": "10s", "backoff_jitter": "0",
                                "backoff_reset": "10m", "restart_window": "inf",
                                "hang_timeout": "25m", "health_disk_paths": "[]",
                                "health_min_free_disk": "1GB", "health_command": "",
                                "health_command_timeout": "60s", "unhealthy_exit_code": "75",
                                "drain_on": "[SIGTERM]", "drain_signal": "SIGTERM",
                                "drain_timeout": "25s", "preempted_exit_code": "0",
                                "checkpoint_path": "", "no_progress_restarts": "3",
                                "infra_exit_codes": "[]", "infra_restarts": "3",
                                "backoff_reset_on_progress": "false",
                                "stable_slots": "true", "node_replacements": "inf",
                                "clean_slate_timeout": "10s", "quarantine_after": "3"}
    recs = steps(path)
    failed = [r for r in recs if r["trigger"] == "failed"]
    assert [(r["dest"], r["rule"]) for r in failed] == [("BACKOFF", "retry")] * 3 + [
        ("FAILED", "retry")]  # the fourth failure: budget spent, the same rule gives up
    # 2 s, then x3, capped at 10 s.
    assert [r["timer"] for r in failed[:3]] == [2.0, 6.0, 10.0]
    assert failed[3]["timer"] is None
    assert all(r["rule"] is None for r in recs if r["trigger"] != "failed")
    assert all(r["timer"] is None for r in recs if r["dest"] != "BACKOFF")
    res = replayed(path)
    assert res.ok, res.divergence
    assert res.params["backoff_initial"] == "2s"


def test_a_jittered_backoff_replays(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["FAILED"] * 6, max_restarts=5, seed=7)  # the preset's jitter 0.1
    timers = [r["timer"] for r in steps(path) if r["dest"] == "BACKOFF"]
    assert len(timers) == 5 and timers != [1.0, 2.0, 4.0, 8.0, 16.0]
    assert replayed(path).ok


def test_no_retry_rule_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["HEALTHY", make_result("FAILED", exitcode=3)],
           params={"no_retry_exit_codes": [3, 4]})
    last = steps(path)[-1]
    assert (last["dest"], last["rule"], last["timer"]) == ("FAILED", "no_retry", None)
    assert lines(path)[0]["params"]["no_retry_exit_codes"] == "[3, 4]"
    assert replayed(path).ok


def test_backoff_reset_after_a_long_healthy_run_replays(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # Ticks of 20 s: the third attempt runs 80 s, longer than backoff_reset (1m).
    script = ["FAILED", "FAILED", "HEALTHY", "HEALTHY", "HEALTHY", "FAILED", "FAILED", "SUCCEEDED"]
    record(path, script, max_restarts=4, monitor_interval=20.0,
           params={"backoff_jitter": 0, "backoff_reset": "1m"})
    timers = [r["timer"] for r in steps(path) if r["dest"] == "BACKOFF"]
    assert timers == [1.0, 2.0, 1.0, 2.0]
    assert replayed(path).ok


def test_restarts_leaving_the_window_give_the_budget_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # One restart allowed per 30 s; ticks of 20 s: by the second failure the first restart has
    # left the window.
    record(path, ["FAILED", "HEALTHY", "HEALTHY", "FAILED", "SUCCEEDED"], max_restarts=1,
           monitor_interval=20.0, params={"backoff_jitter": 0, "restart_window": "30s"})
    recs = steps(path)
    remaining = [r["remaining_restarts"] for r in recs]
    assert 0 in remaining and remaining.index(0) < len(remaining) - 1
    assert any(a == 0 and b == 1 for a, b in itertools.pairwise(remaining))
    assert recs[-1]["dest"] == "SUCCEEDED"
    assert replayed(path).ok
    # Against the header's window the budget may come back; with the whole job as the window
    # (what the spec says without the parameter) it may not.
    bad = mutate(path, lambda rs: rs[0]["params"].update(restart_window="inf"))
    res = replayed(bad)
    assert not res.ok
    # (the resilient budget is the job's: one agent's trace bounds it from above only)
    assert ("remaining_restarts went from 0 to 1; a budget of the job never gives restarts back "
            "without a window") in str(res.divergence)
    # Within the window the budget still cannot exceed --max-restarts (here 1).
    bad = mutate(path, lambda rs: step_where(rs, trigger="healthy").update(
        remaining_restarts=2))
    assert ("remaining_restarts went from 0 to 2; with 0 restart(s) consumed in a budget window "
            "it must be between 0 and 1") in str(replayed(bad).divergence)


def test_a_fixed_timer_is_checked_against_the_parameter_in_force(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["FAILED", "SUCCEEDED"], spec=POLICY_SPEC, params={"pause": "2500ms"})
    (entry,) = [r for r in steps(path) if r["dest"] == "BACKOFF"]
    assert entry["timer"] == 2.5
    assert replayed(path, POLICY_SPEC).ok
    # The header says the run used the default: the timer it recorded does not fit that.
    bad = mutate(path, lambda rs: rs[0]["params"].update(pause="1s"))
    res = replayed(bad, POLICY_SPEC)
    assert not res.ok
    assert res.divergence is not None
    assert res.divergence.message.endswith(
        "entering BACKOFF set a timer of 2.5 s, but its timeout is pause = 1 s (the value in "
        "force)")


def _crash_loop(tmp_path: Path, **params: Any) -> Path:
    path = tmp_path / "t.jsonl"
    record(path, ["FAILED"] * 4, params={"backoff_jitter": 0, **params})
    return path


def test_wrong_rule_is_rejected(tmp_path: Path) -> None:
    path = _crash_loop(tmp_path)
    bad = mutate(path, lambda rs: step_where(rs, trigger="failed").update(rule="no_retry"))
    res = replayed(bad)
    assert not res.ok and res.divergence is not None
    rule_line = load_spec("resilient").outgoing("HEALTHY", "failed")[-1].line
    assert res.divergence.message.endswith(
        "the trace says rule 'no_retry' decided, but with peer_lost=False, no_retry_exit=False, "
        "quarantine_due=False, stalled=False, "
        f"infra_exit=False, has_restarts_left=True the spec's rule 'retry' (line {rule_line}) "
        "decides")
    # A rule named on a plain transition, and none named on a rule's.
    bad = mutate(path, lambda rs: step_where(rs, trigger="start").update(rule="retry"))
    assert "the spec takes a plain transition" in str(replayed(bad).divergence)
    bad = mutate(path, lambda rs: step_where(rs, trigger="failed").update(rule=None))
    assert "the trace names no rule, but" in str(replayed(bad).divergence)


def test_wrong_backoff_is_rejected(tmp_path: Path) -> None:
    path = _crash_loop(tmp_path)
    records = steps(path)
    second = [r for r in records if r["dest"] == "BACKOFF"][1]
    assert second["timer"] == 2.0

    def change(rs: list[dict[str, Any]]) -> None:
        step_where(rs, seq=second["seq"])["timer"] = 3.0

    res = replayed(mutate(path, change))
    assert not res.ok and res.divergence is not None
    assert res.divergence.message.endswith(
        "entering BACKOFF set a backoff of 3 s, but the backoff allows 2 s (2nd backoff in a "
        "row) or 1 s (after a healthy attempt of 600 s or more resets it) (initial "
        "backoff_initial = 1 s, factor backoff_factor = 2, max backoff_max = 60 s, jitter "
        "backoff_jitter = 0)")


def test_a_backoff_outside_the_jitter_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["FAILED"] * 2, max_restarts=1, params={"backoff_reset": "inf"})
    first = step_where(lines(path), dest="BACKOFF")
    assert 0.9 <= first["timer"] <= 1.1
    for wrong in (0.85, 1.15):
        bad = mutate(path, lambda rs, w=wrong: step_where(rs, dest="BACKOFF").update(timer=w))
        assert "the backoff allows 0.9 to 1.1 s (1st backoff in a row)" in str(
            replayed(bad).divergence)


def test_timers_recorded_where_none_is_set_or_missing_are_rejected(tmp_path: Path) -> None:
    path = _crash_loop(tmp_path)
    bad = mutate(path, lambda rs: step_where(rs, dest="BACKOFF").update(timer=None))
    assert "entering BACKOFF sets its timer (backoff(" in str(replayed(bad).divergence)
    assert "but the trace recorded none" in str(replayed(bad).divergence)
    bad = mutate(path, lambda rs: step_where(rs, trigger="start").update(timer=5))
    assert str(replayed(bad).divergence).endswith(
        "the trace recorded a timer of 5 s entering HEALTHY, but HEALTHY has no timeout")


def test_timeout_from_a_state_without_a_timer_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["HEALTHY", "SUCCEEDED"])

    def change(rs: list[dict[str, Any]]) -> None:
        step_where(rs, trigger="healthy").update(trigger="timeout", guards=[], observed=None)

    res = replayed(mutate(path, change))
    assert not res.ok and res.divergence is not None
    assert res.divergence.step == 2
    assert res.divergence.message == (
        "step 2 (line 3): 'timeout' fired in HEALTHY, which has no timer (spec 'resilient' "
        "declares no timeout on it)")


def test_header_parameters_the_spec_cannot_take(tmp_path: Path) -> None:
    path = _crash_loop(tmp_path)
    bad = mutate(path, lambda rs: rs[0]["params"].update(backoff_max="soon"))
    res = replayed(bad)
    assert not res.ok and res.divergence is not None
    assert res.divergence.step == 0
    assert res.divergence.message.startswith(
        "the trace header's parameters do not fit spec 'resilient': bad value 'soon': expected "
        "a duration")
    # Parameters of another spec (replayed with --spec) are not this spec's business.
    other = mutate(path, lambda rs: rs[0]["params"].update(somebody_elses="1"))
    assert replayed(other).ok


def test_traces_without_rules_timers_or_params_still_replay(tmp_path: Path) -> None:
    path = _crash_loop(tmp_path)

    def strip(rs: list[dict[str, Any]]) -> None:
        del rs[0]["params"]
        for r in rs[1:]:
            r.pop("rule", None)
            r.pop("timer", None)

    assert replayed(mutate(path, strip)).ok


def test_replay_cli_prints_the_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    path = _crash_loop(tmp_path)
    bad = mutate(path, lambda rs: step_where(rs, trigger="failed").update(rule="no_retry"))
    assert replay_main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "diverges from spec 'resilient'" in out
    assert "the trace says rule 'no_retry' decided" in out
    assert replay_main([str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lifecycles"][0]["params"]["backoff_jitter"] == "0"


def test_the_writer_refuses_parameters_the_spec_does_not_have(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown parameter 'nope'"):
        JsonlTraceWriter(tmp_path / "t.jsonl", spec=load_spec("resilient"), params={"nope": 1})
    assert not (tmp_path / "t.jsonl").exists()


@pytest.fixture
def jobs(tmp_path: Path):
    """Real ``fsm-agent run`` jobs of the reliability tests' worker; fails on any leftover."""
    from fsm_test_procs import Jobs, jobs_fixture

    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=3, default_script=WORKER))


WORKER = ROOT / "tests" / "reliability" / "scripts" / "worker.py"


@pytest.mark.timeout(120)
def test_a_real_run_records_parameters_rules_and_backoffs_that_replay_checks(
        jobs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fsm-agent run --spec resilient --spec-param ... --trace``: rank 1 fails the first two
    attempts; the header has the parameters given, each failure names rule ``retry`` and a
    backoff of 0.2 s then 0.4 s (jitter 0), and the trace replays."""
    from fsm_test_procs import FAST

    trace = tmp_path / "trace.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST, "--max-restarts", "2",
                      "--spec", "resilient", "--spec-param", "backoff_initial=200ms",
                      "--spec-param", "backoff_jitter=0", "--trace", str(trace)],
                     env={"FAIL_RANK": "1", "FAIL_ATTEMPTS": "0,1", "FAIL_HOW": "exit:7"})
    assert job.wait(100) == 0, job.output
    header, *records = lines(trace)
    assert header["params"]["backoff_initial"] == "200ms"
    assert header["params"]["backoff_jitter"] == "0"
    assert header["params"]["backoff_max"] == "60s"  # the default, recorded too
    decided = [r for r in records if r.get("rule") is not None]
    assert [(r["dest"], r["rule"], r["timer"]) for r in decided] == [
        ("BACKOFF", "retry", 0.2), ("BACKOFF", "retry", 0.4)]
    assert [r["trigger"] for r in records if r["source"] == "BACKOFF"] == ["timeout"] * 2
    assert replay_main([str(trace)]) == 0, capsys.readouterr().out
    assert "parameters: " in capsys.readouterr().out


def test_replay_cli_takes_the_parameters_a_trace_does_not_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    record(path, ["FAILED", "SUCCEEDED"], spec=POLICY_SPEC, params={"pause": "2500ms"})
    bare = mutate(path, lambda rs: rs[0].pop("params"))
    # Without the header's values, the spec's default (1s) does not fit the 2.5 s timer ...
    assert replay_main([str(bare), "--spec", str(POLICY_SPEC)]) == 1
    assert "its timeout is pause = 1 s" in capsys.readouterr().out
    # ... with the value the run used, it does.
    assert replay_main([str(bare), "--spec", str(POLICY_SPEC), "--spec-param",
                        "pause=2.5s"]) == 0
    assert "parameters: codes=[3], pause=2.5s" in capsys.readouterr().out
