"""Replaying a recorded trace against a spec: is every step one the spec allows?

Each record must leave the state the previous one entered, by a trigger the spec handles there;
the spec's choice among the transitions on that trigger, made with the guard values the trace
recorded (in the engine's order: file order, ``guards`` then ``unless``, first match wins), must
be the transition the trace took; the actions must be the spec's, in the engine's order
(transition actions, exit of the source, entry of the destination, ``after``); and the counters
must move as ``consume_restart`` says (within a finite budget window, ``remaining_restarts``
also goes back up as restarts leave the window). The rule recorded, the timers set and the
``timeout`` steps are checked by ``_replay_policy``. The first divergence is reported in plain
words.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._core._files import printable
from .._core._load import load_spec, preset_names
from .._core._spec import (
    ALWAYS_TRIGGER,
    ERROR_STATE,
    INTERRUPT_TRIGGER,
    OBSERVATION_TRIGGERS,
    START_TRIGGER,
    Spec,
)
from .._core._spec import TransitionSpec as Transition
from ._reader import Trace, TraceRecord
from ._replay_policy import PolicyCheck

__all__ = [
    "Divergence",
    "ReplayResult",
    "UntrustedSpec",
    "choose_transition",
    "expected_actions",
    "replay",
    "trace_spec",
]

_CONSUME = "consume_restart"


@attrs.frozen
class Divergence:
    """Where a trace first departs from its spec, and how."""

    line: int | None
    step: int
    message: str

    def __str__(self) -> str:
        return self.message


@attrs.frozen
class ReplayResult:
    """What replaying one lifecycle found. ``ok`` when it followed the spec to the end."""

    spec: Spec
    trace: Trace
    checked: int
    divergence: Divergence | None
    # (transition index, source) -> times taken; transitions the spec does not have are absent.
    edge_counts: Mapping[tuple[int, str], int]
    final_state: str | None
    # Moves that are no spec transition: (source, trigger, dest) -> (times, why). An action that
    # raised moves the machine to UNKNOWN; a diverging step is the other kind.
    extra_moves: Mapping[tuple[str, str, str], tuple[int, str]] = attrs.field(factory=dict)
    #: The spec's parameters in force (from the trace's header, else the spec's defaults), in
    #: the spec's syntax.
    params: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return self.divergence is None


class UntrustedSpec(LookupError):
    """The spec a trace names cannot be used without the user naming it; ``str()`` says why.

    ``path``: the spec file the header names (shown escaped), to suggest as ``--spec``.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


def trace_spec(trace: Trace) -> Spec:
    """The built-in spec that ``trace``'s header names.

    A trace is untrusted input, so it may only choose among this installation's presets: a file
    named in its header (``spec_path``) is never opened, and a ``spec`` that is no preset name is
    never looked up as a path. Raises ``UntrustedSpec`` otherwise; the user then passes the spec.
    """
    header = trace.header
    name = header.get("spec")
    path = header.get("spec_path")
    shown_path = printable(path) if isinstance(path, str) and path != "<string>" else None
    if not isinstance(name, str) or not name:
        raise UntrustedSpec("the trace does not name its spec (it was recorded without one)")
    if name in preset_names():
        preset = load_spec(name)
        if path is None or header.get("preset") is True or path == preset.path:
            return preset
        raise UntrustedSpec(f"the trace was recorded with a spec named {name!r} from the file "
                            f"{shown_path}, not with the built-in preset; a trace may not choose a "
                            "file to read", shown_path)
    where = f" from the file {shown_path}" if shown_path else ""
    raise UntrustedSpec(f"the trace was recorded with spec {printable(repr(name), 80)}{where}, "
                        "which is no built-in preset; a trace may not choose a file to read",
                        shown_path)


def _describe(t: Transition) -> str:
    conds = [*t.guards, *(f"!{g}" for g in t.unless)]
    return f"{t.dest}" + (f" [{' & '.join(conds)}]" if conds else "")


