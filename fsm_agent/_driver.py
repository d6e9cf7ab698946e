"""The driver interface: everything the lifecycle does to the outside world goes through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult

__all__ = ["Driver", "JobDriver"]


@runtime_checkable
class Driver(Protocol):
    """What a lifecycle needs from the supervisor that embeds it.

    The torch agent's driver calls ``SimpleElasticAgent``'s own hooks; ``fsm_agent.testing
    .RecordingDriver`` scripts results and records calls. ``monitor()`` returns torch's
    ``RunResult``.
    """

    def rendezvous(self) -> None:
        """Join the next rendezvous round (assigns ranks and world size)."""

    def start_workers(self) -> None:
        """Start the local worker group."""

    def stop_workers(self) -> None:
        """Stop every local worker, whatever its state."""

    def monitor(self) -> RunResult:
        """Check on the workers; the result's ``state`` is the observed ``WorkerState``."""
        ...

    def num_nodes_waiting(self) -> int:
        """How many nodes wait to join the next rendezvous round."""
        ...

    def exit_barrier(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every agent of the group to finish."""

    def put_metric(self, name: str, value: int) -> None:
        """Publish one metric (torch's ``put_metric`` in the torch driver)."""


@runtime_checkable
class JobDriver(Protocol):
    """Optional driver methods for a job of several agents (``fsm_agent.torch``'s driver has them).

    With them, a spec whose budget is ``job`` counts failure restarts once for the whole job
    (``has_restarts_left``, ``consume_restart`` and ``remaining_restarts`` read the job's count),
    and ``announce_failure`` tells every other agent that this one gives up. A driver without
    them is a job of one agent: the budget is counted by the lifecycle, the announcement is
    skipped. ``window`` is the budget's sliding window in seconds (``inf``: the whole job);
    ``budget`` names a spec's named budget (``fsm_agent._budgets``; "" the default one). It is
    passed only for a named budget, so a driver for specs without them may leave it out.
    ``has_job`` (optional, default True) says whether the driver is in a job of several agents
    right now; when False the lifecycle counts by itself. Quarantine (``fsm_agent._quarantine``)
    reads it the other way: only a driver that says True is in a job where another node could
    take this one's slot; and it counts a failure as the node's own only when the driver's
    optional ``failed_first()`` (default True) says this node's failure of the round reached
    the job first (the torch driver: a ``compare_set`` on the job's store).
    """

    def job_restart_count(self, window: float, budget: str = "") -> int:
        """Failure restarts the job has counted against ``budget`` (within ``window``)."""
        ...

    def job_restarts_left(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Restarts of ``budget`` left for a failure of the current round (at least 1 when
        another agent has already counted that round's failure)."""
        ...

    def add_job_restart(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Count the current round's failure restart once for the job, against ``budget``;
        that budget's count after it. Raises ``TriggerInterrupt`` (``job_failed``) when the
        budget was spent meanwhile."""
        ...

    def announce_failure(self, exit_code: int, reason: str) -> None:
        """Tell every agent of the job that it failed (the first announcement wins)."""
