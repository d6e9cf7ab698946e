"""A spec's restart-policy constructs, for ``_shape``: the default budget, named budgets and
the failure-policy table, key by key.
"""

from __future__ import annotations

from typing import Any

from ._budgets import RESERVED_BUDGETS
from ._policy import DEFAULT_OUTCOMES
from ._shape_base import _ShapeBase
from ._spec import (
    BudgetSpec,
    InstanceSpec,
    NamedBudgetSpec,
    OutcomeSpec,
    PolicySpec,
    RuleSpec,
)
from ._units import kind_of

__all__ = ["budget_instance"]

BUDGET_SCOPES = ("agent", "job")


def budget_instance(b: NamedBudgetSpec, role: str) -> InstanceSpec:
    """The guard (``role="guard"``) or action a named budget declares
    (``fsm_agent._core._budgets``)."""
    if role == "guard":
        return InstanceSpec(name=b.guard, kind="budget_left", args={"budget": b.name},
                            role="guard", description=f"a restart of budget {b.name} is left",
                            line=b.line)
    return InstanceSpec(name=b.action, kind="consume_budget", args={"budget": b.name},
                        role="action", description=f"spend one restart of budget {b.name}",
                        line=b.line)


class _PolicyShape(_ShapeBase):
    """The checks of the budgets and of ``failure_policy``."""

    def _budget(self, value: Any) -> BudgetSpec:
        where = ("budget",)
        if value is None:
            return BudgetSpec()
        if isinstance(value, str):
            value = {"scope": value}
        if not isinstance(value, dict):
            self.problem(where, f"expected agent, job or a mapping (scope, window), got "
                         f"{kind_of(value)}")
            return BudgetSpec()
        self._keys(value, ("scope", "window"), where)
        scope = value.get("scope", "agent")
        if scope not in BUDGET_SCOPES:
            self.problem((*where, "scope"), f"expected one of {', '.join(BUDGET_SCOPES)}, "
                         f"got {scope!r}")
            scope = "agent"
        window = self._value(value.get("window", "inf"), "duration", (*where, "window"))
        return BudgetSpec(scope=scope, window=window or BudgetSpec().window,
                          line=self.line(where))

    def _named_budgets(self, value: Any) -> tuple[NamedBudgetSpec, ...]:
        body = self._mapping(value, ("budgets",), "a mapping of budget names") or {}
        out = []
        for name, decl in body.items():
            w = ("budgets", name)
            if not isinstance(name, str) or not name.isidentifier():
                self.problem(w, f"{name!r} is not a valid budget name (letters, digits, "
                             "underscores)")
                continue
            if name in RESERVED_BUDGETS:
                self.problem(w, f"{name!r} is the default budget (max_restarts, the 'budget' "
                             "block): a named budget needs a name of its own")
                continue
            if not isinstance(decl, dict):
                self.problem(w, f"expected a mapping (max, window, description), got "
                             f"{kind_of(decl)}")
                continue
            self._keys(decl, ("max", "window", "description"), w)
            if "max" not in decl:
                self.problem(w, "missing required key 'max' (a count: an integer >= 0 or inf, "
                             "or an int or count parameter)")
                continue
            most = self._value(decl["max"], "count", (*w, "max"))
            window = (self._value(decl["window"], "duration", (*w, "window"))
                      if "window" in decl else None)
            if most is None or ("window" in decl and window is None):
                continue
            b = NamedBudgetSpec(name=name, max=most, window=window,
                                description=self._text(decl, w), line=self.line(w))
            for taken, what, role in ((self.guards, b.guard, "guard"),
                                      (self.actions, b.action, "action")):
                if what in taken:
                    self.problem(w, f"budget {name!r} declares {role} {what!r}, which is "
                                 "already defined")
                taken.add(what)
                self.budget_declared[what] = name
            out.append(b)
            self.budget_names.add(name)
        return tuple(out)

    def _policy(self, value: Any) -> PolicySpec | None:
        where: tuple[Any, ...] = ("failure_policy",)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem(where, f"expected a mapping (on, rules, ...), got {kind_of(value)}")
            return None
        self._keys(value, ("applies_to", "budget_guard", "rules", "outcomes", "description"),
                   where)
        on = self._policy_on(value.get("applies_to"), (*where, "applies_to"))
        budget_guard = value.get("budget_guard", "has_restarts_left")
        if budget_guard not in self.guards:
            self.problem((*where, "budget_guard"), f"unknown guard {budget_guard!r}")
        outcomes = self._outcomes(value.get("outcomes"), (*where, "outcomes"))
        rules = []
        raw_rules = value.get("rules")
        if not isinstance(raw_rules, list) or not raw_rules:
            self.problem((*where, "rules"), f"expected a non-empty list of rules, got "
                         f"{kind_of(raw_rules)}")
            raw_rules = []
        seen: set[str] = set()
        for i, body in enumerate(raw_rules):
            w = (*where, "rules", i)
            if not isinstance(body, dict):
                self.problem(w, f"expected a mapping (name, when, then), got {kind_of(body)}")
                continue
            self._keys(body, ("name", "when", "then", "budget", "description"), w)
            name = self._str(body.get("name"), (*w, "name"), ident=True)
            if name is not None and name in seen:
                self.problem((*w, "name"), f"rule {name!r} is defined twice")
            seen.add(name or "")
            when = self._names(body.get("when"), (*w, "when"), single_ok=True)
            self._check_guards(when, (*w, "when"))
            then = body.get("then")
            if then not in outcomes:
                self.problem((*w, "then"), f"unknown outcome {then!r} (outcomes: "
                             f"{', '.join(outcomes)})")
                continue
            spends = body.get("budget")
            if spends is not None:
                if spends not in self.budget_names:
                    known = ", ".join(sorted(self.budget_names)) or "none declared"
                    self.problem((*w, "budget"), f"unknown budget {spends!r} (the spec's "
                                 f"'budgets': {known}; omit it for the default budget, "
                                 "max_restarts)")
                    continue
                if not outcomes[then].restarts:
                    self.problem((*w, "budget"), f"rule {name!r} spends budget {spends!r}, "
                                 f"but its outcome {then!r} does not restart")
                    continue
            if name is not None:
                rules.append(RuleSpec(name=name, when=when, then=then, index=i,
                                      line=self.line(w), description=self._text(body, w),
                                      budget=spends))
        used = {r.then for r in rules}
        if any(outcomes[o].restarts for o in used):
            used.add("give_up")  # where a restart goes when the budget is spent
        for name in sorted(used):
            users = [r for r in rules if r.then == name]
            if name in (value.get("outcomes") or {}):
                at: tuple[Any, ...] = (*where, "outcomes", name)
            elif users:
                at = (*where, "rules", users[0].index, "then")
            else:
                at = where
            outcome = outcomes[name]
            if outcome.dest not in self.states:
                self.problem(at, f"outcome {name!r} goes to {outcome.dest}, which this spec does "
                             f"not declare (declare the state, or set failure_policy.outcomes."
                             f"{name}.dest)")
            for a in outcome.actions:
                if a not in self.actions:
                    self.problem(at, f"outcome {name!r} runs action {a!r}, which is not defined "
                                 f"(declare it under 'actions', or set failure_policy.outcomes."
                                 f"{name}.actions)")
        return PolicySpec(on=on, budget_guard=str(budget_guard), rules=tuple(rules),
                          outcomes=outcomes, line=self.line(where))

    def _policy_on(self, value: Any, where: tuple[Any, ...]) -> tuple[tuple[str, str], ...]:
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list) or not value:
            self.problem(where, "expected a list of {trigger, source} pairs")
            return ()
        out = []
        for i, pair in enumerate(value):
            w = (*where, i)
            if not isinstance(pair, dict) or set(pair) != {"trigger", "source"}:
                self.problem(w, "expected {trigger: NAME, source: STATE}")
                continue
            source = self._state_ref(pair["source"], (*w, "source"))
            trigger = self._str(pair["trigger"], (*w, "trigger"), ident=True)
            if source is not None and trigger is not None:
                out.append((trigger, source))
        return tuple(out)

    def _outcomes(self, value: Any, where: tuple[Any, ...]) -> dict[str, OutcomeSpec]:
        body = self._mapping(value, where, "a mapping of outcome names") or {}
        out = {}
        for name in {**DEFAULT_OUTCOMES, **body}:
            w = (*where, name)
            if name in body:
                decl = body[name]
                if not isinstance(decl, dict):
                    self.problem(w, f"expected a mapping (dest, actions, restarts), got "
                                 f"{kind_of(decl)}")
                    continue
                self._keys(decl, ("dest", "actions", "restarts", "description"), w)
                default = DEFAULT_OUTCOMES.get(name)
                dest = decl.get("dest", default.dest if default else None)
                actions = self._names(decl["actions"], (*w, "actions"), single_ok=False) \
                    if "actions" in decl else (default.actions if default else ())
                restarts = self._bool(decl.get("restarts", default.restarts if default
                                               else False), (*w, "restarts"))
            else:
                default = DEFAULT_OUTCOMES[name]
                dest, actions, restarts = default.dest, default.actions, default.restarts
            out[name] = OutcomeSpec(name=name, dest=str(dest), actions=tuple(actions),
                                    restarts=restarts)
        return out
