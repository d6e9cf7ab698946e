"""Spec parameters: typed values with defaults and bounds, and the value syntax they share.

One syntax everywhere a value is written: in a spec (``default: 10m``), on the command line
(``--spec-param backoff_max=90s``) and in ``Lifecycle(..., params={...})``. Durations are seconds
(``1.5``) or a number with a unit (``500ms``, ``5s``, ``10m``, ``2h``), ``inf`` meaning never;
a count is an integer >= 0 or ``inf`` (unlimited: a budget that never runs out); lists of
integers are YAML lists, or ``[3,4]``/``3,4`` on the command line. Durations are read and
written by ``fsm_agent._core._units``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._driver import Driver, members
from ._units import BadValue, format_seconds, kind_of, parse_duration

__all__ = [
    "BUILTIN_VALUES",
    "PARAM_TYPES",
    "ParamSpec",
    "Ref",
    "bind_params",
    "check_settings",
    "coerce",
    "format_param",
    "format_value",
    "parse_text",
]

#: The type names a parameter (or a guard's argument) may have.
PARAM_TYPES: tuple[str, ...] = ("int", "count", "float", "duration", "int_list", "str_list", "str",
                                 "bool")
#: Values every spec may refer to by name: the agent's own settings, not spec parameters.
BUILTIN_VALUES: Mapping[str, str] = {"max_restarts": "int", "exit_barrier_timeout": "duration"}


def coerce(type_name: str, value: Any) -> Any:
    """``value`` (YAML data or a Python value) as a value of ``type_name``; raises BadValue."""
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"expected an integer, got {kind_of(value)}")
        return value
    if type_name == "count":
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "unlimited"):
            return math.inf
        if isinstance(value, float) and math.isinf(value) and value > 0:
            return math.inf
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"expected a count (an integer >= 0, or inf), got {kind_of(value)}")
        if value < 0:
            raise BadValue(f"expected a count (an integer >= 0, or inf), got {value}")
        return value
    if type_name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise BadValue(f"expected a number, got {kind_of(value)}")
        return float(value)
    if type_name == "duration":
        return parse_duration(value)
    if type_name == "int_list":
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise BadValue(f"expected a list of integers, got {kind_of(value)}")
        out = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise BadValue(f"expected a list of integers, but it holds {kind_of(item)}")
            out.append(item)
        return tuple(out)
    if type_name == "str_list":
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise BadValue(f"expected a list of names, got {kind_of(value)}")
        if not all(isinstance(item, str) and item.strip() for item in value):
            raise BadValue("expected a list of names, but it holds something else")
        return tuple(item.strip() for item in value)
    if type_name == "str":
        if not isinstance(value, str):
            raise BadValue(f"expected a string, got {kind_of(value)}")
        return value
    if type_name == "bool":
        if not isinstance(value, bool):
            raise BadValue(f"expected true or false, got {kind_of(value)}")
        return value
    raise BadValue(f"unknown type {type_name!r} (types: {', '.join(PARAM_TYPES)})")


def parse_text(type_name: str, text: str) -> Any:
    """A value of ``type_name`` from command-line text (``90s``, ``[3,4]``, ``3,4``, ``true``)."""
    raw: Any = text.strip()
    if type_name == "int":
        try:
            raw = int(raw, 10)
        except ValueError:
            raise BadValue(f"expected an integer, got {text!r}") from None
    elif type_name == "count" and raw.lower() not in ("inf", "infinity", "unlimited"):
        try:
            raw = int(raw, 10)
        except ValueError:
            raise BadValue(f"expected a count (an integer >= 0, or inf), got {text!r}") from None
    elif type_name == "float":
        try:
            raw = float(raw)
        except ValueError:
            raise BadValue(f"expected a number, got {text!r}") from None
    elif type_name in ("int_list", "str_list"):
        body = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
        items = [p.strip() for p in body.split(",")] if body.strip() else []
        if type_name == "str_list":
            return coerce(type_name, items)
        try:
            raw = [int(p, 10) for p in items]
        except ValueError:
            raise BadValue(
                f"expected a list of integers such as [3,4] or 3,4, got {text!r}"
            ) from None
    elif type_name == "bool":
        low = raw.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise BadValue(f"expected true or false, got {text!r}")
        raw = low in ("true", "1", "yes")
    return coerce(type_name, raw)


def format_value(value: Any) -> str:
    """A value as the spec syntax writes it (``inf``, ``[3, 4]``, ``90s``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def format_param(type_name: str, value: Any) -> str:
    """A value of a parameter of ``type_name`` as the command line writes it (``--spec-param
    backoff_max=90s``): durations with their unit, others as :func:`format_value`."""
    if type_name == "duration" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_seconds(float(value))
    return format_value(value)


@attrs.frozen
class ParamSpec:
    """A declared spec parameter: its type, default and bounds."""

    name: str
    type: str
    default: Any
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    description: str = ""
    line: int | None = None

    def check(self, value: Any) -> Any:
        """``value`` coerced to this parameter's type and checked against its bounds."""
        value = coerce(self.type, value)
        items = value if self.type.endswith("_list") else (value,)
        for item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                if self.min is not None and item < self.min:
                    raise BadValue(f"{format_value(item)} is below the minimum "
                                      f"{format_value(self.min)}")
                if self.max is not None and item > self.max:
                    raise BadValue(f"{format_value(item)} is above the maximum "
                                      f"{format_value(self.max)}")
        for item in items:
            if self.choices and item not in self.choices:
                raise BadValue(f"{item!r} is not one of {', '.join(self.choices)}")
        return value





@attrs.frozen
class Ref:
    """A value as a spec writes it: a literal, or the name of a parameter or built-in value."""

    value: Any = None
    name: str | None = None

    def resolve(self, values: Mapping[str, Any]) -> Any:
        """The literal, or the named value in ``values``."""
        return values[self.name] if self.name is not None else self.value

    def __str__(self) -> str:
        return self.name if self.name is not None else format_value(self.value)


def bind_params(
    params: Sequence[ParamSpec], overrides: Mapping[str, Any] | None, *, path: str = "<string>"
) -> dict[str, Any]:
    """Every parameter's value in force: its default, or the override (checked).

    Raises ``SpecError`` naming the parameter (and the spec's line declaring it) for an unknown
    name or a value of the wrong type or out of range. Overrides given as text (from the command
    line) are parsed with the spec syntax (``90s``, ``[3,4]``).
    """
    if not overrides:
        return {p.name: p.default for p in params}
    from ._errors import Problem, SpecError

    declared = {p.name: p for p in params}
    values = {p.name: p.default for p in params}
    problems = []
    for name, raw in (overrides or {}).items():
        spec = declared.get(name)
        if spec is None:
            known = ", ".join(sorted(declared)) or "none"
            problems.append(Problem(path, None, f"params.{name}",
                                    f"unknown parameter {name!r} (this spec's: {known})"))
            continue
        try:
            values[name] = spec.check(parse_text(spec.type, raw) if isinstance(raw, str)
                                      and spec.type != "str" else raw)
        except BadValue as e:
            problems.append(Problem(path, spec.line, f"params.{name}",
                                    f"bad value {raw!r}: {e}"))
    if problems:
        raise SpecError(problems)
    return values


#: What a driver must have: the methods of the ``Driver`` Protocol.
_DRIVER_METHODS = members(Driver)


def check_settings(driver: Any, *, role: Any, max_restarts: Any,
                   exit_barrier_timeout: Any) -> None:
    """A ``Lifecycle``'s own settings (not the spec's parameters): ``ValueError`` or
    ``TypeError`` naming the one that is wrong."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    # torch accepts 0 (the barrier then waits for nobody: it passes only if every agent is
    # already there); negative and NaN are refused here, not later at the barrier.
    if (isinstance(exit_barrier_timeout, bool) or not isinstance(exit_barrier_timeout, (int,
            float)) or not exit_barrier_timeout >= 0):
        raise ValueError(f"exit_barrier_timeout must be a number of seconds >= 0, got "
                         f"{exit_barrier_timeout!r}")
    if not isinstance(role, str) or not role:
        raise ValueError(f"role must be a non-empty string, got {role!r}")
    missing = [m for m in _DRIVER_METHODS if not callable(getattr(driver, m, None))]
    if missing:
        raise TypeError(f"driver {type(driver).__name__} lacks {', '.join(missing)}")
