"""Which failure the analysis blames, on traces written by hand: the cases a real run reaches
only by the luck of the clock (torch stamps a failure without an error file to the second)."""

from __future__ import annotations

from typing import Any

from fsm_agent import load_spec
from fsm_agent._readers._analysis import analyse
from fsm_agent._readers._summary import format_text
from fsm_agent.trace._reader import Trace, TraceRecord


def _failure(rank: int, exitcode: int, timestamp: int, error_file: str | None = None
             ) -> dict[str, Any]:
    return {"local_rank": rank, "pid": 100 + rank, "exitcode": exitcode,
            "error_file": error_file or "<N/A>", "timestamp": timestamp,
            "message": f"exit {exitcode}"}


_START = {"trigger": "start", "source": "INIT", "dest": "HEALTHY", "wall_time": 10.0,
          "actions": [{"name": "rendezvous"}, {"name": "start_workers"}]}


def _hand_trace(spec: str, steps: list[dict[str, Any]], remaining: int = 0) -> Trace:
    """One agent's trace of ``spec``: the start, then ``steps`` (each step's own fields)."""
    base = {"guards": [], "actions": [], "error": None, "restart_count": 0,
            "remaining_restarts": remaining}
    records = [{**base, **step} for step in (_START, *steps)]
    return Trace("<hand>", {"spec": spec, "node": "n0", "pid": 1}, None,
                 tuple(TraceRecord(i, r) for i, r in enumerate(records, 1)))


def _trace(failures: dict[str, Any]) -> Trace:
    return _hand_trace("torchelastic", [
        {"trigger": "failed", "source": "HEALTHY", "dest": "FAILED", "wall_time": 20.0,
         "observed": "FAILED", "failures": failures,
         "guards": [{"name": "has_restarts_left", "value": False}],
         "actions": [{"name": "stop_workers"}]},
    ])


def test_a_rank_torch_stopped_is_not_the_root_cause_even_when_stamped_earlier() -> None:
    # rank 1 crashed (error file, stamped 101); torch then SIGTERMed rank 0, whose failure is
    # stamped with the whole second before (100) and sorts first by rank too.
    trace = _trace({"0": _failure(0, -15, 100), "1": _failure(1, 1, 101, "/e/1.json")})
    a = analyse([trace], load_spec("torchelastic"))
    assert a.root_cause is not None and a.root_cause.rank == 1
    assert a.incidents[0].cause == "exit code 1"
    assert "root cause: rank 1 " in format_text(a)


def test_at_equal_times_the_failure_with_an_error_file_is_blamed() -> None:
    trace = _trace({"0": _failure(0, 2, 100), "1": _failure(1, 1, 100, "/e/1.json")})
    a = analyse([trace], load_spec("torchelastic"))
    assert a.root_cause is not None and a.root_cause.rank == 1


def test_when_every_rank_was_sigtermed_the_earliest_is_blamed() -> None:
    trace = _trace({"0": _failure(0, -15, 101), "1": _failure(1, -15, 100)})
    a = analyse([trace], load_spec("torchelastic"))
    assert a.root_cause is not None and a.root_cause.rank == 1
    assert a.incidents[0].cause == "signal SIGTERM"


def test_otherwise_the_earliest_failure_is_blamed() -> None:
    trace = _trace({"0": _failure(0, 3, 99), "1": _failure(1, 1, 101, "/e/1.json")})
    a = analyse([trace], load_spec("torchelastic"))
    assert a.root_cause is not None and a.root_cause.rank == 0


def test_a_job_failure_during_a_backoff_is_decided_by_the_step_that_ended_it() -> None:
    # resilient: rule 'retry' chose a backoff, then the store was lost (job_failed) before the
    # restart. The rule did not give up: the summary named it as if it had.
    trace = _hand_trace("resilient", [
        {"trigger": "failed", "source": "HEALTHY", "dest": "BACKOFF", "wall_time": 20.0,
         "observed": "FAILED", "failures": {"1": _failure(1, 3, 20)}, "rule": "retry",
         "actions": [{"name": "stop_workers"}, {"name": "consume_restart"}]},
        {"trigger": "job_failed", "source": "BACKOFF", "dest": "FAILED", "wall_time": 20.5,
         "actions": [{"name": "stop_workers"}]},
    ], remaining=2)
    a = analyse([trace], load_spec("resilient"))
    text = format_text(a)
    assert "decided by: job_failed BACKOFF -> FAILED" in text, text
    assert "rule 'retry'" not in text, text
