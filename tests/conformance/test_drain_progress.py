"""The kit on the drain and no-progress rule (docs/spec-format.md, "Preemption" and "Progress"):
its scripts reach DRAINING (a preemption in a monitor wait or a backoff; workers exiting 0, failing
or ignoring the drain signal) and no-progress give-ups, the reference says what the spec says
(checked by hand here, and against the engine running specs/resilient.yaml), and wrong supervisors
are rejected with a readable counterexample."""

from __future__ import annotations

import collections
import contextlib
import math
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from fsm_agent import Lifecycle
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    check_script,
    default_settings,
    draw_case,
    run_conformance,
)
from fsm_agent.testing._oracle import _oracle, _profile
from fsm_agent.testing._reference import (
    Pending,
    Raised,
    ReferenceRun,
    Returned,
    reference_trace,
)
from fsm_agent.testing._strategies import RunConfig, Tick

from . import drain_mutants as mutants
from .test_resilient import MixinResilient

pytestmark = pytest.mark.timeout(300)

SPECS = Path(__file__).resolve().parents[2] / "specs"
REJECT = settings(default_settings(2_000), database=None)
#: Every correct supervisor of a hand-written script: the preset, the engine running the spec
#: file as the reference, a LifecycleAgentMixin agent (its driver's drain and progress hooks).
TARGETS = [(Lifecycle, "resilient"), (Lifecycle, SPECS / "resilient.yaml"),
           (MixinResilient, "resilient")]
TARGET_IDS = ["lifecycle", "lifecycle-file", "mixin-agent"]
TERM, USR1 = int(signal.SIGTERM), int(signal.SIGUSR1)


def _mixin_with(params: dict[str, Any]) -> type:
    """A LifecycleAgentMixin agent running resilient with ``params`` (an agent takes no
    ``params=`` from the kit: its parameters are its own)."""

    class Mixin(MixinResilient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, lifecycle_params=params, **kwargs)

    return Mixin


def _check(target: Any, spec: Any, config: RunConfig, script: list[Tick]) -> Any:
    if target is MixinResilient and config.params:
        target = _mixin_with(config.param_values())
    trace = check_script(target, config, script, spec=spec)
    assert trace.events == reference_trace("resilient", config, script).events
    return trace


# -- what the scripts reach ------------------------------------------------------------------


