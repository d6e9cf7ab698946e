"""A fresh worker store per rendezvous round: the fix for stale gloo addresses after a restart.

Root cause (pytorch issue 135712, still present in torch 2.13): with the c10d rendezvous the agent
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

Fix: the one thing that is the same for every agent of an attempt is the rendezvous round, and
the agent store handed out by ``next_rendezvous`` is already prefixed with it. For each round the
group-rank-0 agent starts a brand-new ``TCPStore`` server on an OS-chosen port and publishes its
address under a key of that round-prefixed store; every agent reads it and gives its workers
that address as MASTER_ADDR/MASTER_PORT. Workers of one attempt can only ever see keys written by
workers of the same attempt, and the store still outlives the workers (the reason torch started
sharing it, pytorch PR 128096). The previous round's server is dropped once the new one exists.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerGroup

__all__ = ["WorkerStoreIsolation"]

logger = logging.getLogger(__name__)

_KEY = "fsm_agent/worker_store"


class WorkerStoreIsolation:
    """Hands each rendezvous round's workers their own, empty ``TCPStore``.

    ``apply(worker_group, restart_count)`` is called after every rendezvous; it rewrites
    ``worker_group.master_addr``/``master_port``. ``close()`` drops the server this agent hosts.
    """

    def __init__(self) -> None:
        self._server: Any = None
        self.rounds = 0

    @staticmethod
    def needed(worker_group: WorkerGroup) -> bool:
        """Whether workers share the agent's store (otherwise they host a fresh one per round)."""
        return bool(getattr(worker_group.spec.rdzv_handler, "use_agent_store", False))

    def apply(self, worker_group: WorkerGroup, restart_count: int) -> None:
        """Point the workers of the round just joined at a store no earlier attempt has used."""
        if not self.needed(worker_group):
            return
        import torch.distributed as dist

        store = worker_group.store
        if store is None:
            raise RuntimeError("rendezvous did not set the worker group's store")
        key = _KEY
        if worker_group.spec.rdzv_handler.get_backend() == "static":
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
