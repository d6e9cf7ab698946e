"""Waits in torch's c10d rendezvous that a restart does not need, and how the agent skips them.

Measured with ``bench/run_all.py`` (probes around torch's own methods; see docs/performance.md),
a single-node restart in torch 2.13 spends most of its time in ``next_rendezvous`` although that
makes two or three store round trips of well under a millisecond each:

1. ``DynamicRendezvousHandler.next_rendezvous`` sleeps a random 0-0.3 s "if this is our first
   run" to spread the first joins of many nodes. The test is ``state.round == 0``, which is still
   true at the first *restart* (the round number only moves when the next round completes), so
   the first restart of every job sleeps 0.15 s on average. A single-node job
   (``max_nodes == 1``) has nobody to spread from at all.
2. Every ``_record`` call (several per rendezvous) evaluates ``get_method_name()``, which calls
   ``inspect.stack()`` twice: it builds a ``FrameInfo`` with source context for every frame
   (file reads, a scan of ``sys.modules``), 5-15 ms each here, only to take one function name for
   an event that is dropped anyway when no event handler is configured (the default).
3. While waiting for other nodes the join loop sleeps 1 s between two looks at the state
   (``_delay(seconds=1)``), and the state holder serves a cached state for 1 s anyway
   (``_BackendRendezvousStateHolder._cache_duration``). With several agents this dominates a
   restart: an agent waits up to a second (often two) for a round the last agent already
   completed.

:func:`fast_rendezvous` removes 1 and 2 and shortens 3, around one ``next_rendezvous`` call: it
swaps the two module-level helpers of ``torch.distributed.elastic.rendezvous.dynamic_rendezvous``
and lowers the handler's state cache to the poll period for the duration of the call (the
agent's rendezvous runs on its main thread; torch's keep-alive thread uses neither helper).
Outside the call torch's own functions and cache are back in place, so the monitor tick's
``num_nodes_waiting`` reads the store at most once a second, as in torch. If a future torch
renames any of these, the part that no longer fits is left alone.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from fsm_agent.torch._compat import enabled

__all__ = [
    "DEFAULT_SYNC_POLL",
    "cached_nodes_waiting",
    "cheap_rendezvous_events",
    "fast_rendezvous",
    "notify_background_syncs",
    "state_cache_expiry",
]

#: Store poll period while waiting for other nodes, instead of torch's 1 s. At 0.1 s, 8 waiting
#: agents add 80 small ``get`` requests per second to the store for as long as they wait.
DEFAULT_SYNC_POLL = 0.1


def _method_name(depth: int = 2) -> str:
    """``get_method_name`` without ``inspect.stack()``: the same frame, found by walking."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a shallower stack than asked for
        return "no_method_name"


