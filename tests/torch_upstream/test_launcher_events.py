"""What ``fsm_agent.torch.launch`` does around the agent, against torch's own ``launch_agent`` run
the same way in the same process: the launcher-level events it records, and the
health check server a caller hands it."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic import events
from torch.distributed.elastic.agent.server.health_check_server import HealthCheckServer
from torch.distributed.elastic.agent.server.local_elastic_agent import (
    LocalElasticAgent,
    _AliveCallbackProxy,
)
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, launch_agent

from fsm_agent.torch import launch

SAD = "raise SystemExit(3)"
HAPPY = "pass"


def _config(tmp_path: Path) -> LaunchConfig:
    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id=uuid.uuid4().hex,
                        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                        monitor_interval=0.05, local_addr="127.0.0.1",
                        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / uuid.uuid4().hex)))


def _agent_events(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[str | None, list[str]]:
    """Run ``run()``; the launcher's AGENT events (their state) and the error it raised."""
    seen: list[Any] = []
    real = events.record
    monkeypatch.setattr(events, "record", lambda e, *a, **kw: (seen.append(e), real(e, *a, **kw)))
    error = None
    try:
        run()
    except ChildFailedError as e:
        error = type(e).__name__
    finally:
        monkeypatch.setattr(events, "record", real)
    return error, [e.metadata.get("state") for e in seen if e.source.value == "AGENT"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code", [SAD, HAPPY])
@pytest.mark.parametrize("preset", ["torchelastic", "torchrun", "resilient"])
def test_the_launcher_records_the_agent_event_torch_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str, code: str) -> None:
    args = ["-c", code]
    want = _agent_events(monkeypatch, lambda: launch_agent(_config(tmp_path), sys.executable,
                                                           args))
    got = _agent_events(monkeypatch, lambda: launch(_config(tmp_path), sys.executable, args,
                                                    lifecycle_spec=preset))
    assert want[1], want  # torch records one, whatever the workers did
    assert got == want, (preset, got, want)


class _Server(HealthCheckServer):
    """torch's no-op server on torch's ``_AliveCallbackProxy``, as a caller that started one
    before the agent existed has it; it remembers being stopped."""

    stopped = False

    def __init__(self) -> None:
        super().__init__(_AliveCallbackProxy(), port=0, timeout=60)

    def stop(self) -> None:
        self.stopped = True
        super().stop()


def _served(run: Any) -> tuple[Any, bool]:
    """Run ``run(server)``: the agent method the server's callback then delegates to, and
    whether the server was stopped."""
    server = _Server()
    assert server.alive_callback() > 0  # the proxy's current time until an agent is wired in
    run(server)
    delegate = server.alive_callback._delegate  # type: ignore[attr-defined]
    return getattr(delegate, "__func__", None), server.stopped


@pytest.mark.timeout(120)
def test_a_health_check_server_given_is_answered_by_the_agent_and_stopped(
        tmp_path: Path) -> None:
    """torch 2.13's ``launch_agent(..., health_check_server=)``: the agent answers through the
    server's proxy and stops the server when it shuts down, as under torch's launch_agent."""
    args = ["-c", HAPPY]
    want = _served(lambda server: launch_agent(_config(tmp_path), sys.executable, args,
                                               health_check_server=server))
    agents: list[Any] = []
    got = _served(lambda server: launch(_config(tmp_path), sys.executable, args,
                                        lifecycle_spec="torchrun", health_check_server=server,
                                        on_agent=agents.append))
    assert want == (LocalElasticAgent._get_alive_time, True), want
    assert got == want, (got, want)
    assert isinstance(agents[0], LocalElasticAgent)
