"""An exit barrier that a termination signal can interrupt, released as fast as torch's.

torch's ``torch.distributed.elastic.utils.store.barrier`` blocks in one C++ call
(``store.wait([key])``) for up to the whole barrier timeout (300 s by default). Python runs
signal handlers only between bytecodes, so a SIGTERM, SIGINT or SIGHUP sent to an agent waiting
at its exit barrier is acted on only when the barrier ends: torch's own agent ignores a shutdown
request for up to five minutes there (torch 2.13, ``tests/reliability/test_signals.py``).

:func:`interruptible_barrier` is the same barrier on the same keys and with the same store calls,
so torch agents and ours meet at one barrier: every member adds 1 to ``<prefix>/num_members``,
the last one sets ``<prefix>/last_member``, and the others wait for that key with torch's own
blocking ``store.wait``, released by the store's notification as under torch. Three things differ:

- the wait runs on a connection of its own (``store.clone()``), so that it can be ended without
  touching the agent's store;
- an ``abort`` question (the torch driver's: is a peer of the round lost?) ends it, asked every
  :data:`ABORT_EVERY` seconds from a thread that shuts the connection down as a signal does;
- a signal ends it. Python's C-level handler writes each signal to the wake-up fd
  (``signal.set_wakeup_fd``) at once, even while the main thread is inside C++; a watcher thread
  reads it and shuts that connection down, the wait fails, and back in Python the signal's
  handler runs (torch's raises ``SignalException``). If the handler does not raise, the barrier
  waits again on a new connection.

torch logs the failed receive with a C++ stack trace; this process' stderr is pointed at
``/dev/null`` from the shutdown until the wait has returned (well under a millisecond), so the
signal's own messages are what the user sees. Store errors (the store's host is gone) propagate,
a timeout raises ``TimeoutError``; the lifecycle's ``exit_barrier`` action logs both.

When that is not possible (not on the main thread, the wake-up fd already owned by someone such as
asyncio, a store that cannot be cloned, no ``/proc`` to tell its connection apart) the barrier
polls ``store.check`` instead, at most every :data:`BARRIER_POLL_INTERVAL`, and sleeps in between.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["ABORT_EVERY", "BARRIER_POLL_INTERVAL", "BarrierAborted", "interruptible_barrier"]

logger = logging.getLogger("fsm_agent.torch")

#: Longest pause between two looks at the store when the barrier has to poll (the fallback): the
#: bound on how late an agent leaves after the last one arrives. A ``store.check`` is one
#: loopback round trip (~0.1 ms).
BARRIER_POLL_INTERVAL = 0.01

#: How often (seconds) a barrier with an ``abort`` question asks it.
ABORT_EVERY = 1.0

# Longest a connection of the barrier's own may take to open (normally a few milliseconds).
_CLONE_TIMEOUT = 2.0
# The store's clock and ours may disagree on when the timeout ran out by this much.
_CLOCK_SLACK = 0.05


class BarrierAborted(Exception):
    """The barrier's ``abort`` question answered: nobody will release it (``reason``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Abort = Callable[[], "str | None"]


def interruptible_barrier(store: Any, world_size: int, key_prefix: str, timeout: float,
                          *, abort: Abort | None = None,
                          abort_every: float = ABORT_EVERY) -> None:
    """Wait until ``world_size`` agents reached the barrier ``key_prefix`` on ``store``.

    Same keys and protocol as torch's ``barrier`` (``_barrier_nonblocking``, then a wait for
    ``<prefix>/last_member``). ``abort``, asked every ``abort_every`` seconds while waiting
    (from a thread of its own while the wait blocks), ends the wait with
    :class:`BarrierAborted` as soon as it returns a reason (a peer that can never arrive).
    """
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    deadline = time.monotonic() + timeout
    last_member_key = _barrier_nonblocking(store=store, world_size=world_size,
                                           key_prefix=key_prefix)
    if store.check([last_member_key]):
        return  # the last to arrive, or everyone was there already
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timeout(timeout, last_member_key)
        # signals are handled on the main thread only; elsewhere nothing can interrupt the wait
        on_main = threading.current_thread() is threading.main_thread()
        waiter, connection = _clone_with_connection(store, left) if on_main else (None, None)
        watch = _SignalWatch.get() if connection is not None else None
        if waiter is None or watch is None or not watch.arm(connection):  # type: ignore[arg-type]
            # off the main thread a blocked C++ wait would outlive an interpreter exit
            _poll(store, last_member_key, deadline, timeout, abort=abort,
                  abort_every=abort_every)
            return
        asking = _ask(abort, abort_every, watch) if abort is not None else None
        try:
            waiter.wait([last_member_key], timedelta(seconds=left))
            return
        except RuntimeError:  # torch's store errors (DistError and its kinds)
            if watch.aborted is not None:
                if store.check([last_member_key]):
                    return
                raise BarrierAborted(watch.aborted) from None
            if not watch.fired:  # the store's own error, or its timeout
                if store.check([last_member_key]):
                    return
                if time.monotonic() >= deadline - _CLOCK_SLACK:
                    raise _timeout(timeout, last_member_key) from None
                raise
        finally:
            if asking is not None:
                asking.set()
            # Finished even if a signal handler raises in it: a handler runs at any function
            # entry, this one's included, so the retry is here and not in a helper.
            raised: BaseException | None = None
            while True:
                try:
                    watch.disarm()
                    break
                except BaseException as e:
                    raised = e
            if raised is not None:
                raise raised
        # A signal ended the wait and its handler did not raise (one that raises, such as
        # torch's SignalException, has propagated): wait again on a new connection.


