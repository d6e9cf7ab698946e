"""The membership model (specs/model/Membership.tla): spares, stable rank slots, peer loss and
quarantine (docs/job-protocol.md, "Membership"), checked by TLC.

TLC checks the CI config (specs/model/Membership.cfg) and finds no error; each wrong variant
(torch's renumbering, #348's rendezvous closed on a fault, a join that admits a quarantined
node) is rejected with the property it breaks; and the properties are not vacuous: every
situation they speak of is reachable (docs/job-protocol.md, "Membership: spares, slots, peer
loss and quarantine").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from membership_trace import tlc_missing

from fsm_agent.testing._model_check import (
    ModelError,
    TLCResult,
    check_model,
    model_dir,
)

pytestmark = pytest.mark.skipif(tlc_missing() is not None, reason=str(tlc_missing()))

#: No TLC run of this module should take more than a few seconds to half a minute.
TIMEOUT = 100.0


def _explain(result: TLCResult) -> str:
    return f"{result.verdict}\n{result.trace[-6000:] or result.output[-3000:]}"


def _states(trace: str) -> list[tuple[str, dict[str, str]]]:
    """The states of a TLC trace: (the action that led to it, variable -> value)."""
    states = []
    for block in re.split(r"\n(?=State \d+: )", trace):
        head = re.match(r"State \d+: <(\w+)", block)
        if head is None:
            continue
        values = dict(re.findall(r"^/\\ (\w+) = (.*)$", block, flags=re.MULTILINE))
        states.append((head.group(1), values))
    return states


def _tuple(value: str) -> list[str]:
    return [x.strip().strip('"') for x in value.strip("<> ").split(",")]


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT)
def test_tlc_finds_no_error_in_the_ci_config() -> None:
    result = check_model("Membership", timeout=TIMEOUT)
    assert result.ok, _explain(result)
    # Not vacuous: TLC explored the whole state space (34,040 states: docs/job-protocol.md).
    assert result.distinct_states is not None and result.distinct_states > 10_000, result.output
    # and Refill, the liveness property, over all of it
    assert re.search(r"Checking \d+ branches of temporal properties for the complete state space",
                     result.output), result.output


def _rejected(variant: str, invariant: str) -> TLCResult:
    """TLC on the CI config with the wrong variant ``variant``: it must violate ``invariant``."""
    result = check_model("Membership", constants={"WrongVariant": f'"{variant}"'},
                         timeout=TIMEOUT)
    assert not result.ok
    assert result.violated() == invariant, _explain(result)
    return result


@pytest.mark.timeout(2 * TIMEOUT)
def test_torch_renumbering_moves_a_survivor() -> None:
    result = _rejected("renumber", "KeepSlots")
    # The last round moved a node of the round before to another slot.
    action, last = _states(result.trace)[-1]
    assert action == "NewRound", result.trace
    before, slots = _tuple(last["before"]), _tuple(last["slots"])
    moved = [i for i, (b, s) in enumerate(zip(before, slots, strict=True))
             if b != "-1" != s and b != s]
    assert moved, result.trace


@pytest.mark.timeout(2 * TIMEOUT)
def test_closing_the_rendezvous_on_a_fault_with_a_spare_is_rejected() -> None:
    # NVIDIA/nvidia-resiliency-ext#348: an oversubscribed re-rendezvous closes for good.
    result = _rejected("close_on_fault", "RendezvousOpen")
    action, last = _states(result.trace)[-1]
    assert action == "CloseOnFault", result.trace
    assert last["closed"] == "TRUE" and last["outcome"] == '"running"', result.trace
    live = [s for s in _tuple(last["status"]) if s not in ("lost", "quarantined")]
    assert len(live) > 2, result.trace  # more than N = 2 usable nodes: a spare was waiting


@pytest.mark.timeout(2 * TIMEOUT)
def test_a_join_that_admits_a_quarantined_node_is_rejected() -> None:
    result = _rejected("admit_quarantined", "QuarantinedStayOut")
    assert _states(result.trace)[-1][0] == "TryRejoin", result.trace


# Non-vacuity: each of these is false in some reachable state, so TLC reports it violated.
_REACH = r"""---- MODULE MembershipReach ----
EXTENDS Membership
NeverSucceeds == outcome # "succeeded"
NeverFails == outcome # "failed"
NeverQuarantines == quarantined = {}
\* a quarantined node's agent tries to join again while the job runs (and is refused)
NoRejoinAttempt == ~(Running /\ \E q \in quarantined : status[q] = "quarantined")
\* a newcomer (a spare) holds the slot a quarantined node held in the round before
NoSpareInQuarantinedSlot == ~\E q \in quarantined, n \in Nodes :
    before[q] # NoSlot /\ slots[q] = NoSlot /\ before[n] = NoSlot /\ slots[n] = before[q]
