"""The seed's torchelastic agent, transcribed line by line onto torch 2.13's SimpleElasticAgent.

Reference for the ``torchelastic`` preset: ``_invoke_run`` below is the seed's
(``shared/seed/000_d513e7c7919f25f5.txt``, pytorch/elastic 2020) with only the renames torch
made since, each marked ``# 2.13:``:

* ``monitor_result.ret_vals`` / ``.exceptions`` are ``return_values`` / ``failures``;
* ``store_util.barrier(store, rank, world_size, ...)`` takes ``world_size`` first and ``rank``
  as a keyword;
* ``spec.fn`` is deprecated in favour of ``spec.entrypoint``;
* ``WorkerGroupFailureException`` no longer exists in torch; fsm_agent's carries the same
  ``(msg, failures)``.

Everything else, including the inlined barrier calls (the seed did not go through
``_exit_barrier`` in the loop) and the ``assert``, is as the seed has it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed.elastic.utils.store as store_util
from torch.distributed.elastic.agent.server.api import (
    _TERMINAL_STATE_SYNC_ID,
    DEFAULT_ROLE,
    SimpleElasticAgent,
    WorkerState,
)
from torch.distributed.elastic.metrics import put_metric

from fsm_agent import WorkerGroupFailureException

log = logging.getLogger(__name__)


class SeedAgent(SimpleElasticAgent):
    """Abstract: the kit adds scripted hooks. Only the seed's run loop lives here."""

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> Any:
        # NOTE: currently only works for a single role
        spec = self._worker_group.spec
        role = spec.role
        log.info(f"[{role}] starting workers for function: {spec.get_entrypoint_name()}")  # 2.13:
        self._initialize_workers(self._worker_group)
        monitor_interval = spec.monitor_interval
        rdzv_handler = spec.rdzv_handler
        while True:
            assert self._worker_group.state != WorkerState.INIT
            time.sleep(monitor_interval)
            monitor_result = self._monitor_workers(self._worker_group)
            state = monitor_result.state
            self._worker_group.state = state
            put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
            put_metric(f"workers.{role}.{state.name.lower()}", 1)
            if state == WorkerState.SUCCEEDED:
                log.info(
                    f"[{role}] worker group successfully finished."
                    f" Waiting {self._exit_barrier_timeout} seconds for other agents to finish."
                )
                try:
                    store_util.barrier(
                        self._store,
                        self._worker_group.group_world_size,  # 2.13: world_size before rank
                        key_prefix=_TERMINAL_STATE_SYNC_ID,
                        barrier_timeout=self._exit_barrier_timeout,
                        rank=self._worker_group.group_rank,  # 2.13: rank is a keyword
                    )
                except Exception:
                    log.exception(
                        "Local worker group succeeded, but exit barrier failed while waiting "
                        "for other nodes"
                    )
                return monitor_result.return_values  # 2.13: ret_vals
            elif state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
                if self._remaining_restarts > 0:
                    log.info(
                        f"[{role}] Worker group {state.name}. "
                        f"{self._remaining_restarts}/{spec.max_restarts} attempts left;"
                        f" will restart worker group"
                    )
                    self._remaining_restarts -= 1
                    self._restart_workers(self._worker_group)
                else:
                    self._stop_workers(self._worker_group)
                    self._worker_group.state = WorkerState.FAILED
                    msg = f"[{role}] exceeded max_restarts={spec.max_restarts}"
                    log.error(
                        f"{msg}. Waiting {self._exit_barrier_timeout} seconds for other agents "
                        "to finish."
                    )
                    try:
                        store_util.barrier(
                            self._store,
                            self._worker_group.group_world_size,  # 2.13: world_size first
                            key_prefix=_TERMINAL_STATE_SYNC_ID,
                            barrier_timeout=self._exit_barrier_timeout,
                            rank=self._worker_group.group_rank,  # 2.13: rank is a keyword
                        )
                    except Exception:
                        log.exception("Local worker group failed waiting for other nodes.")
                    raise WorkerGroupFailureException(msg, monitor_result.failures)  # 2.13:
            elif state == WorkerState.HEALTHY:
                # membership changes do not count as retries
                num_nodes_waiting = rdzv_handler.num_nodes_waiting()
                group_rank = self._worker_group.group_rank
                if num_nodes_waiting > 0:
                    log.info(
                        f"[{role}] Detected {num_nodes_waiting} "
                        f"new nodes from group_rank={group_rank}; "
                        f"will restart worker group"
                    )
                    self._restart_workers(self._worker_group)
            else:
                raise Exception(f"[{role}] Worker group in {state.name} state")
