"""The job protocol's TLA+ model (specs/model/JobProtocol.tla), checked by TLC for every preset.

The per-agent transitions of the model are the preset's own (generated from the spec file), so
these runs check the specs: a preset that stopped handling ``job_failed``, announced too late or
lost its membership restart would fail here. The edits below show that they do, and the broken
variant (a job budget counted by each agent alone) shows a counterexample TLC finds.
"""

from __future__ import annotations

import re

import pytest

from fsm_agent import load_spec, parse_spec
from fsm_agent.testing._model_check import (
    ModelError,
    TLCResult,
    check_protocol,
    lifecycle_module,
)

PRESETS = ("torchelastic", "torchrun", "resilient")
ALL_OUTCOMES = ("failed", "unhealthy", "succeeded", "hung")

# What each run explores (docs/job-protocol.md, "Running the checker"):
CONFIGS = {
    # two agents, every invariant plus termination under fairness; a crash and a replacement
    "n2-liveness": dict(agents=2, liveness=True, max_crashes=1, max_rejoins=1, max_preempts=0),
    # two agents, invariants only, every fault: crash, leave on a signal, rejoin, unhealthy
    "n2-faults": dict(agents=2, liveness=False, max_crashes=1, max_leaves=1, max_rejoins=1,
                      max_preempts=0, outcomes=ALL_OUTCOMES),
    # three agents, invariants only (agents interchangeable), a crash
    "n3": dict(agents=3, liveness=False, symmetry=True, max_crashes=1, max_rejoins=0,
               max_preempts=0, outcomes=ALL_OUTCOMES),
    # two agents, a drain signal to either at any point (a spec that drains: resilient),
    # termination included; with crashes and rejoins as well under --long
    "n2-drain": dict(agents=2, liveness=True, max_crashes=0, max_rejoins=0, max_preempts=1,
                     outcomes=("failed", "succeeded")),
    "n2-drain-faults": dict(agents=2, liveness=False, max_crashes=1, max_rejoins=1,
                            max_preempts=1, outcomes=("failed", "succeeded")),
}
DRAINS = {"n2-drain", "n2-drain-faults"}  # only a spec with the preempted trigger drains


def _explain(result: TLCResult) -> str:
    return f"{result.verdict}\n{result.trace[-6000:] or result.output[-3000:]}"


def _marks(preset: str, config: str) -> list[pytest.MarkDecorator]:
    # CI: every preset's invariants with every fault (n2-faults), and three agents and
    # termination for resilient, whose job-wide budget is what they exercise; the torch presets
    # share the protocol's other lines with it. `pytest --long` runs the whole matrix.
    if config == "n2-faults":
        return []
    if config == "n2-drain-faults":
        return [pytest.mark.slow, pytest.mark.long]
    return [pytest.mark.slow] + ([] if preset == "resilient" else [pytest.mark.long])


# A bound for a TLC that hangs, not a speed check: resilient's drain configuration takes about
# 170 s of one core with the suite running beside it, more than 300 s on a loaded machine, and
# more than 600 s (the default bound of check_protocol) with a second copy of the suite beside
# it at load 9. The bound is wall time, so it leaves room for the load.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("preset", "config"), [
    pytest.param(preset, name, marks=_marks(preset, name), id=f"{preset}-{name}")
    for preset in PRESETS for name in sorted(CONFIGS)
    if name not in DRAINS or preset == "resilient"])
def test_tlc_finds_no_error_in_the_presets(preset: str, config: str) -> None:
    result = check_protocol(preset, timeout=1500, **CONFIGS[config])  # type: ignore[arg-type]
    assert result.ok, _explain(result)
    # Not vacuous: TLC explored a real state space.
    assert result.distinct_states is not None and result.distinct_states > 1000, result.output


def test_the_broken_variant_exceeds_the_job_budget() -> None:
    # Counting a job budget per agent: each agent restarts once, and the job twice. (No drain:
    # the budget needs none, and a preemption at every point is most of the state space.)
    result = check_protocol("resilient", agents=2, liveness=False, broken_count=True,
                            max_preempts=0)
    assert not result.ok
    assert result.violated() == "JobBudget", _explain(result)
    assert re.search(r"restarts = 2", result.trace), result.trace
    # the correct protocol, same configuration
    assert check_protocol("resilient", agents=2, liveness=False, max_preempts=0).ok


def test_the_model_reads_the_spec_file() -> None:
    spec = load_spec("torchrun")
    text = lifecycle_module(spec)
    edges = list(spec.edges())
    assert text.count("[trig |->") == len(edges)
    for trigger, source, dest, _ in edges:
        assert f'trig |-> "{trigger}", src |-> "{source}", dst |-> "{dest}"' in text
    assert 'SpecScope == "agent"' in text
    assert 'SpecScope == "job"' in lifecycle_module("resilient")


