"""The restart-policy constructs of the spec format, run by the engine in virtual time.

Parameters, timers and backoff, sliding restart windows, failure matchers, the failure-policy
table, states that report another WorkerState and external triggers (crash-loop bounds: in
test_bounds.py).
Expected values are worked out here from the parameters, not read back from the engine.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Lifecycle, LifecycleError, SpecError, Step, VirtualClock, parse_spec
from fsm_agent._core._params import parse_text
from fsm_agent.testing import RecordingDriver, make_result

NO_JITTER = {"backoff_jitter": 0}


def _resilient(results: list[Any], clock: VirtualClock, **kw: Any) -> tuple[Lifecycle, list[Step]]:
    steps: list[Step] = []
    params = {**NO_JITTER, **kw.pop("params", {})}
    lc = Lifecycle("resilient", RecordingDriver(results), clock=clock, params=params,
                   listeners=[steps.append], rng=random.Random(0), **kw)
    return lc, steps


@pytest.mark.parametrize(("text", "value"), [("[3,4]", (3, 4)), ("3,4", (3, 4)), ("[]", ()),
                                             ("7", (7,)), (" [ 3 , 4 ] ", (3, 4))])
def test_int_lists_from_the_command_line(text: str, value: tuple[int, ...]) -> None:
    assert parse_text("int_list", text) == value


def test_parameters_are_set_checked_and_located() -> None:
    lc = Lifecycle("resilient", RecordingDriver([]), params={"backoff_max": "90s",
                                                              "no_retry_exit_codes": "3,4"})
    assert lc.params["backoff_max"] == 90.0
    assert lc.params["no_retry_exit_codes"] == (3, 4)
    assert lc.params["backoff_initial"] == 1.0  # the default
    with pytest.raises(SpecError) as info:
        Lifecycle("resilient", RecordingDriver([]), params={"backoff_jitter": 1.5, "nope": 1})
    messages = [str(p) for p in info.value.problems]
    assert any("backoff_jitter" in m and "above the maximum 1" in m and "resilient.yaml:" in m
               for m in messages), messages
    assert any("unknown parameter 'nope'" in m for m in messages), messages


def test_backoff_grows_by_its_factor_up_to_its_cap_and_the_group_reports_stopped() -> None:
    clock = VirtualClock()
    lc, steps = _resilient(["FAILED"] * 9, clock, max_restarts=8,
                           params={"backoff_initial": 2, "backoff_factor": 3, "backoff_max": 40})
    lc.start()
    gaps = []
    for _ in range(8):
        lc.observe(make_result("FAILED"))
        assert lc.state_name == "BACKOFF"
        assert lc.state.name == "STOPPED"  # what torch and the metrics see
        gaps.append(lc.deadline - clock.now())  # type: ignore[operator]
        clock.sleep(gaps[-1] - 0.001)
        assert not lc.poll_timer()  # not yet
        clock.sleep(0.001)
        assert lc.poll_timer()
        assert lc.state_name == "HEALTHY"
    assert gaps == pytest.approx([2, 6, 18, 40, 40, 40, 40, 40])
    assert [s.timer for s in steps if s.dest == "BACKOFF"] == pytest.approx(gaps)
    assert {s.rule for s in steps if s.dest == "BACKOFF"} == {"retry"}


def test_run_waits_out_the_backoff_in_virtual_time() -> None:
    clock = VirtualClock()
    lc, _ = _resilient(["FAILED", "FAILED", "FAILED", "SUCCEEDED"], clock, max_restarts=3)
    assert lc.run(0.5).state.name == "SUCCEEDED"
    # a tick, a 1 s backoff, a tick, 2 s, a tick, 4 s, the tick that sees success
    assert clock.slept == pytest.approx([0.5, 1, 0.5, 2, 0.5, 4, 0.5])


def test_backoff_starts_again_after_a_long_healthy_attempt() -> None:
    clock = VirtualClock()
    lc, _ = _resilient([], clock, max_restarts=5, params={"backoff_reset": "1m"})
    lc.start()
    delays = []
    for healthy_for in (0, 0, 0, 61, 0):
        clock.advance(healthy_for)
        lc.observe(make_result("FAILED"))
        delays.append(lc.deadline - clock.now())  # type: ignore[operator]
        clock.sleep(delays[-1])
        assert lc.poll_timer()
    assert delays == pytest.approx([1, 2, 4, 1, 2])


def test_jitter_stays_within_its_fraction() -> None:
    for seed in range(30):
        clock = VirtualClock()
        lc = Lifecycle("resilient", RecordingDriver([]), clock=clock, rng=random.Random(seed),
                       params={"backoff_initial": 10, "backoff_jitter": 0.2})
        lc.start()
        lc.observe(make_result("FAILED"))
        assert 8 <= lc.deadline - clock.now() <= 12  # type: ignore[operator]


def test_no_retry_exit_codes_give_up_at_once_without_counting() -> None:
    clock = VirtualClock()
    failure = make_result("FAILED", ranks=(0, 1), exitcode={0: 3, 1: 4})
    lc, steps = _resilient([failure], clock, params={"no_retry_exit_codes": [3, 4]})
    assert lc.run(0.1).state.name == "FAILED"
    assert lc.restart_count == 0
    assert lc.exit_code == 93
    assert steps[-1].rule == "no_retry"
    # one rank with another code: an ordinary failure, restarted
    mixed = make_result("FAILED", ranks=(0, 1), exitcode={0: 3, 1: 1})
    lc, steps = _resilient([mixed, "SUCCEEDED"], VirtualClock(),
                           params={"no_retry_exit_codes": [3, 4]})
    assert lc.run(0.1).state.name == "SUCCEEDED"
    assert lc.restart_count == 1 and lc.exit_code is None


def test_a_plain_give_up_sets_no_exit_code_and_reports_failed() -> None:
    lc, steps = _resilient(["UNHEALTHY", "FAILED"], VirtualClock(), max_restarts=1)
    assert lc.run(0.1).state.name == "FAILED"
    assert lc.exit_code is None and lc.restart_count == 1
    assert steps[-1].rule == "retry" and steps[-1].guards[-1] == ("has_restarts_left", False)


def test_the_budget_window_forgets_old_restarts() -> None:
    clock = VirtualClock()
    lc, _ = _resilient([], clock, max_restarts=2, params={
        "restart_window": "1m", "backoff_initial": 1, "backoff_factor": 1})
    lc.start()
    for i in range(6):  # a failure every 41 s: never more than 2 restarts in any minute
        clock.advance(40)
        lc.observe(make_result("FAILED"))
        assert lc.state_name == "BACKOFF", lc.restart_count
        # after the first, this restart and the one 41 s ago fill the window until one leaves it
        assert lc.remaining_restarts == (1 if i == 0 else 0)
        clock.sleep(1)
        assert lc.poll_timer()
    assert lc.restart_count == 6
    clock.advance(5)
    lc.observe(make_result("FAILED"))  # restarts 6 s and 47 s ago: the minute's budget is spent
    assert lc.state_name == "FAILED"
    assert lc.restart_count == 6


def test_withdrawn_restarts_stay_withdrawn_under_a_window() -> None:
    # torch's agent zeroes its restarts when a worker is stuck in uninterruptible sleep; the
    # torch driver withdraws them (fsm_agent.torch._driver): a window must not give them back
    clock = VirtualClock()
    lc, _ = _resilient([], clock, max_restarts=2, params={
        "restart_window": "1m", "backoff_initial": 1, "backoff_factor": 1})
    lc.start()
    lc.context.withdraw_restarts()
    clock.advance(600)  # long past any window
    lc.observe(make_result("FAILED"))
    assert lc.state_name == "FAILED" and lc.restart_count == 0


MATCHERS = """
name: matchers
description: One observed failure, classified by a parameterised guard.
params:
  quick: {type: duration, default: 10s}
