"""Deliberately wrong supervisors: the conformance kit must reject every one.

``TorchLoop`` is torch 2.13's ``SimpleElasticAgent._invoke_run`` copied, with one switch per
bug; each mutant flips exactly one switch (so the unswitched copy passing the kit shows that the
switch, not the copy, is what the kit catches). The last mutants embed ``fsm_agent.Lifecycle``
the way a third-party supervisor would, and get one thing wrong around it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    SimpleElasticAgent,
    WorkerState,
)
from torch.distributed.elastic.metrics import put_metric

from fsm_agent import Lifecycle, load_spec

SPECS = Path(__file__).resolve().parents[2] / "specs"


class TorchLoop(SimpleElasticAgent):
    """torch 2.13's run loop; the class attributes switch one bug on each."""

    counts_membership_restarts = False
    restart_check = 0  # restart while remaining_restarts > restart_check
    skips_barrier = False
    barrier_twice = False
    failed_is_final = False
    keeps_stepping_after_succeeded = False
    swallows_unknown = False
    metric_name = "remaining_restarts"
    invalid_state_message = "[{role}] Worker group in {state} state"
    returns_first_result = False

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        spec = self._worker_group.spec
        role = spec.role
        self._initialize_workers(self._worker_group)
        monitor_interval = spec.monitor_interval
        rdzv_handler = spec.rdzv_handler
        first: RunResult | None = None
        while True:
            if self._worker_group.state == WorkerState.INIT:
                raise AssertionError
            time.sleep(monitor_interval)
            run_result = self._monitor_workers(self._worker_group)
            first = first or run_result
            state = run_result.state
            self._worker_group.state = state
            put_metric(f"workers.{role}.{self.metric_name}", self._remaining_restarts)
            put_metric(f"workers.{role}.{state.name.lower()}", 1)
            if state == WorkerState.SUCCEEDED:
                if not self.skips_barrier:
                    self._exit_barrier()
                if self.barrier_twice:
                    self._exit_barrier()
                if self.keeps_stepping_after_succeeded:
                    continue
                return first if self.returns_first_result else run_result
            elif state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
                may_restart = self._remaining_restarts > self.restart_check
                if self.failed_is_final and state == WorkerState.FAILED:
                    may_restart = False
                if may_restart:
                    self._remaining_restarts -= 1
                    self._restart_workers(self._worker_group)
                else:
                    self._stop_workers(self._worker_group)
                    self._worker_group.state = WorkerState.FAILED
                    return run_result
            elif state == WorkerState.HEALTHY or (
                    self.swallows_unknown and state == WorkerState.UNKNOWN):
                num_nodes_waiting = rdzv_handler.num_nodes_waiting()
                if num_nodes_waiting > 0:
                    if self.counts_membership_restarts:
                        self._remaining_restarts -= 1
                    self._restart_workers(self._worker_group)
            else:
                raise Exception(
                    self.invalid_state_message.format(role=role, state=state.name))


class CountsMembershipRestarts(TorchLoop):
    counts_membership_restarts = True


class OffByOneMaxRestarts(TorchLoop):
    restart_check = -1  # `>= 0`: one restart more than max_restarts allows


class SkipsBarrier(TorchLoop):
    skips_barrier = True


class BarrierTwice(TorchLoop):
    barrier_twice = True


class RestartsWithoutStopping(TorchLoop):
    def _restart_workers(self, worker_group: Any) -> None:
        worker_group.state = WorkerState.STOPPED
        self._initialize_workers(worker_group)


class StopsAfterFailed(TorchLoop):
    failed_is_final = True  # gives up on the first FAILED although restarts are left


class KeepsSteppingAfterSucceeded(TorchLoop):
    keeps_stepping_after_succeeded = True


class SwallowsUnknown(TorchLoop):
    swallows_unknown = True


class WrongMetricName(TorchLoop):
    metric_name = "remaining_retries"


class BarrierErrorChangesOutcome(TorchLoop):
    def _exit_barrier(self) -> None:
        import torch.distributed.elastic.utils.store as store_util

        # No try/except: a barrier timeout now fails the whole job.
        store_util.barrier(store=self._store, world_size=self._worker_group.group_world_size,
                           key_prefix="x", barrier_timeout=self._exit_barrier_timeout)


class WrongInvalidStateMessage(TorchLoop):
    invalid_state_message = "[{role}] worker group is {state}"


class ReturnsFirstResult(TorchLoop):
    returns_first_result = True


TORCH_MUTANTS: tuple[type[TorchLoop], ...] = (
    CountsMembershipRestarts,
    OffByOneMaxRestarts,
    SkipsBarrier,
    BarrierTwice,
    RestartsWithoutStopping,
    StopsAfterFailed,
    KeepsSteppingAfterSucceeded,
    SwallowsUnknown,
    WrongMetricName,
    BarrierErrorChangesOutcome,
    WrongInvalidStateMessage,
    ReturnsFirstResult,
)


# -- supervisors that embed Lifecycle -----------------------------------------------------------


def good_lifecycle(driver: Any, **settings: Any) -> Lifecycle:
    """What a correct embedding looks like: the preset, the driver, the kit's settings."""
    return Lifecycle("torchrun", driver, **settings)


class _NoSleep:
    def __init__(self, lc: Lifecycle) -> None:
        self._lc = lc

    def run(self, monitor_interval: float, sleep: Any = time.sleep) -> Any:
        return self._lc.run(monitor_interval, sleep=lambda s: None)  # busy-polls the workers


def lifecycle_without_sleep(driver: Any, **settings: Any) -> Any:
    return _NoSleep(Lifecycle("torchrun", driver, **settings))


class _DoubleAsk:
    """A driver wrapper that asks the rendezvous twice per tick (load on the store)."""

    def __init__(self, driver: Any) -> None:
        self._d = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    def num_nodes_waiting(self) -> int:
        self._d.num_nodes_waiting()
        return self._d.num_nodes_waiting()  # type: ignore[no-any-return]


def lifecycle_asking_twice(driver: Any, **settings: Any) -> Lifecycle:
    return Lifecycle("torchrun", _DoubleAsk(driver), **settings)


def uncounted_unhealthy_spec(tmp_dir: Path) -> Path:
    """torchrun with UNHEALTHY restarts not counted against max_restarts."""
    text = (SPECS / "torchrun.yaml").read_text()
    needle = ("    guards: [has_restarts_left]\n    actions: [consume_restart, stop_workers]\n"
              "    description: Restart an unhealthy group")
    assert needle in text, "torchrun.yaml changed shape; update this mutant"
    out = tmp_dir / "uncounted_unhealthy.yaml"
    # The check rejects an unbounded restart cycle unless the spec says it means one.
    out.write_text(text.replace(needle, needle.replace("consume_restart, ", ""))
                   + "\nrestart_forever: true\n")
    load_spec(out)
    return out


LIFECYCLE_MUTANTS = (lifecycle_without_sleep, lifecycle_asking_twice)
