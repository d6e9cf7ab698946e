"""The driver interface: everything the lifecycle does to the outside world goes through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult

__all__ = ["Driver"]


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
