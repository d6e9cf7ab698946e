"""Lifecycle specs: loading YAML safely, checking it, and the immutable ``Spec`` model.

Every rule here reports the file, the line and the element, and all findings are reported at
once. Loading never executes anything: the YAML is composed with PyYAML's safe loader into nodes
and only plain mappings, sequences and scalars with the standard tags are accepted.
"""

from __future__ import annotations

import itertools
import os
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from ._errors import Problem, SpecError
from ._files import read_bounded
from ._vocabulary import Vocabulary

__all__ = [
    "OBSERVATION_TRIGGERS",
    "STATE_NAMES",
    "MetricSpec",
    "Spec",
    "StateSpec",
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
START_TRIGGER = "start"
ALWAYS_TRIGGER = "always"
#: The trigger of the final trace record a supervisor writes when a signal interrupts the lifecycle
#: between two transitions. Reserved: no spec may use it.
INTERRUPT_TRIGGER = "signal"
#: The state the engine enters when an action fails; reachable whatever the transitions say.
ERROR_STATE = "UNKNOWN"

METRIC_FIELDS = ("role", "observed")
METRIC_VALUES = ("remaining_restarts", "restart_count", "max_restarts")

MAX_SPEC_BYTES = 1 << 20
MAX_NODES = 20_000
MAX_DEPTH = 64
# Exhaustiveness is checked by enumerating guard assignments; beyond this it is skipped.
MAX_EXHAUSTIVE_GUARDS = 12

_TOP_KEYS = {
    "name": True,
    "description": True,
    "states": True,
    "transitions": True,
    "metrics": False,
    "triggers": False,
}
_STATE_KEYS = {"initial", "final", "enter", "exit", "description"}
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
_CORE_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "bool", "null", "float", "map", "seq")
}

PRESETS_DIR_ENV = "FSM_AGENT_SPECS"

# libyaml's composer when PyYAML has it (ten times faster); both build the same inert nodes.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@attrs.frozen
class StateSpec:
    """One state of a spec."""

    name: str
    initial: bool = False
    final: bool = False
    enter: tuple[str, ...] = ()
    exit: tuple[str, ...] = ()
    description: str = ""
    line: int | None = None


@attrs.frozen
class TransitionSpec:
    """One transition entry of a spec; it may cover several triggers and sources."""

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

    def holds_with(self, assignment: Mapping[str, bool]) -> bool:
        """Whether the guards pass under ``assignment`` (guard name -> value)."""
        return all(assignment[g] for g in self.guards) and not any(
            assignment[g] for g in self.unless
        )


@attrs.frozen
class MetricSpec:
    """A metric put on every monitor tick; ``name`` is a template over ``{role}``/``{observed}``."""

    name: str
    value: int | str
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
    # Compiled engine artefacts, filled on first use by the engine (the spec itself never changes).
    _cache: dict[str, Any] = attrs.field(factory=dict, repr=False, alias="_cache")

    @property
    def initial(self) -> str:
        """The name of the initial state."""
        return next(s.name for s in self.states if s.initial)

    @property
    def finals(self) -> frozenset[str]:
        """Names of the final states."""
        return frozenset(s.name for s in self.states if s.final)

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
        """Every trigger a spec may use: start, always, the observations and its own."""
        return (START_TRIGGER, ALWAYS_TRIGGER, *OBSERVATION_TRIGGERS, *self.triggers)


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
    """Names of the built-in specs (``torchelastic``, ``torchrun``, ...)."""
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
    ``vocabulary`` adds the embedding program's own guards and actions.
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
    reader = _Reader(path)
    raw = reader.read(text)
    return _Checker(path, vocab, reader.lines).check(raw)


