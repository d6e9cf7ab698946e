"""torch's ``api_test.py`` (``SimpleElasticAgentTest``) on ``LifecycleAgentMixin``.

torch's test drives a ``SimpleElasticAgent`` subclass whose worker hooks are fake (no processes)
over a real static rendezvous; here the same agent has ``LifecycleAgentMixin`` first among its
bases, so the spec's lifecycle runs instead of torch's ``_invoke_run``. Every test names the
upstream test it mirrors and keeps its assertions. Where upstream patches a torch internal that
the mixin does not call (``_initialize_workers``, ``_restart_workers``, ``_invoke_run``), the test
drives the same situation through the lifecycle and says so. torch's own value classes
(``WorkerState``, ``WorkerGroup``, ``_RoleInstanceInfo``), which the mixin does not touch, are not
repeated. The ``torchrun`` preset is torch's behaviour; where the ``torchelastic`` preset differs
(it raises ``WorkerGroupFailureException`` on giving up instead of returning), both are run.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from multiprocessing.pool import ThreadPool
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic import metrics
from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
    _RoleInstanceInfo,
)
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousGracefulExitError
from upstream_helpers import free_port

from fsm_agent import ActionError, WorkerGroupFailureException
from fsm_agent.torch import LifecycleAgentMixin

PRESETS = ["torchrun", "torchelastic"]


def do_nothing() -> None:
    pass


class TestAgent(SimpleElasticAgent):
    """torch's ``TestAgent``: fake workers whose id is their global rank; the monitor results
    come from ``script`` (upstream patches ``_monitor_workers``), calls are counted."""

    __test__ = False  # not a pytest class

    def __init__(self, spec: WorkerSpec, script: list[RunResult] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.script = list(script or [])
        self.stop_workers_call_count = 0
        self.start_workers_call_count = 0
        self.monitor_calls = 0
        self.seen: list[dict[str, Any]] = []  # the group as each monitor call found it
        self.shutdown_calls: list[tuple[Any, ...]] = []
        self.record_metrics_calls = 0
        self.record_events_calls = 0

    def _stop_workers(self, worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> None:
        worker_group.group_rank = None
        worker_group.group_world_size = None
        self.stop_workers_call_count += 1

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.start_workers_call_count += 1
        return {w.local_rank: w.global_rank for w in worker_group.workers}

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self.monitor_calls += 1
        self.seen.append({
            "state": worker_group.state, "group_rank": worker_group.group_rank,
            "group_world_size": worker_group.group_world_size,
            "ids": [w.id for w in worker_group.workers],
            "global_ranks": [w.global_rank for w in worker_group.workers],
        })
        result = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.shutdown_calls.append(args)

    def _record_metrics(self, group_results: RunResult) -> None:
        self.record_metrics_calls += 1
        super()._record_metrics(group_results)

    def _record_worker_events(self, result: RunResult) -> None:
        # counted only, as upstream's mock does (its fake results name rank 0 alone)
        self.record_events_calls += 1


class MixinAgent(LifecycleAgentMixin, TestAgent):
    pass


def monres(state: WorkerState) -> RunResult:
    """torch's ``monres``: a monitor result for ``state``."""
    if state == WorkerState.SUCCEEDED:
        return RunResult(state=state, return_values={0: 0}, failures={})
    if state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
        pf = ProcessFailure(local_rank=0, pid=999, exitcode=1, error_file="<none>")
        return RunResult(state=state, return_values={}, failures={0: pf})
    return RunResult(state=state)


@pytest.fixture
def handlers() -> Iterator[list[WorkerSpec]]:
    """Worker specs made by a test; their rendezvous handlers are shut down afterwards."""
    made: list[WorkerSpec] = []
    yield made
    for spec in made:
        spec.rdzv_handler.shutdown()


@pytest.fixture
def put_metrics() -> Iterator[list[tuple[str, int]]]:
    """What the agent puts through torch's metrics API (upstream patches ``put_metric``)."""
    seen: list[tuple[str, int]] = []

    class Handler(metrics.MetricHandler):
        def emit(self, metric_data: metrics.MetricData) -> None:
            seen.append((metric_data.name, metric_data.value))

    metrics.configure(Handler(), group="torchelastic")
    yield seen
    metrics.configure(metrics.NullMetricHandler(), group="torchelastic")