class _SignalWatch:
    """While armed, shuts the armed connection down when a signal arrives.

    One per process, with a daemon thread blocked reading the wake-up pipe. Arming and disarming
    do not wake that thread, so a released barrier costs no thread switch; the thread only runs
    when a signal arrives during a wait.
    """

    _instance: _SignalWatch | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._connection: int | None = None
        self._saved_stderr: int | None = None
        self.fired = False
        #: The reason :meth:`interrupt` gave, when it (not a signal) ended the wait.
        self.aborted: str | None = None
        threading.Thread(target=self._run, name="fsm-agent-exit-barrier", daemon=True).start()

    @classmethod
    def get(cls) -> _SignalWatch:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def arm(self, connection: int) -> bool:
        """Watch for signals until :meth:`disarm`; ``False`` when the wake-up fd is taken (by
        asyncio, say): then nothing was changed."""
        try:
            previous = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread
            return False
        if previous != -1:
            signal.set_wakeup_fd(previous)
            return False
        with self._lock:
            self._connection, self.fired, self.aborted = connection, False, None
        return True

    def disarm(self) -> None:
        """Stop watching; stderr back if a signal silenced it. Repeatable."""
        with self._lock:
            self._connection = None
            if self._saved_stderr is not None:
                os.dup2(self._saved_stderr, 2)
                os.close(self._saved_stderr)
                self._saved_stderr = None
        signal.set_wakeup_fd(-1)

    def _run(self) -> None:
        while True:
            try:
                os.read(self._wake_r, 512)
            except InterruptedError:
                continue
            self._end(None)

    def interrupt(self, reason: str) -> None:
        """End the armed wait as a signal would, for ``reason`` (:attr:`aborted`)."""
        self._end(reason)

    def _end(self, reason: str | None) -> None:
        with self._lock:
            if self._connection is None or self.fired:
                return
            self.fired, self.aborted = True, reason
            # the failed receive's C++ warning is ours, not a store fault
            self._saved_stderr = os.dup(2)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 2)
            os.close(quiet)
            with contextlib.suppress(OSError), \
                    socket.socket(fileno=os.dup(self._connection)) as sock:
                sock.shutdown(socket.SHUT_RDWR)


def _answer(abort: Abort) -> str | None:
    try:
        return abort()
    except Exception:  # a question that fails answers nothing; the barrier goes on
        logger.debug("exit barrier: the abort question failed", exc_info=True)
        return None


def _ask(abort: Abort, every: float, watch: _SignalWatch) -> threading.Event:
    """Ask ``abort`` every ``every`` seconds until the returned event is set; a reason ends
    the armed wait (:meth:`_SignalWatch.interrupt`)."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(every):
            reason = _answer(abort)
            if reason:
                watch.interrupt(reason)
                return

    threading.Thread(target=run, name="fsm-agent-exit-barrier-abort", daemon=True).start()
    return done


def _store_port(store: Any) -> int | None:
    # a PrefixStore over a PrefixStore ... over a TCPStore
    for _ in range(8):
        port = getattr(store, "port", None)
        if isinstance(port, int):
            return port
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _socket_fds() -> set[int] | None:
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    fds = set()
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.add(int(name))
    return fds


def _clone_with_connection(store: Any, left: float) -> tuple[Any, int | None]:
    """A clone of ``store`` and the socket it opened to the store's server (or ``None``s)."""
    port = _store_port(store)
    before = _socket_fds() if port is not None else None
    if before is None:
        return None, None
    # A clone connects with the store's timeout, retrying all along if the store's host has just
    # died (60 s and more); bounded here, and polling (which fails at once then) takes over.
    # The shared client (torch's keep-alive thread uses it too) has the short timeout only for
    # the few milliseconds the connection takes.
    previous = getattr(store, "timeout", None)
    try:
        if isinstance(previous, timedelta):
            store.set_timeout(timedelta(seconds=min(_CLONE_TIMEOUT, max(left, 0.001))))
        waiter = store.clone()
    except (AttributeError, RuntimeError, NotImplementedError):
        return None, None
    finally:
        if isinstance(previous, timedelta):
            store.set_timeout(previous)
    after = _socket_fds() or set()
    mine = []
    for fd in after - before:  # the clone's socket; also the server's side when we host it
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
            if sock.getpeername()[1] == port:
                mine.append(fd)
    return waiter, (mine[0] if len(mine) == 1 else None)


def _poll(store: Any, key: str, deadline: float, timeout: float, *, abort: Abort | None = None,
          abort_every: float = ABORT_EVERY) -> None:
    pause = 0.002
    ask_at = time.monotonic() + abort_every
    while not store.check([key]):
        now = time.monotonic()
        if now >= deadline:
            raise _timeout(timeout, key)
        if abort is not None and now >= ask_at:
            ask_at = now + abort_every
            reason = _answer(abort)
            if reason:
                raise BarrierAborted(reason)
        # Short sleeps first (the common case is a barrier the others reach at once).
        time.sleep(min(pause, deadline - now))
        pause = min(BARRIER_POLL_INTERVAL, pause * 2)


def _timeout(timeout: float, key: str) -> TimeoutError:
    return TimeoutError(
        f"exit barrier: not every agent arrived within {timeout:g} s (key {key!r})"
    )
