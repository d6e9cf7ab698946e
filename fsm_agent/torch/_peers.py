"""Lost peers from torch's own rendezvous keep-alive: the torch driver's answer to the built-in
guard ``peer_lost`` (``fsm_agent._core._peers``; docs/job-protocol.md, "Lost peers").

torch's behaviour (2.13, ``dynamic_rendezvous.py``): every agent's handler writes its heartbeat
(``_RendezvousState.last_heartbeats[node]``, a UTC time) into the rendezvous state every
``keep_alive_interval`` (5 s by default) from a timer thread. Whenever any agent syncs the
state, ``_BackendRendezvousStateHolder._sanitize`` drops the nodes whose heartbeat is older than
``keep_alive_interval * keep_alive_max_attempt`` (15 s by default): they are listed in the
holder's ``_dead_nodes`` for that one sync, and removed from the state, which the next write of
that agent (its own keep-alive, at the latest) stores for everyone. After that write no agent can
tell a node that died from one that left: both are simply absent.

What this adds, on a resilient agent (the spec's policy asks ``peer_lost``):

- :class:`PeerWatch` wraps the holder's ``_sanitize`` (an instance attribute, torch's method
  still does the work): the nodes it drops are recorded on the state itself, in the extra
  attribute ``lost`` (node -> UTC time; kept an hour), which travels with the pickled state
  through torch's compare-and-set writes. So the loss survives whichever agent sanitized first.
- after each completed rendezvous round the agent notes the round's other participants
  (:meth:`PeerWatch.round_started`);
- when the workers fail, the guard asks :meth:`PeerWatch.lost`. It reads the state afresh
  (never torch's cached copy) until every peer of the round is accounted for: **lost** when it is in
  ``lost`` or ``_dead_nodes``; **alive** when its heartbeat changed since the first look (a
  heartbeat is compared with the peer's own earlier one, never with this machine's clock) or it
  is no longer in the state with no loss recorded (it left the round: a peer restarting its
  workers starts with torch's exit op). It answers as soon as one peer is lost, and at the latest
  after ``keep_alive_interval * (keep_alive_max_attempt + 1) + 1`` s (21 s with torch's
  defaults of 5 s and 3; 5 s with ``keep_alive_interval=1,keep_alive_max_attempt=3``), the
  bound docs/multinode.md states: a peer that has not beaten by then would have been dropped.

A failure of a multi-node resilient job therefore waits until its peers are accounted for
before its rule is chosen: typically one ``keep_alive_interval`` (the peers' next heartbeat),
at worst the bound. A single-node round has no peers and asks nothing.

Limits: every agent of the job must run the watch (an agent without it that sanitizes first and
writes leaves no ``lost`` record: the loss then reads as a peer that left, and the failure
spends the user's budget, as under torch); the answer is only as good as torch's keep-alive (a
peer whose agent is alive while its machine is unusable is not lost).
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from fsm_agent.torch._compat import enabled
from fsm_agent.torch._fastpath import cached_nodes_waiting

__all__ = ["LOST_ATTR", "PeerWatch", "RoundLost", "abortable_bootstrap", "install_peer_watch"]

logger = logging.getLogger("fsm_agent.torch")

#: The attribute of torch's ``_RendezvousState`` holding the nodes found dead (node -> UTC time).
LOST_ATTR = "lost"
#: How long a recorded loss is kept on the state (a lost node never comes back: its descriptor
#: names its agent process).
KEEP_LOST = timedelta(hours=1)
#: The attribute of torch's state holder with the nodes its last sync knew to be lost.
GONE_ATTR = "_fsm_gone"
#: How often :meth:`PeerWatch.lost` reads the state while a peer is unaccounted for.
POLL = 0.25


def _now() -> datetime:
    return datetime.now(timezone.utc)


class PeerWatch:
    """The peers of this agent's current rendezvous round, and which of them torch's keep-alive
    says are lost. Built by :func:`install_peer_watch`."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler
        self._holder = holder = handler._state_holder
        self._peers: frozenset[Any] = frozenset()
        # No reference from the holder back to itself: a cycle would keep the handler, and
        # with it the rendezvous store's sockets, open after the run until the garbage
        # collector happens to run (an in-process run must leave nothing behind).
        torch_sanitize = type(holder)._sanitize
        ref = weakref.ref(holder)

        def sanitize() -> None:
            me = ref()
            if me is None:
                return
            torch_sanitize(me)
            PeerWatch._record(me.state, me._dead_nodes)
            # what lost(wait=False) answers from, without the heartbeat lock: the keep-alive
            # thread holds it across its store calls, which a partition can stall for a minute
            setattr(me, GONE_ATTR, frozenset(_gone(me)))

        holder._sanitize = sanitize

    @staticmethod
    def _record(state: Any, dead: Any) -> None:
        lost = getattr(state, LOST_ATTR, None)
        if not isinstance(lost, dict):
            if not dead:
                return
            lost = {}
        now = _now()
        for node in dead:
            lost.setdefault(node, now)
        for node, when in list(lost.items()):
            if not isinstance(when, datetime) or now - when > KEEP_LOST:
                del lost[node]
        setattr(state, LOST_ATTR, lost)

    @property
    def peers(self) -> frozenset[Any]:
        """The other participants of the round that completed last (torch's node descriptors)."""
        return self._peers

    def round_started(self) -> None:
        """Note the peers of the round just completed (after each ``next_rendezvous``)."""
        handler = self._handler
        with handler._heartbeat_lock:
            participants = set(self._holder.state.participants)
        participants.discard(handler._this_node)
        self._peers = frozenset(participants)

    def bound(self) -> float:
        """The most :meth:`lost` waits, in seconds: one heartbeat period past the expiry."""
        settings = self._handler._settings
        interval = settings.keep_alive_interval.total_seconds()
        return float(interval * (settings.keep_alive_max_attempt + 1) + 1.0)

    def lost(self, *, wait: bool = True) -> tuple[str, ...]:
        """The peers of the current round that torch's keep-alive says are lost; empty when
        every peer is alive or left the round, or nothing is known within :meth:`bound`.

        ``wait=False`` asks no store, takes no lock and waits for nothing: what the last sync of
        the state found (torch's keep-alive thread syncs every ``keep_alive_interval``), for a
        question asked on every monitor tick or while waiting at the exit barrier.
        """
        peers = self._peers
        if not peers:
            return ()
        handler = self._handler
        holder = self._holder
        if not wait:
            return _named(peers & getattr(holder, GONE_ATTR, frozenset()))
        first: dict[Any, Any] = {}
        deadline = time.monotonic() + self.bound()
        while True:
            with handler._heartbeat_lock:
                # A fresh read, never torch's cached state (up to 1 s old): a heartbeat the
                # lost peer wrote just before it died must not look like a new one.
                holder._last_sync_time = -1
                holder.sync()
                gone = _gone(holder)
                beats = dict(holder.state.last_heartbeats)
            found = _named(peers & gone)
            if found:
                return found
            pending = []
            for node in peers:
                if node not in beats:
                    continue  # left the round (restarting), not lost
                first.setdefault(node, beats[node])
                if beats[node] == first[node]:
                    pending.append(node)
            if not pending:
                return ()
            if time.monotonic() >= deadline:
                logger.warning("no heartbeat from %s within %.1f s, yet not dropped by the "
                               "rendezvous: not counted as lost",
                               ", ".join(sorted(map(str, pending))), self.bound())
                return ()
            time.sleep(POLL)


    def lost_at_tick(self, membership: Callable[[], object]) -> tuple[str, ...]:
        """:meth:`lost` without waiting, on the rendezvous state the tick's membership check
        reads (``membership``: that check, ``num_nodes_waiting``).

        A healthy tick asks ``peer_lost`` first and ``nodes_waiting`` next (``resilient``:
        restart for waiting nodes unless a peer is lost). Once torch's cached copy of the state
        has run out (1 s), the membership check reads it afresh, and that read can be the first
        to show what another agent's sync found: a peer dropped, and the spare its loss let in
        now waiting. Answered from the older copy, the tick would see the waiting node without
        the loss and restart as for a newcomer. So the read is made here first, when it is due;
        ``membership`` then answers from it (no extra store read).
        """
        if self._peers and cached_nodes_waiting(self._handler) is None:
            membership()
        return self.lost(wait=False)

    def round_rank0(self) -> Any | None:
        """The node that is rank 0 of the round just completed (the one whose agent publishes
        the workers' store address), from the state as this agent last read it."""
        with self._handler._heartbeat_lock:
            participants = dict(self._holder.state.participants)
        return next((node for node, rank in participants.items() if rank == 0), None)

    def is_lost(self, node: Any) -> bool:
        """Whether torch's keep-alive has dropped ``node`` (a fresh read of the state)."""
        with self._handler._heartbeat_lock:
            self._holder._last_sync_time = -1
            self._holder.sync()
            return node in _gone(self._holder)


