"""A fresh worker store per rendezvous round: the fix for stale gloo addresses after a restart.

Root cause (pytorch/pytorch#135712, still present in torch 2.13): with the c10d rendezvous the agent
shares one ``TCPStore`` server with its workers (``use_agent_store``; workers get
``TORCHELASTIC_USE_AGENT_STORE=True`` and connect a client to MASTER_ADDR:MASTER_PORT). That server
lives as long as the agent, so every key a worker ever wrote survives into the next attempt. gloo's
``connectFullMesh`` publishes each rank's listening address under a fixed key (prefix
``default_pg/0//cpu/``) and reads its peers' keys; on attempt N+1 a fast rank reads its peer's key
from attempt N before the peer has overwritten it, connects to a dead port (connection refused,
the restart is burned) or to a port the OS has since handed to someone else (a hang, while the
agent sees live workers and reports HEALTHY). ``_create_c10d_store`` assumes "a new TCPStore for
every retry", but it is a new *client* of the same server. Key prefixes keyed on
``TORCHELASTIC_RESTART_COUNT`` would not fix it: that count is per agent and differs between an
old node and one that joined later (membership changes do not count as restarts).

A second defect of the same cache: the handler builds MASTER_ADDR/MASTER_PORT once and stores
them in round 0's key space only. After a membership change an agent that joins in round N>0
(its own cache empty) waits for ``torch.rendezvous.<run_id>.N/MASTER_ADDR``, which the old rank
0 (cache full) never writes: the joiner times out after 60 s and the job cannot grow.

Fix: the one thing that is the same for every agent of an attempt is the rendezvous round, and
the agent store handed out by ``next_rendezvous`` is already prefixed with it. So the workers'
store is made per round:

- c10d/etcd-v2 (``DynamicRendezvousHandler``): before every rendezvous the handler's cached
  bootstrap info and shared server are dropped. torch's own code then does the right thing each
  round: the round's rank 0 starts a new ``TCPStore`` server on an OS-chosen port and publishes
  it under the round-prefixed keys, every other agent reads it there.
- any other handler that shares its store (``use_agent_store``, e.g. ``static``): after the
  rendezvous the group-rank-0 agent starts a new server itself and publishes its address under
  ``fsm_agent/worker_store`` in the agent store (with the restart count for ``static``, whose
  store has no round prefix and whose membership never changes).

Workers of one attempt can only ever see keys written by workers of the same attempt, and the
store still outlives the workers (the reason torch started sharing it, pytorch PR 128096). The
previous round's server is dropped when the next round starts, after its workers were stopped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fsm_agent.torch._compat import enabled

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerGroup

__all__ = ["WorkerStoreIsolation"]

logger = logging.getLogger(__name__)

_KEY = "fsm_agent/worker_store"


class WorkerStoreIsolation:
    """Hands each rendezvous round's workers their own, empty ``TCPStore``.

    ``before_rendezvous(worker_group)`` and ``apply(worker_group, restart_count)`` bracket every
    rendezvous; ``apply`` may rewrite ``worker_group.master_addr``/``master_port``. ``close()``
    drops the server this agent hosts.
    """

    def __init__(self) -> None:
        self._server: Any = None
        self.rounds = 0

    @staticmethod
    def needed(worker_group: WorkerGroup) -> bool:
        """Whether workers share the agent's store (otherwise they host a fresh one per round)."""
        return bool(getattr(worker_group.spec.rdzv_handler, "use_agent_store", False))

    @staticmethod
    def _per_round_handler(handler: Any) -> bool:
        # DynamicRendezvousHandler (c10d, etcd-v2) caches these two across rounds; clearing them
        # makes its next_rendezvous build a fresh server and bootstrap info for the new round.
        # A torch without them (_compat.py): this agent hosts the round's store itself, as for
        # any other handler.
        return (
            enabled("isolation")
            and hasattr(handler, "_bootstrap_store_info")
            and hasattr(handler, "_shared_tcp_store_server")
        )

    def before_rendezvous(self, worker_group: WorkerGroup) -> None:
        """Make the handler build the next round's worker store afresh."""
        handler = worker_group.spec.rdzv_handler
        if self.needed(worker_group) and self._per_round_handler(handler):
            handler._bootstrap_store_info = None
            handler._shared_tcp_store_server = None  # last reference: the old server stops

    def apply(self, worker_group: WorkerGroup, restart_count: int) -> None:
        """Point the workers of the round just joined at a store no earlier attempt has used."""
        if not self.needed(worker_group):
            return
        handler = worker_group.spec.rdzv_handler
        if self._per_round_handler(handler):
            self.rounds += 1  # torch's handler built this round's server (before_rendezvous)
            return
        import torch.distributed as dist

        store = worker_group.store
        if store is None:
            raise RuntimeError("rendezvous did not set the worker group's store")
        key = _KEY
        if handler.get_backend() == "static":
            if restart_count == 0:
                # The first attempt's workers use the --master-port store, as torchrun's: it
                # holds no worker's keys yet. Only a restart needs a store of its own.
                return
            # The static handler's store has no round prefix; its membership never changes, so
            # the restart count is the same on every node and can stand in for the round.
            key = f"{_KEY}/{restart_count}"
        if worker_group.group_rank == 0:
            previous = self._server
            addr = worker_group.master_addr
            if not addr:
                raise RuntimeError("rendezvous gave no master address for the workers")
            # Bind port 0: the OS picks a port nobody holds, no get_free_port race.
            self._server = dist.TCPStore(
                host_name=addr, port=0, is_master=True, wait_for_workers=False
            )
            del previous  # the last reference: the old round's server shuts down here
            store.set(key, f"{addr}:{self._server.port}".encode())
        else:
            self.close()  # rank 0 may have moved to another node after a membership change
        value = store.get(key).decode()
        addr, _, port = value.rpartition(":")
        worker_group.master_addr = addr
        worker_group.master_port = int(port)
        self.rounds += 1
        logger.info(
            "[%s] workers of this round use a fresh store at %s:%s",
            worker_group.spec.role,
            addr,
            port,
        )

    def close(self) -> None:
        """Stop the store server this agent hosts, if any."""
        self._server = None
