"""A worker that stops making progress, with and without the watchdog (fsm_agent.torch._file_timer).

The worker arms torch's own deadline around each step (``FileTimerClient`` + ``expires``) when
the agent hands it a timer pipe; rank 1 then blocks inside a step on the first attempt.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import STANDALONE, Jobs, alive, trace_records

HANG = {"HANG_RANK": "1", "HANG_ATTEMPTS": "0", "STEPS": "20", "STEP_TIMEOUT": "1"}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_with_the_watchdog_a_hung_worker_makes_the_group_unhealthy_and_restarts(
    jobs: Jobs, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    env = {**HANG, "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
           "TORCHELASTIC_TIMER_FILE": str(tmp_path / "timer.fifo")}
    job = jobs.start([*STANDALONE, "--max-restarts", "1", "--trace", str(trace)], env=env)
    assert job.wait(140) == 0, job.output  # the agent survived the hang (torch's would not)
    records = trace_records(trace)
    unhealthy = [r for r in records if r.get("trigger") == "unhealthy"]
    assert len(unhealthy) == 1, records
    [step] = unhealthy
    assert step["source"] == "HEALTHY" and step["dest"] == "UNHEALTHY"
    failures = step["failures"]
    assert isinstance(failures, dict) and list(failures) == ["1"], failures
    assert "worker hung: timer" in failures["1"]["message"], failures
    # every worker's stacks were taken before the kill, and the failure names rank 1's
    assert "; stacks: " in failures["1"]["message"], failures
    assert {s["rank"] for s in step["diagnostics"]["stacks"]} == {0, 1}
    # Restarted per the spec: UNHEALTHY --always [has_restarts_left]--> STOPPED --> HEALTHY.
    path = [(r["source"], r["dest"]) for r in records if r.get("kind") == "step"]
    i = path.index(("HEALTHY", "UNHEALTHY"))
    assert path[i + 1 : i + 3] == [("UNHEALTHY", "STOPPED"), ("STOPPED", "HEALTHY")], path
    assert records[-1]["dest"] == "SUCCEEDED" and records[-1]["restart_count"] == 1
    starts = {(r["TORCHELASTIC_RESTART_COUNT"], r["RANK"]): r for r in job.records("*_start.json")}
    done = {(r["TORCHELASTIC_RESTART_COUNT"], r["RANK"]) for r in job.records("*_done.json")}
    assert ("0", "1") not in done and {("1", "0"), ("1", "1")} <= done, done
    hung_pid = int(starts[("0", "1")]["pid"])  # type: ignore[call-overload]
    assert failures["1"]["pid"] == hung_pid
    assert not alive(hung_pid)
    assert starts[("0", "1")]["TORCHELASTIC_TIMER_FILE"] == env["TORCHELASTIC_TIMER_FILE"]


@pytest.mark.timeout(120)
def test_without_the_watchdog_nothing_changes(jobs: Jobs, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    job = jobs.start([*STANDALONE, "--max-restarts", "1", "--shutdown-timeout", "3",
                      "--trace", str(trace)], env=HANG)
    [rec] = job.wait_for("a0_r1_start.json", 1, 80)
    assert rec["TORCHELASTIC_TIMER_FILE"] is None  # no watchdog: no pipe for the workers
    time.sleep(3 * float(HANG["STEP_TIMEOUT"]) + 1)  # well past the step's deadline
    assert job.poll() is None, job.output
    records = trace_records(trace)
    assert {r["dest"] for r in records if r.get("kind") == "step"} == {"HEALTHY"}, records
    assert alive(int(rec["pid"]))  # type: ignore[call-overload]
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(15) == 128 + signal.SIGTERM, job.output


@pytest.mark.parametrize("raised", ["signal", "error"])
def test_a_signal_while_the_timer_takes_stacks_is_the_agents(
        monkeypatch: pytest.MonkeyPatch, raised: str) -> None:
    # The stacks before a timer's kill are diagnostics: their errors are logged and the kill goes
    # on; a termination signal that torch's handler raises during the dumps (seconds of py-spy)
    # still ends the agent.
    from types import SimpleNamespace

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from fsm_agent.torch import _file_timer, _hang

    exc = (SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM) if raised == "signal"
           else RuntimeError("py-spy is missing"))

    def take_stacks(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(_hang, "take_stacks", take_stacks)
    agent = SimpleNamespace(_pcontext=SimpleNamespace(error_files={}))
    group = SimpleNamespace(workers=[SimpleNamespace(local_rank=0, global_rank=0)],
                            spec=SimpleNamespace(role="default"))
    if raised == "signal":
        with pytest.raises(SignalException):
            _file_timer._stacks_before_kill(agent, {0: 123}, group)  # type: ignore[arg-type]
    else:
        assert _file_timer._stacks_before_kill(agent, {0: 123}, group) == {}  # type: ignore[arg-type]
