"""The mixin on an agent that is not LocalElasticAgent, compared call by call with torch's loop.

``ScriptedAgent`` is a ``SimpleElasticAgent`` whose worker hooks are scripted (no processes), with
a real c10d rendezvous on an in-process TCPStore. The same script runs under torch's own
``_invoke_run`` and under ``LifecycleAgentMixin`` with the ``torchrun`` spec; the hooks called (with
the group state and remaining restarts each one saw), the ``workers.*`` metrics and the events
must be identical.
"""

from __future__ import annotations

import json
import logging
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed.elastic import events as torch_events
from torch.distributed.elastic import metrics
from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.events import handlers as event_handlers
from torch.distributed.elastic.multiprocessing import ProcessFailure, SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from fsm_agent import WorkerGroupFailureException
from fsm_agent.torch import LifecycleAgentMixin

DEST = "fsm-agent-test"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(json.loads(record.getMessage()))


class _Metrics(metrics.MetricHandler):
    def __init__(self) -> None:
        self.values: list[tuple[str, int]] = []

    def emit(self, metric_data: metrics.MetricData) -> None:
        if metric_data.name.startswith("workers."):
            self.values.append((metric_data.name, metric_data.value))


@pytest.fixture
def capture() -> Iterator[tuple[_Capture, _Metrics]]:
    events = _Capture()
    event_handlers._log_handlers[DEST] = events
    # torch caches one logger per destination with the handler it found first.
    torch_events._events_loggers.pop(DEST, None)
    mets = _Metrics()
    metrics.configure(mets, group="torchelastic")
    try:
        yield events, mets
    finally:
        metrics.configure(metrics.NullMetricHandler(), group="torchelastic")
        event_handlers._log_handlers.pop(DEST, None)
        torch_events._events_loggers.pop(DEST, None)


def _failure(local_rank: int, code: int) -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=code,
                          error_file="<N/A>")


class ScriptedAgent(SimpleElasticAgent):
    """Workers are a script of monitor results; every hook call is logged."""

    def __init__(self, spec: WorkerSpec, script: list[RunResult], **kw: Any) -> None:
        super().__init__(spec, **kw)
        self.script = list(script)
        self.calls: list[tuple[str, str, int]] = []
        self.starts = 0

    def _log(self, hook: str) -> None:
        self.calls.append((hook, self._worker_group.state.name, self._remaining_restarts))

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        self._log("start")
        self.starts += 1
        return {w.local_rank: f"w{self.starts}.{w.local_rank}" for w in worker_group.workers}

    def _stop_workers(self, worker_group: Any) -> None:
        self._log("stop")

    def _monitor_workers(self, worker_group: Any) -> RunResult:
        self._log("monitor")
        return self.script.pop(0)

    def _shutdown(self, death_sig: Any = None, timeout: int = 30) -> None:
        self._log("shutdown")


class SpecDrivenAgent(LifecycleAgentMixin, ScriptedAgent):
    pass


def _spec(max_restarts: int) -> WorkerSpec:
    params = RendezvousParameters(backend="c10d", endpoint="localhost:0",
                                  run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1)
    return WorkerSpec(role="trainer", local_world_size=2, entrypoint="true", args=(),
                      rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
                      max_restarts=max_restarts, monitor_interval=0.001,
                      event_log_handler=DEST)


def _events(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for e in records:
        md = e["metadata"]
        out.append((e["name"], e["source"], md["state"], md["global_rank"], md["worker_id"],
                    md["agent_restarts"], md["group_rank"]))
    return out


def _run(agent_cls: type[ScriptedAgent], script: list[RunResult], max_restarts: int,
         capture: tuple[_Capture, _Metrics], **kw: Any) -> dict[str, Any]:
    events, mets = capture
    events.records.clear()
    mets.values.clear()
    spec = _spec(max_restarts)
    agent = agent_cls(spec, script, **kw)
    outcome: Any
    try:
        outcome = agent.run("trainer")
    except (WorkerGroupFailureException, SignalException) as e:
        outcome = e
    finally:
        spec.rdzv_handler.shutdown()
    return {"outcome": outcome, "calls": agent.calls, "metrics": list(mets.values),
            "events": _events(events.records), "state": agent._worker_group.state,
            "remaining": agent._remaining_restarts}


HEALTHY = RunResult(state=WorkerState.HEALTHY)
SUCCEEDED = RunResult(state=WorkerState.SUCCEEDED, return_values={0: None, 1: None})
FAILED = RunResult(state=WorkerState.FAILED, failures={1: _failure(1, 3)})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("script", "max_restarts"),
    [
        ([HEALTHY, SUCCEEDED], 2),
        ([HEALTHY, FAILED, HEALTHY, SUCCEEDED], 2),
        ([FAILED, FAILED], 1),
        ([FAILED, RunResult(state=WorkerState.UNHEALTHY), FAILED], 2),
    ],
    ids=["success", "fail-once", "exhausted", "unhealthy-then-exhausted"],
)
def test_mixin_keeps_torchs_bookkeeping(
    capture: tuple[_Capture, _Metrics], script: list[RunResult], max_restarts: int
) -> None:
    want = _run(ScriptedAgent, script, max_restarts, capture)
    got = _run(SpecDrivenAgent, script, max_restarts, capture, lifecycle_spec="torchrun")
    assert got["calls"] == want["calls"]
    assert got["metrics"] == want["metrics"]
    assert want["events"], "no events captured: the comparison would be vacuous"
    assert got["events"] == want["events"]
    assert got["state"] == want["state"]
    assert got["remaining"] == want["remaining"]
    assert got["outcome"].state == (
        WorkerState.FAILED if want["outcome"].state == WorkerState.UNHEALTHY  # torch's quirk
        else want["outcome"].state
    )
    assert got["outcome"].failures == want["outcome"].failures


