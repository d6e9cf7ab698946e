"""Quiet monitor ticks (fsm_agent/torch/_tick.py) and the membership check's cached answer.

Real components throughout: torch's c10d rendezvous handlers on an in-process TCPStore, and an
in-process ``FSMElasticAgent`` running real script workers.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed")

from torch.distributed.elastic import metrics  # noqa: E402
from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState  # noqa: E402
from torch.distributed.elastic.agent.server.local_elastic_agent import (  # noqa: E402
    LocalElasticAgent,
)
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: E402
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: E402
    C10dRendezvousBackend,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (  # noqa: E402
    create_handler,
)

from fsm_agent.torch import FSMElasticAgent  # noqa: E402
from fsm_agent.torch._fastpath import (  # noqa: E402
    cached_nodes_waiting,
    notify_background_syncs,
    state_cache_expiry,
)
from fsm_agent.torch._tick import monitor_is_torchs  # noqa: E402

# -- which agents may skip a look --------------------------------------------------------------


class _OwnMonitor(FSMElasticAgent):
    def _monitor_workers(self, worker_group: Any) -> Any:  # checks something torch does not
        return super()._monitor_workers(worker_group)


def test_only_torchs_own_monitor_may_be_skipped() -> None:
    assert monitor_is_torchs(FSMElasticAgent)
    assert monitor_is_torchs(LocalElasticAgent)
    assert not monitor_is_torchs(_OwnMonitor)
    assert not monitor_is_torchs(object)


# -- the membership check --------------------------------------------------------------------


def _handlers(n: int) -> tuple[Any, list[Any]]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    params = RendezvousParameters(backend="c10d", endpoint="127.0.0.1:0", run_id=uuid.uuid4().hex,
                                  min_nodes=1, max_nodes=2, last_call_timeout=1, join_timeout=30)
    return store, [create_handler(store, C10dRendezvousBackend(store, params.run_id), params)
                   for _ in range(n)]


@pytest.mark.timeout(60)
def test_cached_count_is_torchs_and_a_waiting_node_is_seen_when_torch_sees_it() -> None:
    _store, (first, second) = _handlers(2)
    first.next_rendezvous()  # a round of one
    errors: list[BaseException] = []

    def join() -> None:  # the second node waits for the next round
        try:
            second.next_rendezvous()
        except BaseException as e:  # RendezvousClosedError once the first shuts down
            errors.append(e)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    holder = first._state_holder
    compared = read = 0
    seen = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            due = state_cache_expiry(first)
            cached = cached_nodes_waiting(first)
            synced = holder._last_sync_time
            count = first.num_nodes_waiting()  # torch's own answer
            if holder._last_sync_time == synced:  # torch served its cache: so must we
                assert cached == count
                compared += 1
            else:  # torch read the store: the expiry said it would, and we left it to torch
                assert cached is None and due is not None and due <= time.monotonic()
                read += 1
            if count:
                seen = count
                break
            time.sleep(0.02)
    finally:
        first.shutdown()
        joiner.join(20)
    assert seen == 1
    assert compared > 10 and read >= 1
    assert not joiner.is_alive()


@pytest.mark.timeout(30)
def test_background_syncs_are_reported_and_the_hook_is_removed() -> None:
    _store, (handler,) = _handlers(1)
    handler.next_rendezvous()
    calls: list[str] = []
    undo = notify_background_syncs(handler, lambda: calls.append(threading.current_thread().name))
    try:
        handler._state_holder.sync()  # this thread's own syncs are the agent's: no call
        assert calls == []
        keep_alive = threading.Thread(target=handler._state_holder.sync, name="keep-alive")
        keep_alive.start()
        keep_alive.join(10)
        assert calls == ["keep-alive"]
    finally:
        undo()
        handler.shutdown()
    assert "sync" not in vars(handler._state_holder)


def test_handlers_without_torchs_state_holder_are_left_to_their_own_call() -> None:
    class Plain:
        def num_nodes_waiting(self) -> int:
            return 3

    assert cached_nodes_waiting(Plain()) is None
    assert state_cache_expiry(Plain()) is None
    notify_background_syncs(Plain(), lambda: None)()  # a no-op, not an error


# -- a real agent ----------------------------------------------------------------------------

WORKER = """
import os, sys, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "1":
    time.sleep(float(sys.argv[1]))
    sys.exit(7)