class RoundLost(RuntimeError):
    """The round just completed lost its rank 0 before that node published the workers' store
    address: the round can never start; its other agents leave it and join the next one."""


#: How often the master-address wait looks at the rendezvous state for a lost rank 0 (seconds).
RANK0_CHECK = 1.0


@contextlib.contextmanager
def abortable_bootstrap(watch: PeerWatch, poll: Callable[[], None] | None = None
                        ) -> Iterator[None]:
    """Inside this block, an agent that is not rank 0 waits for the round's ``MASTER_ADDR``
    with short store checks (running ``poll`` between them) instead of torch's blocking
    ``get`` (the store's timeout, 60 s), and raises :class:`RoundLost` once torch's keep-alive
    has dropped the round's rank 0: a node lost while it waited in the forming round."""
    from torch.distributed.elastic.rendezvous import api

    info = api.RendezvousStoreInfo
    original = info.__dict__.get("build")
    if not isinstance(original, staticmethod):
        yield
        return
    build = original.__func__

    def waiting_build(rank: int, store: Any, local_addr: str | None,
                      server_port: int | None = None) -> Any:
        if rank != 0:
            rank0 = watch.round_rank0()
            next_look = time.monotonic() + RANK0_CHECK
            pause = 0.005
            while not store.check([info.MASTER_ADDR_KEY]):
                if poll is not None:
                    poll()
                if rank0 is not None and time.monotonic() >= next_look:
                    if watch.is_lost(rank0):
                        raise RoundLost(f"the round's rank 0 ({rank0}) was lost before it "
                                        "published the workers' store address")
                    next_look = time.monotonic() + RANK0_CHECK
                time.sleep(pause)
                pause = min(0.1, pause * 2)
        return build(rank, store, local_addr, server_port)

    info.build = staticmethod(waiting_build)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        info.build = original  # type: ignore[method-assign]


def _gone(holder: Any) -> set[Any]:
    """The nodes the holder's last sync dropped, and those recorded lost on the state (under
    the handler's ``_heartbeat_lock``)."""
    gone = set(holder._dead_nodes)
    recorded = getattr(holder.state, LOST_ATTR, None)
    if isinstance(recorded, dict):
        gone.update(recorded)
    return gone


def _named(nodes: set[Any] | frozenset[Any]) -> tuple[str, ...]:
    return tuple(sorted(str(node) for node in nodes))


def install_peer_watch(handler: Any) -> PeerWatch | None:
    """A :class:`PeerWatch` on ``handler`` (a ``DynamicRendezvousHandler``); ``None`` for any
    other handler, or a torch without the internals (``_compat``'s ``peer_watch``)."""
    if not enabled("peer_watch"):
        return None
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    if not isinstance(handler, dyn.DynamicRendezvousHandler):
        return None
    holder = getattr(handler, "_state_holder", None)
    if not isinstance(holder, dyn._BackendRendezvousStateHolder) or "_sanitize" in vars(holder):
        return None
    return PeerWatch(handler)