guards:
  code_all: {exit_code_in: [3, 4]}
  code_any: {exit_code_in: {codes: [3], ranks: any}}
  not_code: {exit_code_not_in: [1]}
  killed: {signal_in: [KILL, SIGSEGV]}
  oom: {error_type_in: [torch.OutOfMemoryError]}
  two_ranks: {failed_ranks_at_least: 2}
  early: {attempt_shorter_than: quick}
  looping: {consecutive_failures_at_least: {count: 2, min_uptime: quick}}
  busy: {restarts_in_window_at_least: {count: 1, window: 1m}}
  both: {all_of: [code_all, two_ranks]}
  either: {any_of: [killed, oom]}
  calm: {not: early}
triggers: [probe]
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
  - {trigger: [healthy, failed], source: HEALTHY, dest: HEALTHY}
  - {trigger: unhealthy, source: HEALTHY, dest: UNHEALTHY}
  - {trigger: always, source: UNHEALTHY, dest: HEALTHY}
  - {trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}
  - {trigger: [unknown, init, stopped], source: HEALTHY, dest: UNKNOWN}
  - {trigger: probe, source: HEALTHY, dest: STOPPED, actions: [consume_restart, stop_workers],
     guards: [has_restarts_left]}
  - {trigger: probe, source: HEALTHY, dest: FAILED, unless: [has_restarts_left]}
  - {trigger: always, source: STOPPED, dest: HEALTHY, actions: [rendezvous, start_workers]}
