"""Rendezvous store calls that end within the store's timeout, with signals acted on meanwhile.

torch's ``TCPStore`` client waits in one C++ call until the server answers. When the server
stops answering without closing the connection (a network partition, a stopped host),
``check``, ``get``, ``add`` and ``compare_set`` wait for as long as that lasts, whatever the
store's ``timeout`` (torch 2.13: still waiting after 20 s with a 2 s timeout; only ``set``,
which expects no answer, returns). Python runs signal handlers between two bytecodes of the
main thread, so a SIGTERM waited just as long, and the agent said nothing.

:class:`StoreCalls` runs the calls on a thread of its own and waits for each at most the
store's timeout: ``--rdzv-conf read_timeout``, 60 s by default, the timeout torch gives the
c10d rendezvous store. The wait is an ``Event.wait``, which a signal interrupts, so torch's
termination handler raises at once. A call that does not end in time raises
:class:`StoreUnresponsive` (a ``TimeoutError``: one of ``STORE_ERRORS``, and one of the errors
torch's c10d backend turns into ``RendezvousConnectionError``), and so does every later call:
a store that once did not answer is lost, as the job protocol says (docs/job-protocol.md). The
thread left waiting in its C++ call is a daemon; it ends with the process.

Bounded: the job protocol's calls (:class:`fsm_agent.torch._job.AgentJob`) and the c10d
handler's rendezvous-state calls (its backend's store), which ``num_nodes_waiting`` and the
rendezvous make. Not bounded: the exit barrier (its own wait ends at the barrier timeout, and a
signal closes its connection: ``fsm_agent.torch._barrier``) and the workers' store.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

__all__ = ["BoundedStore", "StoreCalls", "StoreUnresponsive", "bound_backend", "timeout_of"]

T = TypeVar("T")


class StoreUnresponsive(TimeoutError):
    """A store call found no answer within the store's timeout (the store is lost)."""


class _Call:
    __slots__ = ("args", "done", "error", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as e:  # handed to the caller, whatever it is
            self.error = e
        finally:
            self.done.set()


class StoreCalls:
    """One thread that makes store calls, each waited for at most ``timeout`` seconds (the
    thread runs for as long as the process: a daemon, idle between calls)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        #: Why the store is lost (the first call that found no answer), or None.
        self.lost: str | None = None
        self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="fsm-agent-store", daemon=True).start()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the store thread; :class:`StoreUnresponsive` if it takes longer
        than the timeout (or an earlier call did)."""
        if self.lost is not None:
            raise StoreUnresponsive(self.lost)
        call = _Call(fn, args)
        self._queue.put(call)
        if not call.done.wait(self.timeout):
            name = getattr(fn, "__name__", "call")
            self.lost = (f"the store did not answer a {name} within {self.timeout:g} s (its "
                         "timeout, --rdzv-conf read_timeout)")
            raise StoreUnresponsive(self.lost)
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            self._queue.get().run()

    def wrap(self, store: Any) -> BoundedStore:
        """``store`` with every method call made through this thread."""
        return BoundedStore(store, self)


class BoundedStore:
    """A store whose method calls go through :class:`StoreCalls`; other attributes are the
    store's own."""

    def __init__(self, store: Any, calls: StoreCalls) -> None:
        self.store = store
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        return functools.partial(self.calls.call, attr) if callable(attr) else attr


def timeout_of(store: Any) -> float | None:
    """The store's own timeout in seconds (``TCPStore.timeout``), or None if it has none."""
    timeout = getattr(store, "timeout", None)
    if not isinstance(timeout, timedelta):
        return None
    seconds = timeout.total_seconds()
    return seconds if seconds > 0 else None


def bound_backend(handler: Any, calls: StoreCalls) -> bool:
    """Make the c10d rendezvous handler's state calls through ``calls``; False if the handler
    has no c10d backend (etcd, a custom handler), which is left as it is."""
    from fsm_agent.torch._compat import enabled

    if not enabled("bounded_store"):
        return False
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    store = getattr(backend, "_store", None)
    if (backend is None or store is None or isinstance(store, BoundedStore)
            or not hasattr(backend, "_call_store")):
        return False
    backend._store = calls.wrap(store)
    return True
