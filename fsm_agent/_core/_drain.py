"""Preemption as spec data: a drain with a deadline, and one exit code for the whole job.

A scheduler that preempts a job (Slurm's ``scontrol requeue`` or a time limit's ``--signal``, a
Kubernetes eviction, a spot reclaim) sends a signal and kills after a grace period. A spec opts
in with two triggers of its own, which the torch agent fires:

``preempted``
    The agent received one of the signals its spec parameter ``drain_on`` lists, or another
    agent of the job announced a preemption (the job protocol's ``PREEMPTED`` outcome).
``drained``
    Every worker has exited (in a state entered by ``drain_workers``).

and a few actions, none of which does I/O itself (each asks the driver, whose methods are
optional; ``fsm_agent.torch``'s driver has them all):

``announce_preemption: <exit code>`` (kind)
    Settle the exit code of the preemption, and announce it to every agent of the job (the
    first announcement wins: every agent ends with the same code). ``0`` means 128 + the number
    of the signal received, as a shell reports a process killed by it.
``drain_workers: <signal name>`` (kind)
    Send the signal to every worker process (not its children: a rank decides what its own
    children do, and a data loader worker without a handler would die of ``SIGUSR1``).
``kill_workers``
    Stop what is left at once (``SIGKILL``), for a drain whose deadline has passed.
``raise_preempted``
    The terminal action of the final state: the run ends with :class:`Preempted`.

``resilient`` is the preset that uses them (``docs/spec-format.md``, "Preemption").
"""

from __future__ import annotations

import logging
import signal as _signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._context import ActionDef, Kind
from ._driver import DrainDriver, capability

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["ACTIONS", "ACTION_KINDS", "DRAINED_TRIGGER", "DRAIN_SIGNALS", "PREEMPTED_OUTCOME",
           "PREEMPTED_TRIGGER", "Preempted", "Preemption", "preempted_code", "signal_number"]

log = logging.getLogger("fsm_agent")

#: The spec trigger of a preemption (a drain signal, or another agent's announcement).
PREEMPTED_TRIGGER = "preempted"
#: The spec trigger fired once every worker has exited during a drain.
DRAINED_TRIGGER = "drained"
#: The job protocol's outcome for a preempted job (``fsm_agent._core._job.JobOutcome.outcome``).
PREEMPTED_OUTCOME = "PREEMPTED"
#: The signals a spec may drain on, or send as the drain signal (the ones schedulers send).
DRAIN_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


def signal_number(name: str) -> int:
    """``SIGTERM`` -> 15; ``ValueError`` for a name that is none of :data:`DRAIN_SIGNALS`."""
    if name not in DRAIN_SIGNALS:
        raise ValueError(f"{name!r} is not a signal a drain may use ({', '.join(DRAIN_SIGNALS)})")
    return int(_signal.Signals[name])


def preempted_code(exit_code: int, signum: int | None) -> int:
    """The exit code of a preemption: ``exit_code``, or (0) 128 + the signal, as a shell reports
    it (SIGTERM: 143)."""
    if exit_code:
        return exit_code
    return 128 + (signum if signum is not None else int(_signal.SIGTERM))


@attrs.frozen
class Preemption:
    """What the driver knows about the preemption under way: the signal this agent received
    (None when another agent's announcement brought it), the exit code the job already settled
    on (None until one is known), a one-line reason, and how the drain ended for the workers
    (``workers``, once it has: "workers drained", or which ones were killed and by what)."""

    signal: int | None
    reason: str
    exit_code: int | None = None
    workers: str | None = None


class Preempted(Exception):
    """The run ended by a preemption, after the drain: ``exit_code``, a one-line ``reason`` and
    how the drain ended for the workers (``workers``: "workers drained" when every worker exited
    by itself; else which ones were killed, and by what).

    Not a failure of the job: a scheduler told to requeue on this code starts it again.
    """

    def __init__(self, reason: str, exit_code: int, workers: str = "workers drained") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.workers = workers


def _preemption(ctx: Context) -> Preemption:
    describe = capability(ctx.driver, DrainDriver.preemption)
    found = describe() if describe is not None else None
    return found if isinstance(found, Preemption) else Preemption(None, "preempted")


def _announce_preemption(exit_code: int) -> Callable[[Context], None]:
    if not 0 <= exit_code < 256:
        raise ValueError(f"an exit code is between 1 and 255 (0: 128 + the signal), "
                         f"got {exit_code}")

    def action(ctx: Context) -> None:
        found = _preemption(ctx)
        code = found.exit_code
        if code is None:
            code = preempted_code(exit_code, found.signal)
            announce = capability(ctx.driver, DrainDriver.announce_preemption)
            if announce is not None:
                # one job, one outcome: the code that won is the one every agent ends with
                won = announce(code, found.reason)
                code = won if isinstance(won, int) else code
        ctx.exit_code = code

    return action


def _drain_workers(signal: str) -> Callable[[Context], None]:
    signum = signal_number(signal)

    def action(ctx: Context) -> None:
        drain = capability(ctx.driver, DrainDriver.drain_workers)
        if drain is None:
            log.warning("[%s] drain_workers: driver %s cannot drain its workers; they are "
                        "stopped when the drain's time is up", ctx.role, type(ctx.driver).__name__)
            return
        drain(signum)

    return action


def _kill_workers(ctx: Context) -> None:
    kill = capability(ctx.driver, DrainDriver.kill_workers)
    (kill if kill is not None else ctx.driver.stop_workers)()


def _raise_preempted(ctx: Context) -> None:
    found = _preemption(ctx)
    code = ctx.exit_code if ctx.exit_code is not None else preempted_code(0, found.signal)
    raise Preempted(found.reason, code, found.workers or "workers drained")


#: ``announce_preemption`` and ``drain_workers``, parameterised (``{drain_workers: drain_signal}``).
ACTION_KINDS: dict[str, Kind] = {
    "announce_preemption": Kind(
        _announce_preemption, {"exit_code": "int"}, "exit_code", {"exit_code": 0},
        description="settle the preemption's exit code (0: 128 + the signal) and announce it "
        "to every agent of the job (\"Preemption\" below)"),
    "drain_workers": Kind(
        _drain_workers, {"signal": "str"}, "signal", {"signal": "SIGTERM"},
        choices={"signal": DRAIN_SIGNALS},
        description="send the signal to every worker process; `drained` fires once all exited"),
}

#: ``kill_workers`` and the terminal ``raise_preempted``.
ACTIONS: dict[str, ActionDef] = {
    "kill_workers": ActionDef(_kill_workers),
    "raise_preempted": ActionDef(_raise_preempted, terminal=True),
}
