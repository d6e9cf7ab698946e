"""Engine behaviour with a recording driver: errors, results, listeners, vocabulary, isolation."""

from __future__ import annotations

import logging
import pickle

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.api import SignalException

from fsm_agent import (
    ActionError,
    Lifecycle,
    LifecycleError,
    Step,
    Vocabulary,
    WorkerGroupFailureException,
    load_spec,
    parse_spec,
)
from fsm_agent.testing import RecordingDriver, make_result


def test_state_is_torchs_worker_state() -> None:
    lc = Lifecycle("torchrun", RecordingDriver(["HEALTHY"]))
    assert lc.state is WorkerState.INIT
    lc.start()
    assert lc.state is WorkerState.HEALTHY
    lc.observe(make_result("HEALTHY"))
    assert lc.state is WorkerState.HEALTHY


def test_metrics_use_torchs_names_and_come_before_the_transition() -> None:
    d = RecordingDriver(nodes_waiting=[0])
    lc = Lifecycle("torchelastic", d, role="trainer", max_restarts=2)
    lc.start()
    lc.observe(make_result("HEALTHY"))
    assert d.calls[2:] == [
        ("put_metric", "workers.trainer.remaining_restarts", 2),
        ("put_metric", "workers.trainer.healthy", 1),
        ("num_nodes_waiting",),
    ]


def test_failing_action_moves_to_unknown_and_names_the_transition() -> None:
    d = RecordingDriver(raises={"stop_workers": OSError("no such process")})
    lc = Lifecycle("torchrun", d, role="r", max_restarts=1)
    lc.start()
    with pytest.raises(ActionError) as info:
        lc.observe(make_result("FAILED"))
    err = info.value
    assert lc.state is WorkerState.UNKNOWN
    assert lc.done
    assert (err.action, err.trigger, err.source, err.dest) == (
        "stop_workers", "failed", "HEALTHY", "STOPPED"
    )
    assert "'failed' HEALTHY -> STOPPED" in str(err)
    assert "OSError: no such process" in str(err)
    assert isinstance(err.__cause__, OSError)
    with pytest.raises(LifecycleError, match="already finished in UNKNOWN"):
        lc.observe(make_result("HEALTHY"))


def test_failing_guard_moves_to_unknown() -> None:
    d = RecordingDriver(raises={"num_nodes_waiting": ConnectionError("store gone")})
    lc = Lifecycle("torchrun", d)
    lc.start()
    with pytest.raises(ActionError, match="guard 'nodes_waiting'") as info:
        lc.observe(make_result("HEALTHY"))
    assert isinstance(info.value.__cause__, ConnectionError)
    assert lc.state is WorkerState.UNKNOWN


def test_failing_rendezvous_during_start() -> None:
    d = RecordingDriver(raises={"rendezvous": TimeoutError("rendezvous timed out")})
    lc = Lifecycle("torchelastic", d)
    with pytest.raises(ActionError, match="'start' INIT -> HEALTHY"):
        lc.start()
    assert lc.state is WorkerState.UNKNOWN


@pytest.mark.parametrize("exc", [SignalException("SIGTERM", 15), KeyboardInterrupt()])
def test_fatal_and_base_exceptions_propagate_unchanged(exc: BaseException) -> None:
    d = RecordingDriver(raises={"start_workers": exc})
    lc = Lifecycle("torchrun", d, fatal_exceptions=(SignalException,))
    with pytest.raises(type(exc)) as info:
        lc.start()
    assert info.value is exc
    assert lc.state is WorkerState.UNKNOWN


def test_barrier_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    d = RecordingDriver(barrier=[TimeoutError("barrier timed out")])
    lc = Lifecycle("torchelastic", d, exit_barrier_timeout=7.0)
    lc.start()
    with caplog.at_level(logging.ERROR, logger="fsm_agent"):
        lc.observe(make_result("SUCCEEDED"))
    assert lc.state is WorkerState.SUCCEEDED
    assert lc.result is not None and lc.result.state is WorkerState.SUCCEEDED
    assert ("exit_barrier", 7.0) in d.calls
    assert "Error waiting on exit barrier. Elapsed:" in caplog.text


def test_termination_signal_in_barrier_propagates() -> None:
    sig = SignalException("SIGTERM", 15)
    d = RecordingDriver(barrier=[sig])
    lc = Lifecycle("torchelastic", d, fatal_exceptions=(SignalException,))
    lc.start()
    with pytest.raises(SignalException):
        lc.observe(make_result("SUCCEEDED"))


def test_giving_up_after_unhealthy_reports_failed() -> None:
    d = RecordingDriver(["UNHEALTHY"])
    result = Lifecycle("torchrun", d, max_restarts=0).run(0.0)
    assert result.state is WorkerState.FAILED
    assert result.failures  # the failures of the last observation are kept
    assert d.names() == ["rendezvous", "start_workers", "monitor", "stop_workers"]


def test_torchelastic_raises_with_failures_by_rank() -> None:
    failed = make_result("FAILED", ranks=(3, 5))
    d = RecordingDriver([failed])
    lc = Lifecycle("torchelastic", d, role="trainer", max_restarts=0)
    with pytest.raises(WorkerGroupFailureException) as info:
        lc.run(0.0)
    assert str(info.value) == "[trainer] exceeded max_restarts=0"
    assert set(info.value.failures) == {3, 5}
    assert lc.state is WorkerState.FAILED
    assert d.names()[-2:] == ["stop_workers", "exit_barrier"]
    clone = pickle.loads(pickle.dumps(info.value))
    assert clone.msg == info.value.msg and set(clone.failures) == {3, 5}


