"""The torch agent's side of the job protocol (``fsm_agent._core._job``), on the c10d rendezvous
store.

:class:`AgentJob` is created at ``run()`` when the rendezvous may hold more than one node and its
handler has a store before the first rendezvous that every agent shares (torch's c10d
``DynamicRendezvousHandler``'s ``TCPStore``; on the ``etcd`` and ``etcd-v2`` backends one built on
their etcd client, ``fsm_agent.torch._etcd``; ``static`` has none: its agents decide alone, as
torch's). It is what the agent calls wherever it waits:

- between two monitor ticks and in a backoff (``LifecycleAgentMixin._monitor_wait``): the wait
  returns ``job_failed`` once the outcome is known, which the lifecycle fires. The outcome comes
  from a watch (:meth:`AgentJob.start_watch`, ``fsm_agent._core._job.OutcomeWatch``: a thread
  blocked in a store wait on a connection of its own, which ends the agent's wait when the outcome
  is announced), so the waits ask the store nothing; without one (a store that cannot be cloned)
  the wait is cut into slices of at most ``POLL_INTERVAL``, each a look at the store;
- in a rendezvous: torch's join loop calls :meth:`rendezvous_poll` between two looks at the
  rendezvous state (``fast_rendezvous(poll=...)``); it raises
  :class:`fsm_agent._core._job.JobOver`, a
  ``TriggerInterrupt``: the engine abandons the transition and takes ``job_failed`` from the
  state it was in (INIT, STOPPED, BACKOFF's timeout);
- at the exit barrier: the barrier's own poll loop asks :meth:`over`, and ends early.

Why an exception inside actions and a returned trigger outside them: outside an action the
machine rests in a state and the run loop can simply fire a trigger; inside one, the only way out
of torch's blocking ``next_rendezvous`` without waiting for its timeout is to raise from a point
torch already polls at, and the engine must tell that exception from a fault (it is not one: the
spec says where ``job_failed`` goes). The exit barrier is an entry action of a final state, which
nothing can redirect: it just returns early, and the agent's result follows the job's outcome.

A store that stops answering (its host agent died) is an outcome too: the agent cannot go on
without its rendezvous, so it ends (exit code 1) with a message naming the store, without
announcing anything (there is nowhere to announce it).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from fsm_agent._core._job import (
    JOB_FAILED,
    LINGER_TIMEOUT,
    POLL_INTERVAL,
    JobChannel,
    JobOutcome,
    JobOver,
    Store,
)
from fsm_agent.torch._bounded import StoreCalls, StoreUnresponsive, bound_backend, timeout_of

__all__ = ["JOB_FAILED", "STORE_ERRORS", "AgentJob", "JobFailed", "RendezvousStoreLost",
           "connector", "node_identity", "round_of", "store_of"]

logger = logging.getLogger("fsm_agent.torch")

#: What a failed store call raises (torch's ``DistError`` family, ``MemoryStore``'s
#: ``ConnectionError``, timeouts). Never ``Exception``: torch turns a termination signal into
#: ``SignalException`` wherever the main thread is, often inside a store call, and the agent must
#: end as the signal says, not as if the store were lost.
STORE_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError)
#: The longest the ledger's count shown between two rounds may be old (seconds).
LEDGER_REFRESH = 30.0


#: The store operations the job protocol calls (``fsm_agent._core._job.Store``).
NEEDED = ("add", "compare_set", "check", "get", "set")


def store_of(handler: Any) -> Store | None:
    """The store the job protocol runs on for ``handler``, if every agent shares one before
    the first rendezvous: the handler's own (c10d's ``TCPStore``) when it implements every
    operation; on torch's etcd backends one built on their etcd client
    (``fsm_agent.torch._etcd``: ``etcd-v2``'s ``EtcdStore`` leaves ``compare_set`` to torch's
    abstract ``Store``, which raises ``Not implemented``); otherwise None (``static``: the
    agents decide alone, as torch's)."""
    from fsm_agent.torch._etcd import etcd_job_store, unimplemented

    store = getattr(handler, "_store", None)
    if store is not None and all(hasattr(store, m) and not unimplemented(store, m)
                                 for m in NEEDED):
        return store  # type: ignore[no-any-return]
    return etcd_job_store(handler)


def node_identity(handler: Any) -> str:
    """The machine's name in the job's quarantine marks: the address of the node's rendezvous
    descriptor (torch's ``local_addr``, ``--local-addr``, or else the host's FQDN, as torch's
    ``_NodeDescGenerator`` takes it). Not the descriptor itself: its pid and local id name the
    agent process, and an agent a scheduler starts again on the same machine must read the
    mark."""
    addr = getattr(getattr(handler, "_this_node", None), "addr", None)
    return addr if isinstance(addr, str) and addr else socket.getfqdn()


def round_of(handler: Any, store: Any = None) -> str | None:
    """The rendezvous round the handler last joined: c10d and etcd-v2 keep it in their state;
    the etcd (v1) rendezvous in the version its round's ``store`` lives under."""
    from fsm_agent.torch._etcd import round_of_store

    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    rnd = getattr(state, "round", None)
    return round_of_store(store) if rnd is None else str(rnd)


def _members(handler: Any) -> set[str] | None:
    """torch's names (``addr_pid_localid``) of the nodes in the c10d rendezvous state the
    handler last read: participants, waiting and redundant ones; None without such a state."""
    holder: Any = getattr(handler, "_state_holder", None)
    if not hasattr(getattr(holder, "state", None), "participants"):
        return None
    lock = getattr(handler, "_heartbeat_lock", None)
    # the keep-alive thread updates the state under this lock; never wait long for it
    locked = lock is not None and lock.acquire(timeout=1.0)
    try:
        for _ in range(3):
            state = holder.state
            try:
                nodes = [*state.participants, *getattr(state, "wait_list", ()),
                         *getattr(state, "redundancy_list", ())]
                return {repr(n) for n in nodes}
            except RuntimeError:  # changed size while read, without the lock
                continue
        return set()
    finally:
        if locked and lock is not None:
            lock.release()


def connector(store: Any) -> Callable[[], Any] | None:
    """What opens a second connection to ``store``'s server, for a watch (None: none can be).

    A ``TCPStore`` client of the same host and port, with the store's own timeout and backend:
    ``TCPStore.clone()`` does the same but takes about 0.25 s here (its client connects
    without libuv), a libuv client under a millisecond.
    """
    from torch.distributed import TCPStore

    if isinstance(store, TCPStore):
        host, port, timeout = store.host, store.port, store.timeout
        libuv = bool(getattr(store, "libuvBackend", True))
        return lambda: TCPStore(host, port, is_master=False, timeout=timeout, use_libuv=libuv)
    clone = getattr(store, "clone", None)
    return clone if callable(clone) else None


class AgentJob:
    """One agent's part in the job-wide protocol: its channel, and what it has learnt."""

    def __init__(self, channel: JobChannel, *, role: str = "default",
                 identity: str | None = None) -> None:
        self.channel = channel
        self.role = role
        #: This node's name in quarantine marks: the machine, which outlives the agent process.
        self.identity = identity or socket.getfqdn()
        #: The outcome this agent ends with when the store became unreachable.
        self.lost: JobOutcome | None = None
        self._round_id: str | None = None
        self._first_failure: tuple[str, str] | None = None  # (round, the node that failed first)
        self.announced_here = False
        self._count_read = -math.inf
        #: Called once the job's outcome is in the store (the torch driver releases the exit
        #: barrier of the agents already waiting at it).
        self.on_announced: Callable[[], None] | None = None
        #: The trigger a preemption announcement interrupts a rendezvous with, when the spec
        #: handles preemption (``preempted``); otherwise the job simply failed.
        self.preempted_trigger: str | None = None
        #: The c10d handler whose rendezvous state says who may announce (None: anyone).
        self._handler: Any = None
        #: Every node this agent has seen in the rendezvous state: an agent that announced and
        #: left (its heartbeat expired, torch dropped it) still counts.
        self._seen: set[str] = set()
        self._refused: set[JobOutcome] = set()
        #: Opens the watch's own store connection (``TCPStore.clone`` of the rendezvous store).
        self.connect: Callable[[], Any] | None = None
        self._count_round: str | None = None

    @property
    def round_id(self) -> str | None:
        """The rendezvous round this agent last joined (set after each rendezvous)."""
        return self._round_id

    @round_id.setter
    def round_id(self, value: str | None) -> None:
        self._round_id = value
        if self._handler is not None:  # the round's nodes may announce, even once gone
            self._seen |= _members(self._handler) or set()

    def _vet(self, outcome: JobOutcome) -> bool:
        """Whether ``outcome``'s announcer is a node of this rendezvous (a participant, waiting
        or redundant, now or earlier); warns once per refused announcement."""
        self._seen |= _members(self._handler) or set()
        if outcome.node in self._seen:
            return True
        if outcome not in self._refused:
            self._refused.add(outcome)
            logger.warning(
                "[%s] ignoring an outcome announced on the rendezvous store by %s, which is no "
                "node of this rendezvous (a client of the store that is not an agent of the job, "
                "or a stale run id): %s", self.role, outcome.node, outcome.describe())
        return False

    @classmethod
    def for_handler(cls, handler: Any, *, role: str, node: str | None = None,
                    poll_interval: float = POLL_INTERVAL) -> AgentJob | None:
        """The job of a rendezvous handler, or None (one node at most, or no shared store)."""
        from fsm_agent.torch._etcd import max_nodes_of

        settings = getattr(handler, "settings", None)
        max_nodes = getattr(settings, "max_nodes", None) or max_nodes_of(handler)
        store = store_of(handler)
        if store is None or (max_nodes is not None and max_nodes <= 1):
            return None
        try:
            run_id = str(handler.get_run_id())
        except Exception:  # a handler without a run id: no job to share
            return None
        this_node = getattr(handler, "_this_node", None)
        # torch's name for this node in the rendezvous state, so that the others can tell it
        # is one of theirs
        node = node or (repr(this_node) if this_node is not None
                        else f"{socket.gethostname()}:{os.getpid()}")
        connect = connector(store)
        timeout = timeout_of(store)
        if timeout is not None:
            # every store call ends within the store's timeout (fsm_agent.torch._bounded)
            calls = StoreCalls(timeout)
            bound_backend(handler, calls)
            store = calls.wrap(store)
        job = cls(JobChannel(store, run_id, node, poll_interval=poll_interval), role=role,
                  identity=node_identity(handler))
        if _members(handler) is not None:
            job._handler = handler
            job.channel.vet = job._vet
        job.connect = connect
        return job

    # -- quarantine (fsm_agent._core._quarantine)
    # ----------------------------------------------------

    def quarantine(self, reason: str) -> None:
        """Mark this node quarantined for the rest of the job (a store error is logged: the
        node leaves anyway)."""
        try:
            self.channel.quarantine(self.identity, reason)
        except STORE_ERRORS as e:
            logger.error("[%s] could not write the quarantine mark of node %s: %s", self.role,
                         self.identity, e)

    def quarantine_mark(self) -> str | None:
        """Why this node is quarantined in the job, None if it is not (or the store cannot
        say: the health check ``store_reachable`` is the one that judges the store)."""
        try:
            return self.channel.quarantined(self.identity)
        except STORE_ERRORS:
            return None

    # -- the watch ---------------------------------------------------------------------------

    def start_watch(self, on_fire: Callable[[], object] | None = None) -> bool:
        """Learn the outcome from a watch from now on (``on_fire``: wakes the agent's wait);
        False when there is none to be had (the store cannot open a second connection, or
        refused it: the waits poll, as before)."""
        if self.connect is None:
            return False
        try:
            self.channel.watch(self.connect, on_fire=on_fire)
        except STORE_ERRORS as e:
            logger.debug("[%s] no job watch (%s); polling the store", self.role, e)
            return False
        return True

    @property
    def watched(self) -> bool:
        """Whether the outcome reaches this agent without polling."""
        return self.channel.watching is not None

    def close(self) -> None:
        """End the watch, its thread and its connection (the agent's run is over)."""
        self.channel.close()

    # -- what the agent asks while it waits ---------------------------------------------------

    @property
    def outcome(self) -> JobOutcome | None:
        """The job's outcome as this agent knows it (announced, or the store lost)."""
        return self.channel.outcome or self.lost

    @property
    def only_store_lost(self) -> bool:
        """Whether the store became unreachable with no outcome announced on it."""
        return self.lost is not None and self.channel.outcome is None

    @property
    def poll_interval(self) -> float:
        """How often the waits look at the store."""
        return self.channel.poll_interval

    def check(self, *, force: bool = False) -> JobOutcome | None:
        """Look for an announcement (rate-limited); a store error is the store lost."""
        if self.lost is not None:
            return self.lost
        try:
            return self.channel.poll(force=force)
        except STORE_ERRORS as e:  # DistNetworkError and friends: the store's host is gone
            consequence = ("this agent cannot reach it, so it cannot rendezvous again"
                           if isinstance(e, StoreUnresponsive) else
                           "its host is gone (the node hosting it, or the fsm-agent store "
                           "serving it), so no agent can rendezvous again")
            self.lost = JobOutcome(
                exit_code=1, node=self.channel.node,
                reason=f"the rendezvous store is unreachable ({type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}); {consequence}",
            )
            logger.error("[%s] %s", self.role, self.lost.reason)
            return self.lost

    def rendezvous_poll(self, *, restart: bool) -> None:
        """Between two looks at the rendezvous state: raise ``JobOver`` if the job is over, or,
        on a restart, if a node has already reached its exit barrier (the round to come could
        never complete: this agent gives up and says so)."""
        outcome = self.check()
        if outcome is None and restart:
            try:
                finishing = self.channel.finishing()
            except STORE_ERRORS:
                finishing = False  # the next check() finds the store lost
            if finishing:
                outcome = self.announce(1, "a node already finished (it is at its exit barrier): "
                                           "a restart of the workers can never complete")
        if outcome is not None:
            trigger = self.preempted_trigger if outcome.preempted else None
            raise JobOver(outcome, trigger or JOB_FAILED)

    def announce(self, exit_code: int, reason: str, *, outcome: str = "FAILED") -> JobOutcome:
        """Announce that the job failed, or is preempted (the first announcement wins); never
        raises."""
        if self.outcome is not None:
            return self.outcome
        try:
            won = self.channel.announce(exit_code, reason, outcome=outcome)
        except STORE_ERRORS as e:
            self.check(force=True)
            if self.lost is None:
                self.lost = JobOutcome(exit_code=exit_code, node=self.channel.node,
                                       reason=f"{reason} (could not announce it: {e})",
                                       outcome=outcome)
            return self.lost
        self.announced_here = won.node == self.channel.node
        if self.announced_here:
            logger.error("[%s] announced to every agent: %s", self.role, won.describe())
        self._announced()
        return won

    def _announced(self) -> None:
        if self.on_announced is not None:
            try:
                self.on_announced()
            except STORE_ERRORS:
                logger.debug("on_announced failed", exc_info=True)

    # -- the budget (TorchDriver's JobDriver methods) ----------------------------------------

    def _round(self) -> str:
        return self.round_id if self.round_id is not None else "0"

    def restart_count(self, window: float, budget: str | None = "") -> int:
        """Failure restarts the job has counted against ``budget`` ("": the default; ``ANY``:
        every budget). Every monitor tick asks (the ``remaining_restarts`` metric), so the
        ledger is read again only when it can have changed for this agent: a new rendezvous
        round (a claim is made for a failed round, and a restart follows it), its own claim,
        or :data:`LEDGER_REFRESH` seconds after the last read. The guards that decide
        (``restarts_left``, the claim) always read it."""
        now = time.monotonic()
        if (self._count_round != self.round_id
                or now - self._count_read >= max(self.poll_interval, LEDGER_REFRESH)):
            self.channel.entries()
            self._count_read = now
            self._count_round = self.round_id
        return self.channel.restart_count(window, cached=True, budget=budget)

    def restarts_left(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Restarts of ``budget`` left for a failure of the current round."""
        return self.channel.restarts_left(self._round(), max_restarts, window, budget=budget)

    def claim_restart(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Count the current round's failure restart (raises ``JobOver`` when spent)."""
        try:
            count = self.channel.claim_restart(self._round(), max_restarts, window,
                                               budget=budget)
        except JobOver as e:  # the budget is spent: the claim announced it
            self.announced_here = e.outcome.node == self.channel.node
            self._announced()
            raise
        self._count_read = -math.inf
        return count

    def failed_first(self) -> bool:
        """Whether this node's failure in the current round is the job's first (the others'
        workers failed with it: a broken collective); asked once per round, and True when the
        store cannot say (the failure then counts, as it did before)."""
        rnd = self._round()
        if self._first_failure is None or self._first_failure[0] != rnd:
            try:
                holder = self.channel.first_failure(rnd)
            except STORE_ERRORS as e:
                logger.warning("[%s] could not ask the store whose failure came first: %s",
                               self.role, e)
                holder = self.channel.node
            self._first_failure = (rnd, holder)
            if holder != self.channel.node:
                logger.debug("[%s] round %s: node %s failed first", self.role, rnd, holder)
        return self._first_failure[1] == self.channel.node

    def pool_notes(self, topic: str, note: bytes, expected: int, timeout: float) -> list[bytes]:
        """Share ``note`` on ``topic`` for the current round and gather every agent's (at most
        ``expected``, waiting at most ``timeout``); only this agent's own if the store fails."""
        try:
            self.channel.share(topic, self._round(), note)
            return self.channel.gather(topic, self._round(), expected, timeout)
        except STORE_ERRORS:
            logger.debug("[%s] could not share %s", self.role, topic, exc_info=True)
            return [note]

    def mark_finishing(self) -> None:
        """This agent's workers succeeded and it waits at the exit barrier."""
        try:
            self.channel.mark_finishing()
        except STORE_ERRORS:
            self.check(force=True)

    # -- the end -----------------------------------------------------------------------------

    def linger(self, expected: int, timeout: float = LINGER_TIMEOUT,
               sleep: Callable[[float], object] | None = None) -> None:
        """After the job failed: wait (at most ``timeout``) until ``expected`` agents have read
        the outcome, so that the store's host does not take it down with it."""
        if self.channel.outcome is None or self.lost is not None or expected <= 1:
            return
        if not math.isfinite(timeout) or timeout <= 0:
            return
        try:
            kwargs = {} if sleep is None else {"sleep": sleep}
            if not self.channel.wait_acks(expected, timeout, **kwargs):
                logger.warning("[%s] not every agent acknowledged the job's outcome within "
                               "%.3g s; leaving anyway", self.role, timeout)
        except STORE_ERRORS:
            logger.debug("[%s] store gone while waiting for acknowledgements", self.role,
                         exc_info=True)


class RendezvousStoreLost(RuntimeError):
    """The rendezvous store became unreachable while this agent waited at its exit barrier."""


class JobFailed(Exception):
    """Another agent gave up (or the store is gone): this agent ends with the job's outcome."""

    def __init__(self, outcome: JobOutcome, *, store_lost: bool = False) -> None:
        self.outcome = outcome
        self.store_lost = store_lost
        super().__init__(outcome.reason if store_lost else outcome.describe())

    @property
    def exit_code(self) -> int:
        """The exit code every agent of the job ends with."""
        return self.outcome.exit_code
