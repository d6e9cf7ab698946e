"""torch's internals the adapter uses (``fsm_agent/torch/_compat.py``): all present in the torch
under test, a missing one detected, and each optional feature off (one logged line, torch's
behaviour instead) when torch lacks one of its touch points, with a real job still running."""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch.distributed as dist
from fsm_test_procs import kill_leftovers
from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from fsm_agent.torch import FSMElasticAgent, _compat
from fsm_agent.torch._fastpath import state_cache_expiry
from fsm_agent.torch._loopback import loopback_rendezvous_handler

OPTIONAL = [f for f in _compat.FEATURES if f != "core"]
# rank 1 fails on the first attempt: the job restarts once (rendezvous, store, waker again)
FAIL_ONCE = ("import os, sys; sys.exit(1 if os.environ['LOCAL_RANK'] == '1' and "
             "os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)")


@pytest.fixture(autouse=True)
def fresh_check() -> Iterator[None]:
    _compat.reset()
    yield
    _compat.reset()


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    yield
    leaked = kill_leftovers(uuid.uuid4().hex)
    assert not leaked, f"processes left behind: {sorted(leaked)}"


def _without(monkeypatch: pytest.MonkeyPatch, feature: str) -> _compat.TouchPoint:
    """A torch that lacks the first touch point of ``feature`` (the table names a part that
    does not exist); returns the point taken away."""
    points = list(_compat.TOUCH_POINTS)
    i = next(i for i, p in enumerate(points) if p.feature == feature)
    gone = points[i]
    points[i] = attrs.evolve(gone, name=gone.name + "_gone") if gone.name else \
        attrs.evolve(gone, target=gone.target + "_gone")
    monkeypatch.setattr(_compat, "TOUCH_POINTS", tuple(points))
    return gone


def _off_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if " off: torch " in r.getMessage()]


def _run_job(**agent_kwargs: Any) -> tuple[Any, FSMElasticAgent]:
    """A real two-worker job on a c10d rendezvous that fails once and recovers."""
    params = RendezvousParameters(backend="c10d", endpoint="localhost:0",
                                  run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1)
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=sys.executable,
                      args=("-c", FAIL_ONCE),
                      rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
                      max_restarts=1, monitor_interval=0.05)
    agent = FSMElasticAgent(spec, logs_specs=DefaultLogsSpecs(), exit_barrier_timeout=5,
                            lifecycle_spec="torchrun", **agent_kwargs)
    try:
        return agent.run(), agent
    finally:
        spec.rdzv_handler.shutdown()


def test_every_touch_point_is_in_the_torch_under_test() -> None:
    """The table is not stale: the installed torch has everything (CI: 2.13.0; compat/ runs
    the suite on other versions)."""
    assert _compat.missing() == {}
    assert all(_compat.enabled(f) for f in _compat.FEATURES)