time.sleep(float(sys.argv[2]))
"""


class _Metrics(metrics.MetricHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def emit(self, metric_data: metrics.MetricData) -> None:
        self.names.append(metric_data.name)


@pytest.fixture
def torch_metrics() -> Iterator[_Metrics]:
    handler = _Metrics()
    metrics.configure(handler, group="torchelastic")
    try:
        yield handler
    finally:
        metrics.configure(metrics.NullMetricHandler(), group="torchelastic")


def _run_agent(tmp_path: Path, crash_after: float, run_for: float, max_restarts: int,
               listeners: tuple[Any, ...] = ()) -> Any:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    params = RendezvousParameters(backend="c10d", endpoint="127.0.0.1:0", run_id=uuid.uuid4().hex,
                                  min_nodes=1, max_nodes=1)
    handler = create_handler(store, C10dRendezvousBackend(store, params.run_id), params)
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=sys.executable,
                      args=(str(script), str(crash_after), str(run_for)), rdzv_handler=handler,
                      max_restarts=max_restarts, monitor_interval=0.05, master_addr="127.0.0.1")
    agent = FSMElasticAgent(spec, DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
                            lifecycle_spec="torchrun", exit_barrier_timeout=5,
                            listeners=listeners)
    try:
        result = agent.run("trainer")
    finally:
        handler.shutdown()
    return agent, result


@pytest.mark.timeout(60)
def test_an_idle_agent_looks_rarely_and_still_sees_a_crash_at_once(tmp_path: Path) -> None:
    agent, result = _run_agent(tmp_path, crash_after=1.5, run_for=1.0, max_restarts=1)
    assert result.state == WorkerState.SUCCEEDED
    assert agent.lifecycle.restart_count == 1  # the crash was seen and the group restarted
    # About 50 ticks of 0.05 s passed while the workers ran; nothing needed a look in between
    # the crash, the membership check's store reads (1 s cache) and the starts.
    assert agent._fsm_quiet.looks < 20


@pytest.mark.timeout(60)
def test_with_a_metrics_handler_every_tick_looks_as_under_torch(
    tmp_path: Path, torch_metrics: _Metrics
) -> None:
    agent, result = _run_agent(tmp_path, crash_after=0.5, run_for=0.5, max_restarts=1)
    assert result.state == WorkerState.SUCCEEDED
    assert agent._fsm_quiet.quiet == 0
    names = torch_metrics.names
    looks = names.count("LocalElasticAgent._monitor_workers.success")
    ticks = sum(names.count(f"workers.trainer.{s}") for s in ("healthy", "failed", "succeeded"))
    assert looks == ticks == agent._fsm_quiet.looks > 10


class _Steps:
    """A lifecycle listener that counts the steps it sees."""

    def __init__(self, every_tick: bool) -> None:
        self.every_tick = every_tick
        self.steps = 0

    def __call__(self, step: Any) -> None:
        self.steps += 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("every_tick", [True, False])
def test_a_listener_sees_every_tick_unless_it_says_it_folds_them(
    tmp_path: Path, every_tick: bool
) -> None:
    # fsm-agent run's run-summary recorder folds quiet ticks (every_tick = False): it must not
    # keep the agent ticking; a listener that says nothing (a trace writer) sees every tick.
    listener = _Steps(every_tick)
    agent, result = _run_agent(tmp_path, crash_after=0.2, run_for=1.5, max_restarts=1,
                               listeners=(listener,))
    assert result.state == WorkerState.SUCCEEDED
    if every_tick:
        assert listener.steps > 25  # 1.5 s of 0.05 s ticks
    else:
        assert agent._fsm_quiet.looks < 20 and listener.steps < 20
