"""The shapes every section of a spec shares, for ``_shape``: where a problem is, and the checks
of one key, name, string or value on its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ._errors import Problem, SpecError
from ._params import BUILTIN_VALUES, ParamSpec, Ref, coerce
from ._units import BadValue, kind_of
from ._vocabulary import Vocabulary
from ._yaml import element_name

__all__ = ["Findings"]

# Words a duration may be written as: never parameter names.
_DURATION_WORDS = frozenset({"inf", "infinity", "never"})
_NUMERIC = ("int", "float", "duration")
# A name of the embedding program's own is unknown only until it is registered: say how.
_OWN_NAMES = ("; one of your program's own: register it in a fsm_agent.Vocabulary, "
              "--vocabulary MODULE:ATTR")


class Findings:
    """Problems found so far, each located by the element's path and the lines the reader saw."""

    def __init__(self, path: str, lines: Mapping[tuple[Any, ...], int]) -> None:
        self.path = path
        self.lines = lines
        self.problems: list[Problem] = []

    def line(self, where: Sequence[Any]) -> int | None:
        """The line of ``where``, or of its nearest enclosing element."""
        probe = tuple(where)
        while True:
            line = self.lines.get(probe)
            if line is not None or not probe:
                return line
            probe = probe[:-1]

    def problem(self, where: Sequence[Any], message: str) -> None:
        """Record one problem at ``where``."""
        self.problems.append(Problem(self.path, self.line(where), element_name(where), message))

    def fail_if_any(self) -> None:
        """Raise ``SpecError`` with every problem recorded so far."""
        if self.problems:
            raise SpecError(self.problems)



class _ShapeBase:
    """What the checks of every section share: the findings, the names declared so far and the
    small shapes."""

    def __init__(self, found: Findings, vocab: Vocabulary) -> None:
        self.found = found
        self.vocab = vocab
        self.params: dict[str, ParamSpec] = {}
        self.states: set[str] = set()
        self.guards: set[str] = set(vocab.guards)
        self.actions: set[str] = set(vocab.actions)
        self.budget_names: set[str] = set()
        self.budget_declared: dict[str, str] = {}  # a named budget's guard and action
        # Problems that leave the machine whole (a name of the program's own, unregistered):
        # the whole-spec checks still run, so one `check` shows every problem.
        self.unknown_names = 0

    def problem(self, where: Sequence[Any], message: str) -> None:
        self.found.problem(where, message)

    def line(self, where: Sequence[Any]) -> int | None:
        return self.found.lines.get(tuple(where))

    # -- small shapes ------------------------------------------------------------------------

    def _str(self, value: Any, where: tuple[Any, ...], *, ident: bool = False) -> str | None:
        if not isinstance(value, str) or not value.strip():
            self.problem(where, f"expected a non-empty string, got {kind_of(value)}")
            return None
        if ident and not value.isidentifier():
            self.problem(where, f"{value!r} is not a valid name (letters, digits, underscores)")
            return None
        return value

    def _text(self, body: Mapping[str, Any], where: tuple[Any, ...]) -> str:
        desc = body.get("description", "")
        if not isinstance(desc, str):
            self.problem((*where, "description"), f"expected a string, got {kind_of(desc)}")
            return ""
        return desc

    def _names(self, value: Any, where: tuple[Any, ...], *, single_ok: bool) -> tuple[str, ...]:
        if value is None:
            return ()
        if single_ok and isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            want = "a name or a list of names" if single_ok else "a list of names"
            self.problem(where, f"expected {want}, got {kind_of(value)}")
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
            self.problem(where, f"expected true or false, got {kind_of(value)}")
            return False
        return value

    def _keys(self, data: Mapping[str, Any], allowed: Iterable[str],
              where: tuple[Any, ...]) -> None:
        allowed = list(allowed)
        for key in data:
            if key not in allowed:
                self.problem((*where, key), f"unknown key {key!r} (allowed: {', '.join(allowed)})")

    def _mapping(self, value: Any, where: tuple[Any, ...], what: str) -> dict[str, Any] | None:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(where, f"expected {what}, got {kind_of(value)}")
            return None
        return value

    def _value(self, raw: Any, type_name: str, where: tuple[Any, ...]) -> Ref | None:
        """A literal of ``type_name``, or a reference to a parameter or built-in value."""
        if (isinstance(raw, str) and raw.isidentifier() and raw.lower() not in _DURATION_WORDS
                and (type_name != "str" or raw in self.params)):
            have = self.params[raw].type if raw in self.params else BUILTIN_VALUES.get(raw)
            if have is None:
                known = ", ".join([*self.params, *BUILTIN_VALUES])
                self.problem(where, f"unknown parameter {raw!r} (known: {known})")
                return None
            if not (have == type_name or (have in _NUMERIC and type_name in _NUMERIC[1:])
                    or (have == "int" and type_name == "count")):
                self.problem(where, f"parameter {raw!r} is a {have}; a {type_name} is needed here")
                return None
            return Ref(name=raw)
        try:
            return Ref(coerce(type_name, raw))
        except BadValue as e:
            self.problem(where, str(e))
            return None

    def _check_actions(self, names: Sequence[str], where: tuple[Any, ...]) -> None:
        self._check_known("action", names, self.actions, where)

    def _check_guards(self, names: Sequence[str], where: tuple[Any, ...]) -> None:
        self._check_known("guard", names, self.guards, where)

    def _check_known(self, what: str, names: Sequence[str], known: Collection[str],
                     where: tuple[Any, ...]) -> None:
        for i, name in enumerate(names):
            if name not in known:
                self.unknown_names += 1
                self.problem((*where, i),
                             f"unknown {what} {name!r} (known: {', '.join(sorted(known))}"
                             f"{_OWN_NAMES})")

    def _state_ref(self, name: Any, where: tuple[Any, ...]) -> str | None:
        if not isinstance(name, str) or name not in self.states:
            self.problem(where, f"unknown state {name!r} (states: "
                         f"{', '.join(sorted(self.states)) or 'none'})")
            return None
        return name
