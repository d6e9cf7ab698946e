"""A STAND-IN for nvidia-resiliency-ext 0.7.0's ft_launcher agent, NOT the package itself.

0.7.0's wheel is cp312-only and CI runs Python 3.11, so the kit's path for it is tested here on a
class with 0.7.0's interface: the constructor's required ``fault_tol_cfg`` and ``logs_specs``,
``round()`` read at construction, and in the run loop the handler calls 0.7.0's
``nvidia_resiliency_ext.fault_tolerance.launcher:LocalElasticAgent`` makes
(``attribution_stop_requested()``, ``is_next_round_open()`` instead of ``num_nodes_waiting()``,
``no_restart_reason()``, ``signal_no_restart()``, ``_this_node``,
``_barrier_state.open_rendezvous()``), with its restart decisions: a restart a peer opened is
counted against ``max_restarts``, and with none left the agent stops its workers and returns
FAILED. Written here from reading NVRx's launcher (telemetry, profiling, rank monitors and the
progress tracker left out: with no checkpoint-iteration file the tracker never ends a run
early). The real package is checked on Python 3.12 as docs/conformance.md says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerState,
)
from torch.distributed.elastic.metrics.api import put_metric
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

__all__ = ["DefaultLogsSpecs", "FaultToleranceConfig", "NoRestartRequested", "StandInNVRx070Agent"]


@dataclass
class FaultToleranceConfig:
    """What the stand-in reads of 0.7.0's config (its defaults: no progress tracking)."""

    checkpoint_iteration_file: str | None = None


class NoRestartRequested(Exception):
    """0.7.0 raises this when the job must not restart (an attribution verdict, no progress)."""


class StandInNVRx070Agent(SimpleElasticAgent):
    """0.7.0's ``LocalElasticAgent`` interface and any-failed policy, on torch's base class."""

    def __init__(self, spec: Any, fault_tol_cfg: FaultToleranceConfig, logs_specs: Any,
                 start_method: str = "spawn", exit_barrier_timeout: float = 300,
                 term_timeout: float = 1800, workers_stop_timeout: float = 30,
                 restart_policy: str = "any-failed", is_store_host: bool = False) -> None:
        super().__init__(spec, exit_barrier_timeout)
        self._rdzv_handler = spec.rdzv_handler
        self._ft_cfg = fault_tol_cfg
        self._logs_specs = logs_specs
        # The budget left is the job's: max_restarts less the rounds the job already went
        # through (a replacement node joining at round 2 has two fewer).
        self._remaining_restarts = spec.max_restarts - self._rdzv_handler.round()

    def _restart_or_not(self, open_rendezvous: bool) -> bool:
        if self._remaining_restarts <= 0:
            return False
        self._remaining_restarts -= 1
        if open_rendezvous:  # the node that saw the failure opens the round its peers join
            self._rdzv_handler._barrier_state.open_rendezvous()
        self._restart_workers(self._worker_group)
        return True

    def _give_up(self, failures: Any = None) -> RunResult:
        self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.FAILED
        return RunResult(state=WorkerState.FAILED, failures=failures or {})

    def _invoke_run(self, role: str = "default") -> RunResult:
        import time

        spec = self._worker_group.spec
        role = spec.role
        self._initialize_workers(self._worker_group)
        handler = spec.rdzv_handler
        while True:
            assert self._worker_group.state != WorkerState.INIT
            time.sleep(spec.monitor_interval)
            result = self._monitor_workers(self._worker_group)
            state = result.state
            self._worker_group.state = state
            put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
            put_metric(f"workers.{role}.{state.name.lower()}", 1)
            if state == WorkerState.SUCCEEDED:
                self._exit_barrier()
                return result
            if handler.attribution_stop_requested():
                handler.signal_no_restart("attribution_stop")
                self._stop_workers(self._worker_group)
                self._worker_group.state = WorkerState.FAILED
                raise NoRestartRequested("attribution recommended stopping the job")
            if state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
                _node = handler._this_node  # 0.7.0 records a failure-detected event for it
                if not self._restart_or_not(open_rendezvous=True):
                    return self._give_up(result.failures)
            elif state == WorkerState.HEALTHY:
                if handler.is_next_round_open():  # a peer opened the next round: it restarts
                    reason = handler.no_restart_reason()
                    if reason is not None:
                        self._stop_workers(self._worker_group)
                        self._worker_group.state = WorkerState.FAILED
                        raise NoRestartRequested(reason)
                    _node = handler._this_node
                    if not self._restart_or_not(open_rendezvous=False):
                        return self._give_up()
            else:
                raise Exception(f"[{role}] Worker group in {state.name} state")