def choose_transition(
    candidates: Sequence[Transition], values: Mapping[str, bool]
) -> tuple[Transition | None, list[str], str | None]:
    """The transition the engine takes among ``candidates`` given the recorded guard ``values``.

    Returns (transition or None, the guards the engine would have evaluated, in order, the first
    guard it needed but ``values`` lacks, if any). Evaluation follows ``transitions``: each
    candidate in file order, its ``guards`` then its ``unless``, stopping at the first that fails.
    """
    evaluated: list[str] = []
    for t in candidates:
        ok = True
        for name, want in [*((g, True) for g in t.guards), *((g, False) for g in t.unless)]:
            if name not in evaluated:
                evaluated.append(name)
            if name not in values:
                return None, evaluated, name
            if values[name] != want:
                ok = False
                break
        if ok:
            return t, evaluated, None
    return None, evaluated, None


def expected_actions(spec: Spec, t: Transition, source: str) -> list[tuple[str, str]]:
    """(kind, name) of every action taking ``t`` from ``source`` runs, in the engine's order."""
    out = [("action", a) for a in t.actions]
    if t.dest != source:
        # A transition back to its own state stays in it: no exit or entry actions.
        out += [("exit", a) for a in spec.state(source).exit]
        out += [("enter", a) for a in spec.state(t.dest).enter]
    out += [("after", a) for a in t.after]
    return out


def _fmt_actions(items: Sequence[tuple[str, str]], source: str, dest: str) -> str:
    """``stop_workers, then on entering FAILED: exit_barrier, raise_failure``."""
    if not items:
        return "no actions"
    heads = {"action": "", "exit": f"on leaving {source}: ", "enter": f"on entering {dest}: ",
             "after": "after the state changed: "}
    groups: list[tuple[str, list[str]]] = []
    for kind, name in items:
        if groups and groups[-1][0] == kind:
            groups[-1][1].append(name)
        else:
            groups.append((kind, [name]))
    return ", then ".join(heads.get(kind, f"{kind}: ") + ", ".join(names)
                          for kind, names in groups)


