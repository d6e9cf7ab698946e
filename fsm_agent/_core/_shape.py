"""A spec's data, key by key, into a ``Spec``: every unknown key, wrong type and bad name found.

This is the first of the two checks: it looks at the shape of each element on its own (and that
every name it uses is declared). What the whole spec means is ``_static``'s job.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from ._budgets import BUDGET_KINDS
from ._errors import Problem, SpecError
from ._params import (
    BUILTIN_VALUES,
    PARAM_TYPES,
    ParamSpec,
    Ref,
    coerce,
    format_value,
)
from ._policy import compile_policy
from ._shape_base import _DURATION_WORDS, Findings
from ._shape_policy import _PolicyShape, budget_instance
from ._spec import (
    ALWAYS_TRIGGER,
    INTERRUPT_TRIGGER,
    OBSERVATION_TRIGGERS,
    START_TRIGGER,
    STATE_NAMES,
    TIMEOUT_TRIGGER,
    BackoffSpec,
    InstanceSpec,
    MetricSpec,
    Spec,
    StateSpec,
    TimeoutSpec,
    TransitionSpec,
)
from ._units import BadValue, kind_of
from ._vocabulary import Kind, Vocabulary

__all__ = ["Findings", "UnknownNames", "build_spec"]

METRIC_FIELDS = ("role", "observed")
METRIC_VALUES = ("remaining_restarts", "restart_count", "max_restarts")

_TOP_KEYS = {
    "name": True,
    "description": True,
    "states": True,
    "transitions": True,
    "metrics": False,
    "triggers": False,
    "params": False,
    "guards": False,
    "actions": False,
    "budget": False,
    "budgets": False,
    "failure_policy": False,
    "restart_forever": False,
}
_STATE_KEYS = ("initial", "final", "enter", "exit", "reports", "timeout", "description")
_TRANSITION_KEYS = {
    "trigger": True,
    "source": True,
    "dest": True,
    "guards": False,
    "unless": False,
    "actions": False,
    "after": False,
    "description": False,
}
_PARAM_KEYS = ("type", "default", "min", "max", "choices", "description")
_BACKOFF_KEYS = {"initial": ("duration", None), "factor": ("float", 2.0),
                 "max": ("duration", float("inf")), "jitter": ("float", 0.0),
                 "reset_after": ("duration", float("inf")),
                 "reset_on_progress": ("bool", False)}
_INSTANCE_EXTRA = ("timeout", "description")
_STATE_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _literal(value: Any) -> Any:
    return value.value if isinstance(value, Ref) and value.name is None else value


class UnknownNames(SpecError):
    """The spec's only problems are guard or action names nobody registered; ``spec`` is the
    machine it describes otherwise, for the whole-spec checks to find the rest."""

    def __init__(self, problems: Sequence[Problem], spec: Spec) -> None:
        super().__init__(problems)
        self.spec = spec


def build_spec(
    raw: Any, *, path: str, vocabulary: Vocabulary, lines: Mapping[tuple[Any, ...], int]
) -> Spec:
    """Check ``raw`` (a spec's YAML data) key by key; the ``Spec`` it describes, or SpecError."""
    return _Shape(Findings(path, lines), vocabulary).build(raw)


class _Shape(_PolicyShape):
    # -- the whole spec ----------------------------------------------------------------------

    def build(self, raw: Any) -> Spec:
        if not isinstance(raw, dict):
            self.problem((), f"a spec is a mapping at the top level, got {kind_of(raw)}")
            self.found.fail_if_any()
        self._keys(raw, _TOP_KEYS, ())
        for key, required in _TOP_KEYS.items():
            if required and key not in raw:
                self.problem((), f"missing required key {key!r}")
        name = self._str(raw.get("name"), ("name",)) if "name" in raw else None
        description = self._text(raw, ())
        triggers = self._triggers(raw.get("triggers"))
        params = self._params(raw.get("params"))
        named = self._named_budgets(raw.get("budgets"))
        guard_defs = self._instances(raw.get("guards"), "guards")
        action_defs = self._instances(raw.get("actions"), "actions")
        budget = self._budget(raw.get("budget"))
        states = self._states(raw.get("states"))
        transitions = self._transitions(raw.get("transitions"))
        metrics = self._metrics(raw.get("metrics"))
        forever = self._bool(raw.get("restart_forever", False), ("restart_forever",))
        policy = self._policy(raw.get("failure_policy"))
        if len(self.found.problems) > self.unknown_names:
            self.found.fail_if_any()
        # A named budget's guard and action: declared by the budget, never written by hand.
        guard_defs = (*guard_defs, *(budget_instance(b, "guard") for b in named))
        action_defs = (*action_defs, *(budget_instance(b, "action") for b in named))
        if policy is not None:
            compiled, synthesized = compile_policy(policy, start_index=len(transitions),
                                                   budgets=named)
            transitions = (*transitions, *compiled)
            guard_defs = (*guard_defs, *synthesized)
        spec = Spec(
            name=name or "",
            description=description,
            states=states,
            transitions=transitions,
            metrics=metrics,
            triggers=triggers,
            path=self.found.path,
            vocabulary=self.vocab,
            params=params,
            guard_defs=guard_defs,
            action_defs=action_defs,
            budget=budget,
            budgets=named,
            policy=policy,
            restart_forever=forever,
        )
        if self.found.problems:
            raise UnknownNames(self.found.problems, spec)
        return spec

    def _triggers(self, value: Any) -> tuple[str, ...]:
        names = self._names(value, ("triggers",), single_ok=False)
        builtin = (START_TRIGGER, ALWAYS_TRIGGER, TIMEOUT_TRIGGER, *OBSERVATION_TRIGGERS)
        for i, trig in enumerate(names):
            if trig in builtin:
                self.problem(("triggers", i), f"{trig!r} is a built-in trigger; do not declare it")
            elif trig == INTERRUPT_TRIGGER:
                self.problem(("triggers", i), f"{trig!r} is reserved for the record of an "
                             "interrupted lifecycle in traces")
        return names

    def _params(self, value: Any) -> tuple[ParamSpec, ...]:
        body = self._mapping(value, ("params",), "a mapping of parameter names")
        out = []
        for name, decl in (body or {}).items():
            w = ("params", name)
            if not name.isidentifier() or name.lower() in _DURATION_WORDS:
                self.problem(w, f"{name!r} is not a valid parameter name")
                continue
            if name in BUILTIN_VALUES:
                self.problem(w, f"{name!r} is a built-in value (the agent's own setting); "
                             "a parameter cannot shadow it")
                continue
            if not isinstance(decl, dict):
                self.problem(w, f"expected a mapping (type, default, ...), got {kind_of(decl)}")
                continue
            self._keys(decl, _PARAM_KEYS, w)
            ptype = decl.get("type")
            if ptype not in PARAM_TYPES:
                self.problem((*w, "type"), f"unknown type {ptype!r} (types: "
                             f"{', '.join(PARAM_TYPES)})")
                continue
            if "default" not in decl:
                self.problem(w, "missing required key 'default' (every parameter has one)")
                continue
            bounds: dict[str, float | None] = {}
            for key in ("min", "max"):
                if key in decl:
                    bound_type = "duration" if ptype == "duration" else "float"
                    try:
                        bounds[key] = coerce(bound_type, decl[key])
                    except BadValue as e:
                        self.problem((*w, key), str(e))
                    if ptype not in ("int", "float", "duration", "int_list"):
                        self.problem((*w, key), f"a {ptype} parameter has no {key}")
            choices = self._names(decl.get("choices"), (*w, "choices"), single_ok=False) \
                if "choices" in decl else ()
            if choices and ptype not in ("str", "str_list"):
                self.problem((*w, "choices"), f"a {ptype} parameter has no choices")
            try:
                default = coerce(ptype, decl["default"])
            except BadValue as e:
                self.problem((*w, "default"), f"bad default: {e}")
                continue
            spec = ParamSpec(name=name, type=ptype, default=default, min=bounds.get("min"),
                             max=bounds.get("max"), choices=choices,
                             description=self._text(decl, w), line=self.line(w))
            try:
                spec.check(default)
            except BadValue as e:
                self.problem((*w, "default"), f"default out of range: {e}")
            self.params[name] = spec
            out.append(spec)
        return tuple(out)

    def _instances(self, value: Any, section: str) -> tuple[InstanceSpec, ...]:
        role = "guard" if section == "guards" else "action"
        kinds = self.vocab.guard_kinds if role == "guard" else self.vocab.action_kinds
        taken = self.guards if role == "guard" else self.actions
        body = self._mapping(value, (section,), f"a mapping of {role} names")
        out = []
        for name, decl in (body or {}).items():
            w = (section, name)
            if not name.isidentifier():
                self.problem(w, f"{name!r} is not a valid {role} name")
                continue
            if name in self.budget_declared:
                self.problem(w, f"{role} {name!r} is declared by budget "
                             f"{self.budget_declared[name]!r} (budgets.{self.budget_declared[name]}"
                             "): name yours otherwise")
                continue
            if name in taken:
                self.problem(w, f"{role} {name!r} is already defined (built in or above)")
                continue
            if not isinstance(decl, dict):
                self.problem(w, f"expected {{KIND: ARGUMENTS}}, got {kind_of(decl)}")
                continue
            named = [k for k in decl if k not in _INSTANCE_EXTRA]
            if len(named) != 1 or named[0] not in kinds:
                self.problem(w, f"expected exactly one {role} kind (known: "
                             f"{', '.join(sorted(kinds)) or 'none'})"
                             + (f", got {', '.join(named)}" if named else ""))
                continue
            kind_name = named[0]
            if role == "guard" and "timeout" in decl:
                self.problem((*w, "timeout"), "a guard has no timeout")
            timeout = self._value(decl["timeout"], "duration", (*w, "timeout")) \
                if "timeout" in decl else None
            args = self._args(kinds[kind_name], decl[kind_name], (*w, kind_name))
            # Declared only now: a guard cannot refer to itself.
            taken.add(name)
            if args is None:
                continue
            if kind_name in BUDGET_KINDS and _literal(args.get("budget")) not in \
                    self.budget_names:
                self.problem((*w, kind_name), f"unknown budget "
                             f"{_literal(args.get('budget'))!r} (the spec's 'budgets': "
                             f"{', '.join(sorted(self.budget_names)) or 'none declared'})")
                continue
            out.append(InstanceSpec(name=name, kind=kind_name, args=args, role=role,
                                    timeout=timeout, description=self._text(decl, w),
                                    line=self.line(w)))
        return tuple(out)

    def _args(self, kind: Kind, raw: Any, where: tuple[Any, ...]) -> dict[str, Any] | None:
        # A bare value fills the positional argument; a mapping names them (no argument is
        # itself a mapping, so the two cannot be confused).
        if isinstance(raw, dict):
            given = [(arg, value, (*where, arg)) for arg, value in raw.items()]
        elif kind.positional is not None:
            given = [(kind.positional, raw, where)]
        elif raw is None:
            given = []
        else:
            self.problem(where, f"expected a mapping of arguments ({', '.join(kind.args)}), "
                         f"got {kind_of(raw)}")
            return None
        out: dict[str, Any] = {}
        ok = True
        for arg, value, w in given:
            type_name = kind.args.get(arg)
            if type_name is None:
                self.problem(w, f"unknown argument {arg!r} (arguments: {', '.join(kind.args)})")
                ok = False
            elif type_name in ("guard", "guard_list"):
                names = self._names(value, w, single_ok=type_name == "guard")
                for n in names:
                    if n not in self.guards:
                        self.problem(w, f"unknown guard {n!r} (a guard used here is declared "
                                     "before this one)")
                        ok = False
                out[arg] = names[0] if type_name == "guard" and names else names
            else:
                ref = self._value(value, type_name, w)
                allowed = kind.choices.get(arg)
                if ref is not None and allowed and ref.name is None and ref.value not in allowed:
                    self.problem(w, f"{ref.value!r} is not one of {', '.join(allowed)}")
                    ref = None
                if ref is not None and arg in kind.user_only:
                    ref = self._user_only(arg, ref, w)
                ok = ok and ref is not None
                out[arg] = ref
        missing = [a for a in kind.args if a not in out and a not in kind.defaults]
        if missing and ok:
            self.problem(where, f"missing argument(s) {', '.join(missing)}")
            ok = False
        return out if ok else None

    def _user_only(self, arg: str, ref: Ref, where: tuple[Any, ...]) -> Ref | None:
        """``ref`` if a spec may give it for ``arg``, an argument only the user sets: a literal
        (other than empty) or a parameter whose default is not empty would let a spec file on its
        own run a command or probe a host."""
        how = (f"a spec cannot set {arg!r} itself (a spec is data and never runs a command or "
               "probes a host of its own): name a parameter whose default is empty, which the "
               "user who runs the job sets with --spec-param NAME=VALUE")
        if ref.name is None:
            if ref.value:
                self.problem(where, f"{how}; got {format_value(ref.value)}")
                return None
            return ref
        param = self.params.get(ref.name)
        if param is not None and param.default:
            self.problem(("params", ref.name, "default"),
                         f"parameter {ref.name!r} is the {arg!r} of a guard, so its default must "
                         f"be empty: {how}; got {format_value(param.default)}")
            return None
        return ref

    def _timeout(self, raw: Any, where: tuple[Any, ...]) -> TimeoutSpec | None:
        if not isinstance(raw, dict):
            ref = self._value(raw, "duration", where)
            return None if ref is None else TimeoutSpec(after=ref, line=self.line(where))
        self._keys(raw, ("after", "backoff"), where)
        if ("after" in raw) == ("backoff" in raw):
            self.problem(where, "expected a duration, a parameter name, {after: DURATION} or "
                         "{backoff: {...}}")
            return None
        if "after" in raw:
            ref = self._value(raw["after"], "duration", (*where, "after"))
            return None if ref is None else TimeoutSpec(after=ref, line=self.line(where))
        w = (*where, "backoff")
        body = self._mapping(raw["backoff"], w, "a mapping (initial, factor, max, jitter, "
                             "reset_after, reset_on_progress)")
        if body is None:
            return None
        self._keys(body, _BACKOFF_KEYS, w)
        fields: dict[str, Ref] = {}
        for key, (type_name, default) in _BACKOFF_KEYS.items():
            if key not in body:
                if default is None:
                    self.problem(w, f"missing required key {key!r}")
                    return None
                fields[key] = Ref(default)
                continue
            ref = self._value(body[key], type_name, (*w, key))
            if ref is None:
                return None
            fields[key] = ref
        return TimeoutSpec(backoff=BackoffSpec(**fields), line=self.line(where))

    def _states(self, value: Any) -> tuple[StateSpec, ...]:
        where: tuple[Any, ...] = ("states",)
        body = self._mapping(value, where, "a mapping of state names")
        if not body:
            return ()
        self.states = {n for n in body if isinstance(n, str) and _STATE_NAME.match(n)}
        out = []
        for name, decl in body.items():
            w = (*where, name)
            if not _STATE_NAME.match(name):
                self.problem(w, f"{name!r} is not a valid state name (upper case: letters, "
                             "digits, underscores)")
                continue
            decl = {} if decl is None else decl  # noqa: PLW2901 - a bare `STATE:` means no options
            if not isinstance(decl, dict):
                self.problem(w, f"expected a mapping ({', '.join(_STATE_KEYS)}), "
                             f"got {kind_of(decl)}")
                continue
            self._keys(decl, _STATE_KEYS, w)
            reports = decl.get("reports", name if name in STATE_NAMES else None)
            if reports is None:
                self.problem(w, f"state {name} is not one of torch's WorkerState members, so it "
                             f"must say which one it reports (reports: one of "
                             f"{', '.join(STATE_NAMES)})")
                reports = "UNKNOWN"
            elif reports not in STATE_NAMES:
                self.problem((*w, "reports"), f"unknown WorkerState {reports!r} "
                             f"({', '.join(STATE_NAMES)})")
                reports = "UNKNOWN"
            elif name in STATE_NAMES and reports != name:
                self.problem((*w, "reports"), f"torch's {name} reports itself")
            enter = self._names(decl.get("enter"), (*w, "enter"), single_ok=False)
            exit_ = self._names(decl.get("exit"), (*w, "exit"), single_ok=False)
            for key, names in (("enter", enter), ("exit", exit_)):
                self._check_actions(names, (*w, key))
            timeout = self._timeout(decl["timeout"], (*w, "timeout")) \
                if "timeout" in decl else None
            out.append(
                StateSpec(
                    name=name,
                    initial=self._bool(decl.get("initial", False), (*w, "initial")),
                    final=self._bool(decl.get("final", False), (*w, "final")),
                    enter=enter,
                    exit=exit_,
                    description=self._text(decl, w),
                    line=self.line(w),
                    reports=reports,
                    timeout=timeout,
                )
            )
        missing = [s for s in STATE_NAMES if s not in body]
        if missing:
            self.problem(
                where,
                f"missing state(s) {', '.join(missing)}: a lifecycle has all seven "
                "of torch's WorkerState members",
            )
        return tuple(out)

    def _transitions(self, value: Any) -> tuple[TransitionSpec, ...]:
        where: tuple[Any, ...] = ("transitions",)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(where, f"expected a list of transitions, got {kind_of(value)}")
            return ()
        out = []
        for i, body in enumerate(value):
            w = (*where, i)
            if not isinstance(body, dict):
                self.problem(w, f"expected a mapping (trigger, source, dest, ...), got "
                             f"{kind_of(body)}")
                continue
            self._keys(body, _TRANSITION_KEYS, w)
            for key, required in _TRANSITION_KEYS.items():
                if required and key not in body:
                    self.problem(w, f"missing required key {key!r}")
            triggers = self._names(body.get("trigger"), (*w, "trigger"), single_ok=True)
            sources = self._sources(body.get("source"), (*w, "source"))
            dest = self._state_ref(body.get("dest"), (*w, "dest")) if "dest" in body else None
            guards = self._names(body.get("guards"), (*w, "guards"), single_ok=False)
            unless = self._names(body.get("unless"), (*w, "unless"), single_ok=False)
            self._check_guards(guards, (*w, "guards"))
            self._check_guards(unless, (*w, "unless"))
            for g in set(guards) & set(unless):
                self.problem((*w, "unless"), f"guard {g!r} is both required and forbidden: "
                             "this transition can never be taken")
            actions = self._names(body.get("actions"), (*w, "actions"), single_ok=False)
            after = self._names(body.get("after"), (*w, "after"), single_ok=False)
            self._check_actions(actions, (*w, "actions"))
            self._check_actions(after, (*w, "after"))
            desc = self._text(body, w)
            if not triggers or not sources or dest is None:
                continue
            out.append(TransitionSpec(triggers=triggers, sources=sources, dest=dest,
                                      guards=guards, unless=unless, actions=actions, after=after,
                                      description=desc, index=i, line=self.line(w), where=w))
        return tuple(out)

    def _sources(self, value: Any, where: tuple[Any, ...]) -> tuple[str, ...]:
        names = self._names(value, where, single_ok=True)
        ok = []
        for i, name in enumerate(names):
            w = where if isinstance(value, str) else (*where, i)
            if self._state_ref(name, w) is not None:
                ok.append(name)
        return tuple(ok) if len(ok) == len(names) else ()

    def _metrics(self, value: Any) -> tuple[MetricSpec, ...]:
        where: tuple[Any, ...] = ("metrics",)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(where, f"expected a list of metrics, got {kind_of(value)}")
            return ()
        int_params = [p for p, s in self.params.items() if s.type == "int"]
        out = []
        for i, body in enumerate(value):
            w = (*where, i)
            if not isinstance(body, dict):
                self.problem(w, f"expected a mapping (name, value), got {kind_of(body)}")
                continue
            self._keys(body, ("name", "value"), w)
            name = self._str(body.get("name"), (*w, "name"))
            if name is not None:
                try:
                    parts = list(string.Formatter().parse(name))
                except ValueError as e:
                    self.problem((*w, "name"), f"bad template: {e}")
                    parts = []
                for _, field, spec, conv in parts:
                    if field is None:
                        continue
                    if field not in METRIC_FIELDS or spec or conv:
                        self.problem(
                            (*w, "name"),
                            f"template field {{{field}}} not allowed "
                            f"(allowed: {', '.join('{' + f + '}' for f in METRIC_FIELDS)})",
                        )
            val = body.get("value")
            if isinstance(val, bool) or not (
                isinstance(val, int) or val in METRIC_VALUES or val in int_params
            ):
                self.problem(
                    (*w, "value"),
                    f"expected an integer, one of {', '.join(METRIC_VALUES)} or an int "
                    f"parameter, got {val!r}",
                )
                continue
            if name is not None:
                out.append(MetricSpec(name=name, value=val, line=self.line(w)))
        return tuple(out)