def _spec(made: list[WorkerSpec], max_restarts: int = 1, role: str = "test_trainer",
          local_world_size: int = 8, local_addr: str | None = "127.0.0.1") -> WorkerSpec:
    """torch's ``_get_worker_spec``: a static rendezvous of one node (on loopback)."""
    params = RendezvousParameters(
        backend="static", endpoint=f"127.0.0.1:{free_port()}", run_id=str(uuid.uuid4().int),
        min_nodes=1, max_nodes=1, rank=0, local_addr=local_addr,
    )
    spec = WorkerSpec(
        role=role, local_world_size=local_world_size, entrypoint=do_nothing, args=(),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params), max_restarts=max_restarts,
        monitor_interval=0.01, local_addr=local_addr,
    )
    made.append(spec)
    return spec


def _agent(made: list[WorkerSpec], script: list[Any] | None = None, preset: str = "torchrun",
           **spec_kwargs: Any) -> MixinAgent:
    return MixinAgent(_spec(made, **spec_kwargs), script, lifecycle_spec=preset)


def _run(agent: MixinAgent) -> Any:
    """``agent.run()``; the torchelastic preset's exception on giving up is the outcome."""
    try:
        return agent.run()
    except WorkerGroupFailureException as e:
        return e


def test_agent_constructor(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_agent_constructor``."""
    agent = _agent(handlers, max_restarts=1)
    assert agent.get_worker_group().state == WorkerState.INIT
    assert agent._remaining_restarts == agent.get_worker_group().spec.max_restarts


def test_record_flakiness_metric(handlers: list[WorkerSpec],
                                 put_metrics: list[tuple[str, int]]) -> None:
    """Mirrors ``test_record_flakiness_metric``, ``..._zero_restarts`` and
    ``..._user_exception`` (torch's method, inherited unchanged by the mixin)."""
    agent = _agent(handlers, max_restarts=1)
    agent._record_flakiness_metric()
    assert put_metrics[-1] == ("workers.test_trainer.flakiness", 0)
    agent._worker_group.spec.max_restarts = 10
    agent._remaining_restarts = 3
    agent._record_flakiness_metric()
    assert put_metrics[-1] == ("workers.test_trainer.flakiness", 63)
    agent._record_flakiness_metric(True)
    assert put_metrics[-1] == ("workers.test_trainer.flakiness", 100)
    zero = _agent(handlers, max_restarts=0)
    zero._record_flakiness_metric()
    assert put_metrics[-1] == ("workers.test_trainer.flakiness", 0)


@pytest.mark.parametrize("preset", PRESETS)
def test_invoke_run(handlers: list[WorkerSpec], preset: str) -> None:
    """Mirrors ``test_invoke_run``: ``run()`` records the metrics and the worker events and shuts
    down once each. Upstream patches ``_invoke_run`` away; here it is the mixin's, on a run that
    succeeds at once."""
    agent = _agent(handlers, [monres(WorkerState.SUCCEEDED)], preset)
    agent.run()
    assert agent.record_metrics_calls == 1
    assert agent.record_events_calls == 1
    assert len(agent.shutdown_calls) == 1


RECORD_METRICS = {
    # name: (script, max_restarts, the one run_* metric that is 1)
    "success_no_retries": ([WorkerState.SUCCEEDED], 1, "run_success_no_retries"),
    "success_with_retries": ([WorkerState.FAILED, WorkerState.SUCCEEDED], 10,
                             "run_success_with_retries"),
    "failed_with_retries": ([WorkerState.FAILED, WorkerState.FAILED], 1,
                            "run_failed_with_retries"),
    "failed_no_retries": ([WorkerState.FAILED], 0, "run_failed_no_retries"),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case", list(RECORD_METRICS))
def test_record_metrics(handlers: list[WorkerSpec], put_metrics: list[tuple[str, int]],
                        case: str, preset: str) -> None:
    """Mirrors ``test_record_metrics_success_no_retries``, ``..._success_with_retries``,
    ``..._failed_with_retries`` and ``..._failed_no_retries``. Upstream calls
    ``_record_metrics`` on a made-up result; here a run ends that way, so the counters it reads
    are the lifecycle's (the torchelastic preset raises, and the mixin records the run itself)."""
    states, max_restarts, which = RECORD_METRICS[case]
    agent = _agent(handlers, [monres(s) for s in states], preset, max_restarts=max_restarts)
    _run(agent)
    run_metrics = {name.rsplit(".", 1)[1]: value for name, value in put_metrics
                   if name.startswith("workers.test_trainer.run_")}
    assert run_metrics == {
        "run_total": 1,
        "run_success_with_retries": 0, "run_success_no_retries": 0,
        "run_failed_with_retries": 0, "run_failed_no_retries": 0,
        which: 1,
    }
    assert agent.record_metrics_calls == 1


def _check_rendezvous(worker_group: WorkerGroup, local_world_size: int) -> None:
    assert worker_group.group_world_size == 1
    assert worker_group.group_rank == 0
    assert worker_group.master_port > 0
    rank_set = {w.global_rank for w in worker_group.workers}
    for w in worker_group.workers:
        assert w.id is None
        assert w.world_size == local_world_size * worker_group.group_world_size
        assert w.global_rank == local_world_size * worker_group.group_rank + w.local_rank
        assert set(range(w.world_size)) == rank_set


def test_rendezvous_master_addr_with_local_addr(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_rendezvous`` and ``test_rendezvous_master_addr_with_local_addr`` (the
    mixin's own ``_rendezvous``: torch's, without its needless sleeps). Loopback only: upstream's
    ``test_rendezvous`` binds the store to the host's name."""
    agent = _agent(handlers, local_addr="127.0.0.1")
    worker_group = agent.get_worker_group()
    agent._rendezvous(worker_group)
    _check_rendezvous(worker_group, 8)
    assert worker_group.master_addr == "127.0.0.1"


def test_rendezvous_default_master_addr(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_rendezvous_default_master_addr``: without a local address, the workers are
    told the address torch's own agent gives them (torch 2.13: the rendezvous endpoint's host;
    upstream's test puts the host's name there, which would leave loopback)."""
    agent = _agent(handlers, local_addr=None)
    worker_group = agent.get_worker_group()
    agent._rendezvous(worker_group)
    _check_rendezvous(worker_group, 8)
    torch_agent = TestAgent(_spec(handlers, local_addr=None))
    torch_agent._rendezvous(torch_agent.get_worker_group())
    assert worker_group.master_addr == torch_agent.get_worker_group().master_addr == "127.0.0.1"


def test_initialize_workers(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_initialize_workers``. The mixin never calls ``_initialize_workers``: the
    spec's ``start`` transition runs the driver's ``rendezvous`` and ``start_workers``. So the
    check is what the first monitor tick finds: HEALTHY, and every worker's id its global rank."""
    agent = _agent(handlers, [monres(WorkerState.SUCCEEDED)])
    agent.run()
    first = agent.seen[0]
    assert first["state"] == WorkerState.HEALTHY
    assert first["ids"] == first["global_ranks"] == list(range(8))


def test_restart_workers(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_restart_workers``. The mixin never calls ``_restart_workers``: the spec's
    restart transition stops, re-rendezvous and starts. Three failures, three restarts: after
    each, the group is HEALTHY with its ranks and ids assigned."""
    num_restarts = 3
    agent = _agent(handlers, [*[monres(WorkerState.FAILED)] * num_restarts,
                              monres(WorkerState.SUCCEEDED)], max_restarts=num_restarts)
    assert agent.run().state == WorkerState.SUCCEEDED
    for seen in agent.seen:
        assert seen["state"] == WorkerState.HEALTHY
        assert seen["group_rank"] is not None and seen["group_world_size"] is not None
        assert None not in seen["ids"] and -1 not in seen["global_ranks"]
    assert agent.start_workers_call_count == num_restarts + 1  # the first start, then restarts
    assert agent.stop_workers_call_count == num_restarts


def test_run_happy_path(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_run_happy_path``: always healthy, then succeeds; no retries."""
    max_restarts = 10
    agent = _agent(handlers, [monres(WorkerState.HEALTHY), monres(WorkerState.HEALTHY),
                              monres(WorkerState.SUCCEEDED)], max_restarts=max_restarts)
    agent.run()
    assert agent._remaining_restarts == max_restarts
    assert agent.record_events_calls == 1


class FailingStart(MixinAgent):
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        raise RuntimeError("cannot start")


@pytest.mark.parametrize("preset", PRESETS)
def test_run_initialization_failure(handlers: list[WorkerSpec], preset: str) -> None:
    """Mirrors ``test_run_initialization_failure``. Upstream's ``_initialize_workers`` raises;
    here the first start of the workers does (the mixin does not call ``_initialize_workers``).
    ``run()`` raises a RuntimeError (``ActionError`` is one, naming the action and transition,
    with torch's error as its cause). The group state differs on purpose: torch leaves it INIT,
    the lifecycle reports the UNKNOWN its spec moved to (an aborted start is not a group that
    was never started)."""
    agent = FailingStart(_spec(handlers), [], lifecycle_spec=preset)
    with pytest.raises(RuntimeError) as info:
        agent.run()
    assert isinstance(info.value, ActionError)
    assert str(info.value.__cause__) == "cannot start"
    assert agent._worker_group.state == WorkerState.UNKNOWN
    assert len(agent.shutdown_calls) == 1


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("restartable", [WorkerState.FAILED, WorkerState.UNHEALTHY])
def test_run_max_retries_exceeded(handlers: list[WorkerSpec], preset: str,
                                  restartable: WorkerState) -> None:
    """Mirrors ``test_run_max_retries_exceeded``: a group that keeps failing (or being unhealthy)
    ends FAILED with no restarts left, after one monitor call per attempt."""
    agent = _agent(handlers, [monres(restartable)], preset, max_restarts=3)
    outcome = _run(agent)
    if preset == "torchelastic":
        assert isinstance(outcome, WorkerGroupFailureException)
    else:
        assert outcome.state == WorkerState.FAILED
    assert agent._worker_group.state == WorkerState.FAILED
    assert agent._remaining_restarts == 0
    assert agent.monitor_calls == 3 + 1


@pytest.mark.parametrize("preset", PRESETS)
def test_run_membership_change(handlers: list[WorkerSpec], preset: str) -> None:
    """Mirrors ``test_run_membership_change``: nodes wait to join on two ticks, so the group is
    restarted twice, without using up restarts, and then succeeds. (Upstream patches
    ``num_nodes_waiting`` on the handler class; here on the handler the agent uses.)"""
    agent = _agent(handlers, [monres(WorkerState.HEALTHY)] * 3 + [monres(WorkerState.SUCCEEDED)],
                   preset, max_restarts=1)
    waiting = [1, 1, 0]
    agent._worker_group.spec.rdzv_handler.num_nodes_waiting = (  # type: ignore[method-assign]
        lambda: waiting.pop(0) if waiting else 0
    )
    assert agent.run().state == WorkerState.SUCCEEDED
    assert agent._worker_group.state == WorkerState.SUCCEEDED
    assert agent.record_events_calls == 1
    assert agent.start_workers_call_count == 3  # the first start and two membership restarts
    assert agent._remaining_restarts == 1  # membership changes do not count


@pytest.mark.parametrize("preset", PRESETS)
def test_run_unknown_state(handlers: list[WorkerSpec], preset: str) -> None:
    """Mirrors ``test_run_unknown_state``: an UNKNOWN group ends the run at once, no retries."""
    agent = _agent(handlers, [monres(WorkerState.UNKNOWN)], preset, max_restarts=100)
    with pytest.raises(Exception):  # noqa: B017 - upstream asserts just that
        agent.run()
    assert agent._worker_group.state == WorkerState.UNKNOWN
    assert agent.monitor_calls == 1
    assert agent._remaining_restarts == 100


def test_assign_worker_ranks(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_assign_worker_ranks`` (torch's rank assignment, on the mixin's agent)."""
    role_infos = [
        _RoleInstanceInfo("parameter_server", 0, 4),
        _RoleInstanceInfo("trainer", 1, 1),
        _RoleInstanceInfo("trainer", 2, 2),
        _RoleInstanceInfo("trainer", 3, 3),
        _RoleInstanceInfo("parameter_server", 4, 5),
    ]
    store = dist.HashStore()
    specs = [_spec(handlers, max_restarts=3, role=info.role,
                   local_world_size=info.local_world_size) for info in role_infos]

    def assign(i: int) -> list[tuple[int, int, int, int, int]]:
        info, spec = role_infos[i], specs[i]
        workers = MixinAgent(spec)._assign_worker_ranks(store, info.rank, len(role_infos), spec)
        return [(w.local_rank, w.role_rank, w.global_rank, w.world_size, w.role_world_size)
                for w in workers]

    with ThreadPool(len(role_infos)) as pool:
        out = pool.map(assign, range(len(role_infos)))
    assert out == [
        [(0, 0, 0, 15, 9), (1, 1, 1, 15, 9), (2, 2, 2, 15, 9), (3, 3, 3, 15, 9)],
        [(0, 0, 4, 15, 6)],
        [(0, 1, 5, 15, 6), (1, 2, 6, 15, 6)],
        [(0, 3, 7, 15, 6), (1, 4, 8, 15, 6), (2, 5, 9, 15, 6)],
        [(0, 4, 10, 15, 9), (1, 5, 11, 15, 9), (2, 6, 12, 15, 9), (3, 7, 13, 15, 9),
         (4, 8, 14, 15, 9)],
    ]


def test_get_event(handlers: list[WorkerSpec]) -> None:
    """Mirrors ``test_get_event`` and ``test_get_worker_status_event``."""
    agent = _agent(handlers, max_restarts=4)
    event = agent.get_event_succeeded()
    assert event.source == "AGENT"
    assert event.metadata["rdzv_backend"] == "static"
    assert event.metadata["state"] == "SUCCEEDED"
    assert event.metadata["role"] == "test_trainer"
    agent._remaining_restarts = 4 - 2
    worker_event = agent._construct_event(state="SUCCEEDED", source="WORKER",
                                          worker=agent._worker_group.workers[0])
    assert worker_event.source == "WORKER"
    assert worker_event.metadata["rdzv_backend"] == "static"
    assert worker_event.metadata["state"] == "SUCCEEDED"
    assert worker_event.metadata["role"] == "test_trainer"
    assert worker_event.metadata["agent_restarts"] == 2


@pytest.mark.parametrize("preset", PRESETS)
def test_agent_process_signal_exception(handlers: list[WorkerSpec], preset: str) -> None:
    """Mirrors ``test_agent_process_signal_exception``: a termination signal during the run
    reaches ``run()``, which shuts the workers down with that signal and re-raises. (Upstream
    raises it from a patched ``_invoke_run``; here from a monitor tick, through the lifecycle.)"""
    sig = SignalException("signal exception", sigval=signal.SIGTERM)
    agent = _agent(handlers, [monres(WorkerState.HEALTHY), sig], preset, max_restarts=0)
    with pytest.raises(SignalException):
        agent.run()
    assert agent.shutdown_calls == [(signal.SIGTERM,)]


class GracefulExit(MixinAgent):
    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        raise RendezvousGracefulExitError()


@pytest.mark.parametrize("preset", PRESETS)
def test_agent_process_handler_graceful_exception(handlers: list[WorkerSpec],
                                                  preset: str) -> None:
    """Mirrors ``test_agent_process_handler_graceful_exception``: the rendezvous handler's
    graceful exit ends ``run()`` quietly (upstream raises it from ``_invoke_run``; here from the
    rendezvous, inside the spec's start transition, which must let it through unwrapped)."""
    agent = GracefulExit(_spec(handlers, max_restarts=0), [], lifecycle_spec=preset)
    assert agent.run() is None
    assert len(agent.shutdown_calls) == 1
