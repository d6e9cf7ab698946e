"""The job protocol on torch's etcd rendezvous backends (``etcd`` and ``etcd-v2``).

The protocol (``fsm_agent._core._job``) needs a store every agent shares before the first round,
with
``set``, ``get``, ``add``, ``check`` and an atomic ``compare_set``. The c10d backend's
``TCPStore`` has them all. On etcd torch gives less:

- ``etcd-v2``'s handler keeps an ``EtcdStore`` (``handler._store``) whose ``compare_set`` is
  torch's abstract ``Store.compare_set``: it raises ``Not implemented``;
- ``etcd`` (v1)'s handler has no store before a round at all, only its etcd client
  (``handler._rdzv_impl.client``); each round's ``EtcdStore`` lives under that round's version.

:class:`EtcdJobStore` builds the five operations from the etcd client itself (python-etcd, the
etcd v2 API torch's backends speak): ``compare_set`` is etcd's own compare-and-swap (a create
with ``prevExist=false``, or a write with ``prevIndex`` of the value compared), ``add`` the same
loop torch's ``EtcdStore.add`` uses, ``check`` one read per key. Keys and values are base64, as
in ``EtcdStore`` (a store key may hold any byte). Every key is written with a TTL of two hours,
torch's own ``etcd-v2`` state TTL: etcd outlives the job, and a later job with the same run id
must not read this one's outcome (torch's rendezvous refuses a closed run id for as long).

:func:`etcd_rendezvous_poll` gives the ``etcd`` (v1) rendezvous the poll the c10d join loop
gets from ``fast_rendezvous``: torch's waits there go through
``EtcdRendezvous.try_wait_for_state_change`` (cut to slices of at most a second) and end with
``get_rdzv_state``; the poll runs before each, so an announcement ends the rendezvous within a
second, or one keep-alive refresh (5 s) while a full round is waited out.
"""

from __future__ import annotations

import contextlib
import functools
import time
from base64 import b64decode, b64encode, urlsafe_b64encode
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from fsm_agent._core._job import StoreTimeout

T = TypeVar("T")

__all__ = ["ETCD_TTL", "EtcdJobStore", "etcd_job_store", "etcd_rendezvous_poll", "max_nodes_of",
           "round_of_store", "unimplemented"]

#: Seconds an etcd key of the job protocol lives after its last write (torch's etcd-v2 TTL).
ETCD_TTL = 7200
#: The longest a poll-less wait of the etcd (v1) rendezvous lasts (seconds).
V1_WAIT_SLICE = 1.0


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _enc(value: str | bytes) -> str:
    return b64encode(_bytes(value)).decode()


def _lost_as_connection_error(method: Callable[..., T]) -> Callable[..., T]:
    """python-etcd's errors (``EtcdConnectionFailed`` and the rest, urllib3's timeouts) as
    ``ConnectionError``: one of ``fsm_agent.torch._job.STORE_ERRORS``, so an etcd the agent
    cannot reach is the store lost, as a TCPStore whose host is gone."""

    @functools.wraps(method)
    def call(self: Any, *args: Any) -> T:
        try:
            return method(self, *args)
        except self._errors as e:
            raise ConnectionError(f"etcd: {type(e).__name__}: {e}") from e

    return call