"""


def _classify(result: Any, *, clock: VirtualClock | None = None,
              before: int = 0) -> dict[str, bool]:
    spec = parse_spec(MATCHERS)
    clock = clock or VirtualClock()
    lc = Lifecycle(spec, RecordingDriver([]), clock=clock, max_restarts=10)
    lc.start()
    for _ in range(before):  # earlier attempts: each fails at once and is restarted
        lc.observe(make_result("FAILED"))
        lc.fire("probe")
    lc.observe(result)
    ctx = lc.context
    ctx.memo.clear()
    return {g.name: ctx.check(g.name) for g in spec.guard_defs}


def test_failure_matchers() -> None:
    plain = _classify(make_result("FAILED", exitcode=3))
    assert plain["code_all"] and plain["code_any"] and plain["not_code"]
    assert not plain["killed"] and not plain["two_ranks"] and not plain["both"]
    two = _classify(make_result("FAILED", ranks=(0, 1), exitcode={0: 3, 1: 1}))
    assert not two["code_all"] and two["code_any"] and not two["not_code"] and two["two_ranks"]
    killed = _classify(make_result("FAILED", exitcode=-9))
    assert killed["killed"] and killed["either"] and not killed["code_all"]
    oom = _classify(make_result("FAILED", error="torch.OutOfMemoryError: CUDA out of memory"))
    assert oom["oom"] and oom["either"] and not oom["killed"]
    nothing = _classify(make_result("HEALTHY"))
    assert not any(nothing[g] for g in ("code_all", "code_any", "not_code", "killed", "oom"))


def test_ranks_torch_stopped_are_not_failed_ranks() -> None:
    # rank 0 exited 3; torch stopped rank 1 with SIGTERM and lists it too (exit code -15)
    stopped = _classify(make_result("FAILED", ranks=(0, 1), exitcode={0: 3, 1: -15}))
    assert stopped["code_all"] and stopped["code_any"] and not stopped["two_ranks"]
    assert not stopped["killed"]
    # every listed rank ended by SIGTERM: something else sent it, those are the failures
    sigterm = _classify(make_result("FAILED", ranks=(0, 1), exitcode={0: -15, 1: -15}))
    assert not sigterm["code_any"] and sigterm["two_ranks"] and sigterm["not_code"]


def test_time_and_history_matchers() -> None:
    clock = VirtualClock()
    first = _classify(make_result("FAILED"), clock=clock)
    assert first["early"] and not first["calm"] and not first["looping"] and not first["busy"]
    looping = _classify(make_result("FAILED"), before=2)
    assert looping["looping"] and looping["busy"]


def test_an_attempt_that_ran_long_is_not_early() -> None:
    spec = parse_spec(MATCHERS)
    clock = VirtualClock()
    lc = Lifecycle(spec, RecordingDriver([]), clock=clock)
    lc.start()
    clock.advance(11)
    lc.observe(make_result("FAILED"))
    assert not lc.context.check("early") and lc.context.check("calm")


def test_external_triggers_from_the_wait() -> None:
    spec = parse_spec(MATCHERS)
    events = iter(["probe", None, None])
    lc = Lifecycle(spec, RecordingDriver(["HEALTHY", "SUCCEEDED"]), clock=VirtualClock(),
                   max_restarts=1)
    assert lc.run(0.1, sleep=lambda s: next(events)).state.name == "SUCCEEDED"
    assert lc.restart_count == 1  # the probe restarted the group
    bad = Lifecycle(spec, RecordingDriver([]), clock=VirtualClock())
    with pytest.raises(LifecycleError, match="not one of the spec's own triggers"):
        bad.run(0.1, sleep=lambda s: "nonsense")


def test_a_waiting_state_is_not_monitored() -> None:
    # In BACKOFF the workers are stopped: the agent waits for the timer, it does not ask.
    clock = VirtualClock()
    driver = RecordingDriver(["FAILED", "SUCCEEDED"])
    lc = Lifecycle("resilient", driver, clock=clock, params=NO_JITTER)
    lc.run(0.25)
    monitors = [c for c in driver.calls if c[0] == "monitor"]
    assert len(monitors) == 2
    assert clock.slept == pytest.approx([0.25, 1.0, 0.25])


# -- which rule shadows which: each guard kind's own knowledge (Kind.implies) ---------------

_IMPLIED = Path(__file__).parent / "specs" / "bad" / "policy_rule_implied.yaml"


@pytest.mark.parametrize(("first", "second", "shadowed"), [
    ("{exit_code_in: [3, 4]}", "{exit_code_in: [3]}", True),
    ("{exit_code_in: [3]}", "{exit_code_in: [3, 4]}", False),
    ("{exit_code_in: {codes: [3], ranks: all}}", "{exit_code_in: {codes: [3], ranks: any}}",
     False),
    ("{signal_in: [SIGKILL, SIGSEGV]}", "{signal_in: [SIGKILL]}", True),
    ("{error_type_in: [ValueError]}", "{error_type_in: [ValueError, KeyError]}", False),
    ("{error_type_in: [ValueError, KeyError]}", "{error_type_in: [KeyError]}", True),
    ("{failed_ranks_at_least: 2}", "{failed_ranks_at_least: 3}", True),
    ("{failed_ranks_at_least: 3}", "{failed_ranks_at_least: 2}", False),
    ("{attempt_shorter_than: 10s}", "{attempt_shorter_than: 5s}", True),
    ("{attempt_shorter_than: 5s}", "{attempt_shorter_than: 10s}", False),
    ("{restarts_in_window_at_least: {count: 2, window: 10m}}",
     "{restarts_in_window_at_least: {count: 3, window: 5m}}", True),
    ("{restarts_in_window_at_least: {count: 2, window: 5m}}",
     "{restarts_in_window_at_least: {count: 3, window: 10m}}", False),
    ("{consecutive_failures_at_least: {count: 2, min_uptime: 1m}}",
     "{consecutive_failures_at_least: {count: 2, min_uptime: 30s}}", True),
    ("{own_failures_at_least: 2}", "{own_failures_at_least: 3}", True),
    ("{own_failures_at_least: 3}", "{own_failures_at_least: 2}", False),
    ("{own_failures_at_least: 0}", "{own_failures_at_least: 3}", False),  # 0: never, shadows none
    ("{exit_code_not_in: [3]}", "{exit_code_not_in: [3]}", False),  # no knowledge: silent
])
def test_a_rule_implied_by_an_earlier_one_is_reported(first: str, second: str,
                                                      shadowed: bool) -> None:
    text = _IMPLIED.read_text().replace("bad_code: {exit_code_in: codes}", f"bad_code: {first}")
    text = text.replace("code3: {exit_code_in: [3]}", f"code3: {second}")
    try:
        parse_spec(text)
    except SpecError as e:
        assert shadowed and "rule 'again' can never match" in str(e), str(e)
    else:
        assert not shadowed, f"{second} after {first}: not reported"
