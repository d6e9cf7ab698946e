"""The reference a target is compared with, and what the scripts drawn for a spec look like.

The *reference* for a preset name is :func:`fsm_agent.testing._reference.reference_trace`
(written from the behaviour tables); for a spec file it is ``fsm_agent.Lifecycle`` running that
spec.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

from ._reference import (
    PRESETS,
    RESILIENT_DEFAULTS,
    ConformanceTrace,
    reference_trace,
)
from ._strategies import (
    RESILIENT_PARAM_VALUES,
    RunConfig,
    Tick,
    param_values_for,
    params,
    run_configs,
    ticks,
)
from ._targets import _spec_label, resolve_target, run_script


def _oracle(spec: Any) -> Callable[[RunConfig, Sequence[Tick]], ConformanceTrace]:
    """The reference for ``spec``: the table for a preset name, the engine for a spec file."""
    if isinstance(spec, str) and spec in PRESETS:
        return functools.partial(reference_trace, spec)
    from fsm_agent import Lifecycle, load_spec

    loaded = load_spec(spec)  # raises SpecError naming file and line
    target = resolve_target(Lifecycle, loaded)
    return lambda config, script: run_script(target, config, script)


@attrs.frozen
class _Profile:
    """What the scripts for one spec look like: its run settings (with parameter values drawn
    for a spec that has parameters) and whether ticks carry time and random draws."""

    configs: st.SearchStrategy[RunConfig]
    timed: bool
    window: Callable[[RunConfig], float]  # the restart window a run's budget counts in
    drains: bool = False  # ticks may carry a preemption (the spec drains)
    progress: bool = False  # ticks may carry a progress step (the spec counts progress)
    peers: bool = False  # failures may follow a lost node (the spec's policy asks peer_lost)

    def ticks(self, faults: bool = True) -> st.SearchStrategy[Tick]:
        """The ticks of this spec's scripts."""
        return ticks(faults=faults, timed=self.timed, drains=self.drains,
                     progress=self.progress, peers=self.peers)


#: Monitor intervals of timed runs: exact binary fractions, as the ticks' elapsed times are.
_TIMED_INTERVALS = (0.5, 4.0)


def _never(config: RunConfig) -> float:
    return math.inf


def _window(spec: Any) -> Callable[[RunConfig], float]:
    """The length of the window ``spec`` counts failure restarts in, for a run's parameters."""
    if isinstance(spec, str) and spec in PRESETS:
        if spec != "resilient":
            return _never
        return lambda c: float(dict(c.params).get("restart_window",
                                                   RESILIENT_DEFAULTS["restart_window"]))
    from fsm_agent import load_spec

    loaded = load_spec(spec)
    ref = loaded.budget.window
    name = ref.name
    if name is None:
        return lambda c: float(ref.value)
    defaults = {p.name: p.default for p in loaded.params}
    return lambda c: float(dict(c.params).get(name, defaults.get(name, math.inf)))


# (spec, fixed) -> (the spec itself, kept so that its id is not reused; its profile)
_PROFILES: dict[Any, tuple[Any, _Profile]] = {}


def _profile(spec: Any, fixed: tuple[tuple[str, Any], ...] = ()) -> _Profile:
    """The script profile of ``spec``; ``fixed`` parameter values are used in every run."""
    # Built once per spec: the config list is hundreds of objects, and hypothesis keeps what it
    # learns about a strategy on the strategy object.
    key = (spec if isinstance(spec, (str, os.PathLike)) else id(spec), fixed)
    entry = _PROFILES.get(key)
    if entry is None or entry[0] is not spec:
        entry = _PROFILES[key] = (spec, _make_profile(spec, fixed))
    return entry[1]


def _make_profile(spec: Any, fixed: tuple[tuple[str, Any], ...]) -> _Profile:
    if isinstance(spec, str) and spec in PRESETS:
        values: dict[str, Any] = dict(RESILIENT_PARAM_VALUES) if spec == "resilient" else {}
        defaults: dict[str, Any] = dict(RESILIENT_DEFAULTS) if spec == "resilient" else {}
        timed = drains = progress = peers = spec == "resilient"
    else:
        from fsm_agent import load_spec

        loaded = load_spec(spec)
        values = param_values_for(loaded)
        defaults = {p.name: p.default for p in loaded.params}
        timed = bool(loaded.params) or any(s.timeout is not None for s in loaded.states)
        # a preemption only for a spec with the drain's own triggers (the engine refuses a
        # trigger the spec does not declare); progress for one whose guards count it
        drains = {"preempted", "drained"} <= set(loaded.triggers)
        progress = any(g.kind == "no_progress_restarts_at_least" for g in loaded.guard_defs)
        peers = loaded.policy is not None and any(
            "peer_lost" in r.when for r in loaded.policy.rules)
    unknown = sorted(set(dict(fixed)) - set(defaults))
    if unknown:
        if spec == "resilient":
            raise ValueError(f"the reference for resilient (README's table) has no parameter "
                             f"{unknown[0]!r} (its parameters: {', '.join(sorted(defaults))}); "
                             "check the others against the spec file, specs/resilient.yaml, "
                             "where the engine is the reference")
        raise ValueError(f"spec {_spec_label(spec)!r} has no parameter {unknown[0]!r} (its "
                         f"parameters: {', '.join(sorted(defaults)) or 'none'})")
    if not timed:
        return _Profile(run_configs(), False, _never, drains, progress, peers)
    for name, _ in fixed:
        values.pop(name, None)
    drawn = params(values, defaults) if values else None
    configs = run_configs(monitor_intervals=_TIMED_INTERVALS, param_sets=drawn)
    if fixed:
        configs = configs.map(lambda c: attrs.evolve(c, params=(*c.params, *fixed)))
    return _Profile(configs, True, _window(spec), drains, progress, peers)

