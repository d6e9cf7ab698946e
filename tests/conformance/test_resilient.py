"""The kit on the ``resilient`` preset: scripts with exit codes, signals, elapsed virtual time and
jitter draws; it accepts the preset and rejects every wrong supervisor of it."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent import Lifecycle
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    check_script,
    default_settings,
    run_conformance,
    run_script,
    trace_invariants,
)
from fsm_agent.testing._reference import (
    ConformanceTrace,
    Pending,
    Raised,
    Returned,
    reference_trace,
)
from fsm_agent.testing._strategies import RunConfig, Tick
from fsm_agent.torch import LifecycleAgentMixin

from . import resilient_mutants as mutants

pytestmark = pytest.mark.timeout(300)

SPECS = Path(__file__).resolve().parents[2] / "specs"

ACCEPT = settings(default_settings(60), database=None)
# Fixed seeds: a mutant that only shows at the edge of a window or of the reset needs a script
# whose times add up to it exactly, which a few hundred scripts usually (not always) contain.
REJECT = settings(default_settings(2_000), database=None)


class MixinResilient(LifecycleAgentMixin, SimpleElasticAgent):
    """torch's agent run by the resilient preset (the kit routes its clock and random source)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, lifecycle_spec="resilient", **kwargs)


@pytest.mark.parametrize(
    ("target", "spec"),
    [
        (Lifecycle, "resilient"),
        (mutants.good_resilient, "resilient"),  # a factory taking params, clock, rng
        (MixinResilient, "resilient"),  # parameters at their defaults: jitter 0.1, no window
        (Lifecycle, SPECS / "resilient.yaml"),  # the engine as the reference, parameters drawn
    ],
    ids=["lifecycle", "factory", "mixin-agent", "lifecycle-file"],
)
def test_kit_accepts_the_resilient_preset(target: object, spec: object) -> None:
    run_conformance(target, spec=spec, settings=ACCEPT, seed=0)


def test_an_unedited_copy_of_the_spec_is_accepted(tmp_path: Path) -> None:
    copy = tmp_path / "resilient_copy.yaml"
    copy.write_text((SPECS / "resilient.yaml").read_text())
    run_conformance(mutants.spec_factory(copy), spec="resilient", settings=ACCEPT, seed=0)


MUTANTS = [*mutants.SPEC_EDITS, *(m.__name__ for m in mutants.WRAPPER_MUTANTS)]


def test_there_are_the_wrong_supervisors_the_issue_names() -> None:
    # no backoff, backoff not capped, retries a no-retry code, counts a membership restart,
    # window off by one; and more
    assert {"NoBackoff", "BackoffNotCapped", "RetriesNoRetryCodes", "CountsMembershipRestarts",
            "window_off_by_one"} <= set(MUTANTS)
    assert len(MUTANTS) >= 10


_REJECTIONS: dict[str, str] = {}


