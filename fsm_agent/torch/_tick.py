"""The monitor tick when nothing happened: torch's answers, without asking torch every time.

torch's agent wakes every ``monitor_interval`` (0.1 s under torchrun) to look at its workers and
at the rendezvous. For a ``LocalElasticAgent`` with script workers ``_monitor_workers`` compares
pid sets, polls every ``Popen`` (one ``waitpid`` each), scans for error files, runs the D-state
check when it is enabled and publishes two ``@prof`` metrics; ``num_nodes_waiting`` serves the
rendezvous state it read from the store at most once per second. Measured in a live agent with
4 sleeping workers (``bench/agents.py``), the wake-up alone costs about 55 us of CPU, the look
about 100 us and the lifecycle's observation about 80 us, ten times a second, for an answer that
can only change when a worker exits or the rendezvous state is read again.

fsm-agent's agent learns of every exit at once (``fsm_agent.torch._wakeup``: a pidfd per worker,
level-triggered, so none is lost between two waits). :class:`QuietTicks` uses that twice:

1. **No look when it could only repeat itself.** After a wait that ended without an exit, the
   last look's HEALTHY result stands in for a new one (the lifecycle still observes it: metrics,
   guards and transitions as before) when all of these hold:

   - every ``_monitor_workers`` the agent's class resolves to is torch's ``LocalElasticAgent``'s
     or our hang watchdog's (a subclass that overrides it may check anything, so it is asked);
   - the workers run in a ``SubprocessContext`` (script entry points: the torchrun case), watched
     by the waker since their start;
   - torch's D-state check is off (``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`` unset: it
     reads ``/proc`` on every look, so it needs every look);
   - no hung worker is recorded by the hang watchdog;
   - nobody listens to torch's metrics (the ``torchelastic`` group's handler is torch's
     ``NullMetricHandler``, the default): with a handler, the ``@prof`` metrics of every look
     reach it as under torch;
   - the last real look is less than :data:`FULL_LOOK_PERIOD` old, a bound on what a wake-up
     the waker failed to deliver (a dead ``waitid`` thread, say) can cost.

2. **No tick when nothing can change.** When, in addition, nothing besides the agent sees its
   ticks (no lifecycle listener such as a trace writer, no hang watchdog, no metrics handler),
   the agent waits until the next look is due or the membership check will next read the store
   (torch's state cache runs out), whichever comes first, instead of one interval. A waiting
   node is then counted at the same moment as under torch, when the cached state runs out, or
   at once when torch's keep-alive thread refreshes it
   (:func:`fsm_agent.torch._fastpath.notify_background_syncs` wakes the agent); a worker's exit
   ends the wait at once as before. So every change torch's tick would find is found as early,
   and the agent wakes about once a second instead of ten times.

Neither changes what the lifecycle decides: every observation still goes through it, and a look
is skipped only when its result is known.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.metrics.api import NullMetricHandler, getStream
from torch.distributed.elastic.multiprocessing.api import SubprocessContext

__all__ = ["FULL_LOOK_PERIOD", "QuietTicks", "monitor_is_torchs", "nobody_listens_to_metrics"]

#: Longest time between two real looks at the workers, quiet or not (seconds).
FULL_LOOK_PERIOD = 1.0

_KNOWN_MONITORS: dict[type, bool] = {}


def monitor_is_torchs(cls: type) -> bool:
    """Whether every ``_monitor_workers`` in ``cls``'s MRO is ``LocalElasticAgent``'s or the hang
    watchdog mixin's (whose checks :class:`QuietTicks` accounts for)."""
    known = _KNOWN_MONITORS.get(cls)
    if known is None:
        from fsm_agent.torch._file_timer import HangWatchdogMixin

        mro = cls.__mro__
        # what resolves before torch's own (the bases after it only declare the method)
        before = mro[: mro.index(LocalElasticAgent)] if LocalElasticAgent in mro else None
        known = before is not None and all(
            c is HangWatchdogMixin for c in before if "_monitor_workers" in vars(c)
        )
        _KNOWN_MONITORS[cls] = known
    return known


