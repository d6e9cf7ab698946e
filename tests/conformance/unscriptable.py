"""Targets the conformance kit cannot script: each must be a HarnessError (exit 2, one line
naming what is missing), never a counterexample."""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, SimpleElasticAgent


class NoLoop:
    """Agent hooks, but no _invoke_run: nothing for the kit to run."""

    def _monitor_workers(self, worker_group: Any) -> None: ...

    def _start_workers(self, worker_group: Any) -> None: ...


class MissingHook:
    """Its own loop calls _initialize_workers, which it does not have (not torch's subclass)."""

    def __init__(self, spec: Any, exit_barrier_timeout: float = 300) -> None:
        self._spec = spec

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> Any:
        self._initialize_workers(self._spec)  # type: ignore[attr-defined]


class NeedsAToken(SimpleElasticAgent):
    """A constructor argument the kit cannot supply."""

    def __init__(self, spec: Any, token: str, exit_barrier_timeout: float = 300) -> None:
        super().__init__(spec, exit_barrier_timeout)


class RefusesToBeBuilt(SimpleElasticAgent):
    def __init__(self, spec: Any, exit_barrier_timeout: float = 300) -> None:
        raise ValueError("no rendezvous endpoint configured")


class AsksForTheNextRendezvous(SimpleElasticAgent):
    """Calls a rendezvous handler method the kit's scripted handler does not have."""

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> Any:
        self._worker_group.spec.rdzv_handler.next_rendezvous()
        return super()._invoke_run(role)


class UsesTheStoreForTrainers(SimpleElasticAgent):
    """Reads the rendezvous store on a restart, but only in role "trainer": the probe scripts
    (role "default") do not get there, hypothesis does (and must stop at once, not shrink it)."""

    def _restart_workers(self, worker_group: Any) -> None:
        if worker_group.spec.role == "trainer":
            worker_group.store.get("MASTER_ADDR")
        super()._restart_workers(worker_group)


class ReadsWhatTheRealStartSets(SimpleElasticAgent):
    """Needs an attribute its real _start_workers would set (the kit's scripted one does not)."""

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> Any:
        self._initialize_workers(self._worker_group)
        return self._pcontext.pids()  # type: ignore[attr-defined]


def misuses_the_driver(driver: Any, **settings: Any) -> Any:
    """A factory that treats the kit's driver as a WorkerSpec (the torchelastic 0.2.2 report)."""
    return driver.local_world_size


UNSCRIPTABLE: dict[str, tuple[Any, str]] = {
    # name: (target, what the one line must say)
    "NoLoop": (NoLoop, "has _monitor_workers, _start_workers but no _invoke_run"),
    "MissingHook": (MissingHook, "_invoke_run calls _initialize_workers, which"),
    "NeedsAToken": (NeedsAToken, "its constructor needs token, which the kit cannot supply"),
    "RefusesToBeBuilt": (RefusesToBeBuilt,
                         "(spec, exit_barrier_timeout=...): ValueError: no rendezvous endpoint"),
    "AsksForTheNextRendezvous": (AsksForTheNextRendezvous,
                                 "calls its rendezvous handler's next_rendezvous"),
    "UsesTheStoreForTrainers": (UsesTheStoreForTrainers, "uses the rendezvous store's get"),
    "ReadsWhatTheRealStartSets": (ReadsWhatTheRealStartSets, "uses self._pcontext"),
    "misuses_the_driver": (misuses_the_driver, "asks the kit's driver for local_world_size"),
}
