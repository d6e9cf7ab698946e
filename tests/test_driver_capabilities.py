"""The driver's optional capabilities: declared Protocols, reached through them, with the same
defaults as before for a driver that lacks one.

The core (``fsm_agent/_core/``) asks for an optional driver method with
``capability(driver, SomeProtocol.method)``, never by a name in a string: a new capability is a
new Protocol member, documented where the others are.
"""

from __future__ import annotations

import ast
import logging
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fsm_agent
from fsm_agent._core import _driver
from fsm_agent._core._context import Context
from fsm_agent._core._drain import Preemption, _drain_workers, _kill_workers, _preemption
from fsm_agent._core._health import HealthCheck, LeftJob, _check_guard, _leave_job
from fsm_agent._core._params import _DRIVER_METHODS, check_settings
from fsm_agent._core._peers import lost_peers
from fsm_agent._core._progress import _mark
from fsm_agent._core._quarantine import _alone, _failed_first, _quarantine_node
from fsm_agent._core._vocabulary import _announce_failure, _capture_stacks

PKG = Path(fsm_agent.__file__).resolve().parent

#: The optional-capability Protocols (``JobDriver`` is older and mostly required of a job driver:
#: only ``add_job_restart`` and ``announce_failure`` are asked for one by one).
CAPABILITIES = (_driver.PeerDriver, _driver.HealthDriver, _driver.QuarantineDriver,
                _driver.StackDriver, _driver.DrainDriver, _driver.ProgressDriver)


def _core_modules() -> list[Path]:
    # every module below the outer packages (torch/, testing/ and cli/ have drivers of their own)
    found = sorted(p for p in PKG.rglob("*.py") if p.name != "_driver.py"
                   and p.relative_to(PKG).parts[0] not in ("torch", "testing", "cli"))
    assert PKG / "_core" / "_engine.py" in found, "the core's modules were not found"
    return found


def _calls(path: Path, func: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id == func]


def test_the_core_never_looks_a_driver_method_up_by_a_string() -> None:
    found = []
    for path in _core_modules():
        for name in ("getattr", "hasattr"):
            for call in _calls(path, name):
                target = ast.unparse(call.args[0])
                if "driver" in target and isinstance(call.args[1], ast.Constant):
                    found.append(f"{path.name}:{call.lineno} {ast.unparse(call)}")
    assert found == []


def test_every_capability_member_is_what_the_core_asks_for_and_nothing_else() -> None:
    asked = set()
    protocols = {p.__name__ for p in (*CAPABILITIES, _driver.JobDriver)}
    for path in _core_modules():
        for call in _calls(path, "capability"):
            member = call.args[1]
            assert isinstance(member, ast.Attribute) and isinstance(member.value, ast.Name), (
                f"{path.name}:{call.lineno}: name the method through its Protocol")
        # capability(driver, PeerDriver.lost_peers), or a tick's PeerDriver.lost_peers.__name__
        asked |= {(n.value.id, n.attr) for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id in protocols}
    declared = {(p.__name__, m) for p in CAPABILITIES for m in _driver.members(p)}
    # of JobDriver, the lifecycle asks for two alone; the others it calls on a job driver
    assert asked == declared | {("JobDriver", "add_job_restart"), ("JobDriver", "announce_failure")}
    assert {m for _, m in asked} <= set(_driver.members(_driver.JobDriver)) | {
        m for _, m in declared}


@pytest.mark.parametrize("protocol", [*CAPABILITIES, _driver.JobMembership])
def test_each_capability_protocol_is_public_and_documented(protocol: type) -> None:
    assert getattr(fsm_agent, protocol.__name__) is protocol
    assert protocol.__name__ in fsm_agent.__all__
    assert protocol.__doc__ and all(getattr(protocol, m).__doc__ for m in _driver.members(protocol)
                                    if m != "has_job")


def test_the_required_methods_are_the_driver_protocols() -> None:
    assert _DRIVER_METHODS == _driver.members(fsm_agent.Driver) == (
        "rendezvous", "start_workers", "stop_workers", "monitor", "num_nodes_waiting",
        "exit_barrier", "put_metric")
    assert _driver.members(_driver.JobMembership) == (_driver.HAS_JOB,)


