"""What a whole spec means, checked before anything runs.

``_shape`` has checked every element on its own; this module checks the spec as a machine:
one initial state, every state reachable and able to leave, deterministic and exhaustive
choices, no eventless cycle, restart cycles bounded by a budget, timers that can fire,
failure-policy rules that can match, arguments the vocabulary accepts, action budgets that fit.
Guards are treated as independent booleans: two transitions are exclusive only if one requires
a guard the other forbids.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._params import Ref
from ._policy import rule_condition
from ._shape import Findings
from ._spec import (
    ALWAYS_TRIGGER,
    ERROR_STATE,
    OBSERVATION_TRIGGERS,
    TIMEOUT_TRIGGER,
    InstanceSpec,
    PolicySpec,
    RuleSpec,
    Spec,
    TransitionSpec,
)
from ._vocabulary import BUDGET_GUARDS

__all__ = ["check_spec", "example_values"]

# Exhaustiveness is checked by enumerating guard assignments; beyond this it is skipped.
MAX_EXHAUSTIVE_GUARDS = 12
#: Actions that restart (or begin to restart) the workers.
RESTART_ACTIONS = frozenset({"stop_workers", "restart_workers"})
#: Values the built-in names take when a spec is checked on its own (torchrun's defaults).
BUILTIN_EXAMPLES: Mapping[str, Any] = {"max_restarts": 3, "exit_barrier_timeout": 300.0}


def example_values(spec: Spec) -> dict[str, Any]:
    """The values references resolve to when the spec is checked: parameter defaults and the
    agent's default settings."""
    return {**BUILTIN_EXAMPLES, **spec.defaults}


def check_spec(spec: Spec, *, lines: Mapping[tuple[Any, ...], int]) -> None:
    """Raise ``SpecError`` listing every problem of ``spec`` as a machine."""
    found = Findings(spec.path, lines)
    _Static(spec, found).run()
    found.fail_if_any()


def _where(t: TransitionSpec, *rest: Any) -> tuple[Any, ...]:
    return (*t.where, *rest) if t.rule is None else t.where


def _fmt(assignment: Mapping[str, bool]) -> str:
    return ", ".join(f"{k}={'true' if v else 'false'}" for k, v in assignment.items()) or "always"


def _covers(cands: Sequence[TransitionSpec]) -> dict[str, bool] | None:
    """An assignment of guards under which no candidate holds, or None if they cover all."""
    names = sorted({g for t in cands for g in (*t.guards, *t.unless)})
    if len(names) > MAX_EXHAUSTIVE_GUARDS:
        return None
    for values in itertools.product((False, True), repeat=len(names)):
        assignment = dict(zip(names, values, strict=True))
        if not any(t.holds_with(assignment) for t in cands):
            return assignment
    return None


