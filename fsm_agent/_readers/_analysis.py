"""What happened in a job, read from its agents' traces: the root cause, each decision, time lost.

:func:`analyse` merges the traces of every agent of a job (one *lane* per agent) into a
:class:`JobAnalysis`: where each agent's time went (running, stopping, rendezvous, backoff,
barrier waits), every failure the agents observed and the transition that decided what to do
about it (the failure-policy rule when the trace names one, else the spec's transition and its
guard values), the root cause (the first failure of the round that ended the job, or the first
failure of all if the job recovered) and the time lost per cause. ``fsm_agent._readers._summary``
prints it for a terminal; ``fsm_agent._readers._report`` draws it as an HTML page. Nothing here
imports torch.

Time lost to a failure is counted from the tick that observed it until the workers ran again
(stop, backoff, health checks, rendezvous and start), or until the agent ended if it gave up;
for a hang, the time the workers were stuck before the hang was detected is added. Work lost
since the workers' last checkpoint is not in the trace and is not counted.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._core._matchers import stopped_by_torch
from .._core._spec import HUNG_TRIGGER, Spec
from ..trace._reader import Trace, TraceRecord

if TYPE_CHECKING:
    pass

__all__ = ["Decision", "FailureInfo", "Incident", "JobAnalysis", "Lane", "Segment", "analyse"]

#: Triggers whose step means the workers failed or stopped making progress.
INCIDENT_TRIGGERS = ("failed", "unhealthy", HUNG_TRIGGER)
#: Action name -> timeline segment kind.
SEGMENT_OF_ACTION = {
    "stop_workers": "stopping",
    "restart_workers": "restarting",
    "rendezvous": "rendezvous",
    "start_workers": "starting",
    "exit_barrier": "barrier",
    "capture_stacks": "stacks",
}
RUNNING_STATES = ("HEALTHY",)


@attrs.frozen
class Segment:
    """A span of one lane's time: ``kind`` is running, stopping, rendezvous, starting, backoff,
    barrier, stacks, health, action (another action) or waiting (any other state)."""

    start: float
    end: float
    kind: str
    label: str


@attrs.frozen
class FailureInfo:
    """One failed rank, as the trace recorded torch's ``ProcessFailure``."""

    rank: int
    local_rank: int | None
    pid: int | None
    exitcode: int | None
    error_file: str | None
    exception: str | None  # "ValueError: bad batch" from the error file
    traceback: str | None
    message: str | None
    timestamp: float | None
    node: str
    hung: bool = False
    suspect: bool = False  # the stacks of a hang name it: not where the others wait

    @property
    def stderr_file(self) -> str | None:
        """Where torch saved this rank's stderr (``--redirects``/``--tee``): beside its error
        file, ``<log dir>/<run id>_*/attempt_<n>/<local rank>/``. A path, never opened here."""
        if not self.error_file or os.path.basename(self.error_file) != "error.json":
            return None
        return os.path.join(os.path.dirname(self.error_file), "stderr.log")

    @property
    def log_dir(self) -> str | None:
        """The run's log directory, as the error file's path gives it (None without one)."""
        if self.stderr_file is None:
            return None
        attempt = os.path.dirname(os.path.dirname(self.error_file or ""))
        if not os.path.basename(attempt).startswith("attempt_"):
            return None
        return os.path.dirname(attempt)

    @property
    def how(self) -> str:
        """``exit code 3``, ``signal SIGKILL`` or ``hung``."""
        if self.hung:
            return "hung"
        if self.exitcode is None:
            return "failed"
        if self.exitcode < 0:
            try:
                return f"signal {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"signal {-self.exitcode}"
        return f"exit code {self.exitcode}"


@attrs.frozen
class Decision:
    """The transition that decided what to do about an incident."""

    trigger: str
    source: str
    dest: str
    rule: str | None
    guards: tuple[tuple[str, bool], ...]
    line: int | None
    description: str
    outcome: str  # "restart", "gave up", "membership restart", "left the job", "aborted"

    def describe(self) -> str:
        """``rule 'crash_loop'`` or ``failed HEALTHY -> FAILED [!has_restarts_left] (line 53)``."""
        conds = ", ".join(f"{n}={'true' if v else 'false'}" for n, v in self.guards)
        where = f" (spec line {self.line})" if self.line else ""
        head = f"rule {self.rule!r}: " if self.rule else ""
        text = f"{head}{self.trigger} {self.source} -> {self.dest}{where}"
        return text + (f" with {conds}" if conds else "")


