"""The agent's hooks that ``TorchDriver`` (and the agent's own mixins) call, declared.

The driver is built by ``LifecycleAgentMixin`` on the agent it serves, which may be a user's own
``SimpleElasticAgent`` subclass with only that mixin. What every such agent has, the driver
calls directly (:class:`AgentHooks`, typed on ``TorchDriver``); what comes from the other mixins
of ``FSMElasticAgent``, or that a subclass may override or remove, it asks for one method at a
time with ``fsm_agent._core._driver.capability(agent, SlateHooks._fsm_slate_reason)``, and does
without when the agent has none. ``fsm_agent/torch/_agent.py`` has mypy check that
``FSMElasticAgent`` and each mixin implement them with these types. The names are kept: a
subclass may override ``_fsm_lost_peers`` (docs/spec-format.md, "Budgets per cause").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fsm_agent._core._drain import Preemption
    from fsm_agent._core._health import CheckResult
    from fsm_agent._core._progress import Mark

__all__ = ["AgentHooks", "DiagnosticHooks", "PeerHooks", "PreemptionHooks", "SlateHooks",
           "TimerHooks", "asks_peers"]


@runtime_checkable
class AgentHooks(Protocol):
    """Called by the driver without asking: the notes of the trace and the progress mark
    (``LifecycleAgentMixin``), the drain (``fsm_agent.torch._drain.DrainMixin``: a spec that
    drains needs it among the agent's bases)."""

    def _fsm_note(self, key: str, value: Any) -> None:
        """Add ``value`` to the trace's next record, as diagnostics record ``key``."""

    def _fsm_progress_mark(self) -> Mark:
        """Where training stands (``fsm_agent._core._progress``)."""
        ...

    def _fsm_drain_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker process: the drain begins."""

    def _fsm_kill_workers(self) -> None:
        """Kill what is left of the workers at once: the drain's time is up."""


@runtime_checkable
class DiagnosticHooks(Protocol):
    """Optional (``DiagnosticsMixin``): without ``_fsm_capture_stacks`` the driver logs that it
    cannot take the stacks; without ``_fsm_note_health`` a check's result is not noted."""

    def _fsm_capture_stacks(self) -> None:
        """Dump every running worker's stacks (the ``capture_stacks`` action)."""

    def _fsm_note_health(self, result: CheckResult) -> None:
        """Note a node health check's result for the trace."""


@runtime_checkable
class PeerHooks(Protocol):
    """Optional (``LifecycleAgentMixin``): without ``_fsm_lost_peers`` no peer is ever lost;
    without a true ``_fsm_asks_peers`` (read with :func:`asks_peers`) the exit barrier waits
    for every peer."""

    _fsm_asks_peers: bool

    def _fsm_lost_peers(self) -> tuple[str, ...]:
        """The peers of this round known to be lost (a subclass may add its scheduler's)."""
        ...


@runtime_checkable
class PreemptionHooks(Protocol):
    """Optional (``DrainMixin``): without it no preemption is known."""

    def _fsm_current_preemption(self) -> Preemption | None:
        """The preemption under way: this agent's signal, or the job's announcement."""
        ...


@runtime_checkable
class SlateHooks(Protocol):
    """Optional (``CleanSlateMixin``): without it the ``clean_slate`` check has nothing to end."""

    def _fsm_slate_reason(self, timeout: float) -> str | None:
        """End what is left of earlier attempts; what survived ``timeout``, as one line."""
        ...


@runtime_checkable
class TimerHooks(Protocol):
    """Optional (``HangWatchdogMixin``): without it no worker timer ever expires."""

    def _fsm_timer_hangs(self) -> list[Any]:
        """Workers whose timer expired (``fsm_agent.torch._hang.HungRank``s)."""
        ...


def asks_peers(agent: object) -> bool:
    """``agent._fsm_asks_peers`` (:class:`PeerHooks`); False for an agent that does not say."""
    return bool(getattr(agent, "_fsm_asks_peers", False))
