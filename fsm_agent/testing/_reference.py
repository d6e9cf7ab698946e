"""The reference behaviour of the two preset lifecycles, written from the table in MISSION.md.

This module deliberately does not read the preset specs or use the engine: it restates the
reference table (and the order of calls inside each row, as torch's ``_invoke_run`` and the
seed make them) as plain Python, so that the kit can tell a spec, the engine or a third-party
supervisor that drifts from it. Each monitor tick: sleep ``monitor_interval``, ``monitor()``,
group state := observed, ``put_metric(remaining_restarts)``, ``put_metric(<observed>, 1)``, then:

==================  =============  ===============================  ======================
observed            guard          torchelastic (seed)              torchrun (torch 2.x)
==================  =============  ===============================  ======================
SUCCEEDED           -              exit barrier; return             exit barrier; return
FAILED, UNHEALTHY   restarts left  restarts -= 1; stop, STOPPED,    same
                                   rendezvous, start, HEALTHY
FAILED, UNHEALTHY   none left      stop; FAILED; exit barrier;      stop; FAILED; return
                                   raise WorkerGroupFailureExc.     a FAILED result
HEALTHY             nodes waiting  restart, not counted             same
HEALTHY             none waiting   nothing                          nothing
UNKNOWN, INIT,      -              raise Exception("[role] Worker   same
STOPPED                            group in <STATE> state")
==================  =============  ===============================  ======================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ._strategies import RunConfig, Tick, failure_summary, fault_error, monitor_result

__all__ = [
    "PRESETS",
    "Event",
    "Pending",
    "Raised",
    "Returned",
    "Trace",
    "reference_trace",
]

PRESETS: tuple[str, ...] = ("torchrun", "torchelastic")

#: One recorded call: ``("rendezvous",)``, ``("sleep", 0.1)``, ``("exit_barrier", 300.0)``,
#: ``("put_metric", "workers.default.healthy", 1)``, ...
Event = tuple[Any, ...]


@attrs.frozen
class Returned:
    """The supervisor returned.

    ``state`` is the returned result's state (None when a bare dict of return values came back,
    as the seed's agent returns). ``failures`` is :func:`failure_summary` of the result's (rank ->
    pid and exit code). ``gave_up_after`` is the last observed state when the return is a give-up
    (FAILED or UNHEALTHY): torch 2.13 then returns the observed result itself, UNHEALTHY
    included, where fsm_agent reports FAILED.
    """

    state: str | None
    return_values: Any
    failures: Any
    gave_up_after: str | None = None

    def describe(self) -> str:
        """For the table."""
        state = self.state if self.state is not None else "(bare dict)"
        extra = f" failures={sorted(self.failures)}" if self.failures else ""
        return f"return {state} {self.return_values!r}{extra}"


@attrs.frozen
class Raised:
    """The supervisor raised. ``wrapped`` names the wrapper (``ActionError``) the cause came in."""

    type_name: str
    message: str
    wrapped: str | None = None
    scripted: bool = False

    def describe(self) -> str:
        """For the table."""
        via = f" (in {self.wrapped})" if self.wrapped else ""
        return f"raise {self.type_name}({self.message!r}){via}"


@attrs.frozen
class Pending:
    """The supervisor asked for a monitor result the script does not have: the run goes on."""

    def describe(self) -> str:
        """For the table."""
        return "still running (asked for another monitor tick)"


Outcome = Returned | Raised | Pending


@attrs.frozen
class Trace:
    """Everything observable about one run of a supervisor on one script."""

    events: tuple[Event, ...]
    outcome: Outcome
    state: str | None = None
    remaining_restarts: int | None = None


class _Fault(Exception):
    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


def reference_trace(preset: str, config: RunConfig, script: Sequence[Tick]) -> Trace:
    """What a supervisor of ``preset`` does on ``script``, straight from the reference table.

    The group state after a hook failure is the one torch's agent has reached at that point
    (e.g. STOPPED when the rendezvous of a restart fails).
    """
    if preset not in PRESETS:
        raise ValueError(f"no reference for preset {preset!r} (known: {', '.join(PRESETS)})")
    events: list[Event] = []
    role = config.role
    remaining = config.max_restarts
    state = "INIT"
    tick_no = 0
    fired: set[int] = set()
    faults = {0: config.init_fault} | {i: t.fault for i, t in enumerate(script, 1)}

    def call(hook: str, *args: Any) -> None:
        events.append((hook, *args))
        if faults.get(tick_no) == hook and tick_no not in fired:
            fired.add(tick_no)
            raise _Fault(fault_error(hook, tick_no))

    def restart() -> None:
        nonlocal state
        call("stop_workers")
        state = "STOPPED"
        call("rendezvous")
        call("start_workers")
        state = "HEALTHY"

    def barrier() -> None:
        # Every barrier outcome (ok, error, timeout) is logged and swallowed.
        events.append(("exit_barrier", config.exit_barrier_timeout))

    def done(outcome: Outcome) -> Trace:
        return Trace(tuple(events), outcome, state, remaining)

    try:
        call("rendezvous")
        call("start_workers")
        state = "HEALTHY"
        for tick_no, tick in enumerate(script, 1):
            events.append(("sleep", config.monitor_interval))
            call("monitor")
            result = monitor_result(tick_no, tick.observed)
            observed = tick.observed
            state = observed
            events.append(("put_metric", f"workers.{role}.remaining_restarts", remaining))
            events.append(("put_metric", f"workers.{role}.{observed.lower()}", 1))
            if observed == "SUCCEEDED":
                barrier()
                return done(Returned(observed, result.return_values,
                                     failure_summary(result.failures)))
            if observed in ("FAILED", "UNHEALTHY"):
                if remaining > 0:
                    remaining -= 1
                    restart()
                    continue
                call("stop_workers")
                state = "FAILED"
                if preset == "torchelastic":
                    barrier()
                    return done(Raised("WorkerGroupFailureException",
                                       f"[{role}] exceeded max_restarts={config.max_restarts}"))
                return done(Returned("FAILED", result.return_values,
                                     failure_summary(result.failures), gave_up_after=observed))
            if observed == "HEALTHY":
                call("num_nodes_waiting")
                if tick.nodes_waiting > 0:
                    restart()
                continue
            return done(Raised("Exception", f"[{role}] Worker group in {observed} state"))
        tick_no = len(script) + 1
        events.append(("sleep", config.monitor_interval))
        events.append(("monitor",))
        return done(Pending())
    except _Fault as f:
        return done(Raised(type(f.err).__name__, str(f.err), scripted=True))
