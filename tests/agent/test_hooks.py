"""The agent hooks ``TorchDriver`` and the mixins call: declared in ``fsm_agent.torch._hooks``,
asked for through those Protocols, and the optional ones still optional.
"""

from __future__ import annotations

import ast
import logging
import signal
from pathlib import Path
from typing import Any

import pytest

from fsm_agent._core import _driver
from fsm_agent.torch import FSMElasticAgent, _hooks
from fsm_agent.torch._driver import TorchDriver

TORCH = Path(_hooks.__file__).resolve().parent
REQUIRED = (_hooks.AgentHooks,)
OPTIONAL = (_hooks.DiagnosticHooks, _hooks.PeerHooks, _hooks.PreemptionHooks, _hooks.SlateHooks,
            _hooks.TimerHooks)
HOOKS = {m for p in (*REQUIRED, *OPTIONAL) for m in _driver.members(p)}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def test_no_hook_is_looked_up_by_a_string_outside_its_declaration() -> None:
    found = []
    for path in sorted(TORCH.glob("*.py")):
        if path.name == "_hooks.py":
            continue
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in HOOKS):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []
    assert "type: ignore[attr-defined]" not in (TORCH / "_driver.py").read_text()


def test_the_driver_asks_for_every_optional_hook_and_calls_the_required_ones() -> None:
    asked, called = set(), set()
    for path in sorted(TORCH.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "capability"):
                member = node.args[1]
                assert isinstance(member, ast.Attribute), f"{path.name}:{node.lineno}"
                asked.add(member.attr)
            elif (isinstance(node, ast.Attribute) and node.attr == "__name__"
                  and isinstance(node.value, ast.Attribute) and node.value.attr in HOOKS):
                asked.add(node.value.attr)  # a tick's lookup: getattr(agent, Hooks.name.__name__)
            elif (isinstance(node, ast.Attribute) and node.attr in HOOKS
                  and ast.unparse(node.value) == "self.hooks"):
                called.add(node.attr)
    optional = {m for p in OPTIONAL for m in _driver.members(p)} - {"_fsm_asks_peers"}
    # _fsm_note is required of the driver's agent, and optional to the timer's stacks note
    assert asked == optional | {"_fsm_note"}
    assert called == set(_driver.members(_hooks.AgentHooks))


def test_the_static_check_composes_the_agents_own_bases() -> None:
    # fsm_agent/torch/_agent.py's _Composed (seen by mypy only) stands for FSMElasticAgent
    [composed] = [n for n in ast.walk(_tree(TORCH / "_agent.py"))
                  if isinstance(n, ast.ClassDef) and n.name == "_Composed"]
    ours = [b.__name__ for b in FSMElasticAgent.__bases__ if b.__module__.startswith("fsm_agent")]
    assert [ast.unparse(b) for b in composed.bases] == ours


@pytest.mark.parametrize("protocol", [*REQUIRED, *OPTIONAL])
def test_the_agent_has_every_hook(protocol: type) -> None:
    for name in _driver.members(protocol):
        if name != "_fsm_asks_peers":  # set by the mixin's __init__
            assert callable(getattr(FSMElasticAgent, name)), name


class _Plain:
    """An agent with none of the optional hooks, recording the required ones."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def _fsm_drain_workers(self, signum: int) -> None:
        self.calls.append(("drain", signum))

    def _fsm_kill_workers(self) -> None:
        self.calls.append(("kill",))

    def _fsm_note(self, key: str, value: Any) -> None:
        self.calls.append(("note", key, value))


def test_an_agent_without_the_optional_hooks_keeps_the_drivers_defaults(
        caplog: pytest.LogCaptureFixture) -> None:
    agent = _Plain()
    driver = TorchDriver(agent, isolate_worker_store=False)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="fsm_agent.torch"):
        driver.capture_stacks()
    assert "agent _Plain cannot take its workers' stacks" in caplog.text
    assert driver.preemption() is None
    assert driver.lost_peers() == ()
    assert driver._lost_at_barrier() is None
    driver.drain_workers(signal.SIGTERM)
    driver.kill_workers()
    driver.note_progress({"progressed": True})
    assert agent.calls == [("drain", signal.SIGTERM), ("kill",),
                           ("note", "progress", {"progressed": True})]


def test_an_agent_hook_set_on_the_instance_is_used_and_one_set_to_none_is_missing() -> None:
    agent = _Plain()
    driver = TorchDriver(agent, isolate_worker_store=False)  # type: ignore[arg-type]
    agent._fsm_lost_peers = lambda: ["node-b"]  # type: ignore[attr-defined]
    assert driver.lost_peers() == ("node-b",)
    assert driver._lost_at_barrier() is not None
    agent._fsm_lost_peers = None  # type: ignore[attr-defined]
    assert driver.lost_peers() == ()