def _check_step(
    spec: Spec,
    rec: TraceRecord,
    n: int,
    *,
    state: str,
    remaining: int | None,
    restarts: int | None,
    window: bool = False,
    max_restarts: int | None = None,
) -> tuple[Transition | None, str | None]:
    """Check one record; returns (the spec transition it took or None, divergence message).

    ``window``: the budget counts restarts within a finite window, so ``remaining_restarts``
    may have gone back up since the previous step (by at most what ``max_restarts`` allows).
    A budget of the job (``budget: {scope: job}``) is counted once per round for every agent
    (``fsm_agent._core._driver.JobDriver``): another agent may have spent some of it between two
    steps of this one, and this agent's ``consume_restart`` spends nothing when another agent
    already counted the round's failure. One agent's trace then bounds ``remaining_restarts`` only
    from above (never up, but for a window); the job's count is the report's, across traces.
    """
    shared = spec.budget.scope == "job"
    where = f"step {n} (line {rec.line})"
    move = f"{rec.source} --{rec.trigger}--> {rec.dest}"
    if rec.source != state:
        return None, (f"{where}: the trace leaves {rec.source}, but the machine is in {state} "
                      f"(the previous step ended there)")
    if rec.trigger in OBSERVATION_TRIGGERS and rec.data.get("observed") not in (None, ""):
        observed = str(rec.data["observed"])
        if observed.lower() != rec.trigger:
            return None, (f"{where}: trigger {rec.trigger!r} does not match the observed state "
                          f"{observed}")
    candidates = spec.outgoing(rec.source, rec.trigger)
    if not candidates:
        handled = sorted({trig for trig, src, _, _ in spec.edges() if src == rec.source})
        return None, (f"{where}: {move} is not allowed: spec {spec.name!r} has no transition on "
                      f"{rec.trigger!r} from {rec.source} (it handles: "
                      f"{', '.join(handled) or 'nothing'})")
    recorded = rec.guards
    values = dict(recorded)
    options = "; ".join(_describe(t) for t in candidates)
    chosen, evaluated, missing = choose_transition(candidates, values)
    failed_action = next((a for a in rec.actions if a.get("outcome") == "raised"), None)
    if (missing is not None and failed_action is not None
            and failed_action.get("kind") == "guard" and failed_action["name"] == missing):
        # The guard raised while being evaluated: it has no value, and the engine moved to
        # UNKNOWN without taking any transition.
        if rec.dest != ERROR_STATE:
            return None, (f"{where}: guard {missing!r} raised, so the machine must move to "
                          f"{ERROR_STATE}, but the trace ends in {rec.dest}")
        return None, None
    if missing is not None:
        return None, (f"{where}: on {rec.trigger!r} from {rec.source} the spec needs guard "
                      f"{missing!r}, but the trace recorded no value for it (recorded: "
                      f"{', '.join(f'{k}={v}' for k, v in recorded) or 'none'})")
    extra = [name for name, _ in recorded if name not in evaluated]
    if extra:
        return None, (f"{where}: the trace evaluated guard(s) {', '.join(extra)} that the spec "
                      f"does not check on {rec.trigger!r} from {rec.source}")
    if (
        "has_restarts_left" in values
        and remaining is not None
        and values["has_restarts_left"] != (remaining > 0)
        # Restarts leaving the window give some back: only "none left" can change.
        and not (window and remaining == 0)
        # The other agents spend a job's budget too: only "some left" can change.
        and not (shared and remaining > 0)
    ):
        return None, (f"{where}: guard has_restarts_left was recorded "
                          f"{values['has_restarts_left']}, but {remaining} restart(s) were left "
                          "after the previous step")
    if chosen is None:
        vals = ", ".join(f"{k}={v}" for k, v in recorded) or "no guards"
        return None, (f"{where}: with {vals} no transition on {rec.trigger!r} from "
                      f"{rec.source} is enabled (the spec has: {options})")
    want = expected_actions(spec, chosen, rec.source)
    got = [(str(a.get("kind", "action")), str(a["name"])) for a in rec.actions
           if a.get("kind") != "guard"]
    if failed_action is not None:
        # An action raised: the engine ran the spec's actions up to it, then stopped.
        if got != want[: len(got)]:
            return chosen, (f"{where}: {move} ran {_fmt_actions(got, rec.source, chosen.dest)};"
                            f" the spec's transition to {chosen.dest} (line {chosen.line}) runs "
                            f"{_fmt_actions(want, rec.source, chosen.dest)}")
        if str(rec.data.get("error") or "").startswith("interrupted: "):
            # A TriggerInterrupt (the job is over, say): the transition was abandoned where it
            # stood, and the engine takes the interrupt's trigger from the same state next.
            if rec.dest != rec.source:
                return chosen, (f"{where}: {move} was interrupted, so the machine stays in "
                                f"{rec.source}, but the trace ends in {rec.dest}")
            return chosen, None
        failed_kind = str(failed_action.get("kind", "action"))
        terminal = spec.is_terminal(str(failed_action["name"]))
        if not terminal and rec.dest != ERROR_STATE:
            return chosen, (f"{where}: {failed_kind} {failed_action['name']!r} raised, so the "
                            f"machine must move to {ERROR_STATE}, but the trace ends in "
                            f"{rec.dest}")
        if terminal and rec.dest not in (chosen.dest, ERROR_STATE):
            return chosen, (f"{where}: {move}: the spec goes to {chosen.dest} here")
        return chosen, None
    if rec.dest != chosen.dest:
        vals = ", ".join(f"{k}={v}" for k, v in recorded) or "no guards"
        return chosen, (f"{where}: {move} diverges from the spec: with {vals} the spec takes "
                        f"{rec.source} --{rec.trigger}--> {chosen.dest} (line {chosen.line})")
    if got != want:
        return chosen, (f"{where}: {move} ran {_fmt_actions(got, rec.source, chosen.dest)}; "
                        f"the spec (line {chosen.line}) runs "
                        f"{_fmt_actions(want, rec.source, chosen.dest)}")
    consumed = sum(1 for kind, name in got if name == _CONSUME)
    # restart_count counts the restarts of every budget; remaining_restarts is the default's
    named = {b.action for b in spec.budgets}
    counted = consumed + sum(1 for kind, name in got if name in named)
    new_restarts = rec.data["restart_count"]
    new_remaining = rec.data["remaining_restarts"]
    if restarts is not None and new_restarts != restarts + counted:
        return chosen, (f"{where}: restart_count went from {restarts} to {new_restarts}, but the "
                        f"step consumed {counted} restart(s)")
    if shared and not window and (new_remaining < 0 or (remaining is not None
                                                        and new_remaining > remaining)):
        return chosen, (f"{where}: remaining_restarts went from {remaining} to {new_remaining}; "
                        "a budget of the job never gives restarts back without a window")
    if (not shared and remaining is not None and not window
            and new_remaining != remaining - consumed):
        return chosen, (f"{where}: remaining_restarts went from {remaining} to {new_remaining}, "
                        f"but the step consumed {consumed} restart(s)")
    if remaining is not None and window:
        # Restarts inside the window: at most the previous ones plus those consumed now, at
        # least those consumed now (none, when the other agents spend the budget too).
        low = 0 if shared else max(0, remaining - consumed)
        high = (None if max_restarts is None
                else max_restarts if shared else max(0, max_restarts - consumed))
        if new_remaining < low or (high is not None and new_remaining > high):
            bound = (f"between {low} and {high}" if high is not None else f"at least {low}")
            return chosen, (f"{where}: remaining_restarts went from {remaining} to "
                            f"{new_remaining}; with {consumed} restart(s) consumed in a budget "
                            f"window it must be {bound}")
    return chosen, None