class Bare:
    """A driver with the required methods only."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def rendezvous(self) -> None: ...
    def start_workers(self) -> None: ...

    def stop_workers(self) -> None:
        self.calls.append(("stop_workers",))

    def monitor(self) -> Any: ...
    def num_nodes_waiting(self) -> int:
        return 0

    def exit_barrier(self, timeout: float) -> None: ...
    def put_metric(self, name: str, value: int) -> None: ...


def _ctx(driver: object, **more: Any) -> Any:
    return SimpleNamespace(driver=driver, role="trainer", fatal_exceptions=(KeyboardInterrupt,),
                           exit_code=None, **more)


def test_a_bare_driver_passes_the_settings_check_and_one_without_a_method_is_refused() -> None:
    check_settings(Bare(), role="r", max_restarts=0, exit_barrier_timeout=0)
    lacking = type("Lacking", (), {m: (lambda self: None) for m in _DRIVER_METHODS[:-2]})
    with pytest.raises(TypeError, match=r"driver Lacking lacks exit_barrier, put_metric$"):
        check_settings(lacking(), role="r", max_restarts=0, exit_barrier_timeout=0)


def test_a_driver_without_capabilities_keeps_every_default(
        caplog: pytest.LogCaptureFixture) -> None:
    bare = Bare()
    ctx = _ctx(bare)
    assert lost_peers(ctx) == ()
    assert _failed_first(ctx) is True
    assert _alone(ctx) is True
    assert _mark(ctx) is None
    assert _preemption(ctx) == Preemption(None, "preempted")
    _kill_workers(ctx)
    assert bare.calls == [("stop_workers",)]
    with caplog.at_level(logging.WARNING, logger="fsm_agent"):
        _drain_workers("SIGTERM")(ctx)
        _capture_stacks(ctx)
    assert "driver Bare cannot drain its workers" in caplog.text
    assert "driver Bare cannot capture stacks" in caplog.text
    _announce_failure(ctx)  # nobody to tell: nothing happens
    with pytest.raises(LeftJob, match=r"^a node health check failed$"):
        _leave_job(75)(ctx)
    with pytest.raises(LeftJob):
        _quarantine_node(75, 3)(_ctx(bare, own_failures=[], observed=None, restart_count=0))
    assert _check_guard(HealthCheck("ok", "not_quarantined", {}))(ctx) is True
    job = SimpleNamespace(driver=bare, budget_scope="job")
    assert Context.job_driver(job) is None  # type: ignore[arg-type]


def test_one_method_of_a_group_is_used_without_the_others() -> None:
    bare = Bare()
    bare.drain_workers = lambda signum: bare.calls.append(("drain_workers", signum))  # type: ignore[attr-defined]
    bare.lost_peers = lambda: ["node-b"]  # type: ignore[attr-defined]
    ctx = _ctx(bare)
    _drain_workers("SIGUSR2")(ctx)
    _kill_workers(ctx)  # no kill_workers: the workers are stopped
    assert bare.calls == [("drain_workers", signal.SIGUSR2), ("stop_workers",)]
    assert lost_peers(ctx) == ("node-b",)


def test_a_capability_set_to_none_is_missing_and_has_job_keeps_its_two_defaults() -> None:
    bare = Bare()
    bare.lost_peers = None  # type: ignore[attr-defined]
    bare.add_job_restart = lambda *a, **k: 1  # type: ignore[attr-defined]
    assert lost_peers(_ctx(bare)) == ()
    job = SimpleNamespace(driver=bare, budget_scope="job")
    # without has_job a job driver is in a job; quarantine takes the agent to be alone
    assert Context.job_driver(job) is bare  # type: ignore[arg-type]
    assert _alone(_ctx(bare)) is True
    bare.has_job = False  # type: ignore[attr-defined]
    assert Context.job_driver(job) is None  # type: ignore[arg-type]
    bare.has_job = True  # type: ignore[attr-defined]
    assert _alone(_ctx(bare)) is False
