"""Checking one script against the reference, and drawing scripts tick by tick."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from .._core._spec import DEFAULT_SPEC
from ._compare import compare_traces, trace_invariants
from ._oracle import _oracle, _window
from ._reference import (
    ConformanceTrace,
    Pending,
)
from ._strategies import (
    RunConfig,
    Tick,
    run_configs,
    ticks,
)
from ._table import render_table
from ._targets import _spec_label, resolve_target, run_script


class ConformanceFailure(AssertionError):
    """The supervisor under test disagreed with the reference (message: the counterexample)."""


def check_script(
    target: Any,
    config: RunConfig,
    script: Sequence[Tick],
    *,
    spec: Any = DEFAULT_SPEC,
    expected: ConformanceTrace | None = None,
    spec_label: str | None = None,
    windowed: bool | None = None,
) -> ConformanceTrace:
    """Run ``target`` on one script; raise :class:`ConformanceFailure` (the table) if it differs
    from the reference for ``spec`` or breaks an invariant. Returns the target's trace.

    ``windowed`` says whether restarts are counted in a sliding window in this run (default:
    worked out from ``spec`` and ``config``)."""
    tgt = resolve_target(target, spec)
    if expected is None:
        expected = _oracle(spec)(config, script)
    if windowed is None:
        windowed = _window(spec)(config) < math.inf
    actual = run_script(tgt, config, script)
    problems = compare_traces(expected, actual)
    broken = trace_invariants(actual, config, windowed=windowed)
    if problems or broken:
        label = spec_label if spec_label is not None else _spec_label(spec)
        head = f"{tgt.name} does not conform to spec {label!r}\nrun: {config.describe()}\n"
        extra = "".join(f"\ninvariant broken: {b}" for b in broken)
        raise ConformanceFailure(
            head + render_table(config, script, expected, actual, problems) + extra)
    return actual


def draw_case(
    data: Any,
    oracle: Callable[[RunConfig, Sequence[Tick]], ConformanceTrace],
    *,
    configs: st.SearchStrategy[RunConfig] | None = None,
    max_ticks: int = 16,
    faults: bool = True,
    timed: bool = False,
    tick_strategy: st.SearchStrategy[Tick] | None = None,
) -> tuple[RunConfig, tuple[Tick, ...], ConformanceTrace]:
    """Draw a config, then ticks one at a time until the reference run is over (or the draw
    says the script ends there, with the run still going).

    Drawing lazily keeps every tick of a script meaningful: a list drawn up front would mostly
    hold ticks after the run ended, which cost generation and shrinking time and test nothing.
    Returns the config, the script and the reference trace for it. ``timed``: ticks carry
    elapsed time and random draws (for a spec with timers or parameters); ``tick_strategy``
    replaces :func:`ticks` (a spec's profile adds preemptions and progress steps).
    """
    config = data.draw(configs if configs is not None else run_configs(), label="config")
    if tick_strategy is None:
        tick_strategy = ticks(faults=faults, timed=timed)
    script: list[Tick] = []
    expected = oracle(config, script)
    while isinstance(expected.outcome, Pending) and len(script) < max_ticks:
        # One draw in ten ends the script here. A separate draw, not a None among the ticks:
        # hypothesis draws the first entry of a long sampled_from list far more often than its
        # share, which left half the scripts without a single tick; this draw still shrinks
        # towards 0, ending the script, so counterexamples get short.
        if data.draw(_GO_ON, label=f"go on after {len(script)}") == 0:
            break
        script.append(data.draw(tick_strategy, label=f"tick {len(script) + 1}"))
        expected = oracle(config, script)
    return config, tuple(script), expected


_GO_ON = st.integers(0, 9)