@contextlib.contextmanager
def fast_rendezvous(
    handler: Any,
    *,
    first: bool,
    sync_poll: float = DEFAULT_SYNC_POLL,
    poll: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Run one ``handler.next_rendezvous()`` inside this block without its needless waits.

    ``first``: this is the agent's first rendezvous. Only then, and only when more than one node
    may join, is torch's random start-up skew kept (its purpose: spread many nodes' first joins).
    ``poll`` runs before each wait of the join loop; what it raises ends the rendezvous (the job
    protocol's announcement, ``fsm_agent.torch._job``).
    """
    if not enabled("fastpath"):
        yield
        return
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    original_delay = getattr(dyn, "_delay", None)
    original_name = getattr(dyn, "get_method_name", None)
    if not callable(original_delay) or not callable(original_name):
        yield
        return
    settings = getattr(handler, "settings", None)
    max_nodes = getattr(settings, "max_nodes", None)
    keep_skew = first and (max_nodes is None or max_nodes > 1)

    def delay(seconds: float | tuple[float, float]) -> None:
        if poll is not None:
            poll()
        if isinstance(seconds, tuple):  # the start-up skew
            if keep_skew:
                original_delay(seconds)
            return
        original_delay(min(seconds, sync_poll))

    holder = getattr(handler, "_state_holder", None)
    cache = getattr(holder, "_cache_duration", None)
    dyn._delay = delay
    dyn.get_method_name = _method_name
    if isinstance(cache, (int, float)):
        holder._cache_duration = min(cache, sync_poll)  # type: ignore[union-attr]
    try:
        yield
    finally:
        dyn._delay = original_delay
        dyn.get_method_name = original_name
        if isinstance(cache, (int, float)):
            holder._cache_duration = cache  # type: ignore[union-attr]


@contextlib.contextmanager
def cheap_rendezvous_events() -> Iterator[None]:
    """Replace torch's ``get_method_name`` (two ``inspect.stack()`` per call) for a whole run.

    Besides the rendezvous itself, torch's keep-alive thread calls it every 5 s (10-15 ms of CPU
    per call in an agent process, the larger the more modules are loaded): most of an idle
    agent's CPU time outside its monitor ticks. The result is the same function name.
    """
    if not enabled("fastpath"):
        yield
        return
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    original = getattr(dyn, "get_method_name", None)
    if not callable(original):
        yield
        return
    dyn.get_method_name = _method_name
    try:
        yield
    finally:
        dyn.get_method_name = original


def cached_nodes_waiting(handler: Any) -> int | None:
    """``handler.num_nodes_waiting()`` when torch would answer it from its cached state, else
    ``None`` (call it: torch reads the store then).

    torch's ``DynamicRendezvousHandler.num_nodes_waiting`` takes the heartbeat lock, asks its
    state holder to ``sync()`` and counts the wait list; ``sync()`` reads the store only when the
    state is dirty or older than the cache duration (1 s), and otherwise returns at once. That
    call costs about 15 us of CPU on every monitor tick in a live agent, 10 times a second, for
    the same answer; this reads the same cached state with the same test, without the lock. The
    wait list changes only inside a ``sync()`` or a rendezvous operation, both under that lock
    (the keep-alive thread's too), so the count read here is the call's, or the one from just
    before a keep-alive sync that runs at this very moment (the next tick then sees it). A node
    that starts waiting is seen at the same tick as under torch: the first after the cache runs
    out.
    """
    if not enabled("fastpath"):
        return None
    holder = getattr(handler, "_state_holder", None)
    try:
        cache = holder._cache_duration  # type: ignore[union-attr]
        if (
            holder._dirty  # type: ignore[union-attr]
            or cache <= 0
            or holder._last_sync_time < max(time.monotonic() - cache, 0)  # type: ignore[union-attr]
        ):
            return None
        return len(holder._state.wait_list)  # type: ignore[union-attr]
    except (AttributeError, TypeError):  # not torch's c10d/etcd-v2 state holder
        return None


def state_cache_expiry(handler: Any) -> float | None:
    """When ``handler.num_nodes_waiting()`` will next read the store (``time.monotonic()``), or
    ``None`` when that is not known (not torch's c10d/etcd-v2 state holder).

    Until then every call returns the cached count (see :func:`cached_nodes_waiting`), unless
    another thread refreshes the cached state first (see :func:`notify_background_syncs`).
    """
    if not enabled("fastpath"):
        return None
    holder = getattr(handler, "_state_holder", None)
    try:
        cache = holder._cache_duration  # type: ignore[union-attr]
        last = holder._last_sync_time  # type: ignore[union-attr]
        if holder._dirty or cache <= 0 or last < 0:  # type: ignore[union-attr]
            return time.monotonic()
        return float(last + cache)
    except (AttributeError, TypeError):
        return None


def notify_background_syncs(handler: Any, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` after every ``sync()`` of ``handler``'s rendezvous state that runs on
    another thread than this one (torch's keep-alive thread: it refreshes the cached state, so a
    node that now waits is counted by the next ``num_nodes_waiting()``). Returns the undo; does
    nothing (and returns a no-op) for a handler without torch's state holder.
    """
    holder = getattr(handler, "_state_holder", None)
    original = getattr(holder, "sync", None)
    if (not enabled("fastpath") or holder is None or not callable(original)
            or "sync" in vars(holder)):
        return lambda: None
    owner = threading.get_ident()

    def sync() -> Any:
        try:
            return original()
        finally:
            if threading.get_ident() != owner:
                callback()

    holder.sync = sync

    def undo() -> None:
        if vars(holder).get("sync") is sync:
            del holder.sync

    return undo