def replay(spec: Spec, trace: Trace, *, params: Mapping[str, Any] | None = None
           ) -> ReplayResult:
    """Check ``trace`` (one lifecycle) against ``spec``; stops at the first divergence.

    ``params``: the spec's parameters the run used, in place of those its header records (for
    a trace written without them); the spec's defaults fill in the rest."""
    counts: Counter[tuple[int, str]] = Counter()
    extra: dict[tuple[str, str, str], tuple[int, str]] = {}
    state = spec.initial
    remaining: int | None = None
    restarts: int | None = None
    always_states = {src for trig, src, _, _ in spec.edges() if trig == ALWAYS_TRIGGER}
    finished = False
    checked = 0
    policy = PolicyCheck(spec, trace, params)
    window = policy.window is not None and not math.isinf(policy.window)

    def result(div: Divergence | None) -> ReplayResult:
        return ReplayResult(spec, trace, checked, div, dict(counts),
                            trace.records[checked - 1].dest if checked else None, dict(extra),
                            policy.params)

    def add_extra(rec: TraceRecord, why: str) -> None:
        key = (rec.source, rec.trigger, rec.dest or "?")
        extra[key] = (extra.get(key, (0, why))[0] + 1, why)

    if not trace.records:
        return result(Divergence(trace.header_line, 0, "the trace has no steps"))
    if policy.problem is not None:
        return result(Divergence(trace.header_line, 0, policy.problem))
    cont = trace.header.get("continues")
    if isinstance(cont, Mapping):
        # A rotated trace file: the lifecycle began in an earlier file and stood here.
        state = str(cont["state"])
        remaining, restarts = int(cont["remaining_restarts"]), int(cont["restart_count"])
        if state not in {st.name for st in spec.states}:
            return result(Divergence(trace.header_line, 0, f"the trace continues from state "
                                     f"{state!r}, which spec {spec.name!r} does not have"))
        finished = state in spec.finals
    for n, rec in enumerate(trace.records, start=1):
        where = f"step {n} (line {rec.line})"
        if finished:
            return result(Divergence(rec.line, n, f"{where}: the lifecycle had already finished "
                                     f"in {state}, but the trace goes on ({rec.trigger!r})"))
        if rec.trigger == INTERRUPT_TRIGGER and rec.error is not None and (
            rec.source == rec.dest == state
        ):
            # The supervisor's final record for a signal between two transitions: the lifecycle
            # was interrupted where it stood, which every spec allows.
            checked = n
            add_extra(rec, "interrupted")
            finished = True
            continue
        if n == 1 and rec.trigger != START_TRIGGER and cont is None:
            return result(Divergence(rec.line, n, f"{where}: a lifecycle begins with "
                                     f"{START_TRIGGER!r} from {spec.initial}, but the trace begins "
                                     f"with {rec.trigger!r} from {rec.source}"))
        if (n > 1 or cont is not None) and rec.trigger == START_TRIGGER:
            return result(Divergence(rec.line, n, f"{where}: 'start' fired a second time"))
        if state in always_states and rec.trigger != ALWAYS_TRIGGER:
            return result(Divergence(rec.line, n, f"{where}: {state} is left at once by its "
                                     f"'always' transitions, but the trace fires {rec.trigger!r}"))
        problem = policy.check_timeout(rec, where)
        if problem is not None:
            checked = n
            add_extra(rec, "diverges from the spec")
            return result(Divergence(rec.line, n, problem))
        chosen, problem = _check_step(spec, rec, n, state=state, remaining=remaining,
                                      restarts=restarts, window=window,
                                      max_restarts=policy.max_restarts)
        if problem is None and chosen is not None:
            problem = policy.check(rec, chosen, where)
        if problem is None and rec.count > 1 and (rec.dest != rec.source or rec.actions
                                                  or rec.error is not None):
            problem = (f"{where}: a folded record (count {rec.count}) stands for steps that "
                       "change nothing, but this one moves to another state, runs actions or "
                       "ends the lifecycle")
        checked = n
        if problem is not None:
            add_extra(rec, "diverges from the spec")
            return result(Divergence(rec.line, n, problem))
        if chosen is not None and chosen.dest == rec.dest:
            # A folded record stands for `count` identical steps (one check covers them all).
            counts[(chosen.index, rec.source)] += rec.count
        else:
            raised = next((a for a in rec.actions if a.get("outcome") == "raised"), None)
            add_extra(rec, f"{raised['name']} raised" if raised else "not in the spec")
        state = rec.dest or state
        remaining = int(rec.data["remaining_restarts"])
        restarts = int(rec.data["restart_count"])
        interrupted = rec.error is not None and rec.error.startswith("interrupted: ")
        if (rec.error is not None and not interrupted) or state in spec.finals:
            finished = True
    return result(None)


