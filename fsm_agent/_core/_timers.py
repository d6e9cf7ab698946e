"""State timers: a fixed timeout, or an exponential backoff with jitter and reset.

A timer is built once per lifecycle from the state's ``TimeoutSpec`` and the parameters in
force; on each entry into its state the engine asks it for the delay (seconds on the
lifecycle's clock) after which the trigger ``timeout`` fires.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ._spec import TimeoutSpec
from ._vocabulary import Context

__all__ = ["Timer", "make_timer"]

#: The delay of a state's timer, computed on each entry into the state.
Timer = Callable[[Context], float]


def make_timer(state: str, timeout: TimeoutSpec, values: Mapping[str, Any]) -> Timer:
    """The timer of ``state`` with references resolved against ``values``."""
    if timeout.backoff is None:
        assert timeout.after is not None
        fixed = float(timeout.after.resolve(values))
        return lambda ctx: fixed
    b = timeout.backoff
    initial, factor, cap, jitter, reset_after = (
        float(r.resolve(values)) for r in (b.initial, b.factor, b.max, b.jitter, b.reset_after)
    )
    on_progress = bool(b.reset_on_progress.resolve(values))

    def backoff(ctx: Context) -> float:
        n = ctx.backoff.get(state, 0)
        started = ctx.attempt_started
        if on_progress and ctx.progressed is not None:
            # Whether the attempt that just ended moved training on decides: a long attempt
            # stuck at its checkpoint is still a loop, a short one that advanced is not.
            if ctx.progressed:
                n = 0
        elif started is not None and ctx.clock.now() - started >= reset_after:
            # The attempt that just ended ran long enough: this is a new failure, not a loop.
            n = 0
        ctx.backoff[state] = n + 1
        try:
            delay = min(cap, initial * factor**n)
        except OverflowError:
            delay = cap
        if jitter and math.isfinite(delay):
            delay *= 1.0 + ctx.rng.uniform(-jitter, jitter)
        return max(0.0, delay)

    return backoff