@pytest.fixture
def rejection(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The counterexample the kit finds for a mutant (each searched for once per session)."""

    def find(name: str) -> str:
        if name not in _REJECTIONS:
            target = (mutants.spec_factory(mutants.edited_spec(tmp_path_factory.mktemp(name),
                                                               name))
                      if name in mutants.SPEC_EDITS else getattr(mutants, name))
            with pytest.raises(ConformanceFailure) as info:
                run_conformance(target, spec="resilient", settings=REJECT, seed=0)
            _REJECTIONS[name] = str(info.value)
        return _REJECTIONS[name]

    return find


@pytest.mark.parametrize("name", MUTANTS)
def test_kit_rejects_a_wrong_resilient_supervisor(name: str, rejection: Any) -> None:
    text = rejection(name)
    assert "does not conform to spec 'resilient'" in text
    assert "<-- differs" in text
    # Shrunk to a readable table: a start row and at most five ticks (then the script's end):
    # a window off by one may need a failure and the ticks until the window has passed (seen in
    # a loaded CI run: 5 ticks; 4 or fewer when quiet).
    rows = [line for line in text.splitlines() if re.match(r"^(start|\d+) +\|", line)]
    assert rows[0].startswith("start") and 2 <= len(rows) <= 7, text


def test_the_infra_counterexample_shows_the_user_budget_spent(rejection: Any) -> None:
    text = rejection("InfraSpendsUserBudget")
    # an infrastructure failure, and the user's restarts it must not have spent
    run = next(line for line in text.splitlines() if line.startswith("run:"))
    assert "infra_exit_codes=" in run, text
    # either the restart the infra budget pays is counted against the user's (one fewer
    # left), or, with none of the user's left, the wrong supervisor gives up where the spec
    # restarts (which one the search shrinks to depends on the order it draws in)
    differs = next(line for line in text.splitlines() if line.startswith("differs in:"))
    actual = next(line for line in text.splitlines() if line.startswith("actual outcome"))
    assert ("remaining restarts" in differs
            or ("outcome" in differs and actual.startswith("actual outcome:   return FAILED"))
            ), text


def test_the_no_backoff_counterexample_shows_the_missing_wait(rejection: Any) -> None:
    text = rejection("NoBackoff")
    row = next(line for line in text.splitlines() if line.startswith("1 "))
    expected, actual = row.split(" | ")[-2:]
    assert "FAILED" in row and "stop, sleep(" in expected and "stop, rendezvous" in actual


def test_the_window_counterexample_shows_the_edge_of_the_window(rejection: Any) -> None:
    text = rejection("window_off_by_one")
    assert "restart_window=" in text.splitlines()[1]
    # the restart counted exactly one window ago has left it: a restart is back, which shows
    # in the metric, or (when the shrinker ends the script there) in giving up or not
    differing = [line for line in text.splitlines() if line.endswith("<-- differs")]
    differs_in = text.split("differs in:")[1].splitlines()[0]
    assert differing, text
    assert "remaining restarts" in differs_in or "outcome" in differs_in, text
    assert any("remaining_restarts=" in line or "FAILED" in line for line in differing), text


def test_recorded_backoffs_are_the_waits_the_table_gives() -> None:
    # By hand from the README's resilient row: initial 1 s, factor 2, max 3 s, jitter 0.5; the first
    # backoff's draw is 0.0 (the shortest: 1 s * (1 - 0.5)), the second 0.5 (no jitter: 2 s),
    # the third is capped (min(3, 4) = 3 s; draw 0.75: * 1.25). The fourth attempt ran two
    # ticks and 600 s, longer than backoff_reset (10 s): the backoff starts again from 1 s.
    config = RunConfig(max_restarts=9, monitor_interval=0.25, params={
        "backoff_initial": 1.0, "backoff_factor": 2.0, "backoff_max": 3.0,
        "backoff_jitter": 0.5, "backoff_reset": 10.0})
    script = [Tick("FAILED", draw=0.0), Tick("UNHEALTHY"), Tick("FAILED", draw=0.75),
              Tick("HEALTHY", elapsed=600.0), Tick("FAILED")]
    trace = run_script(Lifecycle, config, script, spec="resilient")
    waits = [e[1] for e in trace.events if e[0] == "sleep" and e[1] != 0.25]
    assert waits == [0.5, 2.0, 3.75, 1.0]
    assert [e[0] for e in trace.events[:12]] == [
        "rendezvous", "start_workers", "sleep", "monitor", "put_metric", "put_metric",
        "stop_workers", "sleep", "rendezvous", "start_workers", "sleep", "monitor"]
    assert trace == reference_trace("resilient", config, script)


def test_no_retry_codes_give_up_at_once_with_the_no_requeue_code() -> None:
    params = {"no_retry_exit_codes": [3, 4], "no_requeue_exit_code": 42}
    config = RunConfig(max_restarts=3, params=params)
    # one rank's code is not listed (and one was killed by SIGKILL): retried, counted
    mixed = [Tick("FAILED", exitcodes=(3, 1)), Tick("FAILED", exitcodes=(-9,)),
             Tick("FAILED", exitcodes=(4, 3), errors=("ValueError",))]
    trace = check_script(Lifecycle, config, mixed, spec="resilient")
    assert isinstance(trace.outcome, Returned) and trace.outcome.state == "FAILED"
    assert trace.exit_code == 42 and trace.remaining_restarts == 1
    assert trace.outcome.failures == {0: (10_003, 4), 1: (20_003, 3)}
    assert not any(e[0] == "exit_barrier" for e in trace.events)


def test_membership_restarts_are_never_counted_and_windows_give_restarts_back() -> None:
    config = RunConfig(max_restarts=1, monitor_interval=4.0,
                       params={"restart_window": 10.0, "backoff_jitter": 0.0})
    # restart at t=4 (1 s backoff), nodes join at t=9, the window is over at t=14: the
    # remaining_restarts metric goes 1, 0, 0, 1, and the failure at t=18 restarts again
    script = [Tick("FAILED"), Tick("HEALTHY", nodes_waiting=1),
              Tick("HEALTHY", elapsed=1.0), Tick("FAILED")]
    trace = check_script(Lifecycle, config, script, spec="resilient")
    left = [e[2] for e in trace.events if e[0] == "put_metric" and "remaining" in e[1]]
    assert left == [1, 0, 1, 1]
    assert trace.events.count(("stop_workers",)) == 3 and trace.remaining_restarts == 0


def test_params_clock_and_rng_reach_a_factory_that_takes_them() -> None:
    seen: dict[str, Any] = {}

    def factory(driver: Any, *, params: Any = None, clock: Any = None, rng: Any = None,
                max_restarts: int = 3) -> Lifecycle:
        seen.update(params=params, clock=clock, rng=rng)
        return Lifecycle("resilient", driver, params=params, clock=clock, rng=rng,
                         max_restarts=max_restarts)

    config = RunConfig(params={"backoff_max": 4.0})
    run_script(factory, config, [Tick("FAILED", draw=0.25)], spec="resilient")
    assert seen["params"] == {"backoff_max": 4.0}
    assert seen["clock"].now() == 0.1 + 1.0 * (1 + -0.1 + 0.2 * 0.25) + 0.1
    assert seen["rng"].random() == 0.5  # the script has ended: the neutral draw


def test_a_kwargs_factory_gets_no_clock_for_a_torch_preset() -> None:
    seen: dict[str, Any] = {}

    def factory(driver: Any, **settings: Any) -> Lifecycle:
        seen.update(settings)
        return Lifecycle("torchrun", driver, **settings)

    run_script(factory, RunConfig(), [Tick("SUCCEEDED")], spec="torchrun")
    assert sorted(seen) == ["exit_barrier_timeout", "max_restarts", "role"]


def test_a_supervisor_waiting_without_sleeping_is_cut_off() -> None:
    class Busy:
        def __init__(self, lc: Lifecycle) -> None:
            self.lc = lc

        def run(self, monitor_interval: float, sleep: Any = None) -> Any:
            return self.lc.run(monitor_interval, sleep=lambda s: None)  # never waits

    def factory(driver: Any, **settings: Any) -> Busy:
        return Busy(Lifecycle("resilient", driver, **settings))

    started = time.monotonic()
    trace = run_script(factory, RunConfig(), [Tick("FAILED")], spec="resilient")
    assert isinstance(trace.outcome, Raised) and trace.outcome.type_name == "RunawaySupervisor"
    assert time.monotonic() - started < 30


def test_fixed_params_are_used_in_every_run() -> None:
    runs: list[Any] = []

    def factory(driver: Any, **settings: Any) -> Lifecycle:
        runs.append(settings.get("params"))
        return Lifecycle("resilient", driver, **settings)

    run_conformance(factory, spec="resilient", settings=settings(ACCEPT, max_examples=30),
                    seed=1, params={"no_retry_exit_codes": [4]})
    assert runs and all(p is not None and p["no_retry_exit_codes"] == [4] for p in runs)
    with pytest.raises(ValueError, match="no parameter 'backoff'"):
        run_conformance(factory, spec="resilient", params={"backoff": 1})
    with pytest.raises(HarnessError, match="takes no params="):
        run_conformance(MixinResilient, spec="resilient", params={"backoff_max": 1})


def test_jitter_stays_within_its_fraction_for_every_draw() -> None:
    for draw in (0.0, 0.25, 0.5, 0.75, 1.0 - 2.0**-10):
        config = RunConfig(params={"backoff_jitter": 0.5, "backoff_initial": 2.0})
        trace = check_script(Lifecycle, config, [Tick("FAILED", draw=draw)], spec="resilient")
        wait = next(e[1] for e in trace.events if e[0] == "sleep" and e[1] != 0.1)
        assert 1.0 <= wait < 3.0 and math.isclose(wait, 2.0 * (1 + (draw * 2 - 1) * 0.5))


def test_invariants_of_a_timed_run() -> None:
    config = RunConfig(max_restarts=2, monitor_interval=0.5)
    start = (("rendezvous",), ("start_workers",))
    tick = (("sleep", 0.5), ("monitor",))
    # a backoff may wait between the stop and the restart: no invariant broken
    backoff = (*start, *tick, ("stop_workers",), ("sleep", 1.0), ("rendezvous",),
               ("start_workers",), *tick)
    assert trace_invariants(ConformanceTrace(backoff, Pending()), config) == []
    # looking at the workers while they are stopped (monitoring during the backoff)
    peeking = (*start, *tick, ("stop_workers",), ("sleep", 0.5), ("monitor",))
    assert trace_invariants(ConformanceTrace(peeking, Pending()), config) == [
        "call 7: monitor() while the workers are stopped"]
    # a restart whose stop is not the last thing before it
    unstopped = (*start, *tick, ("stop_workers",), ("num_nodes_waiting",), ("rendezvous",),
                 ("start_workers",))
    assert trace_invariants(ConformanceTrace(unstopped, Pending()), config) == [
        "call 7: restart without stop_workers() first"]
    # the remaining_restarts metric may come back up only when a window gives restarts back
    metrics = (*start, *tick, ("put_metric", "workers.default.remaining_restarts", 1), *tick,
               ("put_metric", "workers.default.remaining_restarts", 2))
    assert trace_invariants(ConformanceTrace(metrics, Pending()), config, windowed=True) == []
    assert trace_invariants(ConformanceTrace(metrics, Pending()), config) == [
        "remaining_restarts went up: [1, 2]"]
