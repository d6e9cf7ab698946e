"""The reference behaviour of the three presets, written from their behaviour tables.

This module deliberately does not read the preset specs or use the engine: it restates the
tables (the README's preset table, its rows for ``torchelastic``, ``torchrun`` and ``resilient``
with ``resilient``'s parameters as specs/resilient.yaml declares them, and the order of calls
inside each row, as torch's ``_invoke_run`` and the seed make them) as plain Python, so that
the kit and the model tests can tell a spec, the engine or a third-party supervisor that drifts
from them. It is the one statement of those tables in the test code:
the conformance kit replays it on whole scripts (:func:`reference_trace`), the model test steps
it one tick at a time beside a ``Lifecycle`` (:class:`ReferenceRun`).

Each monitor tick: sleep ``monitor_interval``, ``monitor()``, group state := observed,
``put_metric(remaining_restarts)``, ``put_metric(<observed>, 1)``, then:

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

``resilient``, with its parameters (defaults in :data:`RESILIENT_DEFAULTS`):

* a failure where every failed rank exited with a code in ``no_retry_exit_codes`` (the ranks
  torch stopped with SIGTERM after the first failure are not failed ranks) gives up at once,
  without counting a restart: the job's exit code is ``no_requeue_exit_code`` (set first: the
  announcement to the job's other agents carries it); stop; FAILED; return the FAILED result
  (no exit barrier);
* every other failure (FAILED or UNHEALTHY) with restarts left restarts after a backoff: count
  the restart, stop, the group reports STOPPED, wait ``min(backoff_max, backoff_initial *
  backoff_factor**n) * (1 + uniform(-backoff_jitter, backoff_jitter))``, rendezvous, start,
  HEALTHY. ``n`` counts the backoffs since the last reset, and goes back to 0 when the attempt
  that just failed (since the workers were last started) ran for at least ``backoff_reset``
  (with ``backoff_reset_on_progress``: when it made progress, wherever progress is known);
* a failure where every failed rank exited with a code in ``infra_exit_codes`` (neither a
  no-retry failure nor the give-up after restarts without progress, below) spends the infra
  budget instead: ``infra_restarts`` restarts within any window of ``restart_window``,
  restarted after a backoff as any other failure, never counted against ``max_restarts``; with
  none of the infra budget left: stop; FAILED; return the FAILED result;
* a failure that follows a lost node (``Tick.peer_lost``: the driver's ``lost_peers()`` names
  one), whatever its exit codes, restarts at once (stop, the group reports STOPPED, rendezvous,
  start, HEALTHY; no backoff) while fewer than ``node_replacements`` such restarts were made
  (``inf``: always), never counted against ``max_restarts``; with none left: stop; FAILED;
  return the FAILED result;
* ``max_restarts`` failure restarts are allowed within any window of ``restart_window``: a
  restart counts while less than ``restart_window`` has passed since it (``inf``: the whole
  job, as torch); with none left: stop; FAILED; return the FAILED result (no exit barrier);
* HEALTHY with a lost node (``Tick.peer_lost``) restarts at once, from the same
  ``node_replacements`` budget as a failure that follows a loss (with none left: stop; FAILED;
  return the FAILED result), before nodes waiting are asked about;
* HEALTHY with nodes waiting restarts at once (stop, rendezvous, start), never counted;
* success, and UNKNOWN/INIT/STOPPED observations, as torchrun.

``uniform(a, b)`` is Python's, ``a + (b - a) * random()``: the kit scripts what ``random()``
returns (``Tick.draw``), so the reference knows each backoff exactly.

And preemption and progress (docs/spec-format.md, "Preemption" and "Progress"):

* a preemption (``Tick.preempt``: a ``drain_on`` signal) that reaches the supervisor in a wait
  (the monitor wait, or a backoff) ends the wait at once and drains: the exit code is settled
  (``preempted_exit_code``, or 128 + the signal for 0) and announced, every worker gets
  ``drain_signal``, the group reports STOPPED; once every worker has exited (whatever its exit
  code: at once when they were stopped already, in a backoff) stop; otherwise, after
  ``drain_timeout``, kill what is left; then the run raises ``Preempted`` with that code (the
  group reports FAILED). A drain never succeeds and never enters the exit barrier;
* the driver's progress mark is the best step reported so far (``Tick.step``), taken when the
  workers start and when they fail; an attempt that failed with its mark past its start's made
  progress, one where both marks say nothing counts as progress, and a failed restart (not the
  first attempt) whose mark did not move is a restart without progress. After
  ``no_progress_restarts`` (0: never) such restarts in a row, a failure that is not a no-retry
  one gives up as a no-retry failure does (``no_requeue_exit_code``, no barrier), whatever the
  budget.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ._strategies import RunConfig, Tick, failure_summary, fault_error, tick_result

__all__ = [
    "PRESETS",
    "RESILIENT_DEFAULTS",
    "ConformanceTrace",
    "Event",
    "Pending",
    "Raised",
    "ReferenceRun",
    "Returned",
    "reference_trace",
]

PRESETS: tuple[str, ...] = ("torchrun", "torchelastic", "resilient")

#: The ``resilient`` preset's parameters and their defaults, as specs/resilient.yaml declares them.
RESILIENT_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "no_retry_exit_codes": (),
    "no_requeue_exit_code": 93,
    "backoff_initial": 1.0,
    "backoff_factor": 2.0,
    "backoff_max": 60.0,
    "backoff_jitter": 0.1,
    "backoff_reset": 600.0,
    "backoff_reset_on_progress": False,
    "restart_window": math.inf,
    "drain_signal": "SIGTERM",
    "drain_timeout": 25.0,
    "preempted_exit_code": 0,
    "no_progress_restarts": 3,
    "infra_exit_codes": (),
    "infra_restarts": 3,
    "node_replacements": math.inf,
})

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
    #: The exception's own ``exit_code`` (``fsm_agent.Preempted``'s), None when it has none.
    exit_code: int | None = None

    def describe(self) -> str:
        """For the table."""
        via = f" (in {self.wrapped})" if self.wrapped else ""
        code = f" with exit_code {self.exit_code}" if self.exit_code is not None else ""
        return f"raise {self.type_name}({self.message!r}){code}{via}"


@attrs.frozen
class Pending:
    """The supervisor asked for a monitor result the script does not have: the run goes on."""

    def describe(self) -> str:
        """For the table."""
        return "still running (asked for another monitor tick)"


Outcome = Returned | Raised | Pending


@attrs.frozen
class ConformanceTrace:
    """Everything observable about one run of a supervisor on one script.

    ``exit_code`` is the exit code the supervisor asked the job to end with
    (``Lifecycle.exit_code``: ``resilient``'s no-requeue code), None when it asked for none.
    """

    events: tuple[Event, ...]
    outcome: Outcome
    state: str | None = None
    remaining_restarts: int | None = None
    exit_code: int | None = None


class _Fault(Exception):
    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


class ReferenceRun:
    """One supervisor of a preset, as its table says, fed one monitor tick at a time.

    >>> from fsm_agent.testing import RunConfig, Tick
    >>> run = ReferenceRun("resilient", RunConfig(max_restarts=1, monitor_interval=0.5))
    >>> run.start(); run.tick(Tick("FAILED", draw=0.0))
    >>> run.events[-4:]   # counted, stopped, a 1 s backoff less the 10 % jitter, restarted
    [('stop_workers',), ('sleep', 0.9), ('rendezvous',), ('start_workers',)]

    ``events`` are the calls so far (driver calls, sleeps, metrics); ``outcome`` is set once the
    run ends (returned, or raised: a scripted fault, or what the table raises); ``state`` is
    the group's ``WorkerState`` name, ``remaining_restarts`` the restarts left as of the latest
    tick, ``exit_code`` the job's exit code if the supervisor set one, ``now`` the virtual time
    (the sum of the waits and of the ticks' ``elapsed``).
    """

    def __init__(self, preset: str, config: RunConfig) -> None:
        if preset not in PRESETS:
            raise ValueError(f"no reference for preset {preset!r} (known: {', '.join(PRESETS)})")
        self.preset = preset
        self.config = config
        self.events: list[Event] = []
        self.outcome: Outcome | None = None
        self.state = "INIT"
        self.remaining_restarts = config.max_restarts
        self.exit_code: int | None = None
        self.now = 0.0
        self.tick_no = 0
        self._fired: set[int] = set()
        self._faults: dict[int, str | None] = {0: config.init_fault}
        p: dict[str, Any] = {}
        if preset == "resilient":
            p = dict(RESILIENT_DEFAULTS)
            for name, value in config.params:
                if name not in p:
                    raise ValueError(f"resilient has no parameter {name!r}")
                p[name] = value
        self.params: Mapping[str, Any] = MappingProxyType(p)
        self._restarts: list[float] = []  # when each failure restart was counted
        self._infra_restarts: list[float] = []  # the same, of the infra budget
        self._replacements = 0  # restarts after a lost node (budget node_replacements)
        self._started_at: float | None = None  # when the workers were last started
        self._backoffs = 0  # backoffs since the last reset
        self._running = False  # whether the workers run (a drain of stopped ones ends at once)
        self.best_step: int | None = None  # the progress mark: the best step reported so far
        self._attempts = 0  # starts of the workers
        self._start_step: int | None = None  # the mark when the workers last started
        self._progressed: bool | None = None  # did the attempt that failed last make progress
        #: Failed restarts in a row without progress.
        self.stalled_restarts = 0

    # -- feeding it --------------------------------------------------------------------------

    def start(self) -> None:
        """Before the loop: rendezvous, start, HEALTHY."""
        self._run(self._start)

    def tick(self, tick: Tick) -> None:
        """The next monitor call returns what ``tick`` says."""
        if self.outcome is not None:
            raise RuntimeError("the run is over")
        self.tick_no += 1
        self._faults[self.tick_no] = tick.fault
        self._run(lambda: self._tick(tick))

    def trace(self) -> ConformanceTrace:
        """The run so far; a run still going ends with the wait and the monitor call the
        supervisor makes next (which finds no tick in the script)."""
        events = tuple(self.events)
        outcome = self.outcome
        if outcome is None:
            events += (("sleep", self.config.monitor_interval), ("monitor",))
            outcome = Pending()
        return ConformanceTrace(events, outcome, self.state, self.remaining_restarts,
                                self.exit_code)

    # -- the tables --------------------------------------------------------------------------

    def _run(self, step: Any) -> None:
        try:
            step()
        except _Fault as f:
            self.outcome = Raised(type(f.err).__name__, str(f.err), scripted=True)

    def _call(self, hook: str, *args: Any) -> None:
        self.events.append((hook, *args))
        if hook in ("stop_workers", "kill_workers"):
            self._running = False
        if self._faults.get(self.tick_no) == hook and self.tick_no not in self._fired:
            self._fired.add(self.tick_no)
            raise _Fault(fault_error(hook, self.tick_no))

    def _sleep(self, seconds: float) -> None:
        self.events.append(("sleep", seconds))
        self.now += seconds

    def _start_workers(self) -> None:
        self._call("rendezvous")
        self._call("start_workers")
        self._started_at = self.now
        self._running = True
        self._attempts += 1
        self._start_step = self.best_step
        self._progressed = None
        self.state = "HEALTHY"

    def _start(self) -> None:
        self._start_workers()

    def _restart(self) -> None:
        self._call("stop_workers")
        self.state = "STOPPED"
        self._start_workers()

    def _barrier(self) -> None:
        # Every barrier outcome (ok, error, timeout) is logged and swallowed.
        self.events.append(("exit_barrier", self.config.exit_barrier_timeout))

    def _left(self, *, infra: bool = False) -> int:
        """Failure restarts still allowed now (``infra``: of the infra budget, infra_restarts)."""
        window = self.params.get("restart_window", math.inf)
        times = self._infra_restarts if infra else self._restarts
        inside = sum(1 for t in times if self.now - t < window)
        most = int(self.params.get("infra_restarts", 0)) if infra else self.config.max_restarts
        return max(0, most - inside)

    def _tick(self, tick: Tick) -> None:
        config, role, observed = self.config, self.config.role, tick.observed
        self._sleep(config.monitor_interval)
        self._call("monitor")
        self.now += tick.elapsed
        result = tick_result(self.tick_no, tick)
        self.state = observed
        resilient = self.preset == "resilient"
        if tick.step is not None:
            self.best_step = (tick.step if self.best_step is None
                              else max(self.best_step, tick.step))
        if resilient and observed in ("FAILED", "UNHEALTHY"):
            self._note_attempt_end()
        if resilient:
            self.remaining_restarts = self._left()
        self.events.append(("put_metric", f"workers.{role}.remaining_restarts",
                            self.remaining_restarts))
        self.events.append(("put_metric", f"workers.{role}.{observed.lower()}", 1))
        if observed == "SUCCEEDED":
            self._barrier()
            self.outcome = Returned(observed, result.return_values,
                                    failure_summary(result.failures))
        elif observed in ("FAILED", "UNHEALTHY"):
            listed = [f.exitcode for f in result.failures.values()]
            # "failed ranks": torch also lists the ranks it stopped (SIGTERM) after the first
            # failure; they count only when every listed rank ended by SIGTERM
            codes = [c for c in listed if c != -15] or listed
            no_retry = self.params.get("no_retry_exit_codes", ())
            stalled = self.params.get("no_progress_restarts", 0)
            no_use = codes and all(c in no_retry for c in codes)  # retrying cannot help
            infra = codes and all(c in self.params.get("infra_exit_codes", ()) for c in codes)
            if resilient and tick.peer_lost:
                self._replace_lost(result, observed)
            elif resilient and (no_use or 0 < stalled <= self.stalled_restarts):
                # a no-retry failure, or no_progress_restarts restarts in a row without progress
                self._give_up(result, observed, exit_code=self.params["no_requeue_exit_code"])
            elif resilient and infra:
                # the infrastructure failed: its own budget, never max_restarts
                if self._left(infra=True) > 0:
                    self._restart_after_backoff(tick, infra=True)
                else:
                    self._give_up(result, observed)
            elif self.remaining_restarts > 0:
                if resilient:
                    self._restart_after_backoff(tick)
                else:
                    self.remaining_restarts -= 1
                    self._restart()
            else:
                self._give_up(result, observed)
        elif observed == "HEALTHY" and resilient and tick.peer_lost:
            # lost while the workers ran (they would block at their next collective)
            self._replace_lost(result, observed)
        elif observed == "HEALTHY":
            self._call("num_nodes_waiting")
            if tick.nodes_waiting > 0:
                self._restart()
        else:
            self.outcome = Raised("Exception", f"[{role}] Worker group in {observed} state")
        if resilient and self.outcome is None and tick.preempt is not None:
            # the next monitor wait ends at once: preempted
            self.events.append(("sleep", config.monitor_interval))
            self._drain(tick)

    def _note_attempt_end(self) -> None:
        """A failure: did the attempt move past its start? (Both marks unknown: it did.)"""
        start, end = self._start_step, self.best_step
        unknown = start is None and end is None
        moved = end is not None and (start is None or end > start)
        self._progressed = None if unknown else moved
        if unknown or moved:
            self.stalled_restarts = 0
        elif self._attempts >= 2:  # the first attempt is not a restart
            self.stalled_restarts += 1

    def _drain(self, tick: Tick) -> None:
        """A preemption woke the wait just recorded: drain, then raise ``Preempted``."""
        assert tick.preempt is not None
        p = self.params
        self.events.append(("woken", "preempted"))
        reason = f"received {tick.preempt}"
        code = int(p["preempted_exit_code"]) or 128 + int(signal.Signals[tick.preempt])
        self.exit_code = code
        self._call("announce_preemption", code, reason)
        self._call("drain_workers", int(signal.Signals[p["drain_signal"]]))
        self.state = "STOPPED"  # DRAINING reports STOPPED
        self.events.append(("sleep", p["drain_timeout"]))
        if not self._running or tick.drain != "ignore":
            self.events.append(("woken", "drained"))  # every worker exited
            self._call("stop_workers")
        else:
            self.now += p["drain_timeout"]  # the deadline: what is left is killed
            self._call("kill_workers")
        self.state = "FAILED"  # PREEMPTED reports FAILED
        self.outcome = Raised("Preempted", reason, exit_code=code)

    def _replace_lost(self, result: Any, observed: str) -> None:
        """Another node was lost: its own budget, restarted at once, never max_restarts."""
        if self._replacements < self.params["node_replacements"]:
            self._replacements += 1
            self._restart()
        else:
            self._give_up(result, observed)

    def _give_up(self, result: Any, observed: str, exit_code: int | None = None) -> None:
        if exit_code is not None:
            self.exit_code = exit_code
        self._call("stop_workers")
        self.state = "FAILED"
        if self.preset == "torchelastic":
            self._barrier()
            self.outcome = Raised("WorkerGroupFailureException",
                                  f"[{self.config.role}] exceeded "
                                  f"max_restarts={self.config.max_restarts}")
            return
        self.outcome = Returned("FAILED", result.return_values, failure_summary(result.failures),
                                gave_up_after=observed)

    def _restart_after_backoff(self, tick: Tick, *, infra: bool = False) -> None:
        (self._infra_restarts if infra else self._restarts).append(self.now)
        self.remaining_restarts = self._left()
        self._call("stop_workers")
        self.state = "STOPPED"
        wait = self._backoff(tick.draw)
        if tick.preempt is not None:  # the backoff's wait ends at once: preempted
            self.events.append(("sleep", wait))
            self._drain(tick)
            return
        self._sleep(wait)
        self._start_workers()

    def _backoff(self, draw: float) -> float:
        p: Mapping[str, float] = self.params
        if p.get("backoff_reset_on_progress") and self._progressed is not None:
            if self._progressed:  # progress decides where it is known
                self._backoffs = 0
        elif self._started_at is not None and self.now - self._started_at >= p["backoff_reset"]:
            self._backoffs = 0  # the attempt that failed ran long enough: not a crash loop
        n = self._backoffs
        self._backoffs += 1
        try:
            base = min(p["backoff_max"], p["backoff_initial"] * p["backoff_factor"] ** n)
        except OverflowError:
            base = p["backoff_max"]
        jitter = p["backoff_jitter"]
        if jitter and math.isfinite(base):
            base *= 1.0 + (-jitter + (jitter - -jitter) * draw)
        return max(0.0, base)


def reference_trace(preset: str, config: RunConfig, script: Sequence[Tick]) -> ConformanceTrace:
    """What a supervisor of ``preset`` does on ``script``, straight from the reference table.

    The group state after a hook failure is the one torch's agent has reached at that point
    (e.g. STOPPED when the rendezvous of a restart fails).
    """
    run = ReferenceRun(preset, config)
    run.start()
    for tick in script:
        if run.outcome is not None:
            break
        run.tick(tick)
    return run.trace()
