"""Changing any single line of a preset spec breaks the differential check.

Each mutant is a copy of ``specs/<preset>.yaml`` with one line changed (``spec_mutants.py``).
The loader rejects most of them (SpecError); every one it accepts must be told apart from the
agent the preset claims to be (torch 2.13's for ``torchrun``, the seed's for ``torchelastic``)
by the same generated scripts the differential test uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent import SpecError, load_spec

from .seed_agent import SeedAgent
from .spec_mutants import SPECS, line_mutants, undetected

pytestmark = pytest.mark.timeout(300)

AGENTS = {"torchrun": SimpleElasticAgent, "torchelastic": SeedAgent}


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
    assert undetected(loadable, AGENTS[preset], preset, max_examples=3_000) == []


@pytest.mark.parametrize("preset", sorted(AGENTS))
def test_an_unchanged_copy_passes(preset: str, tmp_path: Path) -> None:
    # The other half: the search does not flag everything.
    copy = tmp_path / f"{preset}.yaml"
    copy.write_text((SPECS / f"{preset}.yaml").read_text())
    assert undetected({"copy": load_spec(copy)}, AGENTS[preset], preset, max_examples=150) == [
        "copy"]
