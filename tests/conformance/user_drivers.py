"""Drivers of a user's own, checked with ``driver=`` / ``--driver`` (docs/conformance.md).

Each wraps a backend (the kit's scripted world stands in for it) the way a supervisor's driver
wraps its cluster client: one is right, one retries a failed rendezvous and so hides it.
"""

from __future__ import annotations

from typing import Any


class ClientDriver:
    """A driver over a backend client: every call goes to the backend once, results unchanged."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.calls = 0

    def rendezvous(self) -> None:
        self.calls += 1
        self.backend.rendezvous()

    def start_workers(self) -> None:
        self.calls += 1
        self.backend.start_workers()

    def stop_workers(self) -> None:
        self.calls += 1
        self.backend.stop_workers()

    def monitor(self) -> Any:
        self.calls += 1
        return self.backend.monitor()

    def num_nodes_waiting(self) -> int:
        self.calls += 1
        return int(self.backend.num_nodes_waiting())

    def exit_barrier(self, timeout: float) -> None:
        self.calls += 1
        self.backend.exit_barrier(timeout)

    def put_metric(self, name: str, value: int) -> None:
        self.calls += 1
        self.backend.put_metric(name, value)


class RetryingDriver(ClientDriver):
    """Retries a rendezvous that raised: the lifecycle never learns the round failed."""

    def rendezvous(self) -> None:
        try:
            self.backend.rendezvous()
        except Exception:
            self.backend.rendezvous()


def make_client_driver(world: Any) -> ClientDriver:
    return ClientDriver(world)


def make_retrying_driver(world: Any) -> RetryingDriver:
    return RetryingDriver(world)
