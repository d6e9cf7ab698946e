"""Sizes in bytes, as flags and spec values write them (``10MB``, ``512KiB``)."""

from __future__ import annotations

import math

__all__ = ["format_bytes", "parse_size"]

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
