"""An exit barrier that a termination signal can interrupt.

torch's ``torch.distributed.elastic.utils.store.barrier`` blocks in one C++ call
(``store.wait([key])``) for up to the whole barrier timeout (300 s by default). Python runs
signal handlers only between bytecodes, so a SIGTERM, SIGINT or SIGHUP sent to an agent waiting
at its exit barrier is acted on only when the barrier ends: torch's own agent ignores a shutdown
request for up to five minutes there (torch 2.13, ``tests/reliability/test_signals.py``).

:func:`interruptible_barrier` is the same barrier on the same keys (so torch agents and ours still
meet), waiting with non-blocking ``store.check`` calls and short Python sleeps instead, so a
signal's handler runs within one poll interval. Store errors (the store's host is gone) propagate
at once, a timeout raises ``TimeoutError``; the lifecycle's ``exit_barrier`` action logs both.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["POLL_INTERVAL", "interruptible_barrier"]

#: Longest pause between two looks at the store: the bound on acting on a signal, and on how late
#: an agent leaves after the last one arrives (the target is 50 ms). A ``store.check`` is one
#: loopback round trip (~0.1 ms), so polling at this rate costs the store next to nothing. Blocking
#: ``store.wait`` calls with a short timeout would release at once, but torch logs two C++
#: warnings per timed-out wait on a client store.
POLL_INTERVAL = 0.01


def interruptible_barrier(store: Any, world_size: int, key_prefix: str, timeout: float) -> None:
    """Wait until ``world_size`` agents reached the barrier ``key_prefix`` on ``store``.

    Same keys and protocol as torch's ``barrier`` (``_barrier_nonblocking``: every member adds 1
    to ``<prefix>/num_members``, the last one sets ``<prefix>/last_member``).
    """
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    start = time.monotonic()
    deadline = start + timeout
    last_member_key = _barrier_nonblocking(store=store, world_size=world_size,
                                           key_prefix=key_prefix)
    pause = 0.002
    while not store.check([last_member_key]):
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(
                f"exit barrier: not every agent arrived within {timeout:g} s "
                f"(key {last_member_key!r})"
            )
        # Short sleeps first (the common case is a barrier the others reach at once).
        time.sleep(min(pause, deadline - now))
        pause = min(POLL_INTERVAL, pause * 2)
