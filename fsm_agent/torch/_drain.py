"""Preemption for torch's agent: a drain signal becomes the spec's ``preempted`` trigger.

A spec that declares the triggers ``preempted`` and ``drained`` (``fsm_agent._core._drain``) and the
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
drain has checkpointed, it has not finished the job. A worker killed by a signal is a drain's
end too (it is gone, and the preemption's exit code is still what the scheduler needs), but not
a drained worker: no handler of its own ended it, so its checkpoint may be missing. The log and
``fsm-agent run``'s last line say which local ranks were killed and by what, and why that
happens: a scheduler that signals every process of the job itself (Slurm's ``scancel``,
``scontrol requeue`` and preemption under ``proctrack/cgroup`` or ``linuxproc``) reaches the
workers at the same moment as the agent, with its own signal rather than ``drain_signal``.

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
from collections.abc import Sequence
from types import FrameType
from typing import Any

import attrs
from torch.distributed.elastic.multiprocessing import SignalException

from fsm_agent._core._drain import (
    DRAINED_TRIGGER,
    PREEMPTED_TRIGGER,
    Preemption,
    signal_number,
)
from fsm_agent._core._errors import TriggerInterrupt
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
    _fsm_drain_sent: int | None = None
    #: the local ranks running when the drain began (a stopped group's old exits do not count)
    _fsm_drain_ranks: frozenset[int] = frozenset()
    _fsm_workers_live: bool = False
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
        self._fsm_drain_sent = None
        self._fsm_drain_ranks = frozenset()
        self._fsm_workers_live = False
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
        self._fsm_workers_live = True
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
                self._fsm_drain_ended()
                return DRAINED_TRIGGER
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._fsm_wait(min(left, DRAIN_POLL))  # type: ignore[attr-defined]

    def _fsm_drain_ended(self) -> None:
        """Every worker has exited: say how each ended, in the log and in the preemption (the
        run's last line)."""
        started = self._fsm_drain_started
        took = f" in {time.monotonic() - started:.3g} s" if started is not None else ""
        role = self._worker_group.spec.role  # type: ignore[attr-defined]
        codes = {r: c for r, c in self._fsm_worker_exit_codes().items()
                 if r in self._fsm_drain_ranks}
        exited = _exit_codes_text({r: c for r, c in codes.items() if c is not None and c > 0})
        killed = _killed_text({r: -c for r, c in codes.items() if c is not None and c < 0})
        if not killed:
            logger.warning("[%s] drained: every worker exited%s%s", role, took,
                           f" ({exited})" if exited else "")
            self._fsm_note_workers("workers drained" + (f" ({exited})" if exited else ""))
            return
        sent = self._fsm_drain_sent
        drain_name = _signal_name(sent) if sent is not None else "the drain signal"
        others = sorted({_signal_name(-c) for c in codes.values()
                         if c is not None and c < 0 and -c != sent})
        why = []
        if others:
            them = " and ".join(others)
            why.append(f"{them} is not the drain signal ({drain_name}): something else sent it "
                       "to the workers, such as a scheduler that signals every process of the "
                       "job (Slurm's scancel, scontrol requeue and preemption under "
                       f"proctrack/cgroup or linuxproc); let the workers handle {them} as they "
                       f"handle {drain_name}, or drain with {others[0]} (docs/multinode.md, "
                       "\"Preemption\")")
        if sent is not None and any(c == -sent for c in codes.values()):
            why.append(f"a worker killed by {drain_name}, the drain signal, has no handler for it")
        logger.warning("[%s] the drain ended%s, but not every worker drained: %s%s (no handler of "
                       "their own ended them: their checkpoints may be missing). %s", role, took,
                       killed, f", {exited}" if exited else "", "; ".join(why))
        self._fsm_note_workers(f"not every worker drained: {killed}"
                               + (f", {exited}" if exited else ""))

    def _fsm_note_workers(self, text: str, killed: Sequence[int] = ()) -> None:
        """How the drain ended for the workers: in the preemption (the run's last line) and in
        the trace (``diagnostics.drain`` on the step that ends the drain; ``killed``: the local
        ranks still running at ``drain_timeout``)."""
        if self._fsm_preemption is not None:
            self._fsm_preemption = attrs.evolve(self._fsm_preemption, workers=text)
        started, sent = self._fsm_drain_started, self._fsm_drain_sent
        codes = self._fsm_worker_exit_codes()
        self._fsm_note("drain", {  # type: ignore[attr-defined]
            "reason": self._fsm_preemption.reason if self._fsm_preemption is not None else None,
            "signal": _signal_name(sent) if sent is not None else None,
            "ranks": sorted(self._fsm_drain_ranks),
            "took_s": round(time.monotonic() - started, 6) if started is not None else None,
            "exit_codes": {str(r): c for r, c in sorted(codes.items())
                           if r in self._fsm_drain_ranks and r not in killed},
            "killed_at_timeout": sorted(killed),
            "workers": text,
        })

    def _fsm_worker_exit_codes(self) -> dict[int, int | None]:
        """Each worker's exit code by local rank, as ``subprocess`` gives it (``-N``: killed by
        signal N; None: unknown, or still running)."""
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is None:
            return {}
        handlers = getattr(pcontext, "subprocess_handlers", None)
        if handlers:
            return {int(r): h.proc.poll() for r, h in handlers.items()}
        processes = getattr(getattr(pcontext, "_pc", None), "processes", None)
        if processes is not None:
            return {r: p.exitcode for r, p in enumerate(processes)}
        return dict.fromkeys(pcontext.pids(), None)

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
        self._fsm_drain_sent = signum
        pcontext = getattr(self, "_pcontext", None)
        pids = dict(pcontext.pids()) if pcontext is not None and self._fsm_workers_live else {}
        self._fsm_drain_ranks = frozenset(int(r) for r in pids)
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
        codes = self._fsm_worker_exit_codes()
        left = sorted(r for r, pid in pcontext.pids().items()
                      if codes.get(r) is None and _alive(pid))
        logger.warning("[%s] the drain's time is up: killing %d worker(s) still running (local "
                       "rank(s) %s)", self._worker_group.spec.role,  # type: ignore[attr-defined]
                       len(left), left)
        self._fsm_note_workers(
            f"not every worker drained: {_ranks(left)} killed at drain_timeout" if left
            else "workers drained", killed=left)
        pcontext.close(signal.SIGKILL, timeout=max(1, int(self._shutdown_timeout or 1)))  # type: ignore[attr-defined]

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        self._fsm_workers_live = False
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



def _ranks(ranks: list[int]) -> str:
    return f"local rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _killed_text(signals: dict[int, int]) -> str:
    """``{0: 15, 1: 15, 2: 9}`` -> "local ranks 0, 1 killed by SIGTERM, local rank 2 by SIGKILL"."""
    by: dict[int, list[int]] = {}
    for rank, signum in sorted(signals.items()):
        by.setdefault(signum, []).append(rank)
    parts: list[str] = []
    for signum, ranks in by.items():
        parts.append(f"{_ranks(ranks)} {'killed ' if not parts else ''}by {_signal_name(signum)}")
    return ", ".join(parts)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _exit_codes_text(codes: dict[int, int]) -> str:
    """``{1: 2}`` -> "local rank 1 exited 2" (workers that exited by themselves, not 0)."""
    by: dict[int, list[int]] = {}
    for rank, code in sorted(codes.items()):
        by.setdefault(code, []).append(rank)
    return ", ".join(f"{_ranks(ranks)} exited {code}" for code, ranks in by.items())
