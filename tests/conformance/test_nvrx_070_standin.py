"""The kit's target API on a STAND-IN for nvidia-resiliency-ext 0.7.0's ft_launcher agent
(``nvrx_0_7_standin.py``: 0.7.0's constructor and rendezvous calls on torch's base class), not on
the package: 0.7.0's wheel is cp312-only and CI runs Python 3.11. The real 0.7.0 is checked on
Python 3.12 by ``test_nvrx.py::test_nvrx_0_7_0_real_agent`` (commands: docs/conformance.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from fsm_agent.cli.conformance import main
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    default_settings,
    run_conformance,
    run_script,
)
from fsm_agent.testing._reference import Pending, Returned
from fsm_agent.testing._strategies import RunConfig, Tick
from fsm_agent.testing._target_api import NVRX, TargetAPI, load_target_api
from fsm_agent.testing._targets import resolve_target

from .nvrx_0_7_standin import StandInNVRx070Agent

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = ROOT / "examples" / "nvrx_0_7_0.yaml"
STANDIN = "tests.conformance.nvrx_0_7_standin:StandInNVRx070Agent"
ACCEPT = settings(default_settings(200), database=None)
REJECT = settings(default_settings(300), database=None)


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")] for line in text.splitlines()
            if re.match(r"^(start|\d+) +\|", line)]


def test_without_a_target_api_the_standin_is_a_harness_error_naming_what_to_declare() -> None:
    with pytest.raises(HarnessError, match=r"needs fault_tol_cfg, logs_specs.*--target-api"):
        run_conformance(StandInNVRx070Agent, spec="torchrun", settings=ACCEPT, seed=0)


def test_an_undeclared_rendezvous_method_is_named() -> None:
    # Only the constructor declared: 0.7.0's __init__ asks the handler for round().
    bare = TargetAPI("ctor-only", constructor=dict(NVRX.constructor))
    with pytest.raises(HarnessError, match=r"rendezvous handler's round, which .*declare it"):
        run_conformance(StandInNVRx070Agent, spec="torchrun", settings=ACCEPT, seed=0,
                        target_api=bare)
    # and a nested one: everything but _barrier_state.open_rendezvous, which only a failure
    # with a restart left reaches (so one script, not a search whose order decides)
    partial = TargetAPI("partial", constructor=dict(NVRX.constructor),
                        rendezvous={k: v for k, v in NVRX.rendezvous
                                    if k != "_barrier_state.open_rendezvous"})
    target = resolve_target(StandInNVRx070Agent, target_api=partial)
    with pytest.raises(HarnessError, match=r"handler's _barrier_state, which"):
        run_script(target, RunConfig(max_restarts=1), [Tick("FAILED")])


def test_a_peer_opened_restart_is_counted_then_gives_up() -> None:
    # max_restarts=1, a peer opens a round twice: the first restart spends the budget
    # (is_next_round_open() is the kit's nodes-waiting question), the second ends the run FAILED.
    config = RunConfig(max_restarts=1)
    script = [Tick("HEALTHY", nodes_waiting=1), Tick("HEALTHY", nodes_waiting=1)]
    target = resolve_target(StandInNVRx070Agent, target_api="nvrx")
    trace = run_script(target, config, script)
    tick = [("sleep", 0.1), ("monitor",)]
    assert trace.events == (
        ("rendezvous",), ("start_workers",),
        *tick, ("put_metric", "workers.default.remaining_restarts", 1),
        ("put_metric", "workers.default.healthy", 1), ("num_nodes_waiting",),
        ("stop_workers",), ("rendezvous",), ("start_workers",),
        *tick, ("put_metric", "workers.default.remaining_restarts", 0),
        ("put_metric", "workers.default.healthy", 1), ("num_nodes_waiting",),
        ("stop_workers",))
    assert trace.outcome == Returned("FAILED", {}, {})
    assert (trace.state, trace.remaining_restarts) == ("FAILED", 0)
    # torch's own loop on the same script: never counted, still running
    torch_trace = run_script(SimpleElasticAgent, config, script)
    assert torch_trace.outcome == Pending() and torch_trace.remaining_restarts == 1


def test_the_standin_conforms_to_the_example_spec() -> None:
    run_conformance(StandInNVRx070Agent, spec=EXAMPLE_SPEC, settings=ACCEPT, seed=0,
                    target_api="nvrx")


def test_the_standin_against_torchrun_shows_the_counted_peer_restart() -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(StandInNVRx070Agent, spec="torchrun", settings=REJECT, seed=0,
                        target_api="nvrx")
    text = str(info.value)
    assert "max_restarts=0" in text.splitlines()[1]
    rows = _rows(text)
    assert [r[0] for r in rows] == ["start", "1", "2"]
    assert rows[1][1:3] == ["HEALTHY", "1"]
    assert rows[1][-1].endswith("nodes_waiting?, stop  <-- differs")
    assert "actual outcome:   return FAILED {}; state FAILED" in text


def test_torch_against_the_example_spec_shows_the_uncounted_restart() -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(SimpleElasticAgent, spec=EXAMPLE_SPEC, settings=REJECT, seed=0)
    text = str(info.value)
    rows = _rows(text)
    assert rows[1][1:3] == ["HEALTHY", "1"]
    assert rows[1][-1].endswith("nodes_waiting?, stop, rendezvous, start  <-- differs")
    assert "expected outcome: return FAILED {}" in text


def test_a_yaml_target_api_works_as_the_builtin(tmp_path: Path) -> None:
    declared = tmp_path / "nvrx.yaml"
    declared.write_text("""\
name: my-nvrx
constructor:
  fault_tol_cfg: tests.conformance.nvrx_0_7_standin:FaultToleranceConfig
  logs_specs: DefaultLogsSpecs
rendezvous:
  round: rounds
  is_next_round_open: any_nodes_waiting
  attribution_stop_requested: false
  no_restart_reason: null
  signal_no_restart: ignore
  _this_node: {value: node-0}
  _barrier_state.open_rendezvous: ignore
""")
    api = load_target_api(declared)
    assert api.name == "my-nvrx" and "_barrier_state.open_rendezvous" in api.names
    run_conformance(StandInNVRx070Agent, spec=EXAMPLE_SPEC, settings=ACCEPT, seed=1,
                    target_api=declared)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rendezvous:\n  is_next_round_open: any_node_waiting\n")
    with pytest.raises(ValueError, match="'any_node_waiting' is not one of rounds"):
        load_target_api(bad)


def test_cli_target_api(capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    example = "examples/nvrx_0_7_0.yaml"
    assert main([STANDIN, "--target-api", "nvrx", "--spec", example, "--examples", "100",
                 "--seed", "3"]) == 0
    assert f"conforms to spec '{example}'" in capsys.readouterr().out
    assert main([STANDIN, "--spec", example, "--examples", "100", "--seed", "3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "needs fault_tol_cfg, logs_specs" in err[0]
    assert main([STANDIN, "--target-api", "nvrx", "--spec", "torchrun", "--examples", "300",
                 "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert "COUNTEREXAMPLE" in out
    assert re.search(r"reproduce with: .* --target-api nvrx ", out)
    assert main([STANDIN, "--target-api", "no-such-api"]) == 2
    assert "neither a built-in one (nvrx) nor a file" in capsys.readouterr().err