def test_generated_scripts_reach_every_kind_of_drain_and_no_progress_give_ups() -> None:
    profile = _profile("resilient")
    oracle = _oracle("resilient")
    seen: collections.Counter[str] = collections.Counter()
    kinds = ("from a backoff", "from a monitor wait", "drained", "deadline",
             "workers exit0", "workers fail", "workers ignore", "no progress")

    class Enough(Exception):
        """Every kind was seen 3 times."""

    # The rarest kind, a drain deadline, is about one script in 150 to 600 (a preemption in a
    # monitor wait whose workers ignore the signal), and a fixed seed does not fix the draws
    # across machines (the last CI run saw 2 in 1200 where this machine saw 9): so draw until
    # every kind was seen 3 times, within a budget that a kit whose strategies reach a deadline
    # does not run out of by chance (generation only: the stop is not a failure to shrink).
    @hypothesis_seed(0)
    @settings(max_examples=8000, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def draw(data: Any) -> None:
        config, script, expected = draw_case(data, oracle, configs=profile.configs,
                                             timed=True, tick_strategy=profile.ticks())
        events = expected.events
        if ("woken", "preempted") in events:
            i = events.index(("woken", "preempted"))
            seen["from a backoff" if events[i - 2] == ("stop_workers",) else
                 "from a monitor wait"] += 1
            seen["drained" if ("woken", "drained") in events else "deadline"] += 1
            seen[f"workers {script[-1].drain}"] += 1
            assert isinstance(expected.outcome, Raised)
            assert expected.outcome.type_name == "Preempted"
        elif isinstance(expected.outcome, Returned) and expected.exit_code is not None:
            run = ReferenceRun("resilient", config)  # a no-retry or a no-progress give-up
            run.start()
            for tick in script:
                run.tick(tick)
            if 0 < run.params["no_progress_restarts"] <= run.stalled_restarts:
                seen["no progress"] += 1
        if all(seen[kind] >= 3 for kind in kinds):  # after the draws: hypothesis replays this
            raise Enough

    with contextlib.suppress(Enough):
        draw()
    for kind in kinds:
        assert seen[kind] >= 3, (kind, seen)


# -- the drain, by hand ----------------------------------------------------------------------


@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
def test_a_drain_from_a_monitor_wait_whose_workers_exit_0_ends_preempted(target: Any,
                                                                         spec: Any) -> None:
    config = RunConfig(monitor_interval=0.5, params={"drain_signal": "SIGUSR1"})
    trace = _check(target, spec, config, [Tick("HEALTHY", preempt="SIGTERM")])
    assert trace.events[-7:] == (
        ("sleep", 0.5), ("woken", "preempted"), ("announce_preemption", 143, "received SIGTERM"),
        ("drain_workers", USR1), ("sleep", 25.0), ("woken", "drained"), ("stop_workers",))
    # workers that exited 0 in a drain checkpointed: the job is preempted, not done
    assert trace.outcome == Raised("Preempted", "received SIGTERM", exit_code=143)
    assert (trace.state, trace.exit_code) == ("FAILED", 143)
    assert not any(e[0] == "exit_barrier" for e in trace.events)


@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
def test_workers_ignoring_the_drain_are_killed_at_its_deadline(target: Any, spec: Any) -> None:
    config = RunConfig(monitor_interval=0.5, params={"drain_timeout": 2.5,
                                                     "preempted_exit_code": 99})
    script = [Tick("HEALTHY"), Tick("HEALTHY", preempt="SIGUSR1", drain="ignore")]
    trace = _check(target, spec, config, script)
    assert trace.events[-4:] == (("announce_preemption", 99, "received SIGUSR1"),
                                 ("drain_workers", TERM), ("sleep", 2.5), ("kill_workers",))
    assert trace.outcome == Raised("Preempted", "received SIGUSR1", exit_code=99)


@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
def test_failing_workers_in_a_drain_do_not_make_it_a_failure(target: Any, spec: Any) -> None:
    config = RunConfig(monitor_interval=0.5)
    trace = _check(target, spec, config, [Tick("HEALTHY", preempt="SIGUSR1", drain="fail",
                                               exitcodes=(3, -15))])
    assert trace.outcome == Raised("Preempted", "received SIGUSR1", exit_code=128 + USR1)
    assert trace.remaining_restarts in (None, 3)  # no restart spent


@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
def test_a_preemption_in_a_backoff_drains_the_stopped_group_at_once(target: Any,
                                                                    spec: Any) -> None:
    config = RunConfig(monitor_interval=0.5, params={"backoff_jitter": 0.0})
    # the workers would ignore the signal, but they are stopped already: drained at once
    trace = _check(target, spec, config, [Tick("FAILED", preempt="SIGTERM", drain="ignore")])
    names = [e[0] for e in trace.events if e[0] != "put_metric"]
    assert names[-9:] == ["monitor", "stop_workers", "sleep", "woken", "announce_preemption",
                          "drain_workers", "sleep", "woken", "stop_workers"]
    assert ("sleep", 1.0) in trace.events and "start_workers" not in names[3:]
    assert trace.outcome == Raised("Preempted", "received SIGTERM", exit_code=143)


def test_a_run_that_ends_first_is_never_preempted() -> None:
    config = RunConfig(max_restarts=0)
    for script in ([Tick("SUCCEEDED", preempt="SIGTERM")], [Tick("FAILED", preempt="SIGTERM")]):
        trace = check_script(Lifecycle, config, script, spec="resilient")
        assert isinstance(trace.outcome, Returned) and ("woken", "preempted") not in trace.events


# -- progress, by hand -----------------------------------------------------------------------


def _stalled(count: int, *, fail: str = "FAILED") -> list[Tick]:
    """A step reported in the first attempt, then ``count`` failed restarts without progress."""
    return [Tick("FAILED", step=5), *(Tick(fail) for _ in range(count))]


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
def test_gives_up_after_exactly_no_progress_restarts(target: Any, spec: Any,
                                                     limit: int) -> None:
    params = {"no_progress_restarts": limit} if limit != 3 else {}
    config = RunConfig(max_restarts=5, monitor_interval=0.5, params=params)
    # one restart without progress fewer: the run goes on, restarting
    short = _check(target, spec, config, _stalled(limit - 1, fail="UNHEALTHY"))
    assert isinstance(short.outcome, Pending) and short.exit_code is None
    trace = _check(target, spec, config, _stalled(limit))
    assert isinstance(trace.outcome, Returned) and trace.outcome.state == "FAILED"
    assert trace.exit_code == 93  # no_requeue_exit_code, with the budget not spent
    assert trace.remaining_restarts == 5 - limit
    assert not any(e[0] == "exit_barrier" for e in trace.events)


def test_progress_resets_the_count_and_no_source_leaves_it_to_the_budget() -> None:
    config = RunConfig(max_restarts=4, monitor_interval=0.5,
                       params={"no_progress_restarts": 2})
    # a higher step in the third attempt: the count starts again; a lower one is no progress
    moving = [Tick("FAILED", step=5), Tick("FAILED"), Tick("FAILED", step=6),
              Tick("FAILED", step=2), Tick("FAILED")]
    trace = _check(Lifecycle, "resilient", config, moving)
    assert trace.exit_code == 93 and trace.remaining_restarts == 0
    assert isinstance(reference_trace("resilient", config, moving[:4]).outcome, Pending)
    # nothing reported: every attempt counts as progress, the budget decides (exit 1)
    silent = [Tick("FAILED") for _ in range(5)]
    trace = _check(Lifecycle, "resilient", config, silent)
    assert isinstance(trace.outcome, Returned) and trace.exit_code is None


# -- wrong supervisors -----------------------------------------------------------------------


MUTANTS = [*mutants.DRAIN_MUTANTS, *mutants.PROGRESS_MUTANTS]
_REJECTIONS: dict[str, str] = {}


@pytest.fixture
def rejection(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The counterexample the kit finds for a mutant (each searched for once per session)."""

    def find(name: str) -> str:
        if name not in _REJECTIONS:
            target = mutants.mutant(name, tmp_path_factory.mktemp(name))
            with pytest.raises(ConformanceFailure) as info:
                run_conformance(target, spec="resilient", settings=REJECT, seed=0)
            _REJECTIONS[name] = str(info.value)
        return _REJECTIONS[name]

    return find


def test_there_are_the_wrong_supervisors_the_issue_names() -> None:
    # a drain that counts as success (SUCCEEDED, or exit 0), a no-progress count off by one
    assert {"DrainedIsSuccess", "drain_exit0_is_success", "preemption_exits_zero"} <= set(
        mutants.DRAIN_MUTANTS)
    assert {"no_progress_one_early", "no_progress_one_late"} <= set(mutants.PROGRESS_MUTANTS)


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^(start|\d+) +\|", line)]


@pytest.mark.parametrize("name", MUTANTS)
def test_kit_rejects_a_wrong_drain_or_progress_supervisor(name: str, rejection: Any) -> None:
    text = rejection(name)
    assert "does not conform to spec 'resilient'" in text
    assert "<-- differs" in text and "differs in:" in text
    rows = _rows(text)
    assert rows[0].startswith("start") and 2 <= len(rows) <= 6, text  # shrunk: a few ticks
    header = text.splitlines()[2]
    expected = next(line for line in text.splitlines() if line.startswith("expected outcome"))
    if name in mutants.DRAIN_MUTANTS:
        # the preemption and how the drain ended are shown; the reference raises Preempted
        assert "preempted after" in header and "-> preempted" in text, text
        assert "raise Preempted('received SIG" in expected, text
    else:
        # the steps reported are shown; one side gives up with the no-requeue code
        assert "step" in header and "exit code 93" in text, text


def test_a_preemption_that_spends_the_user_budget_shows_the_restart_spent(
        rejection: Any) -> None:
    text = rejection("PreemptionSpendsUserBudget")
    assert "differs in: remaining restarts" in text, text


def test_a_drain_counted_as_success_shows_the_outcome_and_the_exit_code(rejection: Any) -> None:
    text = rejection("preemption_exits_zero")
    actual = next(line for line in text.splitlines() if line.startswith("actual outcome"))
    assert "exit code 0" in actual and actual.endswith("<-- differs"), text
    assert "exit code" in text.split("differs in:")[1]
    text = rejection("drain_exit0_is_success")
    assert "workers exit 0" in text and "return SUCCEEDED" in text, text


def test_an_off_by_one_no_progress_count_differs_at_the_give_up(rejection: Any) -> None:
    for name in ("no_progress_one_early", "no_progress_one_late"):
        text = rejection(name)
        differing = [row for row in _rows(text) if row.endswith("<-- differs")]
        differs_in = text.split("differs in:")[1].splitlines()[0]
        # the last tick: one side restarts or gives up plainly, the other gives up with 93
        assert differing or "exit code" in differs_in, text
        assert "FAILED" in _rows(text)[-1] or "FAILED" in _rows(text)[-2], text


# -- a failure after a lost node (docs/job-protocol.md, "Lost peers") ---------------------------


@pytest.mark.parametrize(("target", "spec"), TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("replacements", [math.inf, 1, 0])
def test_a_failure_after_a_lost_node_restarts_at_once_without_spending_max_restarts(
        target: Any, spec: Any, replacements: float) -> None:
    config = RunConfig(max_restarts=0, monitor_interval=0.5,
                       params={"node_replacements": replacements})
    script = [Tick("FAILED", peer_lost=True), Tick("FAILED", peer_lost=True)]
    trace = _check(target, spec, config, script)
    calls = [e[0] for e in trace.events if e[0] not in ("put_metric", "sleep")]
    restarts = min(2, int(min(replacements, 2)))
    # each restart is stop, rendezvous, start at once: no backoff's sleep between them
    assert calls == ["rendezvous", "start_workers",
                     *["monitor", "stop_workers", "rendezvous", "start_workers"] * restarts,
                     *(["monitor", "stop_workers"] if restarts < 2 else ["monitor"])]
    assert trace.remaining_restarts == 0
    if restarts < 2:
        assert isinstance(trace.outcome, Returned) and trace.outcome.state == "FAILED"
    else:
        assert isinstance(trace.outcome, Pending)


def test_generated_scripts_reach_lost_node_restarts_and_their_budget_running_out() -> None:
    profile = _profile("resilient")
    oracle = _oracle("resilient")
    seen: collections.Counter[str] = collections.Counter()

    class Enough(Exception):
        """Both kinds were seen 3 times."""

    @hypothesis_seed(0)
    @settings(max_examples=4000, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def draw(data: Any) -> None:
        config, script, _ = draw_case(data, oracle, configs=profile.configs,
                                      timed=True, tick_strategy=profile.ticks())
        run = ReferenceRun("resilient", config)
        run.start()
        for tick in script:
            if run.outcome is not None:
                break
            before = run._replacements
            run.tick(tick)
            if tick.peer_lost and run.outcome is None and run._replacements > before:
                seen["restart after a lost node"] += 1
            elif tick.peer_lost and isinstance(run.outcome, Returned):
                seen["node_replacements spent"] += 1
        if all(seen[k] >= 3 for k in ("restart after a lost node", "node_replacements spent")):
            raise Enough

    with contextlib.suppress(Enough):
        draw()
    assert seen["restart after a lost node"] >= 3, seen
    assert seen["node_replacements spent"] >= 3, seen
