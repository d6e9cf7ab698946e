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
from collections.abc import Iterator
from typing import Any

__all__ = ["DEFAULT_SYNC_POLL", "cheap_rendezvous_events", "fast_rendezvous"]

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
) -> Iterator[None]:
    """Run one ``handler.next_rendezvous()`` inside this block without its needless waits.

    ``first``: this is the agent's first rendezvous. Only then, and only when more than one node
    may join, is torch's random start-up skew kept (its purpose: spread many nodes' first joins).
    """
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
    except ImportError:  # pragma: no cover - torch without elastic
        yield
        return
    original_delay = getattr(dyn, "_delay", None)
    original_name = getattr(dyn, "get_method_name", None)
    if not callable(original_delay) or not callable(original_name):
        yield
        return
    settings = getattr(handler, "settings", None)
    max_nodes = getattr(settings, "max_nodes", None)
    keep_skew = first and (max_nodes is None or max_nodes > 1)

    def delay(seconds: float | tuple[float, float]) -> None:
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
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
    except ImportError:  # pragma: no cover - torch without elastic
        yield
        return
    original = getattr(dyn, "get_method_name", None)
    if not callable(original):
        yield
        return
    dyn.get_method_name = _method_name
    try:
        yield
    finally:
        dyn.get_method_name = original
