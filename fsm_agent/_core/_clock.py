"""Clocks: where the engine reads the time and how it waits.

Timers, sliding restart windows and attempt durations all read ``Clock.now()``; waits go through
``Clock.sleep()``. ``SystemClock`` is the real one. ``VirtualClock`` only moves when something
sleeps on it, so model tests and the conformance kit run hours of backoff in microseconds.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """A monotonic time source the engine can wait on."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a real clock may return early when interrupted)."""


class SystemClock:
    """``time.monotonic`` and ``time.sleep``: a signal handler that raises interrupts the wait."""

    __slots__ = ()

    def now(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``."""
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """A clock that advances only when slept on; ``slept`` lists every wait, in order.

    >>> clock = VirtualClock()
    >>> clock.sleep(1.5); clock.sleep(0.5)
    >>> clock.now(), clock.slept
    (2.0, [1.5, 0.5])
    """

    __slots__ = ("_now", "slept")

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self.slept: list[float] = []

    def now(self) -> float:
        """The virtual time."""
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance the virtual time by ``seconds`` at once."""
        self.slept.append(seconds)
        self._now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward without recording a sleep (time spent in actions, say)."""
        self._now += max(0.0, seconds)
