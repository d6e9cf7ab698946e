"""Preemption for torch's agent: a drain signal becomes the spec's ``preempted`` trigger.

A spec that declares the triggers ``preempted`` and ``drained`` (``fsm_agent._drain``) and the
parameter ``drain_on`` (signal names) has :class:`DrainMixin` install a handler for those signals
for the whole ``run()``: from its start, before the first rendezvous, and again after every start
of the workers (torch's ``PContext.start`` puts its own ``SIGTERM`` handler back each time).

The handler never raises where the main thread happens to be. It records the preemption and
wakes the monitor wait; the lifecycle then takes ``preempted`` from the state it rests in:

- in a monitor wait or a backoff: the wait returns ``preempted`` (checked again after every
  wait, so that a tick never observes workers the same signal killed as failed);
- in a rendezvous: torch's join loop polls between two looks at the rendezvous state, and the
  poll raises a ``TriggerInterrupt`` that the engine turns into ``preempted`` from the state the
  rendezvous started in;
- anywhere else (starting or stopping workers, a health check): when that action ends;
- in a final state (the exit barrier after success) or before the lifecycle exists to take it:
  as torch does, ``SignalException``.

A second ``SIGTERM`` or ``SIGINT`` once a preemption is under way raises torch's
``SignalException`` at once, and the workers are killed with ``SIGKILL`` rather than given the
shutdown timeout again: the scheduler's patience is over.

In the drain state (the one with a transition on ``drained``) the wait returns ``drained`` as
soon as every worker process has exited, whatever their exit codes: a worker that exits 0 in a
drain has checkpointed, it has not finished the job.

With a job of several agents, the agent that received the signal announces a ``PREEMPTED``
outcome (``announce_preemption``); every other agent reads it wherever it waits and takes
``preempted`` as well, so the whole job drains and every agent exits with the same code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from torch.distributed.elastic.multiprocessing import SignalException

from fsm_agent._drain import (
    DRAINED_TRIGGER,
    PREEMPTED_TRIGGER,
    Preemption,
    signal_number,
)
from fsm_agent._errors import TriggerInterrupt
from fsm_agent.torch._job import JOB_FAILED

__all__ = ["DRAIN_ON_PARAM", "DrainMixin"]

logger = logging.getLogger("fsm_agent.torch")

#: The spec parameter listing the signals that mean "preempted".
DRAIN_ON_PARAM = "drain_on"
#: The longest wait in the drain state between two looks at the workers (a worker's exit
#: wakes the wait sooner when the exit waker watches them).
DRAIN_POLL = 0.05
_STOP_AT_ONCE = (signal.SIGTERM, signal.SIGINT)


class DrainMixin:
    """Drains the workers on a preemption signal, as the spec says (see the module docstring).

    Needs ``LifecycleAgentMixin`` after it among the bases; a spec without the ``preempted``
    trigger or with an empty ``drain_on`` leaves every signal to torch.
    """

    _fsm_preemption: Preemption | None = None
    _fsm_drain_signals: tuple[int, ...] = ()
    _fsm_drain_started: float | None = None
    _fsm_drain_aborted: bool = False
    _fsm_saved_handlers: dict[int, Any] | None = None

    # -- set-up ------------------------------------------------------------------------------

    def _fsm_drain_setup(self) -> tuple[int, ...]:
        spec = self._lifecycle_spec  # type: ignore[attr-defined]
        if PREEMPTED_TRIGGER not in spec.triggers:
            return ()
        names = self._lifecycle_params.get(DRAIN_ON_PARAM, ())  # type: ignore[attr-defined]
        return tuple(sorted({signal_number(n) for n in names}))

    def run(self, role: str = "default") -> Any:
        """torch's ``run()`` with the spec's drain signals handled from its first step."""
        self._fsm_preemption = None
        self._fsm_drain_started = None
        self._fsm_drain_aborted = False
        self._fsm_drain_signals = self._fsm_drain_setup()
        if self._fsm_drain_signals and threading.current_thread() is not threading.main_thread():
            logger.warning("drain_on: the agent runs outside the main thread, where no signal "
                           "handler can be installed; signals stop the workers as under torch")
            self._fsm_drain_signals = ()
        self._fsm_saved_handlers = {s: signal.getsignal(s) for s in self._fsm_drain_signals}
        self._fsm_install_drain()
        try:
            return super().run(role)  # type: ignore[misc]
        finally:
            for s, old in (self._fsm_saved_handlers or {}).items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(s, old if old is not None else signal.SIG_DFL)
            self._fsm_saved_handlers = None

    def _fsm_install_drain(self) -> None:
        for s in self._fsm_drain_signals:
            signal.signal(s, self._fsm_on_signal)

    def _start_workers(self, worker_group: Any) -> Any:
        out = super()._start_workers(worker_group)  # type: ignore[misc]
        self._fsm_install_drain()  # torch's PContext.start() installed its own SIGTERM handler
        return out

    # -- the signal --------------------------------------------------------------------------

    def _fsm_on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._fsm_preemption is not None:
            if signum in _STOP_AT_ONCE:
                # the scheduler asks again: stop now, without waiting for the drain
                self._fsm_drain_aborted = True
                raise SignalException(f"Process {os.getpid()} got signal: {signum} during a "
                                      "drain", sigval=signal.Signals(signum))
            logger.warning("received %s: a drain is already under way", name)
            return
        lifecycle = self._lifecycle  # type: ignore[attr-defined]
        if lifecycle is None or lifecycle.done or lifecycle.state_name in lifecycle.spec.finals:
            # nothing left to drain from (the exit barrier after success): as torch
            raise SignalException(f"Process {os.getpid()} got signal: {signum}",
                                  sigval=signal.Signals(signum))
        self._fsm_preemption = Preemption(signum, f"received {name}")
        logger.warning("[%s] received %s: preempted, draining the workers",
                       lifecycle.context.role, name)
        self._fsm_wake()  # type: ignore[attr-defined]

    def _fsm_can_preempt(self) -> bool:
        lifecycle = self._lifecycle  # type: ignore[attr-defined]
        return (lifecycle is not None and not lifecycle.done
                and bool(lifecycle.spec.outgoing(lifecycle.state_name, PREEMPTED_TRIGGER)))

    def _fsm_learn_preemption(self) -> bool:
        """Whether the job announced a preemption (another agent received the signal): if so it
        is this agent's preemption too, with the announced exit code."""
        job = self._fsm_job  # type: ignore[attr-defined]
        outcome = job.channel.outcome if job is not None else None
        if outcome is None or not outcome.preempted:
            return False
        if self._fsm_preemption is None:
            self._fsm_preemption = Preemption(None, f"{outcome.node} {outcome.reason}",
                                              exit_code=outcome.exit_code)
        return True

    def _fsm_current_preemption(self) -> Preemption | None:
        """The preemption under way: this agent's signal, or the job's announcement."""
        if self._fsm_preemption is None:
            self._fsm_learn_preemption()
        return self._fsm_preemption

    # -- the waits ---------------------------------------------------------------------------

    def _monitor_wait(self, interval: float) -> str | None:
        lifecycle = self._lifecycle  # type: ignore[attr-defined]
        if lifecycle is not None and lifecycle.spec.outgoing(lifecycle.state_name,
                                                             DRAINED_TRIGGER):
            return self._fsm_drain_wait(interval)
        if self._fsm_preemption is not None and self._fsm_can_preempt():
            return PREEMPTED_TRIGGER
        out: str | None = super()._monitor_wait(interval)  # type: ignore[misc]
        if out == JOB_FAILED and self._fsm_learn_preemption() and self._fsm_can_preempt():
            return PREEMPTED_TRIGGER
        if self._fsm_preemption is not None and self._fsm_can_preempt():
            return PREEMPTED_TRIGGER  # the signal came during the wait
        return out

    def _fsm_drain_wait(self, interval: float) -> str | None:
        deadline = time.monotonic() + interval
        while True:
            if self._fsm_workers_exited():
                started = self._fsm_drain_started
                took = f" in {time.monotonic() - started:.3g} s" if started is not None else ""
                logger.warning("[%s] drained: every worker exited%s",
                               self._worker_group.spec.role, took)  # type: ignore[attr-defined]
                return DRAINED_TRIGGER
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._fsm_wait(min(left, DRAIN_POLL))  # type: ignore[attr-defined]

    def _fsm_rendezvous_poll(self) -> None:
        # between two looks at the rendezvous state: a preemption ends the rendezvous
        super()._fsm_rendezvous_poll()  # type: ignore[misc]
        if self._fsm_preemption is not None:
            raise TriggerInterrupt(PREEMPTED_TRIGGER, self._fsm_preemption.reason)

    # -- the driver's actions ----------------------------------------------------------------

    def _fsm_workers_exited(self) -> bool:
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is None:
            return True
        handlers = getattr(pcontext, "subprocess_handlers", None)
        if handlers:
            return all(h.proc.poll() is not None for h in handlers.values())
        processes = getattr(getattr(pcontext, "_pc", None), "processes", None)
        if processes is not None:
            return all(not p.is_alive() for p in processes)
        return not any(_alive(pid) for pid in pcontext.pids().values())

    def _fsm_drain_workers(self, signum: int) -> None:
        self._fsm_drain_started = time.monotonic()
        pcontext = getattr(self, "_pcontext", None)
        pids = dict(pcontext.pids()) if pcontext is not None else {}
        sent = []
        for rank, pid in sorted(pids.items()):
            # the worker process only, not its group: its children are the rank's to stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                sent.append(rank)
        lifecycle = self._lifecycle  # type: ignore[attr-defined]
        timeout = lifecycle.context.params.get("drain_timeout") if lifecycle else None
        within = f" for up to {timeout:g} s" if isinstance(timeout, (int, float)) else ""
        logger.warning("[%s] drain: sent %s to %d worker(s); waiting%s for them to exit",
                       self._worker_group.spec.role,  # type: ignore[attr-defined]
                       signal.Signals(signum).name, len(sent), within)

    def _fsm_kill_workers(self) -> None:
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is None:
            return
        left = [r for r, pid in pcontext.pids().items() if _alive(pid)]
        logger.warning("[%s] the drain's time is up: killing %d worker(s) still running (local "
                       "rank(s) %s)", self._worker_group.spec.role,  # type: ignore[attr-defined]
                       len(left), sorted(left))
        pcontext.close(signal.SIGKILL, timeout=max(1, int(self._shutdown_timeout or 1)))  # type: ignore[attr-defined]

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        if self._fsm_drain_aborted:
            death_sig = signal.SIGKILL  # a second signal during a drain: at once
        super()._shutdown(death_sig, timeout)  # type: ignore[misc]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

