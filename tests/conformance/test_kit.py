"""The kit checks itself: it accepts the real thing and rejects every deliberately wrong one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent import Lifecycle, SpecError
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    SupervisorConformance,
    check_script,
    conformance_machine,
    default_settings,
    run_conformance,
    run_script,
    simplify,
)
from fsm_agent.testing._oracle import _oracle
from fsm_agent.testing._strategies import RunConfig, Tick
from fsm_agent.torch import LifecycleAgentMixin

from . import mutants
from .seed_agent import SeedAgent
from .unscriptable import UNSCRIPTABLE

pytestmark = pytest.mark.timeout(300)

SPECS = Path(__file__).resolve().parents[2] / "specs"

# torch's agent and the seed also meet the reference table on every differential script.


class MixinTorchelastic(LifecycleAgentMixin, SimpleElasticAgent):
    """torch's agent made spec-driven by the runner's mixin (default spec: torchelastic)."""


class MixinTorchrun(LifecycleAgentMixin, SimpleElasticAgent):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, lifecycle_spec="torchrun", **kwargs)  # type: ignore[arg-type]


ACCEPT = settings(default_settings(100), database=None)
# Mutants are found within a few dozen scripts; the cap keeps a regression from hanging CI.
REJECT = settings(default_settings(1_000), database=None)


@pytest.mark.parametrize(
    ("target", "spec"),
    [
        (SimpleElasticAgent, "torchrun"),  # torch's own agent, abstract hooks and all
        # Against a spec file the engine is the reference, with the divergences the other way.
        (SimpleElasticAgent, SPECS / "torchrun.yaml"),
        (SeedAgent, SPECS / "torchelastic.yaml"),
        (Lifecycle, "torchrun"),
        (Lifecycle, "torchelastic"),
        (SeedAgent, "torchelastic"),
        (mutants.TorchLoop, "torchrun"),  # the mutants' base, with every switch off
        (mutants.good_lifecycle, "torchrun"),  # a factory(driver, **settings)
        (MixinTorchelastic, "torchelastic"),  # fsm_agent.torch's LifecycleAgentMixin
        (MixinTorchrun, "torchrun"),
    ],
    ids=["torch-torchrun", "torch-torchrun-file", "seed-torchelastic-file",
         "lifecycle-torchrun", "lifecycle-torchelastic", "seed-torchelastic",
         "torchloop-copy", "factory", "mixin-torchelastic", "mixin-torchrun"],
)
def test_kit_accepts_conforming_supervisors(target: object, spec: object) -> None:
    run_conformance(target, spec=spec, settings=ACCEPT)


ALL_MUTANTS = [*mutants.TORCH_MUTANTS, *mutants.LIFECYCLE_MUTANTS]


def test_there_are_at_least_ten_mutants() -> None:
    assert len({m.__name__ for m in ALL_MUTANTS}) >= 10


@pytest.mark.parametrize("mutant", ALL_MUTANTS, ids=lambda m: m.__name__)
def test_kit_rejects_wrong_supervisor(mutant: object) -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(mutant, spec="torchrun", settings=REJECT)
    message = str(info.value)
    assert "does not conform to spec 'torchrun'" in message
    assert "<-- differs" in message or "invariant broken" in message or "outcome" in message


def test_kit_rejects_a_mutated_spec_run_by_the_engine(tmp_path: Path) -> None:
    spec = mutants.uncounted_unhealthy_spec(tmp_path)

    def factory(driver: object, **kw: object) -> Lifecycle:
        return Lifecycle(spec, driver, **kw)  # type: ignore[arg-type]

    with pytest.raises(ConformanceFailure):
        run_conformance(factory, spec="torchrun", settings=REJECT)
    # ...while against its own spec (the engine as the reference) it conforms.
    run_conformance(factory, spec=spec, settings=settings(ACCEPT, max_examples=50))


def test_counterexample_is_shrunk_to_a_readable_table() -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(mutants.OffByOneMaxRestarts, spec="torchrun", settings=REJECT)
    text = str(info.value)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("tick "))
    for column in ("tick", "observed", "nodes waiting", "barrier", "fault", "expected calls",
                   "actual calls"):
        assert column in header
    # Shrunk: no restarts allowed, and the run is the start row plus one FAILED tick (then the
    # mutant's extra restart asks for a second tick the script does not have).
    assert "max_restarts=0" in text
    rows = [line for line in lines if re.match(r"^(start|\d+) +\|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["-", "FAILED", "(none: script ended)"]
    assert rows[1].endswith("<-- differs")
    assert "stop, rendezvous, start" in rows[1].split("|")[-1]
    assert "expected outcome: return FAILED" in text
    assert "remaining_restarts -1" in text


def test_state_machine_base_class_runs_as_a_test_case() -> None:
    accept = conformance_machine(SimpleElasticAgent, "torchrun")
    accept.TestCase.settings = settings(ACCEPT, max_examples=15, stateful_step_count=8)
    accept.TestCase().runTest()

    class OffByOne(SupervisorConformance):
        target = mutants.OffByOneMaxRestarts
        spec = "torchrun"

    OffByOne.TestCase.settings = settings(REJECT, stateful_step_count=8)
    with pytest.raises(ConformanceFailure):
        OffByOne.TestCase().runTest()


def test_stateful_mode_of_run_conformance_finds_the_same_bug() -> None:
    with pytest.raises(ConformanceFailure):
        run_conformance(mutants.BarrierTwice, spec="torchrun",
                        settings=settings(REJECT, stateful_step_count=6), stateful=True, seed=1)


def test_seed_makes_a_run_reproducible() -> None:
    def message(seed: int) -> str:
        with pytest.raises(ConformanceFailure) as info:
            run_conformance(mutants.SwallowsUnknown, spec="torchrun", settings=REJECT, seed=seed)
        return str(info.value)

    assert message(7) == message(7)


def test_bad_targets_and_specs_are_refused_before_hypothesis_runs(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"SimpleElasticAgent shape .* or a callable"):
        run_conformance(42)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(SpecError, match=r"bad\.yaml"):
        run_conformance(Lifecycle, spec=bad)


def test_check_script_reports_one_script() -> None:
    config = RunConfig(max_restarts=1)
    script = [Tick("FAILED"), Tick("SUCCEEDED", barrier="timeout")]
    trace = check_script(SimpleElasticAgent, config, script, spec="torchrun")
    assert trace.outcome.state == "SUCCEEDED"
    assert trace.remaining_restarts == 0
    with pytest.raises(ConformanceFailure, match="SkipsBarrier"):
        check_script(mutants.SkipsBarrier, config, script, spec="torchrun")


def test_the_default_spec_is_torchelastic_everywhere() -> None:
    # as for every fsm-agent command: torch 2.x's agent gives up without the seed's barrier
    script = [Tick("FAILED")]
    config = RunConfig(max_restarts=0)
    with pytest.raises(ConformanceFailure, match="does not conform to spec 'torchelastic'"):
        check_script(SimpleElasticAgent, config, script)
    with pytest.raises(ConformanceFailure, match="does not conform to spec 'torchelastic'"):
        run_conformance(SimpleElasticAgent, settings=REJECT, seed=0)
    assert run_script(Lifecycle, config, script).outcome.type_name == (
        "WorkerGroupFailureException")
    assert conformance_machine(SimpleElasticAgent).spec == SupervisorConformance.spec == (
        "torchelastic")


def test_recorded_torch_run_is_what_torch_did() -> None:
    # The recording itself, checked by hand against torch 2.13's _invoke_run for one script:
    # a membership restart, a counted restart, then success through a failing barrier.
    config = RunConfig(max_restarts=2, role="trainer", exit_barrier_timeout=7.0)
    script = [Tick("HEALTHY", nodes_waiting=2), Tick("UNHEALTHY"),
              Tick("SUCCEEDED", barrier="error")]
    trace = run_script(SimpleElasticAgent, config, script)
    tick = [("sleep", 0.1), ("monitor",)]
    assert trace.events == (
        ("rendezvous",), ("start_workers",),
        *tick, ("put_metric", "workers.trainer.remaining_restarts", 2),
        ("put_metric", "workers.trainer.healthy", 1), ("num_nodes_waiting",),
        ("stop_workers",), ("rendezvous",), ("start_workers",),
        *tick, ("put_metric", "workers.trainer.remaining_restarts", 2),
        ("put_metric", "workers.trainer.unhealthy", 1),
        ("stop_workers",), ("rendezvous",), ("start_workers",),
        *tick, ("put_metric", "workers.trainer.remaining_restarts", 1),
        ("put_metric", "workers.trainer.succeeded", 1), ("exit_barrier", 7.0),
    )
    assert (trace.state, trace.remaining_restarts) == ("SUCCEEDED", 1)
    assert trace.outcome.return_values == {0: "ret@3"}


@pytest.mark.parametrize("name", sorted(UNSCRIPTABLE))
def test_a_target_the_kit_cannot_script_is_a_harness_error_not_a_counterexample(
        name: str) -> None:
    target, message = UNSCRIPTABLE[name]
    with pytest.raises(HarnessError) as info:
        # torch agents, which conform to torchrun: only the harness error can end the search
        run_conformance(target, spec="torchrun", settings=REJECT, seed=0)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_harness_error_met_mid_search_also_ends_the_stateful_search() -> None:
    target, message = UNSCRIPTABLE["UsesTheStoreForTrainers"]
    with pytest.raises(HarnessError, match=re.escape(message)):
        run_conformance(target, spec="torchrun", settings=settings(REJECT, stateful_step_count=6),
                        seed=0, stateful=True)


def test_simplify_keeps_the_fewest_nodes_waiting_that_still_fail() -> None:
    # A shrunk table once showed "nodes waiting 2" where 1 shows the same bug (the plain
    # value, 0, hides it, and nothing tried 1).
    config = RunConfig(max_restarts=0)
    script = (Tick("HEALTHY", nodes_waiting=2), Tick("FAILED"))
    _, plain = simplify(mutants.CountsMembershipRestarts, _oracle("torchrun"), config, script)
    assert [t.nodes_waiting for t in plain] == [1, 0]