def nobody_listens_to_metrics() -> bool:
    """Whether torch's ``torchelastic`` metrics go to the ``NullMetricHandler`` (the default)."""
    return type(getStream("torchelastic").handler) is NullMetricHandler


def _hang_recorded(agent: Any) -> bool:
    watchdog = getattr(agent, "_worker_watchdog", None)
    hung = getattr(watchdog, "hung", None)
    return callable(hung) and bool(hung())


class QuietTicks:
    """Stands in for ``_monitor_workers`` on ticks where it could only repeat its last answer,
    and says how long the agent may wait when nobody but the agent sees its ticks.

    The agent calls ``watching(pcontext)`` after every start of the workers (the context whose
    every exit its waker reports, or ``None``), ``wait_for(interval, due)`` before each wait and
    ``waited(woke)`` after it; the driver calls ``stand_in()`` before each look (the last HEALTHY
    result, or ``None``: look now) and ``looked(result)`` after a real one. ``ticks_seen()``
    (given by the agent) tells whether anything besides the agent sees each tick: lifecycle
    listeners such as a trace writer, or a hang watchdog. The agent is held weakly.
    """

    __slots__ = ("_agent", "_due", "_quiet_wait", "_result", "_ticks_seen", "_watched", "looks",
                 "quiet")

    def __init__(self, agent: Any, ticks_seen: Callable[[], bool] = lambda: True) -> None:
        self._agent = weakref.ref(agent)
        self._ticks_seen = ticks_seen
        self._watched: Any = None
        self._result: Any = None
        self._quiet_wait = False
        self._due = 0.0
        self.looks = 0  # real looks taken, and ticks answered without one: for tests and benches
        self.quiet = 0

    def watching(self, pcontext: Any) -> None:
        """New workers (``pcontext``: their context if the waker reports each exit, else
        ``None``): the next tick looks."""
        self._watched = pcontext
        self._result = None

    def waited(self, woke: object) -> None:
        """The wait before the next look returned ``woke`` (``False``: no exit, a plain tick)."""
        self._quiet_wait = woke is False

    def looked(self, result: Any) -> None:
        """A real look returned ``result``."""
        self.looks += 1
        self._result = result if self._may_stand_in(result) else None
        self._due = time.monotonic() + FULL_LOOK_PERIOD

    def _may_stand_in(self, result: Any) -> bool:
        agent = self._agent()
        if agent is None or self._watched is None:
            return False
        return (
            result.state == WorkerState.HEALTHY
            and not result.failures
            and isinstance(self._watched, SubprocessContext)
            and self._watched is getattr(agent, "_pcontext", None)
            and monitor_is_torchs(type(agent))
            and "_monitor_workers" not in vars(agent)
            and not getattr(agent, "_uninterruptible_state_timeout", 0.0) > 0
        )

    def stand_in(self) -> Any:
        """The last look's HEALTHY result if it still stands, else ``None`` (look now)."""
        result, quiet_wait = self._result, self._quiet_wait
        self._quiet_wait = False
        if (
            result is None
            or not quiet_wait
            or time.monotonic() >= self._due
            or not nobody_listens_to_metrics()
            or _hang_recorded(self._agent())
        ):
            return None
        self.quiet += 1
        return result

    def wait_for(self, interval: float, membership_due: float | None) -> float:
        """How long the next wait may last: ``interval``, or longer while nothing can change.

        Longer only when the last look's result stands in (see :meth:`stand_in`), nothing
        besides the agent sees the ticks (``ticks_seen``), and the membership check's next store
        read is known (``membership_due``, a ``time.monotonic()`` value): then the wait lasts
        until that read or the next real look is due, whichever comes first. A worker's exit or
        a rendezvous state refreshed by another thread ends it at once (the agent's waker).
        """
        if (
            self._result is None
            or membership_due is None
            or self._ticks_seen()
            or not nobody_listens_to_metrics()
        ):
            return interval
        # one wake-up for both: the look that is due comes with the store read
        self._due = due = min(self._due, membership_due)
        return max(interval, due - time.monotonic())