class EtcdJobStore:
    """``fsm_agent._core._job.Store`` on an etcd (v2 API) client, under ``prefix``.

    ``timeout`` is what ``get`` waits for an absent key, and the bound of every call
    (``fsm_agent.torch._bounded`` reads it as the store's ``timeout``).
    """

    def __init__(self, client: Any, prefix: str, *, timeout: float = 60.0,
                 ttl: int = ETCD_TTL) -> None:
        import etcd  # type: ignore[import-untyped, import-not-found]  # the handler is etcd

        self._etcd = etcd
        self._errors: tuple[type[BaseException], ...] = (etcd.EtcdException,)
        with contextlib.suppress(ImportError):
            import urllib3.exceptions

            self._errors += (urllib3.exceptions.HTTPError,)
        self.client = client
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.timeout = timedelta(seconds=timeout)
        self.ttl = ttl

    def _path(self, key: str) -> str:
        # urlsafe: a '/' in the name would make etcd directories of it
        return self.prefix + urlsafe_b64encode(key.encode()).decode()

    def _read(self, key: str) -> Any | None:
        try:
            return self.client.read(self._path(key))
        except self._etcd.EtcdKeyNotFound:
            return None

    @_lost_as_connection_error
    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key``."""
        self.client.write(self._path(key), _enc(value), ttl=self.ttl)

    @_lost_as_connection_error
    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` for it (then ``StoreTimeout``, as
        ``MemoryStore``)."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        pause = 0.01
        while True:
            node = self._read(key)
            if node is not None:
                return b64decode(node.value)
            if time.monotonic() >= deadline:
                ms = self.timeout.total_seconds() * 1000
                raise StoreTimeout(f"wait timeout after {ms:.0f}ms, key {key!r} not in etcd")
            time.sleep(pause)
            pause = min(0.2, pause * 2)

    @_lost_as_connection_error
    def check(self, keys: list[str]) -> bool:
        """Whether every key exists (one read each, never waits)."""
        return all(self._read(k) is not None for k in keys)

    @_lost_as_connection_error
    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's compare-and-set, by etcd's own compare-and-swap: ``desired`` is written
        only if ``key`` still holds the value read (same ``modifiedIndex``), or is still
        absent when ``expected`` is empty; otherwise look again."""
        etcd = self._etcd
        want = _bytes(expected)
        path = self._path(key)
        while True:
            node = self._read(key)
            if node is None:
                if want:
                    return want  # absent and something expected: TCPStore returns expected
                try:
                    self.client.write(path, _enc(desired), ttl=self.ttl, prevExist=False)
                except etcd.EtcdAlreadyExist:
                    continue  # another agent created it first: compare with theirs
                return _bytes(desired)
            held = b64decode(node.value)
            if held != want:
                return held
            try:
                self.client.write(path, _enc(desired), ttl=self.ttl,
                                  prevIndex=node.modifiedIndex)
            except (etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
                continue  # changed (or expired) since the read: compare again
            return _bytes(desired)

    @_lost_as_connection_error
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if absent), atomically."""
        while True:
            node = self._read(key)
            current = b"0" if node is None else b64decode(node.value)
            value = int(current) + int(amount)
            held = self.compare_set(key, b"" if node is None else current, str(value))
            if held == str(value).encode():
                return value


def unimplemented(store: Any, method: str) -> bool:
    """Whether ``store`` is a Python subclass of torch's ``Store`` that leaves ``method`` to
    the abstract base (whose ``compare_set`` raises ``Not implemented``; torch's ``EtcdStore``
    does). A C++ store (``TCPStore``, ``PrefixStore``) implements every method in C++."""
    from torch.distributed import Store

    if not isinstance(store, Store):
        return False
    for klass in type(store).__mro__:
        if klass is Store:
            return True
        if method in vars(klass) or klass.__module__.startswith("torch._C"):
            return False
    return False


def etcd_job_store(handler: Any) -> EtcdJobStore | None:
    """The job protocol's store on an etcd rendezvous handler's client, or None (no etcd
    handler, or torch's internals moved: ``_compat`` feature ``etcd_job``)."""
    from fsm_agent.torch._compat import enabled

    if not enabled("etcd_job"):
        return None
    store: Any = getattr(handler, "_store", None)
    rdzv: Any = getattr(handler, "_rdzv_impl", None)
    if getattr(store, "client", None) is not None and isinstance(getattr(store, "prefix", None),
                                                                 str):
        # etcd-v2: torch's EtcdStore, on the backend's client (its prefix is shared by every
        # run: the job channel's keys carry the run id)
        client, prefix = store.client, store.prefix.rstrip("/") + "/fsm_agent"
        timeout = getattr(store, "timeout", None)
    elif rdzv is not None and getattr(rdzv, "client", None) is not None:
        client, prefix = rdzv.client, str(getattr(rdzv, "_prefix", "/torch/elastic/")) + \
            "fsm_agent"
        timeout = None
    else:
        return None
    if not hasattr(client, "write") or not hasattr(client, "read"):
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else 0.0
    return EtcdJobStore(client, prefix, timeout=seconds if seconds > 0 else 60.0)


def max_nodes_of(handler: Any) -> int | None:
    """The largest number of nodes an etcd (v1) rendezvous admits (None: not etcd v1)."""
    value = getattr(getattr(handler, "_rdzv_impl", None), "_num_max_workers", None)
    return value if isinstance(value, int) else None


def round_of_store(store: Any) -> str | None:
    """The etcd (v1) rendezvous version a round's ``EtcdStore`` lives under
    (``.../rdzv/v_<N>/kv``), or None."""
    prefix = getattr(store, "prefix", None)
    if not isinstance(prefix, str):
        return None
    head, sep, tail = prefix.rstrip("/").rpartition("/rdzv/v_")
    version = tail.removesuffix("/kv")
    return version if sep and head and version.isdigit() else None


@contextlib.contextmanager
def etcd_rendezvous_poll(handler: Any, poll: Callable[[], None]) -> Iterator[None]:
    """Inside this block the etcd (v1) rendezvous of ``handler`` calls ``poll`` before each
    wait for a state change (cut to :data:`V1_WAIT_SLICE`) and each look at the state; what it
    raises ends the rendezvous. A no-op for any other handler."""
    rdzv = getattr(handler, "_rdzv_impl", None)
    wait = getattr(rdzv, "try_wait_for_state_change", None)
    read = getattr(rdzv, "get_rdzv_state", None)
    from fsm_agent.torch._compat import enabled

    if rdzv is None or not callable(wait) or not callable(read) or not enabled("etcd_job"):
        yield
        return

    def sliced_wait(etcd_index: Any, timeout: float | None = None) -> Any:
        poll()
        return wait(etcd_index, V1_WAIT_SLICE if timeout is None else min(timeout,
                                                                           V1_WAIT_SLICE))

    def polled_read() -> Any:
        poll()
        return read()

    rdzv.try_wait_for_state_change = sliced_wait
    rdzv.get_rdzv_state = polled_read
    try:
        yield
    finally:
        del rdzv.try_wait_for_state_change, rdzv.get_rdzv_state  # torch's methods again