@attrs.frozen
class Incident:
    """A failure (or hang, or membership change, or failed health check) one agent observed,
    what it decided and what it cost."""

    lane: int
    node: str
    start: float
    end: float
    trigger: str
    cause: str
    failures: tuple[FailureInfo, ...]
    decision: Decision | None
    restart_count: int
    remaining_restarts: int
    hang_idle: float
    stacks: tuple[Mapping[str, Any], ...]
    health: Mapping[str, Any] | None
    #: The failed attempt's progress (``diagnostics.progress``: steps or checkpoints at its
    #: start and end, and the restarts in a row without progress), when the spec watches it.
    progress: Mapping[str, Any] | None = None

    @property
    def lost(self) -> float:
        """Seconds of work lost: downtime plus, for a hang, the time stuck before detection."""
        return max(0.0, self.end - self.start) + self.hang_idle


@attrs.frozen
class Lane:
    """One agent: its label, its segments and where it ended."""

    index: int
    node: str
    label: str
    start: float
    end: float
    final_state: str | None
    error: str | None
    segments: tuple[Segment, ...]
    steps: int
    records: int


@attrs.frozen
class JobAnalysis:
    """Everything the summary and the report show."""

    spec_name: str | None
    run_id: str | None
    lanes: tuple[Lane, ...]
    incidents: tuple[Incident, ...]
    root_cause: FailureInfo | None
    root_incident: Incident | None
    outcome: str  # SUCCEEDED, FAILED, LEFT, PREEMPTED, INTERRUPTED, RUNNING, ...
    restarts_used: int  # of the default budget (--max-restarts)
    restart_budget: int | None
    start: float
    end: float
    lost_by_cause: tuple[tuple[str, float, int], ...]  # (cause, seconds, incidents)
    stacks: tuple[Mapping[str, Any], ...]
    error_files: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    #: Restarts spent from each of the spec's named budgets (``fsm_agent._core._budgets``).
    budget_restarts: tuple[tuple[str, int], ...] = ()
    #: Each agent's drain (node, ``diagnostics.drain``: the drain signal, the reason, how long
    #: the workers took, who was killed at ``drain_timeout``), in the order they happened.
    drains: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    @property
    def lost(self) -> float:
        return sum(s for _, s, _ in self.lost_by_cause)


# ---------------------------------------------------------------------------------------------
# reading records


