"""Lifecycle specs: the immutable ``Spec`` model and the names every spec shares.

``_load`` builds a ``Spec`` from a file or text; this module only describes one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ._params import ParamSpec, Ref, bind_params
from ._vocabulary import Vocabulary

__all__ = [
    "ALWAYS_TRIGGER",
    "DEFAULT_SPEC",
    "ERROR_STATE",
    "FAILURE_TRIGGERS",
    "HANG_TIMEOUT_PARAM",
    "HUNG_TRIGGER",
    "INTERRUPT_TRIGGER",
    "OBSERVATION_TRIGGERS",
    "START_TRIGGER",
    "STATE_NAMES",
    "TIMEOUT_TRIGGER",
    "BackoffSpec",
    "BudgetSpec",
    "InstanceSpec",
    "MetricSpec",
    "NamedBudgetSpec",
    "OutcomeSpec",
    "PolicySpec",
    "RuleSpec",
    "Spec",
    "StateSpec",
    "TimeoutSpec",
    "TransitionSpec",
]

#: torch's ``WorkerState`` members, in torch's order. Kept as names so that loading and checking
#: a spec does not import torch.
STATE_NAMES: tuple[str, ...] = (
    "UNKNOWN",
    "INIT",
    "HEALTHY",
    "UNHEALTHY",
    "STOPPED",
    "SUCCEEDED",
    "FAILED",
)
#: One trigger per observable ``WorkerState``: ``observe`` fires ``result.state.name.lower()``.
OBSERVATION_TRIGGERS: tuple[str, ...] = tuple(s.lower() for s in STATE_NAMES)
#: Observations that end an attempt in failure (attempt durations are recorded for them).
FAILURE_TRIGGERS: frozenset[str] = frozenset({"failed", "unhealthy"})
START_TRIGGER = "start"
ALWAYS_TRIGGER = "always"
#: Fired when the current state's timer expires.
TIMEOUT_TRIGGER = "timeout"
#: The trigger of the final trace record a supervisor writes when a signal interrupts the lifecycle
#: between two transitions. Reserved: no spec may use it.
INTERRUPT_TRIGGER = "signal"
#: The state the engine enters when an action fails; reachable whatever the transitions say.
ERROR_STATE = "UNKNOWN"
#: Fired when a worker makes no progress for ``hang_timeout`` (the torch agent's hang detector);
#: a spec opts in to hang detection by using it.
HUNG_TRIGGER = "hung"
#: The spec parameter of how long a worker may go without progress before ``hung`` fires.
HANG_TIMEOUT_PARAM = "hang_timeout"
#: The preset used when none is named: by every ``fsm-agent`` command, the torch agent and the
#: conformance kit.
DEFAULT_SPEC = "torchelastic"

MAX_SPEC_BYTES = 1 << 20
# Immutable, so safe as shared defaults.
_NEVER = Ref(float("inf"))
_NO = Ref(False)
_ZERO = Ref(0.0)


@attrs.frozen
class BackoffSpec:
    """An exponential backoff: ``min(max, initial * factor**n)``, jittered, reset after a while."""

    initial: Ref
    factor: Ref
    max: Ref
    jitter: Ref = _ZERO
    reset_after: Ref = _NEVER
    #: True: an attempt that made progress (``fsm_agent._core._progress``) resets it too; where
    #: progress is known it decides instead of ``reset_after``'s healthy time.
    reset_on_progress: Ref = _NO


@attrs.frozen
class TimeoutSpec:
    """A state's timer: a fixed duration (``after``) or a backoff."""

    after: Ref | None = None
    backoff: BackoffSpec | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.backoff is not None:
            b = self.backoff
            return f"backoff({b.initial} x{b.factor} <= {b.max}, jitter {b.jitter})"
        return str(self.after)


@attrs.frozen
class StateSpec:
    """One state of a spec. ``reports`` is the ``WorkerState`` it shows (its own name for torch's
    seven)."""

    name: str
    initial: bool = False
    final: bool = False
    enter: tuple[str, ...] = ()
    exit: tuple[str, ...] = ()
    description: str = ""
    line: int | None = None
    reports: str = ""
    timeout: TimeoutSpec | None = None

    @property
    def reported(self) -> str:
        """The ``WorkerState`` name this state reports."""
        return self.reports or self.name


@attrs.frozen
class TransitionSpec:
    """One transition entry of a spec; it may cover several triggers and sources.

    ``rule`` names the failure-policy rule a compiled transition came from (None for an entry of
    ``transitions``); ``where`` is the element it was written as, for error messages.
    """

    triggers: tuple[str, ...]
    sources: tuple[str, ...]
    dest: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    description: str = ""
    index: int = 0
    line: int | None = None
    rule: str | None = None
    where: tuple[Any, ...] = ()

    def holds_with(self, assignment: Mapping[str, bool]) -> bool:
        """Whether the guards pass under ``assignment`` (guard name -> value)."""
        return all(assignment[g] for g in self.guards) and not any(
            assignment[g] for g in self.unless
        )


@attrs.frozen
class MetricSpec:
    """A metric put on every monitor tick; ``name`` is a template over ``{role}``/``{observed}``.

    ``value`` is an int, a counter (``remaining_restarts``, ...) or an int parameter's name."""

    name: str
    value: int | str
    line: int | None = None


@attrs.frozen
class InstanceSpec:
    """A spec's own guard or action: a parameterised kind with its arguments."""

    name: str
    kind: str
    args: Mapping[str, Any]
    role: str  # "guard" or "action"
    timeout: Ref | None = None
    description: str = ""
    line: int | None = None


