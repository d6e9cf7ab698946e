"""Lifecycle specs: the immutable ``Spec`` model, and loading one by preset name or path.

Loading is three steps, each in a module of its own: ``_yaml`` reads the text safely into plain
data with the line of every element, ``_shape`` checks that data key by key into a ``Spec`` (and
``_policy`` compiles its failure-policy table into ordinary transitions), and ``_static`` checks
what the spec means (reachability, determinism, bounded restart cycles, timers, rules). Every
problem names the file, the line and the element, and all are reported at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from ._errors import SpecError
from ._files import read_bounded
from ._params import ParamSpec, Ref
from ._vocabulary import Vocabulary

__all__ = [
    "ALWAYS_TRIGGER",
    "ERROR_STATE",
    "FAILURE_TRIGGERS",
    "INTERRUPT_TRIGGER",
    "OBSERVATION_TRIGGERS",
    "START_TRIGGER",
    "STATE_NAMES",
    "TIMEOUT_TRIGGER",
    "BackoffSpec",
    "BudgetSpec",
    "InstanceSpec",
    "MetricSpec",
    "OutcomeSpec",
    "PolicySpec",
    "RuleSpec",
    "Spec",
    "StateSpec",
    "TimeoutSpec",
    "TransitionSpec",
    "load_spec",
    "parse_spec",
    "preset_names",
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

MAX_SPEC_BYTES = 1 << 20
# Immutable, so safe as shared defaults.
_NEVER = Ref(float("inf"))
_ZERO = Ref(0.0)
PRESETS_DIR_ENV = "FSM_AGENT_SPECS"


@attrs.frozen
class BackoffSpec:
    """An exponential backoff: ``min(max, initial * factor**n)``, jittered, reset after a while."""

    initial: Ref
    factor: Ref
    max: Ref
    jitter: Ref = _ZERO
    reset_after: Ref = _NEVER


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


# --------------------------------------------------------------------------------------------
# Loading


def _spec_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    dirs = []
    if os.environ.get(PRESETS_DIR_ENV):
        dirs.append(Path(os.environ[PRESETS_DIR_ENV]))
    # An installed wheel carries the presets inside the package; a source checkout (and an
    # editable install) reads the repository's top-level specs/ directory.
    dirs += [here / "specs", here.parent / "specs"]
    return [d for d in dirs if d.is_dir()]


def preset_names() -> list[str]:
    """Names of the built-in specs (``torchelastic``, ``torchrun``, ``resilient``)."""
    names: set[str] = set()
    for d in _spec_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _resolve(name_or_path: str | os.PathLike[str]) -> Path:
    text = os.fspath(name_or_path)
    path = Path(text)
    looks_like_path = (
        isinstance(name_or_path, os.PathLike)
        or os.sep in text
        or "/" in text
        or path.suffix in (".yaml", ".yml")
    )
    if looks_like_path or path.is_file():
        return path
    for d in _spec_dirs():
        candidate = d / f"{text}.yaml"
        if candidate.is_file():
            return candidate
    raise SpecError.single(
        text,
        None,
        "",
        f"no such spec file or preset (presets: {', '.join(preset_names()) or 'none found'})",
    )


_LOAD_CACHE: dict[tuple[str, int, int, int], Spec] = {}


def load_spec(
    name_or_path: str | os.PathLike[str] | Spec, *, vocabulary: Vocabulary | None = None
) -> Spec:
    """Load and check a spec by preset name (``"torchelastic"``) or file path.

    Raises ``SpecError`` naming the file, line and element of every problem found.
    ``vocabulary`` adds the embedding program's own guards, actions and kinds.
    """
    if isinstance(name_or_path, Spec):
        return name_or_path
    vocab = vocabulary or Vocabulary.builtin()
    path = _resolve(name_or_path)
    shown = str(path)
    try:
        st = path.stat()
        if st.st_size > MAX_SPEC_BYTES:
            raise SpecError.single(
                shown,
                None,
                "",
                f"file is {st.st_size} bytes; a spec may be at most {MAX_SPEC_BYTES}",
            )
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size, id(vocab))
        if key in _LOAD_CACHE:
            return _LOAD_CACHE[key]
        # Bounded and never blocking: a FIFO or /dev/zero is refused, not read for ever.
        data = read_bounded(path, MAX_SPEC_BYTES, "spec")
    except OSError as e:
        raise SpecError.single(shown, None, "", f"cannot read spec: {e.strerror or e}") from None
    spec = parse_spec(data, path=shown, vocabulary=vocab)
    _LOAD_CACHE[key] = spec
    return spec


def parse_spec(
    source: str | bytes, *, path: str = "<string>", vocabulary: Vocabulary | None = None
) -> Spec:
    """Parse and check a spec from YAML text. Raises ``SpecError``."""
    from ._shape import build_spec
    from ._static import check_spec
    from ._yaml import YamlReader

    vocab = vocabulary or Vocabulary.builtin()
    if isinstance(source, bytes):
        if len(source) > MAX_SPEC_BYTES:
            raise SpecError.single(
                path, None, "", f"spec is {len(source)} bytes; at most {MAX_SPEC_BYTES} allowed"
            )
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as e:
            line = source[: e.start].count(b"\n") + 1
            raise SpecError.single(
                path, line, "", f"not valid UTF-8 (byte {source[e.start]:#04x} at offset {e.start})"
            ) from None
    else:
        text = source
    reader = YamlReader(path)
    raw = reader.read(text)
    spec = build_spec(raw, path=path, vocabulary=vocab, lines=reader.lines)
    check_spec(spec, lines=reader.lines)
    return spec
