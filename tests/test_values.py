"""Durations and sizes (``fsm_agent._core._units``): the text each parser reads, and what each
formatter writes. The formatters' outputs are the CLI's, the report's and the docs' text: every
expected string here is one a caller shows, written out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fsm_agent._core._params import parse_text
from fsm_agent._core._units import (
    BadValue,
    check_seconds,
    format_bytes,
    format_duration,
    format_elapsed,
    format_offset,
    format_plain_seconds,
    format_seconds,
    parse_duration,
    parse_size,
)

# -- reading --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("1.5", 1.5), ("500ms", 0.5), ("5s", 5.0), ("10m", 600.0), ("2min", 120.0), ("2h", 7200.0),
    ("inf", math.inf), ("never", math.inf), (" 3 S ", 3.0), (".5s", 0.5), (3, 3.0), (0.25, 0.25),
])
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "expected a duration (seconds, or a number with ms, s, m or h), got '-1'"),
    ("5 parsecs", "expected a duration (seconds, or a number with ms, s, m or h)"),
    ("1e3s", "expected a duration"), ("", "expected a duration"), ("ten", "expected a duration"),
    (True, "expected a duration, got True"), (-2, "a duration cannot be negative, got -2"),
    (None, "expected a duration, got nothing"), ([1], "expected a duration, got a list"),
])
def test_bad_durations(value: Any, message: str) -> None:
    with pytest.raises(BadValue, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_duration(value)


def test_check_seconds_says_what_a_flag_needs() -> None:
    assert check_seconds("2.5") == 2.5 and check_seconds(0, allow_zero=True) == 0
    for value, message in ((0, "must be > 0 seconds, got 0"), ("x", "must be a number of "
                           "seconds, got 'x'"), (math.inf, "must be > 0 seconds, got inf")):
        with pytest.raises(BadValue) as e:
            check_seconds(value)
        assert str(e.value) == message
    with pytest.raises(BadValue, match=r"^must be >= 0 seconds, got -1$"):
        check_seconds(-1, allow_zero=True)


def test_sizes() -> None:
    assert [parse_size(t) for t in ("4096", "512KB", "10MB", "1.5 KiB", "2g", "1TiB")] == [
        4096, 512_000, 10_000_000, 1536, 2_000_000_000, 1024**4]
    for bad in ("10 parsecs", "MB", "-5MB", "nanmb", "inf"):
        with pytest.raises(ValueError, match="expected a size in bytes"):
            parse_size(bad)


# -- writing --------------------------------------------------------------------------------

#: seconds -> (spec syntax, check --bounds, run summary and report, replay messages, script table)
WRITTEN: dict[float, tuple[str, str, str, str, str]] = {
    0: ("0s", "0.0 s", "0.00 s", "0 s", "+0s"),
    0.0005: ("0.5ms", "0.0 s", "0.00 s", "0.0005 s", "+0.0005s"),
    0.001: ("1ms", "0.0 s", "0.00 s", "0.001 s", "+0.001s"),
    0.25: ("250ms", "0.2 s", "0.25 s", "0.25 s", "+0.25s"),
    1: ("1s", "1.0 s", "1.00 s", "1 s", "+1s"),
    1.5: ("1.5s", "1.5 s", "1.50 s", "1.5 s", "+1.5s"),
    12.34: ("12.34s", "12.3 s", "12.3 s", "12.34 s", "+12.34s"),
    59.9: ("59.9s", "59.9 s", "59.9 s", "59.9 s", "+59.9s"),
    60: ("60s", "60.0 s", "1 min 00 s", "60 s", "+60s"),
    90: ("90s", "90.0 s", "1 min 30 s", "90 s", "+90s"),
    120: ("2m", "2 min", "2 min 00 s", "120 s", "+120s"),
    125.5: ("125.5s", "2 min 6 s", "2 min 05 s", "125.5 s", "+125.5s"),
    600.125: ("600.125s", "10 min", "10 min 00 s", "600.125 s", "+600.125s"),
    3600: ("60m", "1 h", "1 h 00 min", "3600 s", "+3600s"),
    3661: ("3661s", "1 h 1 min 1 s", "1 h 01 min", "3661 s", "+3661s"),
    7200: ("2h", "2 h", "2 h 00 min", "7200 s", "+7200s"),
    86400: ("24h", "1 d", "24 h 00 min", "86400 s", "+86400s"),
    90061: ("90061s", "1 d 1 h 1 min", "25 h 01 min", "90061 s", "+90061s"),
    1234567.0: ("1.23457e+06s", "14 d 6 h 56 min", "342 h 56 min", "1.23457e+06 s",
                "+1.23457e+06s"),
}
FORMATTERS = (format_seconds, format_duration, format_elapsed, format_plain_seconds,
              format_offset)


@pytest.mark.parametrize("seconds", list(WRITTEN))
def test_each_formatter_writes_a_duration_as_its_callers_show_it(seconds: float) -> None:
    assert tuple(f(seconds) for f in FORMATTERS) == WRITTEN[seconds]


def test_never_is_written_as_each_caller_says_it() -> None:
    assert format_seconds(math.inf) == "inf"
    assert format_duration(math.inf) == format_duration(None) == "never"
    assert format_plain_seconds(math.inf) == "inf"


@pytest.mark.parametrize("text", ["500ms", "90s", "10m", "2h", "inf", "1.5s", "600.125s"])
def test_the_spec_syntax_reads_back_what_it_wrote(text: str) -> None:
    assert format_seconds(parse_duration(text)) == text
    assert format_seconds(parse_text("duration", text)) == text


def test_sizes_are_written_in_the_decimal_units_they_are_read_in() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 1500, 10**6, 1.5e9, 10**12, 5 * 10**15)] == [
        "0 B", "999 B", "1.0 KB", "1.5 KB", "1.0 MB", "1.5 GB", "1.0 TB", "5000.0 TB"]
    assert parse_size(format_bytes(1.5e9).replace(" ", "")) == 1_500_000_000
