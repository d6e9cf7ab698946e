"""Differential conformance: fsm_agent's presets against the agents they claim to be.

``torchrun``: torch 2.13's real ``SimpleElasticAgent._invoke_run`` (scripted hooks, no
processes). ``torchelastic``: the seed's ``_invoke_run``, transcribed in ``seed_agent.py``. Both
sides run the same generated scripts through the same recorder; fsm_agent must match the other
side call for call, metric for metric, in final state, remaining restarts and outcome, except for
the intended divergences of ``fsm_agent.testing.DIVERGENCES`` (applied by ``ours_from_torch``).
Each side is also checked against the reference table the kit ships (``_reference.py``).
``resilient``: ``Lifecycle`` against that reference alone (nothing else implements it).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent import Lifecycle
from fsm_agent.testing._conformance import DIVERGENCES, check_script, run_script
from fsm_agent.testing._strategies import RunConfig, Tick

from ._support import (
    DIFFERENTIAL,
    LONG,
    _lifecycle,
    differential,
    draw_script,
    ours_from_torch,
)
from .seed_agent import SeedAgent

# --long runs 100,000 scripts per preset: minutes on a quiet machine, far more on a shared one.
pytestmark = pytest.mark.timeout(4 * 3600 if LONG else 600)


@DIFFERENTIAL
@given(st.data())
def test_torchrun_preset_matches_torch_simple_elastic_agent(data: st.DataObject) -> None:
    config, script = draw_script(data, "torchrun")
    problems = differential(SimpleElasticAgent, "torchrun", config, script)
    assert not problems, "\n\n".join(problems)


@DIFFERENTIAL
@given(st.data())
def test_torchelastic_preset_matches_the_seed_transcription(data: st.DataObject) -> None:
    config, script = draw_script(data, "torchelastic")
    problems = differential(SeedAgent, "torchelastic", config, script)
    assert not problems, "\n\n".join(problems)


@DIFFERENTIAL
@given(st.data())
def test_resilient_preset_matches_its_behaviour_table(data: st.DataObject) -> None:
    # No agent outside fsm_agent implements resilient: the reference model, written from the
    # README's preset table (fsm_agent/testing/_reference.py), is the only other side (exit
    # codes, signals, virtual time and jitter drawn).
    config, script = draw_script(data, "resilient")
    check_script(_lifecycle("resilient"), config, script, spec="resilient")


# One script per intended divergence, on which torch's agent and fsm_agent really do differ in
# exactly that way (so the list in DIVERGENCES is neither padded nor short).
DIVERGENCE_CASES = {
    "give-up-reports-failed": (
        SimpleElasticAgent, "torchrun", RunConfig(max_restarts=0), [Tick("UNHEALTHY")]),
    "action-errors-wrapped": (
        SimpleElasticAgent, "torchrun", RunConfig(max_restarts=1),
        [Tick("FAILED", fault="stop_workers")]),
    "unknown-after-action-error": (
        SimpleElasticAgent, "torchrun", RunConfig(max_restarts=1),
        [Tick("FAILED", fault="rendezvous")]),
    "torchelastic-returns-runresult": (SeedAgent, "torchelastic", RunConfig(), [Tick("SUCCEEDED")]),
}


def test_every_intended_divergence_has_a_case() -> None:
    assert sorted(DIVERGENCE_CASES) == sorted(d.name for d in DIVERGENCES)
    assert all(d.reason and d.where for d in DIVERGENCES)


@pytest.mark.parametrize("name", sorted(DIVERGENCE_CASES))
def test_intended_divergence_is_real_and_the_only_difference(name: str) -> None:
    agent, preset, config, script = DIVERGENCE_CASES[name]
    theirs = run_script(agent, config, script)
    ours = run_script(Lifecycle, config, script, spec=preset)
    assert theirs != ours  # the divergence exists...
    assert ours_from_torch(theirs) == ours  # ...and mapping it accounts for all of it
    assert not differential(agent, preset, config, script)
    if name == "give-up-reports-failed":
        assert (theirs.outcome.state, ours.outcome.state) == ("UNHEALTHY", "FAILED")
    elif name == "action-errors-wrapped":
        assert (theirs.outcome.wrapped, ours.outcome.wrapped) == (None, "ActionError")
        assert theirs.outcome.message == ours.outcome.message == (
            "scripted stop_workers failure at tick 1")
    elif name == "unknown-after-action-error":
        assert (theirs.state, ours.state) == ("STOPPED", "UNKNOWN")
    else:
        assert theirs.outcome.state is None and ours.outcome.state == "SUCCEEDED"
        assert theirs.outcome.return_values == ours.outcome.return_values == {0: "ret@1"}


def test_no_divergence_where_none_is_intended() -> None:
    # Invalid observations leave torch's group in the observed state; so does the engine (the
    # raise happens in an `after` action, once the state changed), so this is not a divergence.
    for observed in ("INIT", "STOPPED", "UNKNOWN"):
        script = [Tick("HEALTHY"), Tick(observed)]
        theirs = run_script(SimpleElasticAgent, RunConfig(), script)
        ours = run_script(Lifecycle, RunConfig(), script, spec="torchrun")
        assert theirs == ours
        assert ours.state == observed
        assert ours.outcome.message == f"[default] Worker group in {observed} state"


def test_the_differential_check_sees_a_wrong_agent() -> None:
    # The check is not vacuous: a torch agent that skips the exit barrier is told apart.
    from .mutants import SkipsBarrier

    theirs = run_script(SkipsBarrier, RunConfig(), [Tick("SUCCEEDED")])
    ours = run_script(Lifecycle, RunConfig(), [Tick("SUCCEEDED")], spec="torchrun")
    assert ours_from_torch(theirs) != ours
    assert ("exit_barrier", 300.0) in ours.events
    assert ("exit_barrier", 300.0) not in theirs.events
