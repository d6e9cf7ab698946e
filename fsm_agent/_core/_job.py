"""One outcome for the whole job, and one restart budget: kept on the rendezvous store.

Every agent of a job already shares a key-value store: torch's c10d rendezvous keeps its state in
a ``TCPStore`` hosted by one of the agents. :class:`JobChannel` adds a few keys to it, under
``fsm_agent/job/<run_id>/``:

``outcome``
    The job's outcome once an agent gave up: written with ``compare_set`` on the absent key, so
    the first announcement wins and every agent reads the same one (JSON: exit code, node,
    reason). Agents learn it wherever they wait (:meth:`JobChannel.poll`): from their
    :class:`OutcomeWatch` (no request while nothing happens), or without one by a look at the
    store at most every ``poll_interval``; an agent that reads it stops its workers and ends
    with the same outcome.
``acks``
    A counter (``store.add``): every agent adds 1 when it learns the outcome. The agents wait
    (boundedly) until everyone of the last round has, so that the agent hosting the store does
    not take the news down with it.
``restarts``
    The job-wide restart ledger: the rendezvous rounds whose failure restart was counted, each
    with the wall-clock time of the claim (``round@time``; ``round@time@budget`` for a spec's
    named budget, ``fsm_agent._core._budgets``). Claims are a ``compare_set`` loop, so deciding and
    counting are one atomic step: no budget can ever be exceeded, and a failure that several
    agents see in the same round is counted once (the others ride along on the first claim,
    whichever budget it spent: one ledger for every budget keeps that a single key).
``finishing``
    Set by an agent that reached its exit barrier after success: a restart that needs that agent
    in the next round can never complete.
``claimed/<round>``
    The node that counted that round's failure restart: the agents that restart with it on the
    membership change say whose failure it was.
``quarantined/<identity>``
    Set by a node sent away for its own workers' failures (``fsm_agent._core._quarantine``): JSON,
    the agent that wrote it and its reason. ``identity`` names the machine, not the agent
    process (the torch agent: its rendezvous address, torch's ``--local-addr`` or the host's
    FQDN), so an agent a scheduler starts again on that machine reads it and never joins.
``watchers`` and ``wake/<i>``
    Agents that watch instead of polling (:class:`OutcomeWatch`) take a number from the
    ``watchers`` counter and block, on a store connection of their own, in ``store.wait`` on
    their ``wake/<i>`` key; the announcement that wins sets every one of them (one
    ``multi_set``), and an agent that ends sets its own to stop its watch. One key per watcher
    because a store wait ends only when *all* its keys exist, so a watch on the outcome itself
    could never be stopped without announcing.

Nothing here does I/O of its own beyond the store it is given; :class:`MemoryStore` has the same
semantics as ``TCPStore`` for the operations used, for tests and simulations. The model checked
by TLC (``specs/model/JobProtocol.tla``) is this protocol; docs/job-protocol.md explains it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import attrs

from ._errors import TriggerInterrupt
from ._files import printable

__all__ = [
    "ANY",
    "JOB_FAILED",
    "LINGER_TIMEOUT",
    "POLL_INTERVAL",
    "WATCH_REARM",
    "JobChannel",
    "JobOutcome",
    "JobOver",
    "MemoryStore",
    "OutcomeWatch",
    "Store",
    "StoreTimeout",
]

#: The spec trigger an agent fires when the job's outcome has been announced.
JOB_FAILED = "job_failed"
#: How often an agent looks at the store for an announcement while it waits (seconds). Every
#: agent learns an outcome within this (plus one store round trip) wherever it waits.
POLL_INTERVAL = 0.2
#: The longest an agent waits, after the job failed, for the others to acknowledge it.
LINGER_TIMEOUT = 10.0
#: How long a watch blocks in one store wait before it looks at the outcome itself and waits
#: again (seconds): only a backstop for an outcome written without waking the watchers (an
#: announcer killed between its two requests, a hand-written key), so long; every timeout also
#: costs a C++ warning line from torch's store client.
WATCH_REARM = 3600.0

_PREFIX = "fsm_agent/job"
logger = logging.getLogger("fsm_agent.job")
#: The longest announced reason an agent reads (the rest is cut off).
MAX_REASON = 2000
#: How often ``announce`` replaces a refused announcement before it stops trying.
_REPLACE_ATTEMPTS = 3


@runtime_checkable
class Store(Protocol):
    """The ``TCPStore`` operations the protocol uses (torch's ``Store`` has them all)."""

    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key``."""

    def get(self, key: str) -> bytes:
        """The value of ``key``; waits (up to the store's timeout) until it exists."""
        ...

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if absent); the new value, atomically."""
        ...

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (absent counts as ``""``); return
        the value it holds afterwards (``expected`` itself if the key is absent and ``expected``
        is not empty: TCPStore's semantics)."""
        ...

    def check(self, keys: list[str]) -> bool:
        """Whether every key in ``keys`` exists (never waits)."""
        ...


class StoreTimeout(TimeoutError):
    """``MemoryStore.get`` waited its whole timeout for a key that never appeared."""


def _b(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class MemoryStore:
    """An in-memory store with ``TCPStore``'s semantics for the operations in :class:`Store`.

    Thread-safe. ``get`` waits for an absent key up to ``timeout`` seconds and then raises
    :class:`StoreTimeout` (TCPStore raises ``DistStoreError``). ``add`` on a value that is not an
    integer raises ``ValueError`` (TCPStore's server drops the connection). ``close()`` makes
    every later call raise ``ConnectionError``, as calls to a ``TCPStore`` whose host is gone
    raise ``DistNetworkError`` (a ``RuntimeError``).
    """

    def __init__(self, timeout: float = 30.0) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self.timeout = timeout
        self.closed = False
        #: Operations served, by name (for tests and the simulation's cost model).
        self.ops: dict[str, int] = {}

    def _op(self, name: str) -> None:
        if self.closed:
            raise ConnectionError("store connection closed: its host is gone")
        self.ops[name] = self.ops.get(name, 0) + 1

    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key``."""
        with self._cond:
            self._op("set")
            self._data[key] = _b(value)
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` for it."""
        with self._cond:
            self._op("get")
            if not self._cond.wait_for(lambda: key in self._data or self.closed, self.timeout):
                raise StoreTimeout(f"wait timeout after {self.timeout * 1000:.0f}ms, keys: {key}")
            self._op("get")  # closed while waiting
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key``."""
        with self._cond:
            self._op("add")
            raw = self._data.get(key, b"0")
            try:
                value = int(raw) + int(amount)
            except ValueError:
                raise ValueError(f"add on {key!r}: value {raw!r} is not an integer") from None
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's compare-and-set."""
        with self._cond:
            self._op("compare_set")
            want = _b(expected)
            if key not in self._data:
                if want:
                    return want
                self._data[key] = _b(desired)
                self._cond.notify_all()
                return self._data[key]
            if self._data[key] == want:
                self._data[key] = _b(desired)
                self._cond.notify_all()
            return self._data[key]

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists."""
        with self._cond:
            self._op("check")
            return all(k in self._data for k in keys)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Set every key of ``keys`` to its value, in one request."""
        with self._cond:
            self._op("multi_set")
            for key, value in zip(keys, values, strict=True):
                self._data[key] = _b(value)
            self._cond.notify_all()

    def wait(self, keys: list[str], timeout: timedelta | float | None = None) -> None:
        """Block until every key of ``keys`` exists (TCPStore's server answers a waiting client
        when the last one is set); :class:`StoreTimeout` after ``timeout`` (default the store's),
        ``ConnectionError`` once the store is closed."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        limit = self.timeout if timeout is None else timeout
        with self._cond:
            self._op("wait")
            if not self._cond.wait_for(
                    lambda: self.closed or all(k in self._data for k in keys), limit):
                raise StoreTimeout(f"wait timeout after {limit * 1000:.0f}ms, keys: {keys}")
            self._op("wait")  # closed while waiting

    def clone(self) -> MemoryStore:
        """Another client of the same store (TCPStore's ``clone`` opens a connection): here the
        store itself, which is thread-safe."""
        return self

    def close(self) -> None:
        """The store's host is gone: every call from now on raises ``ConnectionError``."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


@attrs.frozen
class JobOutcome:
    """What the first agent that gave up announced: every agent ends with it."""

    exit_code: int
    node: str
    reason: str
    outcome: str = "FAILED"

    def encode(self) -> bytes:
        """The store value."""
        return json.dumps(attrs.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> JobOutcome:
        """Read a store value (anyone who reaches the store may have written it). Anything
        unreadable is still a failed job, exit code 1; so is an exit code that is no failure's
        (0, or outside 1-255, which a shell would turn into 0); node and reason are cut to
        :data:`MAX_REASON` characters, their control characters escaped (``\\x1b``)."""
        try:
            data = json.loads(raw)
            code = int(data["exit_code"])
            # escaped: a control sequence in it would clear or recolour the user's terminal
            node = printable(data["node"], 200)
            reason = printable(data["reason"], MAX_REASON)
            outcome = printable(data.get("outcome", "FAILED"), 20)
        except (ValueError, KeyError, TypeError, RecursionError):
            return cls(exit_code=1, node="?", reason=f"unreadable announcement {raw[:80]!r}")
        if not 1 <= code <= 255:
            reason += f" (announced exit code {code} is no failure's: exit code 1)"
            code = 1
        return cls(exit_code=code, node=node, reason=reason, outcome=outcome)

    @property
    def preempted(self) -> bool:
        """Whether the job ended by a preemption (its agents drain, not fail)."""
        return self.outcome == "PREEMPTED"

    def describe(self) -> str:
        """One line for logs and the final message."""
        what = "the job is preempted" if self.preempted else "the job failed"
        return f"{what}: {self.reason} (announced by {self.node}, exit code {self.exit_code})"


def _timed_out(error: BaseException) -> bool:
    """Whether a store wait ended by its own timeout (the watch waits again) rather than by a
    lost connection (the store's host is gone): ``MemoryStore``'s ``StoreTimeout``, TCPStore's
    ``DistStoreError`` "wait timeout"."""
    return isinstance(error, TimeoutError) or (
        type(error).__name__ == "DistStoreError" and "timeout" in str(error).lower())


class OutcomeWatch:
    """Learn the job's outcome when it is announced, without polling the store for it.

    A thread blocks in ``wait([wake_key])`` on a store connection of its own (``connect``:
    ``TCPStore.clone``, the same server on a new socket, so that the agent's own calls are never
    queued behind the wait). The server answers the wait when the key is set: the winning
    announcement sets every watcher's key (:meth:`JobChannel.announce`), so the outcome reaches
    a watching agent in one server round trip, and an idle watch costs no request at all. The
    wait times out after ``rearm`` seconds; the watch then reads the outcome itself and waits
    again, which is the only steady traffic and the backstop for an outcome that was written
    without waking anyone.

    ``on_fire`` is called from the watch's thread once :attr:`raw` (the outcome's store value)
    or :attr:`error` (the connection failed: the store's host is gone) is set, to end the agent's
    current wait at once. :meth:`stop` sets this watch's own key, so the thread ends and its
    connection is closed with it.
    """

    def __init__(self, store: Store, outcome_key: str, watchers_key: str, wake_prefix: str,
                 connect: Callable[[], Any], *, on_fire: Callable[[], object] | None = None,
                 rearm: float = WATCH_REARM) -> None:
        self._store = store
        self._connect = connect
        self._on_fire = on_fire
        self.outcome_key = outcome_key
        self.rearm = rearm
        #: The outcome's store value once the watch saw it.
        self.raw: bytes | None = None
        #: What the watch's connection raised (the store is lost), if it did.
        self.error: BaseException | None = None
        #: Waits that timed out and were made again (the steady traffic).
        self.rearms = 0
        self._stopping = False
        self._fired = threading.Event()
        #: Set once the watch has its connection and looked at the outcome (it waits next).
        self.armed = threading.Event()
        # a number first, then the look at the outcome (in the thread): an announcement that
        # read the counter before this add was written before that look
        self.index = int(store.add(watchers_key, 1))
        self.wake_key = f"{wake_prefix}/{self.index}"
        self._thread = threading.Thread(target=self._run, name=f"fsm-agent-watch-{self.index}",
                                        daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        """Whether the watch still answers for the outcome (its thread runs, or it saw it)."""
        return self.raw is not None or self.error is not None or self._thread.is_alive()

    @property
    def fired(self) -> bool:
        """Whether the outcome (or the store's loss) has been seen."""
        return self._fired.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :attr:`fired`, at most ``timeout`` seconds; whether it is."""
        return self._fired.wait(timeout)

    def _run(self) -> None:
        try:
            conn = self._connect()
        except Exception as e:
            # no second connection (a file limit, say): not the store's loss, which the
            # agent's own calls would see; the channel polls as it would without a watch
            self.armed.set()
            logger.warning("job watch: no connection of its own to the store (%s: %s); "
                           "polling it instead", type(e).__name__, e)
            return
        try:
            self._watch(conn)
        except Exception as e:  # the connection failed: the store's host is gone
            self.armed.set()
            if not self._stopping:
                # without its traceback, whose frames would keep the connection open
                self.error = e.with_traceback(None)
                logger.debug("job watch %s ended: %s", self.wake_key, e)
        if self.raw is not None or self.error is not None:
            self._fired.set()
            if self._on_fire is not None:
                try:
                    self._on_fire()
                except Exception:  # waking the agent is a courtesy; its next look finds it
                    logger.debug("job watch: on_fire failed", exc_info=True)

    def _watch(self, conn: Any) -> None:
        keys = [self.wake_key]
        while not self._stopping:
            if conn.check([self.outcome_key]):
                self.raw = bytes(conn.get(self.outcome_key))
                self.armed.set()
                return
            self.armed.set()
            try:
                conn.wait(keys, timedelta(seconds=self.rearm))
            except Exception as e:
                if not _timed_out(e):
                    raise
                self.rearms += 1
                continue
            if self._stopping or not conn.check([self.outcome_key]):
                # stopped, or a wake-up without an outcome (the key written by hand): the
                # watch ends here and the channel polls as it would without one
                return

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch: its thread and its connection (waits at most ``timeout`` seconds for
        the thread; a store that cannot be reached has ended its wait already)."""
        if self._stopping:
            return
        self._stopping = True
        if self._thread.is_alive():
            try:
                self._store.set(self.wake_key, b"stop")
            except Exception:  # the store is gone, and the watch's wait with it
                logger.debug("job watch: could not set %s", self.wake_key, exc_info=True)
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the watch's thread still runs."""
        return self._thread.is_alive()


class JobOver(TriggerInterrupt):
    """The job is over: raised from inside an action (a rendezvous, a restart's claim) so that
    the lifecycle takes ``job_failed`` at once instead of finishing the action."""

    def __init__(self, outcome: JobOutcome, trigger: str = JOB_FAILED) -> None:
        super().__init__(trigger, outcome.describe())
        self.outcome = outcome


#: A ledger entry: (round, wall-clock time of the claim, budget; "" for the default budget).
Entry = tuple[str, float, str]
#: ``budget=ANY`` counts the restarts of every budget (the attempt number the workers see).
ANY = None


def _ledger(raw: bytes) -> list[Entry]:
    out = []
    for entry in raw.decode(errors="replace").split(","):
        rnd, _, rest = entry.partition("@")
        when, _, budget = rest.partition("@")
        if rnd:
            try:
                out.append((rnd, float(when), budget))
            except ValueError:
                out.append((rnd, 0.0, budget))
    return out


class JobChannel:
    """One agent's view of the job's keys on the rendezvous store.

    ``node`` names this agent in announcements (host and node rank, say). ``clock`` (monotonic)
    paces the polls; ``wall`` stamps the restart ledger (its window spans machines, so it needs
    a clock they share).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        node: str,
        *,
        poll_interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        vet: Callable[[JobOutcome], bool] | None = None,
    ) -> None:
        self.store = store
        self.node = node
        #: Whether an announcement read from the store is to be believed (its announcer is one
        #: of the job's nodes); a refused one is read again at the next poll, and replaced by
        #: this agent's own announcement. None: every announcement is.
        self.vet = vet
        self.poll_interval = poll_interval
        self._clock = clock
        self._wall = wall
        base = f"{_PREFIX}/{run_id}"
        self.outcome_key = f"{base}/outcome"
        self.acks_key = f"{base}/acks"
        self.ledger_key = f"{base}/restarts"
        self.finishing_key = f"{base}/finishing"
        self.claims_prefix = f"{base}/claimed"
        self.notes_prefix = f"{base}/notes"
        self.quarantine_prefix = f"{base}/quarantined"
        self.first_failure_prefix = f"{base}/first_failure"
        self.watchers_key = f"{base}/watchers"
        self.wake_prefix = f"{base}/wake"
        self._watch: OutcomeWatch | None = None
        self._outcome: JobOutcome | None = None
        self._acked = False
        self._last_poll = -math.inf
        self._ledger_cache: list[Entry] = []

    # -- the outcome -------------------------------------------------------------------------

    @property
    def outcome(self) -> JobOutcome | None:
        """The job's outcome, once this agent knows it (it never changes afterwards)."""
        return self._outcome

    def announce(self, exit_code: int, reason: str, *, outcome: str = "FAILED") -> JobOutcome:
        """Announce that the job failed (or, ``outcome="PREEMPTED"``, that it is preempted);
        return the outcome that won (maybe another agent's)."""
        if self._outcome is not None:
            return self._outcome
        mine = JobOutcome(exit_code=int(exit_code), node=self.node, reason=reason,
                          outcome=outcome)
        expected: str | bytes = ""
        for _ in range(_REPLACE_ATTEMPTS):
            held = self.store.compare_set(self.outcome_key, expected, mine.encode())
            if held == mine.encode():
                self._wake_watchers()
            if self._learn(JobOutcome.decode(held)):
                assert self._outcome is not None
                return self._outcome
            expected = held  # a refused announcement holds the key: replace exactly it
        self._outcome = mine  # a writer keeps replacing it: this agent still ends as it decided
        self.ack()
        return mine

    def _wake_watchers(self) -> None:
        # after the outcome's compare_set: a watcher numbered after this read looks at the
        # outcome once it has its number, and finds it
        count = int(self.store.add(self.watchers_key, 0))
        if count <= 0:
            return
        keys = [f"{self.wake_prefix}/{i}" for i in range(1, count + 1)]
        multi_set = getattr(self.store, "multi_set", None)
        if multi_set is not None:
            multi_set(keys, [b"outcome"] * count)
        else:
            for key in keys:
                self.store.set(key, b"outcome")

    # -- watching instead of polling ---------------------------------------------------------

    def watch(self, connect: Callable[[], Any] | None = None, *,
              on_fire: Callable[[], object] | None = None,
              rearm: float = WATCH_REARM) -> OutcomeWatch:
        """Learn the outcome from an :class:`OutcomeWatch` from now on: :meth:`poll` then reads
        what the watch saw and asks the store nothing (``force`` still does). ``connect`` opens
        the watch's own connection (default: the store's ``clone``)."""
        if self._watch is not None:
            return self._watch
        if connect is None:
            connect = self.store.clone  # type: ignore[attr-defined]
        self._watch = OutcomeWatch(self.store, self.outcome_key, self.watchers_key,
                                   self.wake_prefix, connect, on_fire=on_fire, rearm=rearm)
        return self._watch

    @property
    def watching(self) -> OutcomeWatch | None:
        """The watch that answers :meth:`poll`, while it does (None: the channel polls)."""
        watch = self._watch
        return watch if watch is not None and watch.active else None

    def close(self) -> None:
        """Stop the watch (its thread and connection); the channel polls from now on."""
        watch = self._watch
        if watch is not None:
            watch.stop()

    def poll(self, *, force: bool = False) -> JobOutcome | None:
        """The outcome if it has been announced. With a watch, what the watch saw (no store
        request); otherwise a look at the store at most every ``poll_interval``. ``force``
        always looks. Store errors propagate (the store's host is gone), the watch's too."""
        if self._outcome is not None:
            return self._outcome
        watch = self._watch
        if watch is not None and not force:
            if watch.raw is not None:
                if self._learn(JobOutcome.decode(watch.raw)):
                    return self._outcome
                # refused (no node of the job announced it): the watch has ended on it, and
                # the announcement that replaces it is looked for by polling, as without one
                watch.stop()
                self._watch = None
                return None
            if watch.error is not None:
                raise watch.error
            if watch.active:
                return None
        now = self._clock()
        if not force and now - self._last_poll < self.poll_interval:
            return None
        self._last_poll = now
        if not self.store.check([self.outcome_key]):
            return None
        self._learn(JobOutcome.decode(self.store.get(self.outcome_key)))
        return self._outcome

    def _learn(self, outcome: JobOutcome) -> bool:
        if self.vet is not None and outcome.node != self.node and not self.vet(outcome):
            return False
        self._outcome = outcome
        self.ack()
        return True

    def ack(self) -> None:
        """Tell the others this agent has read the outcome (once)."""
        if not self._acked:
            self._acked = True
            self.store.add(self.acks_key, 1)

    def acks(self) -> int:
        """How many agents have read the outcome."""
        return int(self.store.add(self.acks_key, 0))

    def wait_acks(self, expected: int, timeout: float,
                  sleep: Callable[[float], object] = time.sleep) -> bool:
        """Wait until ``expected`` agents have read the outcome, at most ``timeout`` seconds."""
        deadline = self._clock() + timeout
        pause = 0.005
        while self.acks() < expected:
            left = deadline - self._clock()
            if left <= 0:
                return False
            sleep(min(pause, left))
            pause = min(self.poll_interval, pause * 2)
        return True

    # -- notes the agents share (a hang's stacks) ---------------------------------------------

    def share(self, topic: str, round_id: str, value: bytes) -> None:
        """Add this agent's ``value`` to the notes on ``topic`` for ``round_id`` (a counter
        numbers them: a store cannot list its keys)."""
        base = f"{self.notes_prefix}/{topic}/{round_id}"
        index = int(self.store.add(f"{base}/count", 1))
        self.store.set(f"{base}/{index}", value)

    def gather(self, topic: str, round_id: str, expected: int, timeout: float,
               sleep: Callable[[float], object] = time.sleep) -> list[bytes]:
        """The notes on ``topic`` for ``round_id``, once ``expected`` are in or ``timeout``
        seconds have passed (then those that are)."""
        base = f"{self.notes_prefix}/{topic}/{round_id}"
        deadline = self._clock() + timeout
        pause = 0.01
        while True:
            count = int(self.store.add(f"{base}/count", 0))
            left = deadline - self._clock()
            if count >= expected or left <= 0:
                break
            sleep(min(pause, left))
            pause = min(self.poll_interval, pause * 2)
        keys = [f"{base}/{i}" for i in range(1, count + 1)]
        return [self.store.get(k) for k in keys if self.store.check([k])]

    # -- quarantine marks -------------------------------------------------------------------

    def quarantine(self, identity: str, reason: str) -> None:
        """Mark the node ``identity`` quarantined for the rest of the job."""
        value = json.dumps({"node": self.node, "reason": reason}, sort_keys=True)
        self.store.set(f"{self.quarantine_prefix}/{identity}", value)

    def first_failure(self, round_id: str) -> str:
        """The node whose failure in ``round_id`` reached the store first: this one if no
        other's did (one ``compare_set``; the first caller's name stays)."""
        desired = self.node.encode()
        held = self.store.compare_set(f"{self.first_failure_prefix}/{round_id}", b"", desired)
        return printable(held.decode(errors="replace"), 200)

    def quarantined(self, identity: str) -> str | None:
        """Why the node ``identity`` was quarantined (one line), None if it was not."""
        key = f"{self.quarantine_prefix}/{identity}"
        if not self.store.check([key]):
            return None
        raw = self.store.get(key)
        try:
            data = json.loads(raw)
            node, reason = printable(data["node"], 200), printable(data["reason"], MAX_REASON)
        except (ValueError, KeyError, TypeError, RecursionError):
            node, reason = "?", f"unreadable mark {raw[:80]!r}"
        return f"node {identity} is quarantined in this job (by {node}: {reason})"

    # -- the finishing flag ------------------------------------------------------------------

    def mark_finishing(self) -> None:
        """This agent reached its exit barrier after success: no further round can complete."""
        self.store.set(self.finishing_key, self.node)

    def finishing(self) -> bool:
        """Whether some agent has reached its exit barrier after success."""
        return bool(self.store.check([self.finishing_key]))

    # -- the restart ledger ------------------------------------------------------------------

    def _read_ledger(self) -> bytes:
        if not self.store.check([self.ledger_key]):
            return b""
        return self.store.get(self.ledger_key)

    def ledger(self) -> list[tuple[str, float]]:
        """The counted failure restarts of every budget: (round, wall-clock time of the claim),
        oldest first (:meth:`entries` says which budget each spent)."""
        return [(r, when) for r, when, _ in self.entries()]

    def entries(self) -> list[Entry]:
        """The counted failure restarts: (round, time of the claim, budget; "" the default)."""
        self._ledger_cache = _ledger(self._read_ledger())
        return list(self._ledger_cache)

    def _count(self, entries: Sequence[Entry], window: float, budget: str | None = "") -> int:
        mine = [when for _, when, b in entries if budget is ANY or b == budget]
        if window == math.inf:
            return len(mine)
        horizon = self._wall() - window
        return sum(1 for when in mine if when > horizon)

    def restart_count(self, window: float = math.inf, *, cached: bool = False,
                      budget: str | None = "") -> int:
        """Failure restarts the job counted against ``budget`` ("": the default one; ``ANY``:
        every budget), within ``window`` seconds of wall-clock time."""
        return self._count(self._ledger_cache if cached else self.entries(), window, budget)

    def budget_of(self, round_id: str) -> str | None:
        """The budget whose restart counted ``round_id``'s failure ("" the default; None: not
        counted), from the last ledger read."""
        return next((b for r, _, b in self._ledger_cache if r == str(round_id)), None)

    def restarts_left(self, round_id: str, max_restarts: int, window: float = math.inf,
                      *, budget: str = "") -> int:
        """Restarts of ``budget`` left for a failure in ``round_id``: at least 1 if that round's
        failure is already counted (another agent claimed it, against whichever budget; this
        one rides along)."""
        entries = self.entries()
        if any(r == str(round_id) for r, _, _ in entries):
            return max(1, max_restarts - self._count(entries, window, budget))
        return max(0, max_restarts - self._count(entries, window, budget))

    def claim_restart(self, round_id: str, max_restarts: int, window: float = math.inf,
                      *, budget: str = "") -> int:
        """Count the failure restart of ``round_id`` once for the job, against ``budget`` ("":
        the default); that budget's count after it.

        Raises :class:`JobOver` (having announced the failure) if another round took the last
        restart since this agent looked: deciding and counting are one ``compare_set``.
        """
        rnd = str(round_id)
        if "," in rnd or "@" in rnd:
            raise ValueError(f"round id {rnd!r} may not contain ',' or '@'")
        if budget and not budget.isidentifier():
            raise ValueError(f"budget {budget!r} is not a name")
        current = self._read_ledger()
        while True:
            entries = _ledger(current)
            if any(r == rnd for r, _, _ in entries):
                self._ledger_cache = entries
                return self._count(entries, window, budget)
            if self._count(entries, window, budget) >= max_restarts:
                self._ledger_cache = entries
                spent = (f"the job's {budget} restart budget is spent (max={max_restarts})"
                         if budget else
                         f"the job's restart budget is spent (max_restarts={max_restarts})")
                outcome = self.announce(1, spent)
                raise JobOver(outcome)
            entry = f"{rnd}@{self._wall():.3f}" + (f"@{budget}" if budget else "")
            desired = current + b"," + entry.encode() if current else entry.encode()
            held = self.store.compare_set(self.ledger_key, current, desired)
            if held == desired:
                self._ledger_cache = _ledger(desired)
                # who claimed it, for the agents that restart with it (their log says why)
                self.store.set(f"{self.claims_prefix}/{rnd}", self.node)
                return self._count(self._ledger_cache, window, budget)
            current = held  # another agent claimed in between: look again

    def claimer(self, round_id: str) -> str | None:
        """The node whose failure restart of ``round_id`` was counted (None: none was)."""
        key = f"{self.claims_prefix}/{round_id}"
        if not self.store.check([key]):
            return None
        return printable(self.store.get(key).decode(errors="replace"), 200)