@attrs.frozen
class BudgetSpec:
    """How failure restarts are counted: by each agent or by the job, within a sliding window."""

    scope: str = "agent"
    window: Ref = _NEVER
    line: int | None = None


@attrs.frozen
class NamedBudgetSpec:
    """A budget of its own for the failures of one cause (``budgets: {infra: {max: ...}}``).

    ``max`` is a literal or an int parameter; ``window`` (None: the default budget's) a duration.
    It shares the default budget's ``scope``. Rules name it with ``budget: NAME``; its guard and
    action (``guard``, ``action``) are synthesized: nothing else spends it.
    """

    name: str
    max: Ref
    window: Ref | None = None
    description: str = ""
    line: int | None = None

    @property
    def guard(self) -> str:
        """The synthesized guard: a restart of this budget is left."""
        return f"has_{self.name}_restarts_left"

    @property
    def action(self) -> str:
        """The synthesized action: spend one restart of this budget."""
        return f"consume_{self.name}_restart"


@attrs.frozen
class OutcomeSpec:
    """Where a failure-policy outcome goes."""

    name: str
    dest: str
    actions: tuple[str, ...]
    restarts: bool  # counted against the budget (falls back to give_up without one)


@attrs.frozen
class RuleSpec:
    """One rule of a failure-policy table: when its guards hold (all of them), then the outcome."""

    name: str
    when: tuple[str, ...]
    then: str
    index: int
    line: int | None = None
    description: str = ""
    #: The named budget a restart by this rule spends (None: the default budget, max_restarts).
    budget: str | None = None


@attrs.frozen
class PolicySpec:
    """An ordered failure-policy table (first match wins) and where it decides."""

    on: tuple[tuple[str, str], ...]
    budget_guard: str
    rules: tuple[RuleSpec, ...]
    outcomes: Mapping[str, OutcomeSpec]
    line: int | None = None


@attrs.frozen(eq=False)
class Spec:
    """A checked lifecycle spec. Build one with ``load_spec`` or ``parse_spec``."""

    name: str
    description: str
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    metrics: tuple[MetricSpec, ...] = ()
    triggers: tuple[str, ...] = ()
    path: str = "<string>"
    vocabulary: Vocabulary = attrs.field(factory=Vocabulary.builtin, repr=False)
    params: tuple[ParamSpec, ...] = ()
    guard_defs: tuple[InstanceSpec, ...] = ()
    action_defs: tuple[InstanceSpec, ...] = ()
    budget: BudgetSpec = BudgetSpec()
    budgets: tuple[NamedBudgetSpec, ...] = ()
    policy: PolicySpec | None = None
    restart_forever: bool = False
    # Compiled engine artefacts, filled on first use by the engine (the spec itself never changes).
    _cache: dict[Any, Any] = attrs.field(factory=dict, repr=False, alias="_cache")

    @property
    def initial(self) -> str:
        """The name of the initial state."""
        return next(s.name for s in self.states if s.initial)

    @property
    def finals(self) -> frozenset[str]:
        """Names of the final states."""
        return frozenset(s.name for s in self.states if s.final)

    @property
    def state_names(self) -> tuple[str, ...]:
        """Every state's name, in file order."""
        return tuple(s.name for s in self.states)

    def state(self, name: str) -> StateSpec:
        """The state called ``name``."""
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    def edges(self) -> Iterator[tuple[str, str, str, TransitionSpec]]:
        """Every (trigger, source, dest, transition) the spec allows, in file order."""
        for t in self.transitions:
            for trigger in t.triggers:
                for source in t.sources:
                    yield trigger, source, t.dest, t

    def outgoing(self, source: str, trigger: str | None = None) -> list[TransitionSpec]:
        """Transitions leaving ``source`` (on ``trigger`` if given), in file order."""
        return [
            t
            for t in self.transitions
            if source in t.sources and (trigger is None or trigger in t.triggers)
        ]

    @property
    def all_triggers(self) -> tuple[str, ...]:
        """Every trigger a spec may use: start, always, timeout, the observations and its own."""
        return (START_TRIGGER, ALWAYS_TRIGGER, TIMEOUT_TRIGGER, *OBSERVATION_TRIGGERS,
                *self.triggers)

    @property
    def defaults(self) -> dict[str, Any]:
        """Every parameter's default value."""
        return {p.name: p.default for p in self.params}

    def bind(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Every parameter's value in force: its default, or the one ``params`` gives (a value,
        or spec-syntax text such as ``"90s"``). Raises ``SpecError`` naming this spec's file for
        an unknown name or a bad value."""
        return bind_params(self.params, params, path=self.path)

    def param(self, name: str) -> ParamSpec:
        """The parameter called ``name``."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def guard_names(self) -> frozenset[str]:
        """Every guard a transition may name: the vocabulary's and the spec's own."""
        return frozenset(self.vocabulary.guards) | {g.name for g in self.guard_defs}

    @property
    def action_names(self) -> frozenset[str]:
        """Every action a transition or state may name: the vocabulary's and the spec's own."""
        return frozenset(self.vocabulary.actions) | {a.name for a in self.action_defs}

    def is_terminal(self, action: str) -> bool:
        """Whether ``action``'s exception is the spec's outcome (``raise_failure``, ...)."""
        adef = self.vocabulary.actions.get(action)
        if adef is not None:
            return adef.terminal
        inst = next((a for a in self.action_defs if a.name == action), None)
        kind = self.vocabulary.action_kinds.get(inst.kind) if inst is not None else None
        return kind is not None and kind.terminal
