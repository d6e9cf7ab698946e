"""Stopping a worker stops its whole process group, even after the worker itself died.

torch starts every worker of a script entry point as the leader of its own session
(``start_new_session=True``) and stops it with ``os.killpg(worker_pid, sig)`` -- but only while
the leader is still running (``SubprocessContext._close`` skips a handler whose ``proc.poll()`` is
not None). A worker that crashed, segfaulted or was SIGKILLed therefore leaves its children (data
loader processes, a shell's background jobs, ...) running for ever: torch 2.13, confirmed by
``tests/reliability/test_worker_faults.py``.

:class:`ProcessGroupReaperMixin` closes that gap: after torch's own ``_shutdown`` it sends the
death signal to every process group a worker of this agent led, waits up to the shutdown
timeout, then SIGKILLs what is left. A process group id cannot be reused while the group has
members, so the signal reaches the worker's own descendants only (those that did not leave the
group with ``setsid``/``setpgid``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from fsm_agent._core._spec import INTERRUPT_TRIGGER
from fsm_agent.torch._compat import enabled

__all__ = [
    "INTERRUPT_TRIGGER",
    "ProcessGroupReaperMixin",
    "live_group_members",
    "reap_process_groups",
    "record_interruption",
]

logger = logging.getLogger("fsm_agent.torch")


def live_group_members(pgids: Iterable[int]) -> dict[int, list[int]]:
    """Live (non-zombie) processes in each of ``pgids``, from ``/proc``."""
    wanted = set(pgids)
    found: dict[int, list[int]] = {}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp in wanted and state not in (b"Z", b"X"):
            found.setdefault(pgrp, []).append(int(entry))
    return found


def reap_process_groups(pgids: Iterable[int], death_sig: int, timeout: float) -> list[int]:
    """Signal every live group of ``pgids`` with ``death_sig``, SIGKILL it after ``timeout``.

    Returns the groups that had to be signalled (empty when torch had already stopped them all).
    """
    left = live_group_members(pgids)
    if not left:
        return []
    signalled = sorted(left)
    logger.warning(
        "stopping the leftover processes of worker process group(s) %s (pids %s) with %s",
        signalled,
        sorted(p for ps in left.values() for p in ps),
        signal.Signals(death_sig).name,
    )
    _killpg(left, death_sig)
    deadline = time.monotonic() + max(0.0, timeout)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = live_group_members(left)
    if left:
        logger.warning("process group(s) %s still alive after %s s: SIGKILL", sorted(left), timeout)
        _killpg(left, signal.SIGKILL)
    return signalled


def _killpg(groups: Iterable[int], sig: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


class ProcessGroupReaperMixin:
    """For ``LocalElasticAgent`` subclasses: list it before ``LocalElasticAgent`` among the bases.

    Wraps ``_shutdown`` (called for every stop of the workers: restarts, giving up, signals, the
    end of ``run``), so that no process a worker started outlives the stop.
    """

    _pcontext: Any

    def _worker_process_groups(self) -> list[int]:
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext

        pcontext = getattr(self, "_pcontext", None)
        if not enabled("reaper"):
            return []
        # Only script entry points run in their own sessions; function entry points are
        # multiprocessing children of the agent, in the agent's own process group.
        if not isinstance(pcontext, SubprocessContext):
            return []
        return [int(h.proc.pid) for h in pcontext.subprocess_handlers.values()]

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        groups = self._worker_process_groups()
        # Not in a finally: if torch's shutdown is interrupted (a signal during a restart's stop),
        # torch's run() shuts down again, with the signal and the configured timeout, and reaps
        # then; reaping here would wait this call's timeout (30 s on a restart) first.
        super()._shutdown(death_sig, timeout)  # type: ignore[misc]
        reap_process_groups(groups, death_sig, timeout)


def record_interruption(
    lifecycle: Any, listeners: Iterable[Callable[[Any], None]], err: BaseException
) -> None:
    """Give ``listeners`` (the trace writer) a final step when ``err`` ends a lifecycle between
    two transitions (a termination signal during the monitor wait, say).

    A signal that arrives *during* a transition (an action such as ``exit_barrier`` or
    ``stop_workers``) already ends the trace: the engine records that step with its error. One
    that arrives between transitions would leave the trace without an ending, as if the agent had
    vanished. The step has trigger ``"signal"`` (no spec transition: the lifecycle was
    interrupted, not driven), source and destination the state the machine was in, and ``error``
    naming the exception, as the engine writes it.
    """
    if lifecycle is None or lifecycle.done:
        return
    from fsm_agent import Step

    state = lifecycle.state_name
    step = Step(
        trigger=INTERRUPT_TRIGGER,
        source=state,
        wall_time=time.time(),
        monotonic_time=time.monotonic(),
        role=lifecycle.context.role,
        dest=state,
        remaining_restarts=lifecycle.remaining_restarts,
        restart_count=lifecycle.restart_count,
        error=f"{type(err).__name__}: {err}",
    )
    for listener in listeners:
        try:
            listener(step)
        except Exception:
            # Same rule as the engine's: an observer must not change the job's outcome.
            logger.exception("lifecycle listener %r failed on the final step", listener)

