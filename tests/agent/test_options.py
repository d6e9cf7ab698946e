"""``AgentOptions`` (``fsm_agent/torch/_options.py``): the agent's options as one object, from
``fsm-agent run`` through ``launch`` into the agent."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
from fsm_test_procs import free_port

from fsm_agent.torch import AgentOptions, launch


def _config() -> Any:
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id=str(uuid.uuid4().int),
                        rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_backend="c10d",
                        monitor_interval=0.1, max_restarts=0, start_method="spawn")


def test_an_unknown_option_is_a_type_error_before_anything_starts() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*lifecycle_sepc.*"
                       r"lifecycle_spec"):
        launch(None, sys.executable, [], lifecycle_sepc="resilient")  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_options_reach_the_agent_and_a_keyword_replaces_one() -> None:
    seen: dict[str, Any] = {}

    def on_agent(agent: Any) -> None:
        seen.update(spec=agent._lifecycle_spec.name, barrier=agent._exit_barrier_timeout)

    options = AgentOptions(lifecycle_spec="resilient", exit_barrier_timeout=7.0)
    launch(_config(), sys.executable, ["-c", "pass"], options=options, on_agent=on_agent,
           exit_barrier_timeout=9.0)
    assert seen["spec"] == "resilient" and seen["barrier"] == 9.0, seen
    assert options.exit_barrier_timeout == 7.0  # frozen: the caller's object is not changed


def test_every_option_is_an_agent_keyword() -> None:
    import inspect

    from fsm_agent.torch import FSMElasticAgent

    accepted = {name for cls in FSMElasticAgent.__mro__ if "__init__" in vars(cls)
                for name in inspect.signature(vars(cls)["__init__"]).parameters}
    assert sorted(AgentOptions.names() - accepted) == []
