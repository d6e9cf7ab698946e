"""What one transition did: the record listeners (such as the trace writer) receive."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["ActionRecord", "Listener", "Step", "failed_result"]


@attrs.define(slots=True)
class ActionRecord:
    """One action (or guard that raised) run during a step."""

    name: str
    kind: str  # "action", "after", "enter", "exit", "guard"
    duration: float
    outcome: str  # "ok" or "raised"
    error: str | None = None


@attrs.define(slots=True)
class Step:
    """What one transition did; listeners (such as the trace writer) receive one per transition.

    ``rule`` names the failure-policy rule whose transition was taken (None for a plain
    transition); ``timer`` is the timeout (seconds) set on entering ``dest``, the backoff chosen
    for a backoff state (None when ``dest`` has no timer).
    """

    trigger: str
    source: str
    wall_time: float
    monotonic_time: float
    role: str
    dest: str | None = None
    guards: list[tuple[str, bool]] = attrs.field(factory=list)
    actions: list[ActionRecord] = attrs.field(factory=list)
    remaining_restarts: int = 0
    restart_count: int = 0
    observed: str | None = None
    failures: Mapping[int, Any] = attrs.field(factory=dict)
    error: str | None = None
    rule: str | None = None
    timer: float | None = None


Listener = Callable[[Step], None]


def failed_result(obs: Any, api: Callable[[], Any]) -> Any:
    """The result of a lifecycle that gave up: always in state FAILED (torch 2.13 returns the raw
    UNHEALTHY result here, which its launcher then reports as a success), and a FAILED result
    when it ended before any tick. ``api()``: torch's agent API module, imported on need."""
    if obs is None:
        return api().RunResult(state=api().WorkerState.FAILED)
    if obs.state.name == "FAILED":
        return obs
    failed = type(obs.state)["FAILED"]
    if dataclasses.is_dataclass(obs) and not isinstance(obs, type):
        return dataclasses.replace(obs, state=failed)
    return api().RunResult(state=failed, return_values=dict(obs.return_values),
                           failures=dict(obs.failures))
