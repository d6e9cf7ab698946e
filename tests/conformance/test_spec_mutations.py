"""Changing any single line of a preset spec breaks the differential check.

Each mutant is a copy of ``specs/<preset>.yaml`` with one line changed (``spec_mutants.py``).
The loader rejects most of them (SpecError); every one it accepts must be told apart from the
agent the preset claims to be (torch 2.13's for ``torchrun``, the seed's for ``torchelastic``)
by the same generated scripts the differential test uses, or, for the lines of the job-wide
protocol (``job_failed``, ``announce_failure``: a single agent never sees them), by TLC on the
protocol's model (``specs/model``), unless the model cannot tell the mutant from the preset.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent import SpecError, load_spec
from fsm_agent.testing._model_check import ModelError, check_protocol, protocol_signature

from .seed_agent import SeedAgent
from .spec_mutants import SPECS, line_mutants, undetected

pytestmark = pytest.mark.timeout(300)

AGENTS = {"torchrun": SimpleElasticAgent, "torchelastic": SeedAgent}


# A bound for a hung run, not a speed check: about 45 s on a quiet machine, and more than 300 s
# (its TLC runs included) with the machine loaded twice over.
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("preset", sorted(AGENTS))
def test_every_loadable_single_line_mutant_fails_the_differential_check(
        preset: str, tmp_path: Path) -> None:
    text = (SPECS / f"{preset}.yaml").read_text()
    loadable, rejected = {}, 0
    for i, (line, what, mutated) in enumerate(line_mutants(text)):
        path = tmp_path / f"{preset}-{i}.yaml"
        path.write_text(mutated)
        try:
            loadable[f"line {line}: {what}"] = load_spec(path)
        except SpecError:
            rejected += 1
    # Not vacuous: plenty of mutants get past the loader, so the differential check has work.
    assert len(loadable) >= 40, (len(loadable), rejected)
    left = undetected(loadable, AGENTS[preset], preset, max_examples=3_000)
    assert len(left) < 20, left  # only the job protocol's few lines
    same = protocol_signature(preset)
    for name in left:
        try:
            if protocol_signature(loadable[name]) == same:
                continue  # the same protocol (a reordered source list, say)
            result = check_protocol(loadable[name], agents=2, liveness=False, max_crashes=1,
                                    max_rejoins=1, outcomes=("failed", "unhealthy", "succeeded"))
        except ModelError:
            continue  # refused before TLC runs: detected
        assert not result.ok, f"{name}: neither the differential check nor TLC tells it apart"


@pytest.mark.parametrize("preset", sorted(AGENTS))
def test_an_unchanged_copy_passes(preset: str, tmp_path: Path) -> None:
    # The other half: the search does not flag everything.
    copy = tmp_path / f"{preset}.yaml"
    copy.write_text((SPECS / f"{preset}.yaml").read_text())
    assert undetected({"copy": load_spec(copy)}, AGENTS[preset], preset, max_examples=150) == [
        "copy"]