@pytest.mark.timeout(60)
def test_torchelastic_spec_raises_with_failures_and_records_the_run(
    capture: tuple[_Capture, _Metrics],
) -> None:
    got = _run(SpecDrivenAgent, [FAILED, FAILED], 1, capture, lifecycle_spec="torchelastic")
    err = got["outcome"]
    assert isinstance(err, WorkerGroupFailureException)
    assert set(err.failures) == {1} and err.failures[1].exitcode == 3
    assert got["state"] == WorkerState.FAILED and got["remaining"] == 0
    # run() records nothing for a raised run; the mixin records the failed run itself.
    assert ("workers.trainer.run_failed_with_retries", 1) in got["metrics"]
    states = [(e[2], e[3]) for e in got["events"] if e[1] == "WORKER"]
    # As torch's _record_worker_events: the failed rank FAILED, the stopped one TERMINATED.
    assert states[-2:] == [("TERMINATED", 0), ("FAILED", 1)]
    assert got["calls"][-1][0] == "shutdown"


@pytest.mark.timeout(60)
def test_exit_barrier_timeout_zero_is_accepted_as_torch_does(
    capture: tuple[_Capture, _Metrics],
) -> None:
    """torch accepts ``exit_barrier_timeout=0`` (its tests use it); so does the mixin, with the
    same outcome as torch's own loop."""
    want = _run(ScriptedAgent, [HEALTHY, SUCCEEDED], 0, capture, exit_barrier_timeout=0)
    got = _run(SpecDrivenAgent, [HEALTHY, SUCCEEDED], 0, capture, exit_barrier_timeout=0,
               lifecycle_spec="torchrun")
    assert want["outcome"].state == got["outcome"].state == WorkerState.SUCCEEDED
    assert got["calls"] == want["calls"]


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5"])
def test_bad_exit_barrier_timeout_is_refused_at_construction(timeout: object) -> None:
    spec = _spec(0)
    try:
        with pytest.raises(ValueError, match="exit_barrier_timeout must be >= 0"):
            SpecDrivenAgent(spec, [], exit_barrier_timeout=timeout)
    finally:
        spec.rdzv_handler.shutdown()


class _FakePContext:
    """A process context whose 'pids' are not pids (as scripted agents and mocks have)."""

    def pids(self) -> dict[int, Any]:
        return {0: "w.0", 1: "w.1"}


class NoRealPidsAgent(SpecDrivenAgent):
    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        self._pcontext = _FakePContext()
        return super()._start_workers(worker_group)


def _waker_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "worker-exit waker failed" in r.getMessage()]


@pytest.mark.timeout(60)
def test_waker_error_in_watch_falls_back_to_the_tick(
    capture: tuple[_Capture, _Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    script = [HEALTHY, FAILED, HEALTHY, SUCCEEDED]
    want = _run(ScriptedAgent, script, 2, capture)
    with caplog.at_level(logging.WARNING, logger="fsm_agent"):
        got = _run(NoRealPidsAgent, script, 2, capture, lifecycle_spec="torchrun")
    assert got["outcome"].state == WorkerState.SUCCEEDED
    assert got["calls"] == want["calls"]
    # two starts, two chances to fail: logged once, then the waker is left alone
    warnings = _waker_warnings(caplog)
    assert len(warnings) == 1 and "in watch" in warnings[0], warnings


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "error",
    [OSError(9, "Bad file descriptor"), SignalException("Process got signal: 15", signal.SIGTERM)],
    ids=["os-error", "signal"],
)
def test_waker_error_in_wait_falls_back_to_the_tick(
    capture: tuple[_Capture, _Metrics], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, error: Exception,
) -> None:
    """Any error of the waker's wait means a plain tick, logged once; a termination signal that
    torch's handler raises during the wait is not an error of the waker and still ends the run."""
    from fsm_agent.torch import _wakeup

    real_wait = _wakeup.WorkerExitWaker.wait
    failures: list[str] = []

    def broken_wait(self: _wakeup.WorkerExitWaker, timeout: float) -> bool:
        if self.backend != "tick":
            failures.append(self.backend)
            raise error
        return real_wait(self, timeout)

    monkeypatch.setattr(_wakeup.WorkerExitWaker, "wait", broken_wait)
    with caplog.at_level(logging.WARNING, logger="fsm_agent"):
        got = _run(SpecDrivenAgent, [HEALTHY, HEALTHY, FAILED, SUCCEEDED], 2, capture,
                   lifecycle_spec="torchrun")
    assert len(failures) == 1  # the broken waker is never asked again
    warnings = _waker_warnings(caplog)
    if isinstance(error, SignalException):
        assert got["outcome"] is error and not warnings
    else:
        assert got["outcome"].state == WorkerState.SUCCEEDED
        assert len(warnings) == 1 and "Bad file descriptor" in warnings[0], warnings
