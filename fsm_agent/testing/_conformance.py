"""The conformance kit: drive any supervisor with generated scripts and compare it to a reference.

This module is the kit's entry: :func:`run_conformance` (whole scripts, or the state machine),
:func:`conformance_machine`, the kit's hypothesis settings, and the simplifying of a failing
script; every name the kit exports is importable from here. Its parts: what a target is and one
run of it (:mod:`._targets`), the scripted world a run plays (:mod:`._scripted`), the reference
and the scripts drawn for a spec (:mod:`._oracle`), comparing traces (:mod:`._compare`), the
counterexample table (:mod:`._table`), checking one script (:mod:`._check_script`) and the state
machine (:mod:`._machine`).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from .._core._spec import DEFAULT_SPEC
from ._agent_shape import (
    HarnessError,
)
from ._check_script import ConformanceFailure, check_script, draw_case
from ._compare import DIVERGENCES, IntendedDivergence, compare_traces, trace_invariants
from ._machine import SupervisorConformance
from ._oracle import _never, _oracle, _profile
from ._reference import (
    ConformanceTrace,
)
from ._scripted import EndOfScript, RunawaySupervisor, ScriptedDriver, _HarnessAbort
from ._strategies import (
    RunConfig,
    Tick,
)
from ._table import render_table
from ._target_api import TargetAPI
from ._targets import _spec_label, resolve_target, run_script

__all__ = [
    "DIVERGENCES",
    "ConformanceFailure",
    "EndOfScript",
    "HarnessError",
    "IntendedDivergence",
    "RunawaySupervisor",
    "ScriptedDriver",
    "SupervisorConformance",
    "check_script",
    "compare_traces",
    "conformance_machine",
    "default_settings",
    "draw_case",
    "render_table",
    "run_conformance",
    "run_script",
    "trace_invariants",
]


_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def default_settings(max_examples: int = 200) -> Settings:
    """The kit's settings: no deadline, one bug reported, no "explain" phase (it re-runs the
    failing script hundreds of times to annotate lines, which costs more than finding it)."""
    return Settings(
        max_examples=max_examples,
        stateful_step_count=12,
        deadline=None,
        report_multiple_bugs=False,
        phases=_PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def conformance_machine(target: Any, spec: Any = DEFAULT_SPEC) -> type[SupervisorConformance]:
    """A ``SupervisorConformance`` subclass bound to ``target`` and ``spec``."""
    name = getattr(target, "__name__", type(target).__name__)
    return type(f"Conformance[{name}]", (SupervisorConformance,),
                {"target": staticmethod(target) if not inspect.isclass(target) else target,
                 "spec": spec, "__module__": __name__})


def run_conformance(
    target: Any,
    spec: str | os.PathLike[str] | Any = DEFAULT_SPEC,
    settings: Settings | None = None,
    *,
    seed: int | None = None,
    stateful: bool = False,
    params: Mapping[str, Any] | None = None,
    driver: Callable[[Any], Any] | None = None,
    target_api: TargetAPI | str | os.PathLike[str] | None = None,
) -> None:
    """Check ``target`` against ``spec``'s reference behaviour; raise on a counterexample.

    ``target`` is a ``SimpleElasticAgent`` subclass or a ``factory(driver, **settings)``
    returning an object with ``run(monitor_interval, sleep=...)``. ``spec`` is a preset name
    (``"torchelastic"``, the default as for every ``fsm-agent`` command, ``"torchrun"``,
    ``"resilient"``: checked against the reference tables) or a spec file / ``Spec`` (checked
    against ``fsm_agent.Lifecycle`` running it). Raises :class:`ConformanceFailure` whose message
    is the shrunk counterexample as a table.

    For a spec with parameters the kit draws their values per run (the target gets them as
    ``params=`` when it takes them; otherwise the defaults are checked); ``params`` fixes some
    for every run instead.

    ``driver`` (``make_driver(world) -> Driver``) checks your own driver too: the target gets
    ``make_driver(world)`` where it would get the kit's driver, and ``world`` is the kit's
    scripted driver, which yours must call as its outside world (what is compared is what
    reaches ``world``).

    ``target_api`` declares what an agent class asks for beyond torch's agent API: constructor
    arguments and rendezvous handler methods, each answered from the script (``"nvrx"`` for
    NVIDIA's ft_launcher agent, a YAML file, or a
    :class:`~fsm_agent.testing._target_api.TargetAPI`; docs/conformance.md).

    Each example is one whole script (:func:`scripts`); ``stateful=True`` runs
    :class:`SupervisorConformance` instead (several runs per example, tick by tick; it finds the
    same bugs but shrinks several times slower).
    """
    # A bad target or spec fails here, not inside hypothesis; so does a target the kit cannot
    # script on the probe scripts (HarnessError).
    tgt = resolve_target(target, spec, driver, target_api)
    oracle = _oracle(spec)
    fixed = RunConfig(params=params or {}).params
    profile = _profile(spec, fixed)
    if fixed and "params" not in tgt.accepts:
        raise HarnessError(f"{tgt.name} takes no params=, so the kit cannot set "
                           f"{', '.join(k for k, _ in fixed)}")
    settings = settings or default_settings()
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        probe(tgt, params=fixed)
        if stateful:
            wrapped = driver is not None or target_api is not None
            machine = conformance_machine(tgt if wrapped else target, spec)
            if fixed:
                machine._fixed_params = fixed
            machine._abort_on_harness_error = True
            if seed is not None:
                machine = hypothesis_seed(seed)(machine)
            run_state_machine_as_test(machine, settings=settings)
            return
        label = _spec_label(spec)
        configs = profile.configs.map(tgt.project)
        failing: list[tuple[RunConfig, tuple[Tick, ...]]] = []

        @settings
        @given(st.data())
        def conformance(data: Any) -> None:
            config, script, expected = draw_case(data, oracle, configs=configs,
                                                 timed=profile.timed,
                                                 tick_strategy=profile.ticks())
            try:
                check_script(tgt, config, script, expected=expected, spec_label=label,
                             windowed=profile.window(config) < math.inf)
            except HarnessError as e:
                raise _HarnessAbort(e) from None
            except ConformanceFailure:
                failing[:] = [(config, script)]  # hypothesis replays the shrunk one last
                raise

        if seed is not None:
            conformance = hypothesis_seed(seed)(conformance)
        try:
            conformance()
        except ConformanceFailure:
            if not failing:
                raise
            config, script = simplify(tgt, oracle, *failing[0], window=profile.window,
                                      keep=[name for name, _ in fixed])
            try:
                check_script(tgt, config, script, expected=oracle(config, script),
                             spec_label=label, windowed=profile.window(config) < math.inf)
            except ConformanceFailure as plain:
                raise plain from None
            raise
    except _HarnessAbort as abort:
        raise abort.error from None
    finally:
        logging.disable(saved)


_PLAIN_TICK = Tick()
#: Tick fields simplify puts back to their plain value, in this order (the error types before
#: the exit codes they belong to).
_PLAIN_FIELDS = ("fault", "barrier", "nodes_waiting", "errors", "exitcodes", "elapsed", "draw",
                 "preempt", "drain", "step")


def _plainer(field: str, value: Any) -> tuple[Any, ...]:
    """The values ``simplify`` tries for a tick's ``field``, plainest first: the default, and
    for nodes waiting every smaller count (hypothesis can stop at 2 where 1 shows the bug)."""
    plain = getattr(_PLAIN_TICK, field)
    if value == plain:
        return ()
    if field == "nodes_waiting":
        return tuple(range(plain, value))
    return (plain,)


def simplify(target: Any, oracle: Callable[[RunConfig, Sequence[Tick]], ConformanceTrace],
             config: RunConfig, script: Sequence[Tick], *,
             window: Callable[[RunConfig], float] = _never,
             keep: Sequence[str] = ()) -> tuple[RunConfig, tuple[Tick, ...]]:
    """Make a failing script plainer while it still fails: each tick's fault, barrier outcome,
    nodes waiting (0, else the fewest that still fail), failure details, elapsed time, random
    draw, preemption and step back to the default, one at a time, then each drawn parameter
    (not those in ``keep``, fixed by the caller) back to its default (a few runs).

    hypothesis draws a tick as one index into every combination, which it shrinks well towards
    fewer faults but can leave, say, a barrier error beside the FAILED the bug is about: the
    table would show a detail that plays no part.
    """
    tgt = resolve_target(target)

    def fails(c: RunConfig, s: tuple[Tick, ...]) -> bool:
        expected = oracle(c, s)
        actual = run_script(tgt, c, s)
        return bool(compare_traces(expected, actual) or trace_invariants(
            actual, c, windowed=window(c) < math.inf))

    ticks_ = tuple(script)
    if config.init_fault is not None and fails(attrs.evolve(config, init_fault=None), ticks_):
        config = attrs.evolve(config, init_fault=None)
    for i in range(len(ticks_)):
        for field in _PLAIN_FIELDS:
            value = getattr(ticks_[i], field)
            for plain in _plainer(field, value):
                candidate = (*ticks_[:i], attrs.evolve(ticks_[i], **{field: plain}),
                             *ticks_[i + 1:])
                if fails(config, candidate):
                    ticks_ = candidate
                    break
    for name, _ in config.params:
        if name in keep:
            continue
        plainer = attrs.evolve(config, params=tuple(p for p in config.params if p[0] != name))
        if fails(plainer, ticks_):
            config = plainer
    return config, ticks_


#: Scripts every target is run on before hypothesis starts: between them they call every hook
#: (a membership restart, a counted restart, success through the exit barrier; giving up after
#: an UNHEALTHY group), so that a target the kit cannot script fails at once, in one line.
PROBES: tuple[tuple[RunConfig, tuple[Tick, ...]], ...] = (
    (RunConfig(max_restarts=1),
     (Tick("HEALTHY", nodes_waiting=1), Tick("FAILED"), Tick("SUCCEEDED"))),
    (RunConfig(max_restarts=0), (Tick("UNHEALTHY"),)),
)


def probe(target: Any, spec: Any = DEFAULT_SPEC, *,
          params: tuple[tuple[str, Any], ...] = ()) -> None:
    """Run ``target`` on :data:`PROBES` (with ``params`` set); raise :class:`HarnessError` if the
    kit cannot script it. What the target does on them is not judged here."""
    tgt = resolve_target(target, spec)
    for config, script in PROBES:
        run_script(tgt, tgt.project(attrs.evolve(config, params=params)), script)