\* a newcomer holds the slot a lost node held in the round before, while a survivor keeps its
NoSpareInLostSlot == ~\E l, n, s \in Nodes :
    /\ status[l] = "lost" /\ before[l] # NoSlot /\ slots[l] = NoSlot
    /\ before[n] = NoSlot /\ slots[n] = before[l]
    /\ before[s] # NoSlot /\ slots[s] = before[s]
\* a survivor loses the race into the next round to a spare (it waits as a spare then)
NoSurvivorOutraced == ~\E s \in Nodes :
    before[s] # NoSlot /\ slots[s] = NoSlot /\ status[s] = "waiting"
\* Refill's premise: a slot's holder is gone while a spare waits
NoRefillNeeded == ~\E s \in Slots : Running /\ HolderGone(s) /\ Spares # {}
\* without fairness for the rendezvous's rounds, a lost slot may never be refilled
SpecNoRoundFairness == Init /\ [][Next]_vars /\ \A n \in Nodes : WF_vars(Arrive(n))
    /\ WF_vars(LeaveRound(n)) /\ WF_vars(JobFails)
====
"""
WITNESSES = ("NeverSucceeds", "NeverFails", "NeverQuarantines", "NoRejoinAttempt",
             "NoSpareInQuarantinedSlot", "NoSpareInLostSlot", "NoSurvivorOutraced",
             "NoRefillNeeded")


def _reach(tmp_path: Path, spec: str, checks: str) -> Path:
    (tmp_path / "MembershipReach.tla").write_text(_REACH)
    cfg = (model_dir() / "Membership.cfg").read_text()
    cfg = re.sub(r"^SPECIFICATION .*$", f"SPECIFICATION {spec}", cfg, flags=re.MULTILINE)
    cfg = re.sub(r"^(INVARIANTS|PROPERTY) .*$", "", cfg, flags=re.MULTILINE) + checks + "\n"
    (tmp_path / "MembershipReach.cfg").write_text(cfg)
    return tmp_path / "MembershipReach.tla"


@pytest.mark.timeout(2 * TIMEOUT)
@pytest.mark.parametrize("witness", WITNESSES)
def test_what_the_properties_speak_of_is_reachable(tmp_path: Path, witness: str) -> None:
    result = check_model(_reach(tmp_path, "Spec", f"INVARIANT {witness}"), timeout=TIMEOUT)
    assert result.violated() == witness, _explain(result)


@pytest.mark.timeout(2 * TIMEOUT)
def test_refill_needs_the_rendezvous_to_form_rounds(tmp_path: Path) -> None:
    result = check_model(_reach(tmp_path, "SpecNoRoundFairness", "PROPERTY Refill"),
                         timeout=TIMEOUT)
    assert not result.ok
    assert "Temporal properties were violated" in result.output, _explain(result)


def test_a_constant_the_config_does_not_set_is_an_error() -> None:
    with pytest.raises(ModelError, match="sets constant Agents 0 times"):
        check_model("Membership", constants={"Agents": "{1}"})