def test_use_before_start_and_twice() -> None:
    lc = Lifecycle("torchrun", RecordingDriver())
    with pytest.raises(LifecycleError, match="start"):
        lc.observe(make_result("HEALTHY"))
    lc.start()
    with pytest.raises(LifecycleError, match="already started"):
        lc.start()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_restarts": True}, "max_restarts"),
        ({"exit_barrier_timeout": -1}, "exit_barrier_timeout"),
        ({"exit_barrier_timeout": float("nan")}, "exit_barrier_timeout"),
        ({"role": ""}, "role"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Lifecycle("torchrun", RecordingDriver(), **kwargs)  # type: ignore[arg-type]


def test_driver_without_methods_is_refused() -> None:
    with pytest.raises(TypeError, match="lacks"):
        Lifecycle("torchrun", object())  # type: ignore[arg-type]


def test_listeners_see_guards_actions_and_counters() -> None:
    steps: list[Step] = []
    d = RecordingDriver(["FAILED", "SUCCEEDED"])
    Lifecycle("torchrun", d, max_restarts=2, listeners=[steps.append]).run(0.0)
    path = [(s.trigger, s.source, s.dest) for s in steps]
    assert path == [
        ("start", "INIT", "HEALTHY"),
        ("failed", "HEALTHY", "STOPPED"),
        ("always", "STOPPED", "HEALTHY"),
        ("succeeded", "HEALTHY", "SUCCEEDED"),
    ]
    failed = steps[1]
    assert failed.guards == [("has_restarts_left", True)]
    assert [a.name for a in failed.actions] == ["consume_restart", "stop_workers"]
    assert all(a.outcome == "ok" and a.duration >= 0 for a in failed.actions)
    assert (failed.remaining_restarts, failed.restart_count, failed.observed) == (1, 1, "FAILED")
    assert 0 in failed.failures
    assert [a.name for a in steps[3].actions] == ["exit_barrier"]


def test_a_failing_listener_does_not_change_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    def broken(step: Step) -> None:
        raise OSError("disk full")

    result = Lifecycle("torchrun", RecordingDriver(["SUCCEEDED"]), listeners=[broken]).run(0.0)
    assert result.state is WorkerState.SUCCEEDED
    assert "listener" in caplog.text


@pytest.mark.parametrize("exc", [SignalException("SIGHUP", 1), KeyboardInterrupt()])
def test_a_signal_raised_while_a_listener_runs_ends_the_run(exc: BaseException) -> None:
    # torch's handler raises SignalException in whatever runs when the signal arrives: in a
    # trace write it must end the run, as between two transitions, not be logged as the
    # listener's failure (the agent then ignored SIGHUP and ran on).
    seen: list[Step] = []

    def writer(step: Step) -> None:
        if step.trigger == "start":
            raise exc
        seen.append(step)

    lc = Lifecycle("torchrun", RecordingDriver(["SUCCEEDED"]), listeners=[writer],
                   fatal_exceptions=(SignalException,))
    with pytest.raises(type(exc)) as info:
        lc.run(0.0)
    assert info.value is exc
    assert seen == [] and lc.result is None


def test_lifecycles_of_one_spec_do_not_share_state() -> None:
    spec = load_spec("torchrun")
    a = Lifecycle(spec, RecordingDriver(), max_restarts=1)
    b = Lifecycle(spec, RecordingDriver(), max_restarts=1)
    a.start()
    b.start()
    a.observe(make_result("FAILED"))
    assert (a.remaining_restarts, b.remaining_restarts) == (0, 1)
    b.observe(make_result("SUCCEEDED"))
    assert b.done and not a.done
    assert a.state is WorkerState.HEALTHY


def test_registered_guards_actions_and_triggers() -> None:
    seen: list[str] = []
    vocab = Vocabulary.builtin().extend(
        guards={"drain_requested": lambda ctx: True},
        actions={"notify": lambda ctx: seen.append(f"{ctx.role}:{ctx.state}")},
    )
    text = load_spec("torchrun").path
    with open(text) as f:
        source = f.read().replace("triggers: [job_failed]", "triggers: [job_failed, drain]")
    source = source.replace(
        "transitions:\n",
        "transitions:\n"
        "  - {trigger: drain, source: HEALTHY, dest: FAILED, guards: [drain_requested],"
        " actions: [notify, stop_workers]}\n",
    )
    spec = parse_spec(source, vocabulary=vocab)
    d = RecordingDriver()
    lc = Lifecycle(spec, d, role="w")
    lc.start()
    lc.fire("drain")
    assert lc.state is WorkerState.FAILED and lc.done
    assert seen == ["w:HEALTHY"]
    assert d.names()[-1] == "stop_workers"
    with pytest.raises(LifecycleError, match="not one of the spec's own triggers"):
        lc.fire("healthy")


def test_non_dataclass_results_are_accepted() -> None:
    class Result:
        def __init__(self, state: WorkerState) -> None:
            self.state = state
            self.return_values: dict[int, object] = {}
            self.failures: dict[int, object] = {0: "boom"}

    lc = Lifecycle("torchrun", RecordingDriver([Result(WorkerState.UNHEALTHY)]), max_restarts=0)
    result = lc.run(0.0)
    assert isinstance(result, RunResult)
    assert result.state is WorkerState.FAILED and result.failures == {0: "boom"}
