"""Durations and sizes: read from the text flags and specs write (``90s``, ``10MB``), and written
back, in the spec's syntax or for people to read.

Every way fsm_agent writes a duration is here, side by side: their outputs differ, and each is
relied on as it is (a spec reads it back, a report or a table in the docs shows it). 0.5, 90
and 7260 seconds are written:

- :func:`format_seconds`, the spec's syntax (flags, legends, trace headers): ``500ms``, ``90s``,
  ``121m``; ``inf``;
- :func:`format_duration`, ``fsm-agent check --bounds``: ``0.5 s``, ``90.0 s``, ``2 h 1 min``;
  ``never``;
- :func:`format_elapsed`, the run summary and the report: ``0.50 s``, ``1 min 30 s``,
  ``2 h 01 min``;
- :func:`format_plain_seconds`, replay's messages: ``0.5 s``, ``90 s``, ``7260 s``; ``inf``;
- :func:`format_offset`, a scripted run's ``time`` column: ``+0.5s``, ``+90s``, ``+7260s``.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "BadValue",
    "check_seconds",
    "format_bytes",
    "format_duration",
    "format_elapsed",
    "format_offset",
    "format_plain_seconds",
    "format_seconds",
    "kind_of",
    "parse_duration",
    "parse_size",
]


class BadValue(ValueError):
    """A value does not have the type (or range) it must have; ``str()`` says why."""


def kind_of(value: Any) -> str:
    """What ``value`` is, as an error message names it: ``string 'x'``, ``number 3``, ``a list``."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# -- durations --------------------------------------------------------------------------------

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from ``1.5``, ``"500ms"``, ``"5s"``, ``"10m"``, ``"2h"`` or ``"inf"``."""
    if isinstance(value, bool):
        raise BadValue(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in ("inf", "infinity", "never"):
            return math.inf
        m = _DURATION.match(text)
        if m is None:
            raise BadValue(
                f"expected a duration (seconds, or a number with ms, s, m or h), got {value!r}"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise BadValue(f"expected a duration, got {kind_of(value)}")
    if math.isnan(seconds) or seconds < 0:
        raise BadValue(f"a duration cannot be negative, got {value!r}")
    return seconds


def check_seconds(value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a finite number of seconds, more than 0 (or at least 0 if ``allow_zero``);
    raises BadValue saying what is wrong (``must be > 0 seconds, got -1``), for a flag's name to
    go in front of."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadValue(f"must be a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise BadValue(f"must be {'>= 0' if allow_zero else '> 0'} seconds, got {number:g}")
    return number


def format_seconds(value: float) -> str:
    """Seconds as the spec syntax writes a duration, in the largest whole unit: ``500ms``,
    ``90s``, ``10m``, ``2h``, ``inf``."""
    if math.isinf(value):
        return "inf"
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if value >= 2 * size and (value / size).is_integer():
            return f"{int(value / size)}{unit}"
    return f"{round(value * 1000, 3):g}ms" if 0 < value < 1 else f"{value:g}s"


def format_duration(seconds: float | None) -> str:
    """``7.3 s``, ``2 h 1 min``; ``never`` for None."""
    if seconds is None or math.isinf(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "",
             f"{minutes} min" if minutes else "", f"{sec} s" if sec and not days else ""]
    return " ".join(p for p in parts if p)


def format_elapsed(s: float) -> str:
    """``0.42 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def format_plain_seconds(value: float) -> str:
    """``4 s``, ``1.5 s``, ``inf``: a duration as a message shows it."""
    return "inf" if math.isinf(value) else f"{float(f'{value:.6g}'):g} s"


def format_offset(value: float) -> str:
    """``+1.5s``: a time since the start."""
    return f"+{value:g}s"


# -- sizes ------------------------------------------------------------------------------------

_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
               "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
               "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``512KB``, ``10MB``, ``1.5GiB`` (``ValueError`` otherwise)."""
    raw = text.strip().lower()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = raw[len(number):].strip()
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"expected a size in bytes, or with KB, MB, GB (or KiB, MiB, GiB), got "
                         f"{text!r}")
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise ValueError(f"expected a size in bytes, or with KB, MB, GB, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a size in bytes, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """``1.5 GB`` (decimal units, as ``10GB`` is read)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