def _edited(preset: str, old: str, new: str) -> str:
    with open(load_spec(preset).path) as f:
        text = f.read()
    assert old in text, old
    return text.replace(old, new, 1)


_JF = "    source: [INIT, HEALTHY, STOPPED]\n    dest: FAILED\n"
_GIVE_UP = "    unless: [has_restarts_left]\n    actions: [announce_failure, stop_workers]\n"
BREAKING_EDITS = {
    # an agent resting in HEALTHY ignores the announcement (it would run on until its own
    # workers fail)
    "HEALTHY ignores job_failed": (
        _JF, "    source: [INIT, STOPPED]\n    dest: FAILED\n", "PromptEnd"),
    # a rendezvous that reads the announcement cannot end through job_failed
    "STOPPED ignores job_failed": (
        _JF, "    source: [INIT, HEALTHY]\n    dest: FAILED\n", "JobFailedHandled"),
    # giving up stops the workers before telling anybody
    "announce after stopping": (
        _GIVE_UP,
        "    unless: [has_restarts_left]\n    actions: [stop_workers, announce_failure]\n",
        "FailureAnnounced"),
    # the learners leave their workers running
    "job_failed keeps the workers": (
        _JF + "    actions: [stop_workers]\n", _JF, "StoppedAtEnd"),
    # membership restarts taken away: an agent stays HEALTHY while its peer waits to restart
    "no membership restart": (
        "    guards: [nodes_waiting]\n    actions: [stop_workers]\n",
        "    guards: [nodes_waiting]\n    actions: []\n", None),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("edit", sorted(BREAKING_EDITS))
def test_a_spec_edit_that_breaks_the_protocol_fails_the_check(edit: str) -> None:
    old, new, invariant = BREAKING_EDITS[edit]
    spec = parse_spec(_edited("torchrun", old, new), path=f"<{edit}>")
    result = check_protocol(spec, agents=2, liveness=False, max_crashes=1, max_rejoins=1,
                            outcomes=ALL_OUTCOMES)
    assert not result.ok, f"{edit}: TLC found nothing"
    if invariant is not None:
        assert result.violated() == invariant, _explain(result)


_DRAINED = "  - trigger: drained\n    source: DRAINING\n    dest: PREEMPTED\n"
_DEADLINE = ("  - trigger: timeout\n    source: DRAINING\n    dest: PREEMPTED\n"
             "    actions: [kill_workers]\n")
DRAIN_EDITS = {
    # workers that exit during a drain (with 0, say) make the job a success
    "a drain that counts as success": (
        _DRAINED, _DRAINED.replace("dest: PREEMPTED", "dest: SUCCEEDED"), "DrainNotSuccess"),
    # an agent whose workers run ignores the drain signal (and the other agents' drain)
    "HEALTHY ignores preempted": (
        "    source: [INIT, HEALTHY, STOPPED, BACKOFF]\n    dest: DRAINING\n",
        "    source: [INIT, STOPPED, BACKOFF]\n    dest: DRAINING\n", "PromptEnd"),
    # the drain's deadline passes and the workers still running are left running
    "the deadline keeps the workers": (
        _DEADLINE, _DEADLINE.replace("[kill_workers]", "[]"), "StoppedAtEnd"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("edit", sorted(DRAIN_EDITS))
def test_a_drain_that_breaks_the_protocol_fails_the_check(edit: str) -> None:
    old, new, invariant = DRAIN_EDITS[edit]
    spec = parse_spec(_edited("resilient", old, new), path=f"<{edit}>")
    result = check_protocol(spec, agents=2, liveness=False, max_crashes=0, max_rejoins=0,
                            max_preempts=1, outcomes=("failed", "succeeded"))
    assert not result.ok, f"{edit}: TLC found nothing"
    assert result.violated() == invariant, _explain(result)


def test_job_failed_must_end_as_the_announcement_says() -> None:
    spec = parse_spec(_edited("torchrun", _JF, "    source: [INIT, HEALTHY, STOPPED]\n"
                                               "    dest: UNKNOWN\n"), path="<edit>")
    with pytest.raises(ModelError, match="job_failed leads to UNKNOWN, which does not report "
                                         "FAILED"):
        lifecycle_module(spec)


def test_an_action_the_model_does_not_know_is_refused() -> None:
    from fsm_agent import Vocabulary

    vocab = Vocabulary.builtin().extend(actions={"page_oncall": lambda ctx: None})
    spec = parse_spec(_edited("torchrun", _GIVE_UP, _GIVE_UP.replace(
        "[announce_failure, stop_workers]", "[announce_failure, page_oncall, stop_workers]")),
        vocabulary=vocab, path="<edit>")
    with pytest.raises(ModelError, match="does not know action 'page_oncall'"):
        lifecycle_module(spec)
