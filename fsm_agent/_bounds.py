"""How long a job can take to give up, and how many restarts it can make: worked out by running
the spec itself.

``fsm-agent check --bounds`` answers the question users of torchrun work out by hand ("3 x 2400 s
= 2 hours"): the spec's own engine runs a crash loop (every attempt fails at its first monitor
tick) in virtual time against a driver whose calls take as long as torch allows them to (a
rendezvous up to its join timeout, a stop up to the shutdown timeout, the exit barrier up to its
timeout, a declared action up to its budget). Two runs bound the answer: the fastest (every call
instant, the smallest jitter) and the slowest (every call as slow as allowed, the largest jitter).
Nothing is restated: timers, windows, rules and budgets are the spec's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._clock import VirtualClock
from ._engine import Lifecycle
from ._spec import Spec
from ._step import Step

__all__ = ["Bound", "Limits", "bounds", "format_bounds", "format_duration"]

#: A crash loop that has not given up after this long never will (for the report's purpose).
HORIZON_S = 30 * 24 * 3600.0
MAX_RESTARTS_SEEN = 10_000


@attrs.frozen
class Limits:
    """What each driver call may take at worst (torch's defaults)."""

    max_restarts: int = 3
    monitor_interval: float = 0.1
    rendezvous_timeout: float = 600.0  # c10d's join_timeout
    stop_timeout: float = 30.0  # TORCH_ELASTIC_SHUTDOWN_TIMEOUT
    exit_barrier_timeout: float = 300.0


@attrs.frozen
class Bound:
    """One crash-loop run: how it ended, after how long, having restarted how often."""

    scenario: str
    restarts: int
    seconds: float | None  # None: it never gives up
    outcome: str
    spent: Mapping[str, float]  # seconds by where they went (rendezvous, stop, backoff, ...)


class _Stop(BaseException):
    pass


class _Jitter:
    """A random source that always draws the low (or high) end of the range."""

    def __init__(self, high: bool) -> None:
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


class _CrashLoop:
    """A driver whose workers fail at every first tick, and whose calls take ``cost`` seconds."""

    def __init__(self, clock: VirtualClock, limits: Limits, slow: bool) -> None:
        self.clock, self.limits, self.slow = clock, limits, slow
        self.spent: dict[str, float] = {}

    def _take(self, what: str, seconds: float) -> None:
        if self.slow and seconds > 0:
            self.clock.advance(seconds)
            self.spent[what] = self.spent.get(what, 0.0) + seconds

    def rendezvous(self) -> None:
        self._take("rendezvous", self.limits.rendezvous_timeout)

    def start_workers(self) -> None:
        pass

    def stop_workers(self) -> None:
        self._take("stopping workers", self.limits.stop_timeout)

    def monitor(self) -> Any:
        from .testing._recording import make_result

        return make_result("FAILED")

    def num_nodes_waiting(self) -> int:
        return 0

    def exit_barrier(self, timeout: float) -> None:
        self._take("exit barrier", min(timeout, self.limits.exit_barrier_timeout))

    def put_metric(self, name: str, value: int) -> None:
        pass


def _run(spec: Spec, params: Mapping[str, Any] | None, limits: Limits, slow: bool) -> Bound:
    clock = VirtualClock()
    driver = _CrashLoop(clock, limits, slow)
    budgets = {a.name: float(a.timeout.resolve({**spec.defaults, **(params or {})}))
               for a in spec.action_defs if a.timeout is not None}
    waits: dict[str, float] = {}

    def listen(step: Step) -> None:
        for a in step.actions:
            if a.name in budgets:
                driver._take(a.name, budgets[a.name])

    lc = Lifecycle(spec, driver, max_restarts=limits.max_restarts,
                   exit_barrier_timeout=limits.exit_barrier_timeout, params=params, clock=clock,
                   rng=_Jitter(slow), listeners=[listen])  # type: ignore[arg-type]

    def sleep(seconds: float) -> None:
        state = lc.state_name
        clock.sleep(seconds)
        waits[state] = waits.get(state, 0.0) + seconds
        if clock.now() > HORIZON_S or lc.restart_count > MAX_RESTARTS_SEEN:
            raise _Stop

    scenario = "crash loop, slowest" if slow else "crash loop, fastest"
    try:
        lc.run(limits.monitor_interval, sleep=sleep)
        outcome = f"ends {lc.state_name}"
    except _Stop:
        spent = {**driver.spent, **{f"waiting in {s}": t for s, t in waits.items()}}
        return Bound(scenario, lc.restart_count, None, "never gives up", spent)
    except Exception as e:
        outcome = f"ends {lc.state_name} ({type(e).__name__})"
    spent = {**driver.spent, **{f"waiting in {s}": t for s, t in waits.items()}}
    return Bound(scenario, lc.restart_count, clock.now(), outcome, spent)


def bounds(spec: Spec, params: Mapping[str, Any] | None = None,
           limits: Limits | None = None) -> list[Bound]:
    """The fastest and the slowest crash loop of ``spec`` under ``limits``."""
    limits = limits or Limits()
    return [_run(spec, params, limits, slow=False), _run(spec, params, limits, slow=True)]


def format_duration(seconds: float | None) -> str:
    """``7.3 s``, ``2 h 1 min``; ``never`` for None."""
    if seconds is None or math.isinf(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "",
             f"{minutes} min" if minutes else "", f"{sec} s" if sec and not days else ""]
    return " ".join(p for p in parts if p)


def format_bounds(spec: Spec, results: list[Bound], limits: Limits,
                  params: Mapping[str, Any] | None = None) -> str:
    """The table ``fsm-agent check --bounds`` prints."""
    shown = {**spec.defaults, **(params or {})}
    head = [f"{spec.name}: every attempt fails at its first monitor tick "
            f"(max_restarts={limits.max_restarts}, monitor interval {limits.monitor_interval:g} s"
            f"; worst case: rendezvous {limits.rendezvous_timeout:g} s, stop "
            f"{limits.stop_timeout:g} s, exit barrier {limits.exit_barrier_timeout:g} s)"]
    if shown:
        from ._params import format_value

        head.append("parameters: " + ", ".join(f"{k}={format_value(v)}"
                                               for k, v in sorted(shown.items())))
    rows = [("scenario", "restarts", "gives up after", "outcome", "where the time goes")]
    for b in results:
        where = ", ".join(f"{k} {format_duration(v)}" for k, v in
                          sorted(b.spent.items(), key=lambda kv: -kv[1]) if v > 0) or "-"
        rows.append((b.scenario, str(b.restarts), format_duration(b.seconds), b.outcome, where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
             for r in rows]
    return "\n".join([*head, "", *lines])