class _Reader:
    """YAML text to plain data, remembering the line of every element."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: dict[tuple[Any, ...], int] = {}
        self._count = 0
        # Only ever given scalar nodes with core tags (checked first), so it builds str/int/bool.
        self._constructor = yaml.constructor.SafeConstructor()  # type: ignore[no-untyped-call]

    def read(self, text: str) -> Any:
        try:
            # compose() builds nodes only; constructing them ourselves is what keeps tags inert.
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark is not None else None
            msg = " ".join(str(x) for x in (e.context, e.problem) if x)
            if e.context_mark is not None and mark is not e.context_mark:
                msg += f" (the construct started on line {e.context_mark.line + 1})"
            raise SpecError.single(self.path, line, "", f"YAML syntax error: {msg}") from None
        except yaml.reader.ReaderError as e:
            # Raised for characters YAML forbids; it knows the offset, not the line.
            line = text[: e.position].count("\n") + 1
            raise SpecError.single(
                self.path, line, "", f"character {_codepoint(e.character)} is not allowed in YAML "
                f"({e.reason})"
            ) from None
        except yaml.YAMLError as e:
            raise SpecError.single(self.path, None, "", f"YAML error: {e}") from None
        except RecursionError:
            # The pure-Python composer recurses per level (libyaml's does not).
            raise SpecError.single(
                self.path, None, "", f"nested more than {MAX_DEPTH} levels deep (no spec is)"
            ) from None
        if node is None:
            raise SpecError.single(self.path, 1, "", "empty spec")
        return self._build(node, ())

    def _build(self, node: yaml.Node, where: tuple[Any, ...]) -> Any:
        self._count += 1
        line = node.start_mark.line + 1
        if self._count > MAX_NODES:
            raise SpecError.single(
                self.path, line, _element(where), f"spec too large (more than {MAX_NODES} elements)"
            )
        if len(where) > MAX_DEPTH:
            # Checked before recursing further: a nesting bomb is an error, not a RecursionError.
            raise SpecError.single(
                self.path, line, "", f"nested more than {MAX_DEPTH} levels deep (no spec is)"
            )
        self.lines[where] = line
        if node.tag not in _CORE_TAGS:
            raise SpecError.single(
                self.path, line, _element(where), f"YAML tag {node.tag!r} is not allowed in a spec"
            )
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    raise SpecError.single(
                        self.path,
                        knode.start_mark.line + 1,
                        _element(where),
                        "mapping keys must be plain scalars",
                    )
                key = self._build(knode, (*where, "<key>"))
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    raise SpecError.single(
                        self.path,
                        knode.start_mark.line + 1,
                        _element((*where, key)),
                        f"duplicate key {key!r}",
                    )
                self.lines[(*where, key)] = knode.start_mark.line + 1
                out[key] = self._build(vnode, (*where, key))
                self.lines[(*where, key)] = knode.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(item, (*where, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._constructor.construct_object(node)  # type: ignore[no-untyped-call]


def _element(where: Sequence[Any]) -> str:
    out = ""
    for part in where:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Checker:
    def __init__(self, path: str, vocab: Vocabulary, lines: dict[tuple[Any, ...], int]) -> None:
        self.path = path
        self.vocab = vocab
        self.lines = lines
        self.problems: list[Problem] = []

    def problem(self, where: tuple[Any, ...], message: str) -> None:
        line = None
        probe: tuple[Any, ...] | None = where
        while line is None and probe is not None:
            line = self.lines.get(probe)
            probe = probe[:-1] if probe else None
        self.problems.append(Problem(self.path, line, _element(where), message))

    def fail_if_any(self) -> None:
        if self.problems:
            raise SpecError(self.problems)

    # -- shapes ------------------------------------------------------------------------------

    def _str(self, value: Any, where: tuple[Any, ...], *, ident: bool = False) -> str | None:
        if not isinstance(value, str) or not value.strip():
            self.problem(where, f"expected a non-empty string, got {_kind(value)}")
            return None
        if ident and not value.isidentifier():
            self.problem(where, f"{value!r} is not a valid name (letters, digits, underscores)")
            return None
        return value

    def _names(self, value: Any, where: tuple[Any, ...], *, single_ok: bool) -> tuple[str, ...]:
        if value is None:
            return ()
        if single_ok and isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            want = "a name or a list of names" if single_ok else "a list of names"
            self.problem(where, f"expected {want}, got {_kind(value)}")
            return ()
        out = []
        for i, item in enumerate(value):
            where_i = where if single_ok and not isinstance(value, list) else (*where, i)
            name = self._str(item, where_i, ident=True)
            if name is not None:
                if name in out:
                    self.problem(where_i, f"{name!r} is listed twice")
                out.append(name)
        return tuple(out)

    def _bool(self, value: Any, where: tuple[Any, ...]) -> bool:
        if not isinstance(value, bool):
            self.problem(where, f"expected true or false, got {_kind(value)}")
            return False
        return value

    def _keys(self, data: dict[str, Any], allowed: Iterable[str], where: tuple[Any, ...]) -> None:
        allowed = list(allowed)
        for key in data:
            if key not in allowed:
                self.problem((*where, key), f"unknown key {key!r} (allowed: {', '.join(allowed)})")

    # -- the whole spec ----------------------------------------------------------------------

    def check(self, raw: Any) -> Spec:
        if not isinstance(raw, dict):
            self.problem((), f"a spec is a mapping at the top level, got {_kind(raw)}")
            self.fail_if_any()
        self._keys(raw, _TOP_KEYS, ())
        for key, required in _TOP_KEYS.items():
            if required and key not in raw:
                self.problem((), f"missing required key {key!r}")
        name = self._str(raw.get("name"), ("name",)) if "name" in raw else None
        description = raw.get("description", "")
        if "description" in raw and not isinstance(description, str):
            self.problem(("description",), f"expected a string, got {_kind(description)}")
            description = ""
        extra_triggers = self._names(raw.get("triggers"), ("triggers",), single_ok=False)
        for i, trig in enumerate(extra_triggers):
            if trig in (START_TRIGGER, ALWAYS_TRIGGER, *OBSERVATION_TRIGGERS):
                self.problem(("triggers", i), f"{trig!r} is a built-in trigger; do not declare it")
            elif trig == INTERRUPT_TRIGGER:
                self.problem(("triggers", i), f"{trig!r} is reserved for the record of an "
                             "interrupted lifecycle in traces")
        states = self._states(raw.get("states"))
        transitions = self._transitions(raw.get("transitions"))
        metrics = self._metrics(raw.get("metrics"))
        self.fail_if_any()
        spec = Spec(
            name=name or "",
            description=description,
            states=states,
            transitions=transitions,
            metrics=metrics,
            triggers=extra_triggers,
            path=self.path,
            vocabulary=self.vocab,
        )
        self._semantics(spec)
        self.fail_if_any()
        return spec

    def _states(self, value: Any) -> tuple[StateSpec, ...]:
        where: tuple[Any, ...] = ("states",)
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(where, f"expected a mapping of state names, got {_kind(value)}")
            return ()
        out = []
        for name, body in value.items():
            w = (*where, name)
            if name not in STATE_NAMES:
                self.problem(
                    w,
                    f"unknown state {name!r}; states are torch's WorkerState members: "
                    f"{', '.join(STATE_NAMES)}",
                )
                continue
            body = {} if body is None else body  # noqa: PLW2901 - a bare `STATE:` means no options
            if not isinstance(body, dict):
                self.problem(
                    w,
                    f"expected a mapping (initial, final, enter, exit, description), "
                    f"got {_kind(body)}",
                )
                continue
            self._keys(body, sorted(_STATE_KEYS), w)
            desc = body.get("description", "")
            if not isinstance(desc, str):
                self.problem((*w, "description"), f"expected a string, got {_kind(desc)}")
                desc = ""
            enter = self._names(body.get("enter"), (*w, "enter"), single_ok=False)
            exit_ = self._names(body.get("exit"), (*w, "exit"), single_ok=False)
            for key, names in (("enter", enter), ("exit", exit_)):
                self._check_actions(names, (*w, key))
            out.append(
                StateSpec(
                    name=name,
                    initial=self._bool(body.get("initial", False), (*w, "initial")),
                    final=self._bool(body.get("final", False), (*w, "final")),
                    enter=enter,
                    exit=exit_,
                    description=desc,
                    line=self.lines.get(w),
                )
            )
        missing = [s for s in STATE_NAMES if s not in value]
        if missing:
            self.problem(
                where,
                f"missing state(s) {', '.join(missing)}: a lifecycle has all seven "
                "of torch's WorkerState members",
            )
        return tuple(out)

    def _check_actions(self, names: Sequence[str], where: tuple[Any, ...]) -> None:
        for i, name in enumerate(names):
            if name not in self.vocab.actions:
                self.problem(
                    (*where, i),
                    f"unknown action {name!r} (known: {', '.join(sorted(self.vocab.actions))})",
                )

    def _transitions(self, value: Any) -> tuple[TransitionSpec, ...]:
        where: tuple[Any, ...] = ("transitions",)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(where, f"expected a list of transitions, got {_kind(value)}")
            return ()
        out = []
        for i, body in enumerate(value):
            w = (*where, i)
            if not isinstance(body, dict):
                self.problem(
                    w, f"expected a mapping (trigger, source, dest, ...), got {_kind(body)}"
                )
                continue
            self._keys(body, _TRANSITION_KEYS, w)
            for key, required in _TRANSITION_KEYS.items():
                if required and key not in body:
                    self.problem(w, f"missing required key {key!r}")
            triggers = self._names(body.get("trigger"), (*w, "trigger"), single_ok=True)
            sources = self._sources(body.get("source"), (*w, "source"))
            dest = body.get("dest")
            if "dest" in body and (not isinstance(dest, str) or dest not in STATE_NAMES):
                self.problem(
                    (*w, "dest"), f"unknown state {dest!r} (states: {', '.join(STATE_NAMES)})"
                )
                dest = None
            guards = self._names(body.get("guards"), (*w, "guards"), single_ok=False)
            unless = self._names(body.get("unless"), (*w, "unless"), single_ok=False)
            for key, names in (("guards", guards), ("unless", unless)):
                for j, g in enumerate(names):
                    if g not in self.vocab.guards:
                        self.problem(
                            (*w, key, j),
                            f"unknown guard {g!r} (known: {', '.join(sorted(self.vocab.guards))})",
                        )
            for g in set(guards) & set(unless):
                self.problem(
                    (*w, "unless"),
                    f"guard {g!r} is both required and forbidden: "
                    "this transition can never be taken",
                )
            actions = self._names(body.get("actions"), (*w, "actions"), single_ok=False)
            after = self._names(body.get("after"), (*w, "after"), single_ok=False)
            self._check_actions(actions, (*w, "actions"))
            self._check_actions(after, (*w, "after"))
            desc = body.get("description", "")
            if not isinstance(desc, str):
                self.problem((*w, "description"), f"expected a string, got {_kind(desc)}")
                desc = ""
            if not triggers or not sources or not isinstance(dest, str):
                continue
            out.append(
                TransitionSpec(
                    triggers=triggers,
                    sources=sources,
                    dest=dest,
                    guards=guards,
                    unless=unless,
                    actions=actions,
                    after=after,
                    description=desc,
                    index=i,
                    line=self.lines.get(w),
                )
            )
        return tuple(out)

    def _sources(self, value: Any, where: tuple[Any, ...]) -> tuple[str, ...]:
        names = self._names(value, where, single_ok=True)
        ok = []
        for i, name in enumerate(names):
            if name not in STATE_NAMES:
                w = where if isinstance(value, str) else (*where, i)
                self.problem(w, f"unknown state {name!r} (states: {', '.join(STATE_NAMES)})")
            else:
                ok.append(name)
        return tuple(ok) if len(ok) == len(names) else ()

    def _metrics(self, value: Any) -> tuple[MetricSpec, ...]:
        where: tuple[Any, ...] = ("metrics",)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(where, f"expected a list of metrics, got {_kind(value)}")
            return ()
        out = []
        for i, body in enumerate(value):
            w = (*where, i)
            if not isinstance(body, dict):
                self.problem(w, f"expected a mapping (name, value), got {_kind(body)}")
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
            if isinstance(val, bool) or not (isinstance(val, int) or val in METRIC_VALUES):
                self.problem(
                    (*w, "value"),
                    f"expected an integer or one of {', '.join(METRIC_VALUES)}, got {val!r}",
                )
                continue
            if name is not None:
                out.append(MetricSpec(name=name, value=val, line=self.lines.get(w)))
        return tuple(out)

    # -- meaning -----------------------------------------------------------------------------

    def _tline(self, t: TransitionSpec, *rest: Any) -> tuple[Any, ...]:
        return ("transitions", t.index, *rest)

    def _semantics(self, spec: Spec) -> None:
        initials = [s for s in spec.states if s.initial]
        if not initials:
            self.problem(("states",), "no initial state (mark exactly one with 'initial: true')")
        for s in initials[1:]:
            self.problem(
                ("states", s.name, "initial"),
                f"several initial states: {', '.join(x.name for x in initials)}",
            )
        finals = spec.finals
        known_triggers = set(spec.all_triggers)
        for t in spec.transitions:
            for i, trig in enumerate(t.triggers):
                if trig not in known_triggers:
                    self.problem(
                        self._tline(t, "trigger")
                        if len(t.triggers) == 1
                        else self._tline(t, "trigger", i),
                        f"unknown trigger {trig!r} (built-in: start, always, "
                        f"{', '.join(OBSERVATION_TRIGGERS)}; declare others under "
                        "'triggers')",
                    )
            for src in t.sources:
                if src in finals:
                    self.problem(
                        self._tline(t, "source"), f"final state {src} has an outgoing transition"
                    )
            if ALWAYS_TRIGGER in t.triggers and len(t.triggers) > 1:
                self.problem(
                    self._tline(t, "trigger"), "'always' cannot be combined with other triggers"
                )
            if ALWAYS_TRIGGER in t.triggers and t.dest in t.sources:
                self.problem(
                    self._tline(t, "dest"),
                    "an 'always' transition back to its own source would never stop",
                )
        if initials:
            self._reachability(spec, initials[0].name)
        for s in spec.states:
            if not s.final and not spec.outgoing(s.name):
                self.problem(("states", s.name), f"state {s.name} is not final and has no way out")
        self._determinism(spec)
        self._exhaustive(spec, initials[0].name if initials else None)
        self._always_acyclic(spec)

    def _reachability(self, spec: Spec, initial: str) -> None:
        seen = {initial, ERROR_STATE}
        frontier = [initial]
        while frontier:
            src = frontier.pop()
            for t in spec.outgoing(src):
                if t.dest not in seen:
                    seen.add(t.dest)
                    frontier.append(t.dest)
        for s in spec.states:
            if s.name not in seen:
                self.problem(
                    ("states", s.name),
                    f"state {s.name} cannot be reached from the initial state {initial}",
                )

    def _determinism(self, spec: Spec) -> None:
        reported: set[tuple[int, int]] = set()
        for src in STATE_NAMES:
            for trig in spec.all_triggers:
                cands = spec.outgoing(src, trig)
                for a, b in itertools.combinations(cands, 2):
                    exclusive = set(a.guards) & set(b.unless) or set(a.unless) & set(b.guards)
                    if exclusive or (a.index, b.index) in reported:
                        continue
                    reported.add((a.index, b.index))
                    self.problem(
                        self._tline(b),
                        f"nondeterministic: on {trig!r} from {src} this transition and "
                        f"transitions[{a.index}] (line {a.line}) can both be taken; make their "
                        "guards exclusive (one requires a guard the other forbids with 'unless')",
                    )

    def _covers(self, cands: Sequence[TransitionSpec]) -> dict[str, bool] | None:
        """An assignment of guards under which no candidate holds, or None if they cover all."""
        names = sorted({g for t in cands for g in (*t.guards, *t.unless)})
        if len(names) > MAX_EXHAUSTIVE_GUARDS:
            return None
        for values in itertools.product((False, True), repeat=len(names)):
            assignment = dict(zip(names, values, strict=True))
            if not any(t.holds_with(assignment) for t in cands):
                return assignment
        return None

    def _exhaustive(self, spec: Spec, initial: str | None) -> None:
        for s in spec.states:
            if s.final or s.name == initial:
                continue
            always = spec.outgoing(s.name, ALWAYS_TRIGGER)
            if always:
                gap = self._covers(always)
                if gap is not None:
                    self.problem(
                        self._tline(always[0]),
                        f"the 'always' transitions of {s.name} "
                        f"do not cover guards {_fmt(gap)}: the machine would be stuck",
                    )
                continue
            # A state the machine rests in is observed on every monitor tick: each of torch's
            # seven results must lead somewhere, or the run fails at runtime instead of here.
            for trig in OBSERVATION_TRIGGERS:
                cands = spec.outgoing(s.name, trig)
                if not cands:
                    self.problem(
                        ("states", s.name),
                        f"state {s.name} is observed on every "
                        f"monitor tick but has no transition on {trig!r}",
                    )
                    continue
                gap = self._covers(cands)
                if gap is not None:
                    self.problem(
                        self._tline(cands[0]),
                        f"on {trig!r} from {s.name} no transition is taken when {_fmt(gap)}",
                    )

    def _always_acyclic(self, spec: Spec) -> None:
        graph = {s: [t.dest for t in spec.outgoing(s, ALWAYS_TRIGGER)] for s in STATE_NAMES}
        state: dict[str, int] = {}

        def visit(node: str, stack: list[str]) -> None:
            state[node] = 1
            for nxt in graph[node]:
                if state.get(nxt) == 1:
                    cycle = [*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt]
                    self.problem(
                        ("transitions",), "'always' transitions form a cycle: " + " -> ".join(cycle)
                    )
                elif nxt not in state:
                    visit(nxt, [*stack, nxt])
            state[node] = 2

        for s in STATE_NAMES:
            if s not in state:
                visit(s, [s])


def _fmt(assignment: Mapping[str, bool]) -> str:
    return ", ".join(f"{k}={'true' if v else 'false'}" for k, v in assignment.items()) or "always"


def _codepoint(char: str | int) -> str:
    return f"U+{char if isinstance(char, int) else ord(char):04X}"


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