def _num(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return float(value)


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _step_end(rec: TraceRecord) -> float:
    """When a step's actions ended (its start plus their durations)."""
    t = _num(rec.data.get("wall_time"))
    return t + sum(_num(a.get("duration_s")) for a in rec.actions)


def _last_time(rec: TraceRecord) -> float:
    """The wall time of the last step a (possibly folded) record stands for."""
    return max(_num(rec.data.get("last_wall_time"), _num(rec.data.get("wall_time"))),
               _num(rec.data.get("wall_time")))


def _count(rec: TraceRecord) -> int:
    n = rec.data.get("count", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def _diagnostics(rec: TraceRecord) -> Mapping[str, Any]:
    d = rec.data.get("diagnostics")
    return d if isinstance(d, Mapping) else {}


def _exception(data: Any) -> tuple[str | None, str | None]:
    """(``Type: message``, traceback) from a torch error file's JSON."""
    if not isinstance(data, Mapping):
        return None, None
    msg = data.get("message")
    if isinstance(msg, Mapping):
        text = msg.get("message")
        extra = msg.get("extraInfo")
        tb = extra.get("py_callstack") if isinstance(extra, Mapping) else None
        return (str(text).strip() if text else None), (str(tb) if tb else None)
    if isinstance(msg, str) and msg and msg != "<NONE>":
        return msg.strip(), None
    return None, None


def _failures(rec: TraceRecord, node: str) -> tuple[FailureInfo, ...]:
    hung = rec.trigger == HUNG_TRIGGER
    raw = rec.data.get("failures")
    if not isinstance(raw, Mapping):
        return ()
    diagnostics = rec.data.get("diagnostics")
    found = diagnostics.get("suspects") if isinstance(diagnostics, Mapping) else None
    named = found.get("suspects") if isinstance(found, Mapping) else None
    suspects = {str(k) for k in named} if isinstance(named, Mapping) else set()
    out = []
    for key, f in raw.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        if not isinstance(f, Mapping):
            out.append(FailureInfo(rank, None, None, None, None, None, None, str(f), None, node))
            continue
        from_file = f.get("error_file_data")
        exc, tb = _exception(from_file)
        # Left out when it is the error file's message (the trace writes that once).
        message = f.get("message", from_file.get("message") if isinstance(from_file, Mapping)
                        else None)
        if isinstance(message, Mapping):
            message = message.get("message")
        error_file = f.get("error_file")
        out.append(FailureInfo(
            rank=rank,
            local_rank=_opt_int(f.get("local_rank")),
            pid=_opt_int(f.get("pid")),
            exitcode=_opt_int(f.get("exitcode")),
            error_file=error_file if isinstance(error_file, str) and error_file
            and error_file != "<N/A>" else None,
            exception=exc,
            traceback=tb,
            message=str(message) if message else None,
            timestamp=_num(f.get("timestamp"), math.nan),
            node=node,
            hung=hung,
            suspect=str(key) in suspects,
        ))
    return tuple(sorted(out, key=lambda f: f.rank))


def _state_kind(spec: Spec | None, state: str | None, rec: TraceRecord) -> str:
    if state in RUNNING_STATES:
        return "running"
    if rec.data.get("timer") is not None or (state is not None and "BACKOFF" in state):
        return "backoff"
    return "waiting"


def _action_kind(name: str) -> str:
    if name in SEGMENT_OF_ACTION:
        return SEGMENT_OF_ACTION[name]
    if "health" in name or name.startswith("check_"):
        return "health"
    return "action"


def _decision(spec: Spec | None, rec: TraceRecord, outcome: str) -> Decision:
    line = None
    description = ""
    if spec is not None:
        from ..trace._replay import choose_transition

        chosen, _, _ = choose_transition(spec.outgoing(rec.source, rec.trigger), dict(rec.guards))
        if chosen is not None:
            line, description = chosen.line, chosen.description
    rule = rec.data.get("rule")
    return Decision(rec.trigger, rec.source, rec.dest or "?", rule if isinstance(rule, str)
                    else None, tuple(rec.guards), line, description, outcome)


def _lane_label(header: Mapping[str, Any], first: TraceRecord | None) -> tuple[str, str]:
    src = dict(header)
    if first is not None:
        src = {**src, **{k: v for k, v in first.data.items() if k in ("node", "group_rank")}}
    node = str(src.get("node") or "agent")
    gr = src.get("group_rank")
    pid = src.get("pid")
    label = node + (f" · group rank {gr}" if gr is not None else "")
    label += f" · pid {pid}" if pid is not None else ""
    return node, label


# ---------------------------------------------------------------------------------------------
# analysis


def _segments(records: Sequence[TraceRecord], spec: Spec | None) -> list[Segment]:
    segs: list[Segment] = []
    for i, rec in enumerate(records):
        t = _num(rec.data.get("wall_time"))
        for a in rec.actions:
            if a.get("kind") == "guard":
                continue
            d = _num(a.get("duration_s"))
            name = str(a.get("name"))
            segs.append(Segment(t, t + d, _action_kind(name), name))
            t += d
        nxt = _num(records[i + 1].data.get("wall_time")) if i + 1 < len(records) else None
        stop = nxt if nxt is not None else max(t, _last_time(rec))
        if rec.dest and stop > t and (nxt is not None or rec.dest in RUNNING_STATES):
            segs.append(Segment(t, stop, _state_kind(spec, rec.dest, rec), rec.dest))
    # Merge neighbours of the same kind (folded healthy ticks, consecutive restarts' halves).
    merged: list[Segment] = []
    for s in segs:
        if merged and merged[-1].kind == s.kind and merged[-1].label == s.label \
                and s.start - merged[-1].end < 1e-3:
            merged[-1] = attrs.evolve(merged[-1], end=max(merged[-1].end, s.end))
        else:
            merged.append(s)
    return merged


def _consume_actions(spec: Spec | None) -> frozenset[str]:
    """The actions that spend a restart: the default budget's and each named budget's."""
    return frozenset({"consume_restart", *(b.action for b in (spec.budgets if spec else ()))})


def _cause(trigger: str, failures: Sequence[FailureInfo]) -> str:
    if trigger == HUNG_TRIGGER:
        return "hang"
    if not failures:
        return "unhealthy" if trigger == "unhealthy" else "failure"
    first = min(failures, key=lambda f: (*_blame(f), f.rank))
    exc = first.exception.split(":", 1)[0] if first.exception else None
    return first.how + (f" ({exc})" if exc else "")


def _incidents(lane: int, node: str, records: Sequence[TraceRecord],
               spec: Spec | None) -> list[Incident]:
    out: list[Incident] = []
    i = 0
    n = len(records)
    while i < n:
        rec = records[i]
        diag = _diagnostics(rec)
        health = diag.get("health") if isinstance(diag.get("health"), Mapping) else None
        stop_acts = {"stop_workers", "restart_workers"} & {str(a.get("name"))
                                                            for a in rec.actions}
        failure = rec.trigger in INCIDENT_TRIGGERS and rec.source in RUNNING_STATES
        membership = rec.trigger == "healthy" and bool(stop_acts)
        left = health is not None and health.get("ok") is False
        if not (failure or membership or left):
            i += 1
            continue
        # Follow the chain of steps until the workers run again or the lifecycle ends.
        chain = [rec]
        j = i + 1
        while chain[-1].dest not in RUNNING_STATES and j < n:
            chain.append(records[j])
            j += 1
        last = chain[-1]
        dest = last.dest or "?"
        consume = _consume_actions(spec)
        consumed = any(str(a.get("name")) in consume for r in chain for a in r.actions)
        if dest in RUNNING_STATES:
            outcome = "restart" if consumed else ("membership restart" if membership
                                                  else "rejoined")
            end = _step_end(last)
        else:
            if left:
                outcome = "left the job"
            elif dest == "FAILED":
                outcome = "gave up"
            else:
                outcome = "aborted"
            end = _step_end(last)
        # The deciding step. A chain that ended in a final state: the step into it, or the
        # rule that chose it (not a rule that chose a backoff the store's loss or another
        # agent's announcement then ended). Otherwise: the step a rule names, or that consumed
        # a restart, else the first with guards, else the first.
        ruled = next((r for r in chain if r.data.get("rule")), None)
        final = next((r for r in chain if r.dest == dest and dest not in RUNNING_STATES), None)
        if final is not None and (ruled is None or ruled.dest != dest):
            decider = final
        else:
            decider = ruled or next(
                (r for r in chain
                 if any(str(a.get("name")) in consume for a in r.actions)),
                None) or (next((r for r in chain if r.guards), None) or rec)
        failures = _failures(rec, node)
        progress = diag.get("progress") if _watched(diag.get("progress")) else None
        stacks: list[Mapping[str, Any]] = []
        hang_idle = 0.0
        for r in chain:
            d = _diagnostics(r)
            st = d.get("stacks")
            if isinstance(st, list):
                stacks.extend(s for s in st if isinstance(s, Mapping))
            hang = d.get("hang")
            if isinstance(hang, Mapping):
                workers = hang.get("workers")
                if isinstance(workers, list):
                    hang_idle = max([hang_idle, *(_num(w.get("idle_s")) for w in workers
                                                  if isinstance(w, Mapping))])
        if left:
            cause = "unhealthy node"
        elif membership:
            cause = "membership change"
        else:
            cause = _cause(rec.trigger, failures)
        out.append(Incident(
            lane=lane, node=node, start=_num(rec.data.get("wall_time")), end=end,
            trigger=rec.trigger, cause=cause, failures=failures,
            decision=_decision(spec, decider, outcome),
            restart_count=int(last.data.get("restart_count", 0)),
            remaining_restarts=int(last.data.get("remaining_restarts", 0)),
            hang_idle=hang_idle, stacks=tuple(stacks), health=health, progress=progress,
        ))
        i = j
    return out


def _watched(progress: Any) -> bool:
    """Whether a ``diagnostics.progress`` verdict had a source of progress to read (a step or
    a checkpoint, at the attempt's start or end): without one every attempt counts as progress
    and there is nothing to show."""
    return isinstance(progress, Mapping) and any(
        isinstance(m, Mapping) and (m.get("step") is not None
                                    or m.get("checkpoint_mtime") is not None)
        for m in (progress.get("start"), progress.get("end")))


def _outcome(lanes: Sequence[Lane]) -> str:
    finals = [ln.final_state for ln in lanes]
    errors = [ln.error for ln in lanes
              if ln.error and not ln.error.startswith(("LeftJob", "Preempted"))]
    left = [ln for ln in lanes if ln.error and ln.error.startswith("LeftJob")]
    if left and len(left) == len(lanes):
        return "LEFT"
    # a drain ends the run with Preempted (fsm_agent._core._drain): the whole job was preempted
    if any(ln.error and ln.error.startswith("Preempted") for ln in lanes):
        return "PREEMPTED"
    if any(f == "FAILED" for f in finals):
        return "FAILED"
    if any(f == "UNKNOWN" for f in finals):
        return "ABORTED"
    if errors:
        return "INTERRUPTED"
    if finals and all(f == "SUCCEEDED" for f in finals):
        return "SUCCEEDED"
    if any(f == "SUCCEEDED" for f in finals):
        return "SUCCEEDED"
    if left:
        return "LEFT"
    return "RUNNING" if finals else "EMPTY"


def _blame(f: FailureInfo) -> tuple[bool, bool, float, bool]:
    """Which failure is to blame first: the earliest, but never a rank torch stopped itself.

    When one rank fails, torch SIGTERMs the others and lists them as failures too, and a
    failure without an error file is stamped with ``int(time.time())``: truncated to the second,
    a stopped rank often looks earlier than the one that crashed (or ties with it). So a SIGTERM
    comes after any other failure, and at equal times one with an error file comes first. In a
    hang (every rank stopped with SIGTERM) the suspect the stacks name comes first: the rank the
    others wait for.
    """
    return (stopped_by_torch(f) and not f.suspect, not f.suspect,
            _num(f.timestamp, math.inf), f.error_file is None)


def _began(x: Incident) -> float:
    """When an incident began: when its agent saw it, or when the hang it detected began."""
    return x.start - x.hang_idle


def analyse(traces: Sequence[Trace], specs: Mapping[int, Spec] | Spec | None = None
            ) -> JobAnalysis:
    """Merge the lifecycles in ``traces`` (one lane per agent: node and pid) into one analysis.

    ``specs``: the spec of every trace (one ``Spec`` for all, or trace index -> spec); without
    it decisions are named by their trigger and guards only.
    """
    by_agent: dict[tuple[str, Any], list[tuple[Trace, Spec | None]]] = {}
    for i, trace in enumerate(traces):
        spec = specs.get(i) if isinstance(specs, Mapping) else specs
        first = trace.records[0] if trace.records else None
        node, _ = _lane_label(trace.header, first)
        key = (node, trace.header.get("pid", trace.path))
        by_agent.setdefault(key, []).append((trace, spec))
    lanes: list[Lane] = []
    incidents: list[Incident] = []
    warnings: list[str] = []
    spec_name = run_id = None
    budget: int | None = None
    used = 0
    named: dict[str, int] = {}
    drains: list[tuple[float, str, Mapping[str, Any]]] = []
    for idx, parts in enumerate(sorted(by_agent.values(), key=lambda p: _first_time(p[0][0]))):
        segs: list[Segment] = []
        records_total = steps = 0
        final = error = None
        node, label = _lane_label(parts[0][0].header, parts[0][0].records[0]
                                  if parts[0][0].records else None)
        start = math.inf
        end = -math.inf
        for trace, spec in parts:
            recs = trace.records
            if not recs:
                continue
            spec_name = spec_name or trace.spec_name
            run_id = run_id or (str(trace.header["run_id"]) if trace.header.get("run_id")
                                else None)
            incomplete = getattr(trace, "incomplete", None)
            if incomplete:
                warnings.append(f"{trace.path}: {incomplete}")
            first = recs[0]
            b = int(first.data.get("remaining_restarts", 0)) + int(first.data.get(
                "restart_count", 0))
            budget = b if budget is None else max(budget, b)
            # restart_count counts every budget's restarts: the named ones' are told apart
            mine = {bud.name: sum(1 for r in recs for a in r.actions
                                  if str(a.get("name")) == bud.action)
                    for bud in (spec.budgets if spec is not None else ())}
            for name, spent in mine.items():
                named[name] = max(named.get(name, 0), spent)
            used = max(used, int(recs[-1].data.get("restart_count", 0)) - sum(mine.values()))
            drains.extend((_num(r.data.get("wall_time")), node, d["drain"]) for r in recs
                          if isinstance((d := _diagnostics(r)).get("drain"), Mapping))
            segs.extend(_segments(recs, spec))
            incidents.extend(_incidents(idx, node, recs, spec))
            records_total += len(recs)
            steps += sum(_count(r) for r in recs)
            start = min(start, _num(first.data.get("wall_time")))
            end = max(end, _step_end(recs[-1]), _last_time(recs[-1]))
            final = recs[-1].dest
            error = recs[-1].error
        if not records_total:
            continue
        lanes.append(Lane(idx, node, label, start, end, final, error, tuple(segs), steps,
                          records_total))
    lanes_t = tuple(lanes)
    outcome = _outcome(lanes_t)
    failing = [x for x in incidents if x.failures or x.trigger == HUNG_TRIGGER]
    gave_up = [x for x in failing if x.decision is not None and x.decision.outcome in
               ("gave up", "aborted")]
    pool = gave_up or failing
    # The first incident of the job, across agents, is the root: the others are its cascade (a
    # peer's "connection closed", a later crash). Incidents are ordered by when the agent saw
    # them (a hang: when it stopped making progress), not by the failures' own timestamps, which
    # torch truncates to the second. Within it, the rank to blame first (_blame).
    root_incident = min(pool, key=_began) if pool else None
    root = None
    if root_incident is not None and root_incident.failures:
        root = min(root_incident.failures, key=lambda f: (*_blame(f), f.rank))
    lost: dict[str, tuple[float, int]] = {}
    for x in incidents:
        s, k = lost.get(x.cause, (0.0, 0))
        lost[x.cause] = (s + x.lost, k + 1)
    stacks = tuple(s for x in incidents for s in x.stacks)
    error_files = tuple(sorted({f.error_file for x in incidents for f in x.failures
                                if f.error_file}))
    start = min((ln.start for ln in lanes_t), default=0.0)
    end = max((ln.end for ln in lanes_t), default=0.0)
    return JobAnalysis(
        spec_name=spec_name, run_id=run_id, lanes=lanes_t,
        incidents=tuple(sorted(incidents, key=lambda x: x.start)),
        root_cause=root, root_incident=root_incident, outcome=outcome,
        restarts_used=used, restart_budget=budget, start=start, end=end,
        lost_by_cause=tuple(sorted(((c, s, k) for c, (s, k) in lost.items()),
                                   key=lambda t: -t[1])),
        stacks=stacks, error_files=error_files, warnings=tuple(warnings),
        budget_restarts=tuple(sorted(named.items())),
        drains=tuple((n, d) for _, n, d in sorted(drains, key=lambda t: t[0])),
    )


def _first_time(trace: Trace) -> float:
    return _num(trace.records[0].data.get("wall_time")) if trace.records else math.inf