class _Static:
    def __init__(self, spec: Spec, found: Findings) -> None:
        self.spec = spec
        self.found = found
        self.values = example_values(spec)

    def problem(self, where: Sequence[Any], message: str) -> None:
        self.found.problem(where, message)

    def run(self) -> None:
        spec = self.spec
        initials = [s for s in spec.states if s.initial]
        if not initials:
            self.problem(("states",), "no initial state (mark exactly one with 'initial: true')")
        for s in initials[1:]:
            self.problem(("states", s.name, "initial"),
                         f"several initial states: {', '.join(x.name for x in initials)}")
        initial = initials[0].name if initials else None
        self._transitions()
        if initial is not None:
            self._reachability(initial)
        for s in spec.states:
            if not s.final and not spec.outgoing(s.name):
                self.problem(("states", s.name), f"state {s.name} is not final and has no way out")
        self._determinism()
        self._exhaustive(initial)
        self._always_acyclic()
        self._timers(initial)
        self._instances()
        self._budgets()
        self._restart_cycles()
        if spec.policy is not None:
            self._policy(spec.policy)

    # -- transitions one by one --------------------------------------------------------------

    def _transitions(self) -> None:
        spec = self.spec
        finals = spec.finals
        known = set(spec.all_triggers)
        for t in spec.transitions:
            for i, trig in enumerate(t.triggers):
                if trig not in known:
                    self.problem(
                        _where(t, "trigger") if len(t.triggers) == 1 else _where(t, "trigger", i),
                        f"unknown trigger {trig!r} (built-in: start, always, timeout, "
                        f"{', '.join(OBSERVATION_TRIGGERS)}; declare others under 'triggers')",
                    )
            for src in t.sources:
                if src in finals:
                    self.problem(_where(t, "source"),
                                 f"final state {src} has an outgoing transition")
            if ALWAYS_TRIGGER in t.triggers and len(t.triggers) > 1:
                self.problem(_where(t, "trigger"),
                             "'always' cannot be combined with other triggers")
            if ALWAYS_TRIGGER in t.triggers and t.dest in t.sources:
                self.problem(_where(t, "dest"),
                             "an 'always' transition back to its own source would never stop")

    def _reachability(self, initial: str) -> None:
        seen = {initial, ERROR_STATE}
        frontier = [initial]
        while frontier:
            src = frontier.pop()
            for t in self.spec.outgoing(src):
                if t.dest not in seen:
                    seen.add(t.dest)
                    frontier.append(t.dest)
        for s in self.spec.states:
            if s.name not in seen:
                self.problem(("states", s.name),
                             f"state {s.name} cannot be reached from the initial state {initial}")

    def _determinism(self) -> None:
        reported: set[tuple[int, int]] = set()
        for src in self.spec.state_names:
            for trig in self.spec.all_triggers:
                for a, b in itertools.combinations(self.spec.outgoing(src, trig), 2):
                    exclusive = set(a.guards) & set(b.unless) or set(a.unless) & set(b.guards)
                    if exclusive or (a.index, b.index) in reported:
                        continue
                    reported.add((a.index, b.index))
                    other = f"rule {a.rule!r}" if a.rule else f"transitions[{a.index}]"
                    self.problem(
                        _where(b),
                        f"nondeterministic: on {trig!r} from {src} this transition and "
                        f"{other} (line {a.line}) can both be taken; make their guards "
                        "exclusive (one requires a guard the other forbids with 'unless')",
                    )

    def _exhaustive(self, initial: str | None) -> None:
        spec = self.spec
        for s in spec.states:
            if s.final or s.name == initial:
                continue
            always = spec.outgoing(s.name, ALWAYS_TRIGGER)
            if always:
                gap = _covers(always)
                if gap is not None:
                    self.problem(_where(always[0]), f"the 'always' transitions of {s.name} do "
                                 f"not cover guards {_fmt(gap)}: the machine would be stuck")
                continue
            observes = any(spec.outgoing(s.name, trig) for trig in OBSERVATION_TRIGGERS)
            if s.timeout is not None:
                cands = spec.outgoing(s.name, TIMEOUT_TRIGGER)
                gap = _covers(cands) if cands else None
                if cands and gap is not None:
                    self.problem(_where(cands[0]), f"on 'timeout' from {s.name} no transition "
                                 f"is taken when {_fmt(gap)}")
                if not observes:
                    continue  # a waiting state: its timer (or an external trigger) moves it on
            elif not observes and any(spec.outgoing(s.name, t) for t in spec.triggers):
                continue  # waits for the embedding program's own triggers
            # A state the machine rests in is observed on every monitor tick: each of torch's
            # seven results must lead somewhere, or the run fails at runtime instead of here.
            for trig in OBSERVATION_TRIGGERS:
                cands = spec.outgoing(s.name, trig)
                if not cands:
                    self.problem(("states", s.name), f"state {s.name} is observed on every "
                                 f"monitor tick but has no transition on {trig!r}")
                    continue
                gap = _covers(cands)
                if gap is not None:
                    self.problem(_where(cands[0]),
                                 f"on {trig!r} from {s.name} no transition is taken when "
                                 f"{_fmt(gap)}")

    def _always_acyclic(self) -> None:
        graph = {s: [t.dest for t in self.spec.outgoing(s, ALWAYS_TRIGGER)]
                 for s in self.spec.state_names}
        state: dict[str, int] = {}

        def visit(node: str, stack: list[str]) -> None:
            state[node] = 1
            for nxt in graph.get(node, ()):
                if state.get(nxt) == 1:
                    cycle = [*stack[stack.index(nxt):], nxt] if nxt in stack else [node, nxt]
                    self.problem(("transitions",),
                                 "'always' transitions form a cycle: " + " -> ".join(cycle))
                elif nxt not in state:
                    visit(nxt, [*stack, nxt])
            state[node] = 2

        for s in self.spec.state_names:
            if s not in state:
                visit(s, [s])

    # -- timers, arguments, budgets ----------------------------------------------------------

    def _seconds(self, ref: Ref) -> float | None:
        try:
            value = ref.resolve(self.values)
        except KeyError:
            return None
        return float(value) if isinstance(value, (int, float)) else None

    def _timers(self, initial: str | None) -> None:
        spec = self.spec
        for s in spec.states:
            w = ("states", s.name, "timeout")
            fires = spec.outgoing(s.name, TIMEOUT_TRIGGER)
            if s.timeout is None:
                for t in fires:
                    self.problem(_where(t, "trigger"), f"state {s.name} has no timeout, so "
                                 "this 'timeout' transition can never fire")
                continue
            if s.final:
                self.problem(w, f"{s.name} is final: its timer can never fire")
            elif s.name == initial:
                self.problem(w, f"{s.name} is the initial state, left by 'start': its timer "
                             "can never fire")
            elif spec.outgoing(s.name, ALWAYS_TRIGGER):
                self.problem(w, f"{s.name} is left at once by its 'always' transitions: its "
                             "timer can never fire")
            elif not fires:
                self.problem(w, f"state {s.name} has a timer but no transition on 'timeout': "
                             "when it fires the machine would be stuck")
            elif s.timeout.after is not None and s.timeout.after.name is None \
                    and s.timeout.after.value == math.inf:
                self.problem(w, f"the timer of {s.name} is inf: it can never fire")

    def _instances(self) -> None:
        spec = self.spec
        seen = set(spec.vocabulary.guards)
        for inst in spec.guard_defs:
            if inst.name in seen:
                self.problem(("guards", inst.name), f"guard {inst.name!r} is defined twice (a "
                             "failure-policy rule with several 'when' guards defines "
                             "rule_<its name>)")
            seen.add(inst.name)
        for inst in (*spec.guard_defs, *spec.action_defs):
            kinds = spec.vocabulary.guard_kinds if inst.role == "guard" else \
                spec.vocabulary.action_kinds
            kind = kinds.get(inst.kind)
            if kind is None:
                continue
            try:
                kind.instantiate(inst.args, self.values)
            except (ValueError, TypeError) as e:
                self.problem((f"{inst.role}s", inst.name, inst.kind), f"{inst.kind}: {e}")

    def _budgets(self) -> None:
        spec = self.spec
        budgets = {a.name: (a, self._seconds(a.timeout)) for a in spec.action_defs
                   if a.timeout is not None}
        for s in spec.states:
            if s.timeout is None or s.timeout.after is None:
                continue
            limit = self._seconds(s.timeout.after)
            used = [(a, sec) for a, sec in (budgets.get(n, (None, None)) for n in s.enter)
                    if a is not None and sec is not None]
            total = sum(sec for _, sec in used)
            if limit is not None and used and total > limit:
                names = ", ".join(f"{a.name} ({sec:g} s)" for a, sec in used)
                self.problem(("states", s.name, "timeout"),
                             f"the entry actions of {s.name} may take {total:g} s ({names}), "
                             f"more than its timeout of {limit:g} s")

    # -- restart cycles ----------------------------------------------------------------------

    def _budget_guards(self) -> set[str]:
        spec = self.spec
        out = set(BUDGET_GUARDS) | {b.guard for b in spec.budgets}
        if spec.policy is not None:
            out.add(spec.policy.budget_guard)
        for g in spec.guard_defs:
            if g.kind == "all_of" and set(g.args.get("guards", ())) & out:
                out.add(g.name)
        return out

    def _restart_cycles(self) -> None:
        spec = self.spec
        if spec.restart_forever:
            return
        budget = self._budget_guards()
        consume = {"consume_restart"} | {b.action for b in spec.budgets}
        graph: dict[str, set[str]] = {s: set() for s in spec.state_names}
        restarts: list[tuple[str, str, str, TransitionSpec]] = []
        for trig, src, dest, t in spec.edges():
            bounded = bool(consume & set(t.actions)) and bool(set(t.guards) & budget)
            if bounded:
                continue
            graph[src].add(dest)
            if trig != "healthy" and RESTART_ACTIONS & {*t.actions, *t.after}:
                restarts.append((trig, src, dest, t))
        reported: set[int] = set()
        for trig, src, dest, t in restarts:
            path = self._path(graph, dest, src)
            if path is None or t.index in reported:
                continue
            reported.add(t.index)
            cycle = " -> ".join([src, *path])
            self.problem(_where(t), f"restarts for ever: the cycle {cycle} restarts the workers "
                         f"on {trig!r} and nothing bounds it (no transition on it consumes a "
                         "restart under a budget guard such as has_restarts_left); bound it, or "
                         "say 'restart_forever: true'")

    @staticmethod
    def _path(graph: Mapping[str, set[str]], start: str, goal: str) -> list[str] | None:
        parents: dict[str, str | None] = {start: None}
        frontier = [start]
        while frontier:
            node = frontier.pop(0)
            if node == goal:
                out = [node]
                while parents[out[-1]] is not None:
                    out.append(parents[out[-1]])  # type: ignore[arg-type]
                return out[::-1]
            for nxt in sorted(graph.get(node, ())):
                if nxt not in parents:
                    parents[nxt] = node
                    frontier.append(nxt)
        return None

    # -- the failure policy ------------------------------------------------------------------

    def _policy(self, policy: PolicySpec) -> None:
        rules = policy.rules
        catch_all: RuleSpec | None = None
        for i, rule in enumerate(rules):
            w = ("failure_policy", "rules", rule.index)
            if catch_all is not None:
                self.problem(w, f"rule {rule.name!r} can never match: the catch-all rule "
                             f"{catch_all.name!r} (line {catch_all.line}) comes before it")
                continue
            for earlier in rules[:i]:
                if self._implies(rule, earlier):
                    self.problem(w, f"rule {rule.name!r} can never match: whenever it holds, "
                                 f"the earlier rule {earlier.name!r} (line {earlier.line}) "
                                 "holds and is taken first")
                    break
            if not rule.when:
                catch_all = rule
        if rules and catch_all is None:
            self.problem(("failure_policy", "rules"), "the table has no final catch-all rule "
                         "(a rule without 'when'): a failure that matches no rule would have "
                         "no transition")

    def _implies(self, rule: RuleSpec, earlier: RuleSpec) -> bool:
        """Whether ``rule``'s condition holding means ``earlier``'s holds too (so it shadows)."""
        if not earlier.when:
            return True
        if set(earlier.when) <= set(rule.when):
            return True
        if len(rule.when) != 1 or len(earlier.when) != 1:
            return False
        a, b = (self._instance(rule_condition(r) or "") for r in (rule, earlier))
        if a is None or b is None or a.kind != b.kind:
            return False
        x, y = self._args(a), self._args(b)
        kind = self.spec.vocabulary.guard_kinds.get(a.kind)
        if x is None or y is None or kind is None or kind.implies is None:
            return False
        return bool(kind.implies(x, y))

    def _instance(self, name: str) -> InstanceSpec | None:
        return next((g for g in self.spec.guard_defs if g.name == name), None)

    def _args(self, inst: InstanceSpec) -> dict[str, Any] | None:
        kind = self.spec.vocabulary.guard_kinds.get(inst.kind)
        if kind is None:
            return None
        out = dict(kind.defaults)
        for k, v in inst.args.items():
            try:
                out[k] = v.resolve(self.values) if isinstance(v, Ref) else v
            except KeyError:
                return None
        return out
