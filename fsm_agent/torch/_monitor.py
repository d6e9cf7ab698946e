"""The agent's monitor wait: between two looks at the workers, ended early by a worker's exit
(the waker), a job's announcement or a hang, and the waker that does it."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from fsm_agent._core._driver import capability
from fsm_agent.torch._compat import enabled
from fsm_agent.torch._diagnostics import DiagnosticsMixin
from fsm_agent.torch._fastpath import state_cache_expiry
from fsm_agent.torch._hang import HungRank
from fsm_agent.torch._hooks import TimerHooks
from fsm_agent.torch._job import JOB_FAILED
from fsm_agent.torch._wakeup import WorkerExitWaker

if TYPE_CHECKING:
    from fsm_agent.torch._tick import QuietTicks

__all__ = ["FATAL_EXCEPTIONS", "MonitorWaitMixin"]

logger = logging.getLogger("fsm_agent.torch")

# Exceptions torch's SimpleElasticAgent.run() handles itself; the engine must let them through
# unwrapped (it wraps any other action error in ActionError and moves to UNKNOWN).
FATAL_EXCEPTIONS: tuple[type[BaseException], ...] = (SignalException, RendezvousGracefulExitError)


class MonitorWaitMixin(DiagnosticsMixin):
    """The monitor wait and waker part of ``LifecycleAgentMixin`` (one of its bases)."""

    # set by LifecycleAgentMixin
    _fsm_quiet: QuietTicks
    _fsm_hung_trigger: bool
    _fsm_exit_waker: WorkerExitWaker | None
    _fsm_waker_failed: bool

    def _monitor_wait(self, interval: float) -> str | None:
        """Wait between two looks at the workers: ``monitor_interval``, or less if one exits.

        The tick still comes every ``interval`` (health and membership checks); a worker's exit
        ends the wait at once (``fsm_agent.torch._wakeup``). Returning the name of one of the
        spec's own triggers fires it: ``hung`` when the spec asks for hang detection and every
        worker stood still for ``hang_timeout`` (sampled within the wait), or when a torch
        timer expired (``fsm_agent.torch._hang``).
        """
        quiet = self._fsm_quiet
        lifecycle = self._lifecycle
        if lifecycle is not None and lifecycle.deadline is None:  # no timer to wake up for
            interval = quiet.wait_for(
                interval, state_cache_expiry(self._worker_group.spec.rdzv_handler)
            )
        hangs = self._fsm_hangs
        sampling = hangs is not None and hangs.watching
        # Another agent's announcement ends any wait (a tick, a backoff): fsm_agent.torch._job.
        job = self._fsm_job
        if job is not None and (lifecycle is None or JOB_FAILED not in lifecycle.spec.triggers):
            job = None
        woke: bool | None = None
        if sampling or job is not None:
            # progress samples and store polls on their own grids, inside the wait
            deadline = time.monotonic() + interval
            while True:
                if job is not None and job.check() is not None:
                    quiet.waited(True)
                    return JOB_FAILED
                if sampling:
                    assert hangs is not None
                    hung = hangs.poll()
                    if hung:
                        quiet.waited(None)
                        return self._fsm_report_hang([
                            HungRank(h.local_rank, self._worker_group.workers[h.local_rank]
                                     .global_rank, h.pid, h.idle_for, h.describe(hangs.timeout),
                                     h.exited)
                            for h in hung], source="progress")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                step = left
                if sampling:
                    assert hangs is not None
                    step = min(step, max(hangs.next_sample_in(), 1e-3))
                if job is not None and not (job.watched and self._fsm_wakeable()):
                    step = min(step, job.poll_interval)  # no watch to end the wait: poll
                woke = self._fsm_wait(step)
                if woke is not False:
                    if job is not None and job.check() is not None:  # the watch's wake-up
                        quiet.waited(True)
                        return JOB_FAILED
                    break
        else:
            woke = self._fsm_wait(interval)
        quiet.waited(woke)
        if self._fsm_hung_trigger:
            timer_hangs = capability(self, TimerHooks._fsm_timer_hangs)
            expired = timer_hangs() if timer_hangs is not None else []
            if expired:
                return self._fsm_report_hang(expired, source="timer")
        return None

    def _fsm_wait(self, seconds: float) -> bool | None:
        """Sleep up to ``seconds``: True when a worker's exit ended the wait early, False when
        the time ran out, None when the waker failed (a plain sleep)."""
        try:
            return bool(self._fsm_waker().wait(seconds))
        except FATAL_EXCEPTIONS:
            raise  # a termination signal raised by torch's handler during the wait
        except Exception as e:
            self._fsm_waker_fallback("wait", e)
            time.sleep(seconds)
            return None

    def _fsm_ticks_seen(self) -> bool:
        # Whether anything besides this agent sees each tick: lifecycle listeners (a trace
        # writer records every tick), or the hang watchdog (ours reports a hang on the next
        # tick). A listener with a false `every_tick` attribute (the agent's own; the run
        # summary's recorder: it folds the ticks that change nothing) does not need a tick
        # when nothing can change.
        lifecycle = self._lifecycle
        if lifecycle is None or getattr(self, "_worker_watchdog", None) is not None:
            return True
        return any(getattr(fn, "every_tick", True) for fn in getattr(lifecycle, "_listeners", ()))

    def _fsm_wake(self) -> None:
        # From torch's keep-alive thread: the rendezvous state was refreshed, look at it now.
        waker = self._fsm_exit_waker
        if waker is not None:
            with contextlib.suppress(Exception):
                waker.wake()

    def _on_workers_started(self) -> None:
        """Called after every start of the workers (first start and each restart)."""
        # watch the new workers' exits; agents without torch's _pcontext just tick.
        self._fsm_quiet.watching(None)
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is not None and self._fsm_hangs is not None:
            self._fsm_hangs.watch({w.local_rank: pid for w in self._worker_group.workers
                                   if (pid := pcontext.pids().get(w.local_rank)) is not None})
        if pcontext is None or self._fsm_waker_failed or not enabled("wakeup"):
            return
        try:
            waker = self._fsm_waker()
            waker.watch(pcontext)
        except FATAL_EXCEPTIONS:
            raise
        except Exception as e:
            self._fsm_waker_fallback("watch", e)
            return
        if waker.backend != "tick":
            self._fsm_quiet.watching(pcontext)  # every exit of these workers wakes the loop

    def _fsm_waker_fallback(self, what: str, error: Exception) -> None:
        # The waker only says when to look, never what happened: when it breaks (a process
        # context without real pids, an fd error) the monitor loop still works on plain ticks.
        self._fsm_waker_failed = True
        self._fsm_quiet.watching(None)
        broken, self._fsm_exit_waker = self._fsm_exit_waker, None
        if broken is not None:
            with contextlib.suppress(Exception):
                broken.close()
        logger.warning(
            "[%s] worker-exit waker failed in %s (%s: %s); looking at the workers every "
            "monitor_interval from now on",
            self._worker_group.spec.role, what, type(error).__name__, error,
        )

    def _fsm_wakeable(self) -> bool:
        """Whether another thread can end the current wait (the waker is not a plain sleep)."""
        return self._fsm_waker().backend != "tick"

    def _fsm_waker(self) -> WorkerExitWaker:
        # Created on first use, so subclasses whose __init__ runs first need nothing extra.
        waker = self._fsm_exit_waker
        if waker is None:
            plain = self._fsm_waker_failed or not enabled("wakeup")
            waker = self._fsm_exit_waker = WorkerExitWaker("tick" if plain else None)
        return waker