def summary(res: ReplayResult, steps: int | None = None, *, restarts_used: int | None = None,
            budgets: Sequence[tuple[str, int]] = (), details: Sequence[str] = ()) -> str:
    """A few lines saying what the lifecycle did (in its first ``steps`` steps, default all
    that were checked), for ``fsm-agent replay``. ``restarts_used`` and ``budgets``: the
    default budget's restarts and each named budget's, told apart (the trace's
    ``restart_count`` counts every budget's); ``details``: lines about progress and drains
    (``fsm_agent._readers._summary.detail_lines``)."""
    n = res.checked if steps is None else steps
    path = [res.trace.records[0].source] if res.trace.records else []
    path += [(r.dest or "?") + (f" (x{r.count})" if r.count > 1 else "")
             for r in res.trace.records[:n]]
    total = sum(r.count for r in res.trace.records[:n])
    lines = [f"{total} step(s): {' -> '.join(path)}"]
    last = res.trace.records[n - 1] if n else None
    if last is not None:
        used = last.data["restart_count"] if restarts_used is None else restarts_used
        lines.append(f"restarts used: {used}, left: {last.data['remaining_restarts']}"
                     + "".join(f"; budget {b}: {k} used" for b, k in budgets))
        lines.extend(details)
        if last.error:
            lines.append(f"ended with: {last.error}")
    if res.params:
        lines.append("parameters: " + ", ".join(f"{k}={v}" for k, v in res.params.items()))
    return "\n".join(lines)
