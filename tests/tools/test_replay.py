"""Replaying traces against specs: real runs follow their spec, each kind of tampering is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_agent import load_spec
from fsm_agent.cli.replay import main as replay_main
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._replay import replay

from ._helpers import DATA, lines, run_traced, write_lines


def _replay(path: Path, spec: str):
    (trace,) = read_trace(path)
    return replay(load_spec(spec), trace)


def _moves(path: Path) -> list[tuple[str, str, str]]:
    return [(r["source"], r["trigger"], r["dest"]) for r in lines(path) if r["kind"] == "step"]


def test_real_fail_once_then_recover_run_follows_both_presets() -> None:
    path = DATA / "fail_once_recover.jsonl"
    moves = _moves(path)
    # What the job did (the number of healthy ticks depends on timing): one restart, success.
    assert moves[0] == ("INIT", "start", "HEALTHY")
    assert moves.count(("HEALTHY", "failed", "STOPPED")) == 1
    assert moves[-1] == ("HEALTHY", "succeeded", "SUCCEEDED")
    # Both presets agree until the agent gives up, and this run never does.
    for spec in ("torchelastic", "torchrun"):
        res = _replay(path, spec)
        assert res.ok, res.divergence
        assert res.checked == len(moves)
        assert res.final_state == "SUCCEEDED"


def test_real_give_up_run_follows_torchrun_not_torchelastic() -> None:
    path = DATA / "give_up_torchrun.jsonl"
    assert _replay(path, "torchrun").ok
    res = _replay(path, "torchelastic")
    assert not res.ok
    assert res.divergence is not None
    assert res.divergence.step == _moves(path).index(("HEALTHY", "failed", "FAILED")) + 1
    # torchelastic waits at the exit barrier and raises on giving up; torchrun did neither.
    (give_up,) = [t for t in load_spec("torchelastic").outgoing("HEALTHY", "failed")
                  if t.dest == "FAILED"]
    assert res.divergence.message.endswith(
        f"HEALTHY --failed--> FAILED ran announce_failure, stop_workers; the spec (line "
        f"{give_up.line}) runs announce_failure, stop_workers, then on entering FAILED: "
        "exit_barrier, raise_failure")


def test_edge_counts(traced) -> None:
    path = traced("torchelastic", ["HEALTHY", "HEALTHY", "FAILED", "UNHEALTHY", "SUCCEEDED"],
                  max_restarts=2)
    res = _replay(path, "torchelastic")
    assert res.ok
    spec = load_spec("torchelastic")
    by_label = {(spec.transitions[i].triggers[0], src, spec.transitions[i].dest): n
                for (i, src), n in res.edge_counts.items()}
    assert by_label == {
        ("start", "INIT", "HEALTHY"): 1,
        ("healthy", "HEALTHY", "HEALTHY"): 2,
        ("failed", "HEALTHY", "STOPPED"): 1,
        ("unhealthy", "HEALTHY", "UNHEALTHY"): 1,
        ("always", "UNHEALTHY", "STOPPED"): 1,
        ("always", "STOPPED", "HEALTHY"): 2,
        ("succeeded", "HEALTHY", "SUCCEEDED"): 1,
    }


def test_action_that_raised_is_not_a_divergence(traced) -> None:
    path = traced("torchelastic", ["FAILED"], raises={"stop_workers": RuntimeError("boom")})
    res = _replay(path, "torchelastic")
    assert res.ok, res.divergence
    assert res.final_state == "UNKNOWN"
    assert res.extra_moves == {("HEALTHY", "failed", "UNKNOWN"): (1, "stop_workers raised")}


def test_guard_that_raised_is_not_a_divergence(traced) -> None:
    path = traced("torchelastic", ["HEALTHY"],
                  raises={"num_nodes_waiting": RuntimeError("store down")})
    res = _replay(path, "torchelastic")
    assert res.ok, res.divergence
    assert res.final_state == "UNKNOWN"
    assert res.extra_moves == {("HEALTHY", "healthy", "UNKNOWN"): (1, "nodes_waiting raised")}


def test_raise_failure_ends_in_failed(traced) -> None:
    path = traced("torchelastic", ["FAILED", "FAILED"], max_restarts=1)
    res = _replay(path, "torchelastic")
    assert res.ok, res.divergence
    assert res.final_state == "FAILED"


# -- tampering: each edit must be reported at its step, in plain words ----------------------


@pytest.fixture
def good(tmp_path: Path) -> list[dict]:
    path = tmp_path / "good.jsonl"
    run_traced(path, "torchelastic", ["HEALTHY", "FAILED", "SUCCEEDED"], max_restarts=1)
    return lines(path)  # header, start, healthy, failed, always, succeeded


def _tampered(tmp_path: Path, records: list[dict]) -> str:
    path = write_lines(tmp_path / "bad.jsonl", records)
    res = _replay(path, "torchelastic")
    assert not res.ok
    return str(res.divergence)


def test_wrong_destination(tmp_path: Path, good: list[dict]) -> None:
    good[3]["dest"] = "FAILED"
    msg = _tampered(tmp_path, good)
    assert msg.startswith("step 3 (line 4): HEALTHY --failed--> FAILED diverges from the spec")
    assert "has_restarts_left=True the spec takes HEALTHY --failed--> STOPPED" in msg


def test_guard_value_inconsistent_with_counters(tmp_path: Path, good: list[dict]) -> None:
    # Restarts were left, yet the trace claims has_restarts_left was false (and gave up).
    good[3]["guards"] = [{"name": "has_restarts_left", "value": False}]
    good[3]["dest"] = "FAILED"
    msg = _tampered(tmp_path, good)
    assert "has_restarts_left was recorded False, but 1 restart(s) were left" in msg


def test_missing_step(tmp_path: Path, good: list[dict]) -> None:
    del good[4]  # the STOPPED --always--> HEALTHY step
    msg = _tampered(tmp_path, good)
    assert "STOPPED is left at once by its 'always' transitions" in msg


def test_unhandled_trigger(tmp_path: Path, good: list[dict]) -> None:
    good[2]["trigger"] = "start"
    good[2]["observed"] = None
    msg = _tampered(tmp_path, good)
    assert "'start' fired a second time" in msg
    good[2]["trigger"] = "stopped"
    good[2]["source"] = "INIT"
    assert "leaves INIT, but the machine is in HEALTHY" in _tampered(tmp_path, good)


def test_wrong_actions(tmp_path: Path, good: list[dict]) -> None:
    good[3]["actions"] = good[3]["actions"][1:]  # no consume_restart
    msg = _tampered(tmp_path, good)
    assert "ran stop_workers; the spec (line" in msg
    assert "runs consume_restart, stop_workers" in msg


def test_counters_that_do_not_add_up(tmp_path: Path, good: list[dict]) -> None:
    for r in good[3:]:
        r["restart_count"] = 5
    assert "restart_count went from 0 to 5" in _tampered(tmp_path, good)


def test_steps_after_the_end(tmp_path: Path, good: list[dict]) -> None:
    good.append({**good[-1], "seq": 99})
    assert "had already finished in SUCCEEDED" in _tampered(tmp_path, good)


def test_guard_the_spec_does_not_check(tmp_path: Path, good: list[dict]) -> None:
    good[5]["guards"] = [{"name": "nodes_waiting", "value": False}]
    assert "evaluated guard(s) nodes_waiting that the spec does not check" in _tampered(
        tmp_path, good)


def test_trigger_and_observation_disagree(tmp_path: Path, good: list[dict]) -> None:
    good[2]["observed"] = "FAILED"
    assert "does not match the observed state FAILED" in _tampered(tmp_path, good)


# -- property: whatever the engine does, its trace replays cleanly ---------------------------

_OBS = st.sampled_from(["HEALTHY", "UNHEALTHY", "FAILED", "SUCCEEDED", "UNKNOWN", "INIT",
                        "STOPPED"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.sampled_from(["torchelastic", "torchrun"]),
    script=st.lists(_OBS, min_size=1, max_size=8),
    waiting=st.lists(st.integers(0, 2), max_size=4),
    max_restarts=st.integers(0, 3),
    failing=st.sampled_from([None, "rendezvous", "start_workers", "stop_workers",
                             "num_nodes_waiting", "exit_barrier"]),
)
def test_engine_traces_always_replay(tmp_path: Path, spec: str, script: list[str],
                                     waiting: list[int], max_restarts: int,
                                     failing: str | None) -> None:
    path = tmp_path / "p.jsonl"
    path.unlink(missing_ok=True)
    raises = {failing: RuntimeError("injected")} if failing else {}
    # Pad with SUCCEEDED so the script never runs dry before a final state.
    run_traced(path, spec, [*script, "SUCCEEDED"], max_restarts=max_restarts,
               nodes_waiting=waiting, raises=raises)
    res = _replay(path, spec)
    assert res.ok, res.divergence
    assert res.final_state in {"SUCCEEDED", "FAILED", "UNKNOWN", "INIT", "STOPPED"}


# -- the command -----------------------------------------------------------------------------


def test_cli_reads_the_spec_from_the_header(traced, capsys) -> None:
    path = traced("torchrun", ["HEALTHY", "SUCCEEDED"])
    assert replay_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "follows spec 'torchrun'" in out
    assert "INIT -> HEALTHY -> HEALTHY -> SUCCEEDED" in out


def test_cli_exit_codes(tmp_path: Path, good: list[dict], capsys) -> None:
    anonymous = write_lines(tmp_path / "anon.jsonl", [{"kind": "header"}, *good[1:]])
    good[3]["dest"] = "FAILED"
    bad = write_lines(tmp_path / "bad.jsonl", good)
    assert replay_main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "diverges from spec 'torchelastic'" in out
    assert "step 3 (line 4)" in out
    assert "path until then: 2 step(s): INIT -> HEALTHY -> HEALTHY" in out

    # The real run's header names its spec; a trace without one needs --spec.
    assert replay_main([str(DATA / "fail_once_recover.jsonl")]) == 0
    assert "follows spec 'torchelastic'" in capsys.readouterr().out
    assert replay_main([str(anonymous)]) == 2
    assert "does not name its spec" in capsys.readouterr().err
    assert replay_main([str(anonymous), "--spec", "torchelastic"]) == 0

    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps(good[0]) + "\n" + '{"kind": "step", "trig')
    assert replay_main([str(cut)]) == 2
    err = capsys.readouterr().err
    assert f"{cut}:2: the last record is cut short" in err
    assert "Traceback" not in err

    assert replay_main([str(bad), "--spec", "nosuchspec"]) == 2
    assert "no such spec file or preset" in capsys.readouterr().err


def _interrupted(good: list[dict], at: int, state: str) -> list[dict]:
    """The trace up to record ``at``, then the agent's final record for a signal in ``state``."""
    last = good[at]
    signal = {**last, "seq": last["seq"] + 1, "trigger": "signal", "source": state, "dest": state,
              "guards": [], "actions": [], "error": "SignalException: Process 1 got signal: 15"}
    return [*good[: at + 1], signal]


def test_a_signal_between_transitions_ends_the_trace(tmp_path: Path, good: list[dict]) -> None:
    path = write_lines(tmp_path / "sig.jsonl", _interrupted(good, 2, "HEALTHY"))
    res = _replay(path, "torchelastic")
    assert res.ok, res.divergence
    assert res.checked == 3


def test_a_signal_record_must_stand_where_the_machine_is(tmp_path: Path, good: list[dict]) -> None:
    records = _interrupted(good, 2, "STOPPED")  # the machine is in HEALTHY after record 2
    assert "leaves STOPPED, but the machine is in HEALTHY" in _tampered(tmp_path, records)
    records = [*_interrupted(good, 2, "HEALTHY"), good[3]]
    assert "had already finished" in _tampered(tmp_path, records)
