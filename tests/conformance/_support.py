"""Shared helpers of the conformance tests: example counts and the strict differential check."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, settings

from fsm_agent import Lifecycle
from fsm_agent.testing._conformance import compare_traces, draw_case, render_table, run_script
from fsm_agent.testing._oracle import _profile
from fsm_agent.testing._reference import ConformanceTrace, Raised, Returned, reference_trace
from fsm_agent.testing._strategies import RunConfig, Tick
from fsm_agent.testing._targets import resolve_target

#: FSM_AGENT_CONFORMANCE_LONG=1 runs the long mode (100,000 scripts per preset);
#: FSM_AGENT_CONFORMANCE_EXAMPLES=N sets the count outright. 500 in CI: scripts average about
#: two ticks and a half (they averaged under one when CI ran 1,000: most were empty).
LONG = os.environ.get("FSM_AGENT_CONFORMANCE_LONG", "") not in ("", "0")
EXAMPLES = int(os.environ.get("FSM_AGENT_CONFORMANCE_EXAMPLES", 100_000 if LONG else 500))

DIFFERENTIAL = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
)


_LIFECYCLES: dict[Any, Any] = {}


def _lifecycle(spec: Any) -> Any:
    key = spec if isinstance(spec, str) else id(spec)
    if key not in _LIFECYCLES:
        _LIFECYCLES[key] = resolve_target(Lifecycle, spec)
    return _LIFECYCLES[key]


def ours_from_torch(torch_trace: ConformanceTrace) -> ConformanceTrace:
    """What fsm_agent must do, given what torch's agent did: torch's trace with exactly the
    intended divergences (``fsm_agent.testing.DIVERGENCES``) applied."""
    out = torch_trace.outcome
    state = torch_trace.state
    if isinstance(out, Returned):
        if out.state is None:  # torchelastic-returns-runresult: the seed returns the bare dict
            out = Returned("SUCCEEDED", out.return_values, {})
        elif torch_trace.state == "FAILED":  # give-up-reports-failed
            out = attrs.evolve(out, state="FAILED")
    elif isinstance(out, Raised) and out.scripted:
        hook = torch_trace.events[-1][0]  # the call that raised is the last one recorded
        if hook != "monitor":  # monitor() is the engine's caller, not one of its actions
            out = attrs.evolve(out, wrapped="ActionError")  # action-errors-wrapped
            state = "UNKNOWN"  # unknown-after-action-error
    return attrs.evolve(torch_trace, outcome=out, state=state)


def draw_script(data: Any, preset: str) -> tuple[RunConfig, tuple[Tick, ...]]:
    """A generated script, drawn tick by tick until the preset's reference run is over (for a
    timed preset, resilient, with its parameters drawn and time passing)."""
    profile = _profile(preset)
    config, script, _ = draw_case(data, lambda c, s: reference_trace(preset, c, s),
                                  configs=profile.configs, timed=profile.timed)
    return config, script


def differential(reference_agent: Any, preset: str, config: RunConfig, script: Sequence[Tick],
                 spec: Any = None) -> list[str]:
    """Run torch's (or the seed's) agent and ``Lifecycle`` on one script; list what differs."""
    theirs = run_script(reference_agent, config, script)
    ours = run_script(_lifecycle(spec if spec is not None else preset), config, script)
    want = ours_from_torch(theirs)
    name = getattr(reference_agent, "__name__", "?")
    problems = []
    if want != ours:
        fields = [f.name for f in attrs.fields(ConformanceTrace)
                  if getattr(want, f.name) != getattr(ours, f.name)]
        problems.append(f"fsm_agent differs from {name} in "
                        f"{', '.join(fields)}:\n" + render_table(config, script, want, ours))
    table = reference_trace(preset, config, script)
    bad = compare_traces(table, theirs)
    if bad:
        problems.append(f"the reference table differs from {name} in "
                        f"{', '.join(bad)}:\n" + render_table(config, script, table, theirs))
    return problems
