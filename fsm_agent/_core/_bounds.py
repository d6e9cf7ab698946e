"""How long a job can take to give up, and how many restarts it can make: worked out by running
the spec itself.

``fsm-agent check --bounds`` answers the question users of torchrun work out by hand ("3 x 2400 s
= 2 hours"): the spec's own engine runs a crash loop (every attempt fails as soon as it starts) in
virtual time against a driver whose calls take as long as torch allows them to. Two runs bound
the answer:

- **fastest**: the failure is seen at once (the agent's worker-exit wake-up), every call is
  instant, every backoff draws the low end of its jitter;
- **slowest**: the failure is seen at the next monitor tick, torch closes the rest of the failed
  group within the stop timeout (``PContext.close`` in the monitor's poll), every stop of workers
  still running takes the stop timeout, every rendezvous takes the c10d join timeout, the exit
  barrier its timeout, a declared action its budget, a node health check with something to do
  its budget, and every backoff draws the high end.

Health checks are never run (they pass); neither is anything else: the driver only keeps time.

Nothing is restated: timers, windows, rules and budgets are the spec's. A crash loop that has
not given up after :data:`HORIZON_S` of virtual time, or :data:`MAX_RESTARTS_SEEN` restarts
(10 x max_restarts when that is more; counted or not), is reported as never giving up: with a
restart window, restarts that take long enough leave the window as fast as new ones are counted.
No torch import: the driver's results are plain stand-ins for torch's ``RunResult``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import textwrap
from collections.abc import Mapping
from typing import Any

import attrs

from ._budgets import DEFAULT_BUDGET
from ._clock import VirtualClock
from ._engine import Lifecycle
from ._params import format_param
from ._policy import budget_limits, rule_budgets
from ._spec import OBSERVATION_TRIGGERS, Spec
from ._step import Step
from ._units import format_duration, format_seconds

__all__ = ["Bound", "Limits", "bounds", "bounds_json", "format_bounds"]

#: A crash loop that has not given up after this long never will (for the report's purpose).
HORIZON_S = 30 * 24 * 3600.0
MAX_RESTARTS_SEEN = 1_000
# Waits without a restart (a spec that restarts for ever without counting, at zero cost).
_MAX_WAITS = 20_000


@attrs.frozen
class Limits:
    """The agent's settings and what each driver call may take at worst (torch's defaults)."""

    max_restarts: int = 3
    monitor_interval: float = 0.1
    rendezvous_timeout: float = 600.0  # c10d's join_timeout
    # torch stops workers on a restart (and closes a failed group's survivors) within a fixed
    # 30 s; --shutdown-timeout / TORCH_ELASTIC_SHUTDOWN_TIMEOUT only bound the final shutdown.
    stop_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0


@attrs.frozen
class Bound:
    """One crash-loop run: how it ended, after how long, having restarted how often."""

    scenario: str  # "fastest" or "slowest"
    restarts: int | None  # failure restarts before giving up; None: no limit (never gives up)
    seconds: float | None  # virtual seconds until it gives up; None: never
    outcome: str
    spent: Mapping[str, float]  # seconds by where they went (rendezvous, backoff, ...)
    final_state: str | None = None  # None: it never ends
    exit_code: int | None = None  # what the spec asked the job to exit with (set_exit_code)
    # How far the run went: virtual seconds and restarts (for a loop that never ends, where it
    # was stopped; ``spent`` covers exactly this much).
    simulated: float = 0.0
    restarts_made: int = 0
    attempts: int = 0  # starts of the workers


class _Stop(BaseException):
    pass


class _Jitter:
    """A random source that always draws the low (or high) end of the range."""

    def __init__(self, high: bool) -> None:
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


# Stand-ins for torch's WorkerState, RunResult and ProcessFailure: what the engine and the
# failure matchers read (state.name, failures, exitcode), without importing torch.
_WorkerState = enum.Enum("_WorkerState", "UNKNOWN INIT HEALTHY UNHEALTHY STOPPED SUCCEEDED FAILED")


@dataclasses.dataclass
class _Failure:
    local_rank: int = 0
    exitcode: int = 1
    message: Any = None
    error_file: str = ""


@dataclasses.dataclass
class _Result:
    state: _WorkerState
    failures: dict[int, _Failure] = dataclasses.field(default_factory=dict)
    return_values: dict[int, Any] = dataclasses.field(default_factory=dict)


class _CrashLoop:
    """A driver whose workers fail as soon as they start; in the slow run its calls take as long
    as ``limits`` allow."""

    def __init__(self, clock: VirtualClock, limits: Limits, slow: bool) -> None:
        self.clock, self.limits, self.slow = clock, limits, slow
        self.spent: dict[str, float] = {}
        self.running = False  # workers started and not yet closed or stopped
        self.starts = 0

    def take(self, what: str, seconds: float) -> None:
        if self.slow and seconds > 0:
            self.clock.advance(seconds)
            self.spent[what] = self.spent.get(what, 0.0) + seconds

    def rendezvous(self) -> None:
        self.take("rendezvous", self.limits.rendezvous_timeout)

    def start_workers(self) -> None:
        self.running = True
        self.starts += 1

    def stop_workers(self) -> None:
        if self.running:
            self.take("stopping workers", self.limits.stop_timeout)
        self.running = False

    def monitor(self) -> _Result:
        # torch's poll closes the rest of a failed group before it returns the failure.
        self.take("closing the failed group", self.limits.stop_timeout)
        self.running = False
        return _Result(_WorkerState.FAILED, {0: _Failure()})

    def num_nodes_waiting(self) -> int:
        return 0

    def check_health(self, check: Any) -> Any:
        """A node health check (``fsm_agent._core._health``): never run here (``check`` must not run
        a user's command); it passes, after its whole budget in the slow run when it has
        something to do."""
        from ._health import CheckResult

        args = getattr(check, "args", {})
        idle = ((check.kind == "command_succeeds" and not str(args.get("command", "")).strip())
                or (check.kind == "disk_free" and not args.get("paths")))
        seconds = 0.0 if idle else float(check.budget)
        self.take("health checks", seconds)
        return CheckResult(check.name, True, "assumed to pass", seconds if self.slow else 0.0)

    def exit_barrier(self, timeout: float) -> None:
        self.take("exit barrier", min(timeout, self.limits.exit_barrier_timeout))

    def put_metric(self, name: str, value: int) -> None:
        pass


def _run(spec: Spec, values: Mapping[str, Any], limits: Limits, slow: bool) -> Bound:
    clock = VirtualClock()
    driver = _CrashLoop(clock, limits, slow)
    builtin = {"max_restarts": limits.max_restarts,
               "exit_barrier_timeout": limits.exit_barrier_timeout}
    budgets = {a.name: float(a.timeout.resolve({**values, **builtin}))
               for a in spec.action_defs if a.timeout is not None}
    waits: dict[str, float] = {}
    count = [0]
    enough = max(MAX_RESTARTS_SEEN, 10 * limits.max_restarts)

    def listen(step: Step) -> None:
        for a in step.actions:
            if a.name in budgets:
                driver.take(f"action {a.name}", budgets[a.name])

    lc = Lifecycle(spec, driver, max_restarts=limits.max_restarts,
                   exit_barrier_timeout=limits.exit_barrier_timeout, params=values, clock=clock,
                   rng=_Jitter(slow), listeners=[listen])  # type: ignore[arg-type]
    observed = {src for trig, src, _, _ in spec.edges() if trig in OBSERVATION_TRIGGERS}

    def sleep(seconds: float) -> None:
        state = lc.state_name
        if state in observed:
            # waiting for the failure: seen at once when fast, at the next tick when slow
            seconds = seconds if slow else 0.0
            where = "monitor ticks"
        else:
            where = f"waiting in {state}"
        clock.sleep(seconds)
        if seconds > 0:
            waits[where] = waits.get(where, 0.0) + seconds
        count[0] += 1
        if clock.now() > HORIZON_S or driver.starts > enough or count[0] > _MAX_WAITS:
            raise _Stop

    scenario = "slowest" if slow else "fastest"
    try:
        lc.run(limits.monitor_interval, sleep=sleep)
        outcome = f"ends {lc.state_name}"
    except _Stop:
        spent = {**driver.spent, **waits}
        return Bound(scenario, None, None, f"never gives up (still restarting after "
                     f"{format_duration(clock.now())})", spent, simulated=clock.now(),
                     restarts_made=lc.restart_count, attempts=driver.starts)
    except Exception as e:
        # The spec's own way of giving up (torchelastic raises WorkerGroupFailureException).
        outcome = f"ends {lc.state_name} ({type(e).__name__})"
    if lc.exit_code is not None:
        outcome += f", exit code {lc.exit_code}"
    spent = {**driver.spent, **waits}
    return Bound(scenario, lc.restart_count, clock.now(), outcome, spent, lc.state_name,
                 lc.exit_code, clock.now(), lc.restart_count, driver.starts)


def bounds(spec: Spec, params: Mapping[str, Any] | None = None,
           limits: Limits | None = None) -> list[Bound]:
    """The fastest and the slowest crash loop of ``spec`` under ``limits``.

    ``params`` are checked as ``Lifecycle`` checks them (text such as ``"90s"`` is parsed); a bad
    one is a ``SpecError``.
    """
    limits = limits or Limits()
    values = spec.bind(params)
    return [_run(spec, values, limits, slow=False), _run(spec, values, limits, slow=True)]


def _param_text(spec: Spec, name: str, value: Any) -> str:
    return '""' if value == "" else format_param(spec.param(name).type, value)


def budget_rows(spec: Spec, limits: Limits, params: Mapping[str, Any] | None = None
                ) -> list[dict[str, Any]]:
    """Every restart budget of ``spec``: the default one (``--max-restarts``) and each named
    one, with its maximum, window (seconds), scope and the rules that spend it."""
    values = {**spec.bind(params), "max_restarts": limits.max_restarts,
              "exit_barrier_timeout": limits.exit_barrier_timeout}
    window = float(spec.budget.window.resolve(values))
    restarting = {r.name for r in spec.policy.rules
                  if spec.policy.outcomes[r.then].restarts} if spec.policy else set()
    spends = {r: b for r, b in rule_budgets(spec).items() if r in restarting}
    rows = [{"name": DEFAULT_BUDGET, "max": limits.max_restarts, "window": window,
             "scope": spec.budget.scope,
             "rules": [r for r, b in spends.items() if b == DEFAULT_BUDGET]}]
    for name, (most, win) in budget_limits(spec, values, window).items():
        rows.append({"name": name, "max": most, "window": win, "scope": spec.budget.scope,
                     "rules": [r for r, b in spends.items() if b == name]})
    return rows


def _budget_lines(spec: Spec, limits: Limits, params: Mapping[str, Any] | None) -> list[str]:
    rows = budget_rows(spec, limits, params)
    if len(rows) == 1:
        return []
    out = []
    for r in rows:
        within = "the whole job" if math.isinf(r["window"]) else \
            f"any {format_seconds(r['window'])}"
        who = "--max-restarts" if r["name"] == DEFAULT_BUDGET else "restarts"
        rules = ", ".join(r["rules"]) or "none"
        out.append(f"  budget {r['name']}: {r['max']} {who} within {within}, counted by "
                   f"{'the job' if r['scope'] == 'job' else 'each agent'} (rules: {rules})")
    endless = [r["name"] for r in rows if math.isinf(r["max"])]
    total = (f"no limit on failure restarts in all (budget {', '.join(endless)} has no maximum)"
             if endless else f"at most {sum(r['max'] for r in rows)} failure restarts in all")
    out.append(f"  {total} (a failure spends one budget: the crash loop below spends the one "
               "its failures match)")
    return out


def format_bounds(spec: Spec, results: list[Bound], limits: Limits,
                  params: Mapping[str, Any] | None = None) -> str:
    """The table ``fsm-agent check --bounds`` prints."""
    values = spec.bind(params)
    head = [f"{spec.name}: a crash loop (every attempt fails as soon as it starts), "
            f"max_restarts={limits.max_restarts}",
            "  fastest: failures seen at once, every call instant, jitter at its low end",
            f"  slowest: failures seen at the next monitor tick "
            f"({format_seconds(limits.monitor_interval)}), each rendezvous "
            f"{format_seconds(limits.rendezvous_timeout)}, each stop "
            f"{format_seconds(limits.stop_timeout)}, exit barrier "
            f"{format_seconds(limits.exit_barrier_timeout)}, health checks their budgets, jitter "
            f"at its high end"]
    if values:
        head.append("  parameters: " + ", ".join(f"{k}={_param_text(spec, k, v)}"
                                                for k, v in sorted(values.items())))
    head.extend(_budget_lines(spec, limits, params))
    head = [textwrap.fill(line, 100, subsequent_indent="    ", break_on_hyphens=False)
            for line in head]
    rows = [("scenario", "restarts", "gives up after", "outcome", "where the time goes")]
    for b in results:
        # A loop that never ends: what one attempt costs, on average.
        per = 1.0 if b.seconds is not None else 1.0 / max(1, b.attempts)
        where = ", ".join(f"{k} {format_duration(v * per)}" for k, v in
                          sorted(b.spent.items(), key=lambda kv: -kv[1]) if v > 0) or "-"
        if b.seconds is None and where != "-":
            where = "per attempt: " + where
        rows.append((b.scenario, "no limit" if b.restarts is None else str(b.restarts),
                     format_duration(b.seconds), b.outcome, where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
             for r in rows]
    return "\n".join([*head, "", *lines])


def bounds_json(spec: Spec, results: list[Bound], limits: Limits,
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``fsm-agent check --bounds --format json`` prints for one spec (docs/cli.md).

    Seconds are numbers; ``null`` for "never" (and ``restarts``, a budget's ``max``, null: no
    limit); ``spent`` covers the ``simulated`` seconds (for a loop that never ends, where it was
    stopped).
    Parameters are given as the command line writes them (``"1s"``, ``"inf"``, ``"[3, 4]"``),
    because JSON has no infinity.
    """
    values = spec.bind(params)
    return {
        "name": spec.name,
        "path": spec.path,
        "params": {k: format_param(spec.param(k).type, v) for k, v in sorted(values.items())},
        "limits": attrs.asdict(limits),
        "budgets": [{**r, "window": None if math.isinf(r["window"]) else r["window"],
                     "max": None if math.isinf(r["max"]) else r["max"]}
                    for r in budget_rows(spec, limits, params)],
        "scenarios": [{"scenario": b.scenario, "restarts": b.restarts,
                       "gives_up_after": None if b.seconds is None else round(b.seconds, 6),
                       "final_state": b.final_state, "exit_code": b.exit_code,
                       "outcome": b.outcome, "simulated": round(b.simulated, 6),
                       "restarts_made": b.restarts_made, "attempts": b.attempts,
                       "spent": {k: round(v, 6) for k, v in
                                 sorted(b.spent.items(), key=lambda kv: -kv[1])}}
                      for b in results],
    }
