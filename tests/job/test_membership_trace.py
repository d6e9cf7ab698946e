"""Trace validation (tests/membership_trace.py, specs/model/MembershipTrace.tla): TLC matches a
run the model allows and rejects one it does not. The real runs are validated at the end of the
multi-node tests (tests/agent/test_slots.py, test_spares.py, test_peers.py, test_quarantine.py,
tests/job/test_standalone_store.py); these traces are written by hand, as those logs read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from membership_trace import Round, Run, matches_model, tlc_missing

pytestmark = pytest.mark.skipif(tlc_missing() is not None, reason=str(tlc_missing()))

A, B, C, D = (f"127.0.0.1_{pid}_0" for pid in (1001, 1002, 1003, 1004))


def _lost_rank_0(second: dict[str, int], *, quarantined: bool = False) -> Run:
    """A and B in the first round, A (rank 0) lost or quarantined, spare C in the second."""
    gone = {A}
    return Run(nodes=[A, B, C], n=2, quarantine_after=1,
               rounds=[Round([{A: 0, B: 1}]), Round([second], gone if quarantined else set())],
               lost=set() if quarantined else gone, quarantined=gone if quarantined else set(),
               succeeded=True)


@pytest.mark.timeout(120)
def test_a_spare_in_the_lost_slot_is_a_behaviour_of_the_model(tmp_path: Path) -> None:
    ok, result = matches_model(_lost_rank_0({B: 1, C: 0}), tmp_path)
    assert ok, result.output[-3000:]


@pytest.mark.timeout(120)
def test_torchs_renumbering_of_the_survivor_is_rejected(tmp_path: Path) -> None:
    # torch's enumerate(sorted(participants)): B moves from 1 to 0, the spare takes 1
    ok, result = matches_model(_lost_rank_0({B: 0, C: 1}), tmp_path)
    assert not ok and result.ok, result.output[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wrong", ["first_round", "quarantined_back", "not_lost",
                                   "extra_round", "not_full", "lost_in_round"])
def test_what_the_model_does_not_allow_is_rejected(tmp_path: Path, wrong: str) -> None:
    run = _lost_rank_0({B: 1, C: 0}, quarantined=True)
    if wrong == "first_round":  # the first round is torch's numbering (nothing to keep)
        run.rounds[0] = Round([{A: 1, B: 0}])
    elif wrong == "quarantined_back":  # a quarantined node in a later round
        run.rounds.append(Round([{A: 0, B: 1}], {A}))
    elif wrong == "not_lost":  # a quarantined node lost as well
        run.lost = {A}
    elif wrong == "extra_round":  # the survivor and the spare again, but C renumbered
        run.rounds.append(Round([{B: 0, C: 1}], {A}))
    elif wrong == "not_full":  # a round of one node in a two-node job
        run.rounds.append(Round([{B: 1}], {A}))
    else:  # C noticed lost before a round it is in (the round otherwise a restart for an
        # own failure of A's, C lost after it)
        run = Run(nodes=[A, B, C], n=2, quarantine_after=3,
                  rounds=[Round([{A: 0, C: 1}]), Round([{A: 0, C: 1}], lost={C})],
                  lost={C}, quarantined=set(), succeeded=False)
    ok, result = matches_model(run, tmp_path)
    assert not ok and result.ok, run.describe()


@pytest.mark.timeout(120)
def test_either_map_of_a_round_two_agents_marked_complete_may_match(tmp_path: Path) -> None:
    run = _lost_rank_0({B: 1, C: 0})
    run.rounds[1].maps.insert(0, {B: 0, D: 1})
    run.nodes.append(D)
    ok, result = matches_model(run, tmp_path)
    assert ok, result.output[-3000:]