def test_a_removed_module_attribute_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dyn, "_delay")
    assert [str(p) for p in _compat.missing()["fastpath"]] == [
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous._delay"]


def test_an_instance_attribute_no_longer_set_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``__init__`` assigns is read off its code: a torch whose handler no longer keeps the
    workers' store server has an ``__init__`` that does not name it."""
    real = dyn.DynamicRendezvousHandler.__init__
    name = "_shared_tcp_store_server"

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        delattr(self, name)

    monkeypatch.setattr(dyn.DynamicRendezvousHandler, "__init__", init)
    # (this __init__ assigns nothing at all, so the handler's other touch points go too)
    assert name in [p.name for p in _compat.missing()["isolation"]]


def test_a_keyword_the_store_no_longer_takes_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    class OldStore(dist.TCPStore):  # type: ignore[misc]
        def __init__(self, host_name: str, port: int, world_size: int | None = None,
                     is_master: bool = False) -> None:
            super().__init__(host_name, port, world_size, is_master)

    # The check imports the modules its touch points name; one imported while TCPStore is
    # patched (c10d_rendezvous_backend: `from torch.distributed import TCPStore`) would keep
    # OldStore for every later test of this process.
    assert _compat.missing() == {}
    monkeypatch.setattr(dist, "TCPStore", OldStore)
    assert [str(p) for p in _compat.missing()["loopback"]] == [
        "torch.distributed.TCPStore.__init__(master_listen_fd=...)"]


def test_without_a_core_touch_point_the_agent_is_not_built(
    monkeypatch: pytest.MonkeyPatch, no_leftovers: None
) -> None:
    gone = _without(monkeypatch, "core")
    with pytest.raises(_compat.TorchCompatError, match=f"has no {gone.target.replace(':', '.')}"):
        _run_job()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("feature", OPTIONAL)
def test_a_feature_torch_lacks_is_off_with_one_line_and_the_job_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_leftovers: None,
    feature: str,
) -> None:
    gone = _without(monkeypatch, feature)
    used: dict[str, Any] = {}
    if feature == "barrier":
        from torch.distributed.elastic.utils import store as store_util

        real_barrier = store_util.barrier

        def barrier(*args: Any, **kwargs: Any) -> None:
            used["torch barrier"] = True
            real_barrier(*args, **kwargs)

        monkeypatch.setattr(store_util, "barrier", barrier)
    if feature == "hang_watchdog":
        monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        real_setup = FSMElasticAgent._setup_local_watchdog

        def setup(self: FSMElasticAgent, envs: Any) -> None:
            real_setup(self, envs)
            used["watchdog"] = type(self._worker_watchdog).__name__

        monkeypatch.setattr(FSMElasticAgent, "_setup_local_watchdog", setup)
    if feature == "wakeup":
        from fsm_agent.torch import _wakeup

        real_init = _wakeup.WorkerExitWaker.__init__

        def waker_init(self: Any, backend: str | None = None) -> None:
            real_init(self, backend)
            used.setdefault("backends", []).append(self.backend)

        monkeypatch.setattr(_wakeup.WorkerExitWaker, "__init__", waker_init)

    with caplog.at_level(logging.INFO, logger="fsm_agent"):
        result, agent = _run_job(**({"preload": ["json"]} if feature == "preload" else {}))
    assert result.state == WorkerState.SUCCEEDED, result
    assert agent.lifecycle is not None and agent.lifecycle.restart_count == 1
    lines = _off_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"fsm_agent.torch: {feature} off: ") and str(gone) in lines[0]
    assert not _compat.enabled(feature)
    assert all(_compat.enabled(f) for f in _compat.FEATURES if f != feature)

    # torch's behaviour in place of the feature
    handler = agent.get_worker_group().spec.rdzv_handler
    if feature == "fastpath":
        assert state_cache_expiry(handler) is None
    elif feature == "barrier":
        assert used == {"torch barrier": True}
    elif feature == "isolation":
        # this agent hosted each round's worker store itself (torch's handler did not)
        assert sum("workers of this round use a fresh store" in r.getMessage()
                   for r in caplog.records) == 2
    elif feature == "loopback":
        params = RendezvousParameters(backend="c10d", endpoint="localhost:0", run_id="x",
                                      min_nodes=1, max_nodes=1)
        assert loopback_rendezvous_handler(params) is None
    elif feature == "wakeup":
        assert set(used["backends"]) == {"tick"}
    elif feature == "hang_watchdog":
        assert used["watchdog"] == "FileTimerServer"  # torch's own
    elif feature == "reaper":
        assert agent._worker_process_groups() == []
    elif feature == "clean_slate":  # the workers are not marked, so nothing is looked for
        assert agent._fsm_slate_token == ""
    elif feature == "preload":  # no template was started: the workers start cold
        assert any("--preload json: not with this torch" in r.getMessage()
                   for r in caplog.records)
    elif feature == "error_files":  # torch's own ProcessFailure while the workers are looked at
        from torch.distributed.elastic.multiprocessing import api, errors

        from fsm_agent.torch._errorfiles import tolerant_error_files

        with tolerant_error_files():
            assert api.ProcessFailure is errors.ProcessFailure
    elif feature == "bounded_store":  # the c10d backend keeps torch's own store
        from fsm_agent.torch._bounded import StoreCalls, bound_backend

        assert not bound_backend(handler, StoreCalls(1.0))
    elif feature == "stable_slots":  # the handler keeps torch's executor and numbering
        from fsm_agent.torch._slots import install_stable_slots

        assert not install_stable_slots(handler)
        assert type(handler._op_executor) is dyn._DistributedRendezvousOpExecutor
    elif feature == "peer_watch":  # the state holder keeps torch's sweep, unwatched
        from fsm_agent.torch._peers import install_peer_watch

        assert install_peer_watch(handler) is None
        assert "_sanitize" not in vars(handler._state_holder)
    elif feature == "etcd_job":  # an etcd handler's agents decide alone, as torch's
        from types import SimpleNamespace

        from fsm_agent.torch._etcd import etcd_job_store

        client = SimpleNamespace(read=print, write=print)
        etcd_v2 = SimpleNamespace(_store=SimpleNamespace(client=client, prefix="/x"))
        assert etcd_job_store(etcd_v2) is None
    else:  # pragma: no cover - a new feature needs its check here
        pytest.fail(f"no check for feature {feature!r}")


def test_checked_once_per_process(monkeypatch: pytest.MonkeyPatch,
                                  caplog: pytest.LogCaptureFixture) -> None:
    _without(monkeypatch, "wakeup")
    with caplog.at_level(logging.WARNING, logger="fsm_agent"):
        for _ in range(3):
            assert not _compat.enabled("wakeup")
    assert len(_off_lines(caplog)) == 1
