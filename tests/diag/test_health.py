"""Node health checks before every (re)join: the checks themselves, their time budget against
the rendezvous timeout, and a real late node that fails one and leaves while the job goes on."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from diag_helpers import Jobs, free_port, trace_records

from fsm_agent import load_spec
from fsm_agent._core._health import command_succeeds, disk_free, health_budget, store_reachable

SPEC = Path(__file__).parent / "specs" / "health.yaml"
ENV_WORKER = Path(__file__).parents[1] / "agent" / "scripts" / "env_worker.py"


def test_disk_free_names_the_path_and_the_shortfall(tmp_path: Path) -> None:
    ok = disk_free([str(tmp_path)], 1)
    assert ok.ok and ok.duration >= 0
    short = disk_free([str(tmp_path), "/"], 10**18)
    assert not short.ok and str(tmp_path) in short.reason and "needs 1000000.0 TB" in short.reason
    missing = disk_free([str(tmp_path / "nope")], 1)
    assert not missing.ok and "No such file" in missing.reason


def test_a_command_that_overruns_its_budget_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    t0 = time.monotonic()
    res = command_succeeds(["sh", "-c", f"sleep 60 & echo $! > {marker}; wait"], 0.5)
    assert not res.ok and "did not finish within 0.5 s" in res.reason
    assert time.monotonic() - t0 < 5
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # the whole process group went
    failed = command_succeeds("sh -c 'echo disk sad >&2; exit 4'", 5)
    assert not failed.ok and failed.reason.endswith("exited 4: disk sad")
    assert not command_succeeds("/no/such/binary", 5).ok
    assert command_succeeds("true", 5).ok


def test_a_command_that_succeeds_leaving_a_child_on_its_output_passes_and_the_child_goes(
        tmp_path: Path) -> None:
    # The child keeps the command's stdout open: read through a pipe, the check waited for it
    # and reported a timeout although the command had exited 0.
    marker = tmp_path / "child.pid"
    t0 = time.monotonic()
    res = command_succeeds(["sh", "-c", f"sleep 60 & echo $! > {marker}; echo ok"], 10)
    assert res.ok, res.reason
    assert time.monotonic() - t0 < 5
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # nothing the check started outlives it


def test_store_reachable_needs_an_answer_not_just_a_port() -> None:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5),
                      wait_for_workers=False)
    assert store_reachable("127.0.0.1", server.port, 5).ok
    t0 = time.monotonic()
    res = store_reachable("127.0.0.1", free_port(), 1.0)
    assert not res.ok and "not reachable within 1 s" in res.reason
    assert time.monotonic() - t0 < 10


def test_a_signal_during_a_command_check_ends_the_check_and_the_command(tmp_path: Path) -> None:
    # torch's handler raises SignalException wherever the agent is: in a check's wait, the check
    # must neither swallow it nor leave the command's processes behind
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def raise_signal(signum: int, frame: object) -> None:
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signum)

    marker = tmp_path / "child.pid"
    old = signal.signal(signal.SIGALRM, raise_signal)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(SignalException):
            command_succeeds(["sh", "-c", f"sleep 60 & echo $! > {marker}; wait"], 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


def test_a_signal_during_a_store_check_is_not_an_unreachable_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def connect(*args: object, **kwargs: object) -> None:
        raise SignalException("Process 1 got signal: 15", sigval=15)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.distributed, "TCPStore", connect)
    with pytest.raises(SignalException):
        store_reachable("127.0.0.1", 1, 1.0)

    def refused(*args: object, **kwargs: object) -> None:
        raise torch.distributed.DistNetworkError("connection refused")

    monkeypatch.setattr(torch.distributed, "TCPStore", refused)
    res = store_reachable("127.0.0.1", 1, 1.0)
    assert not res.ok and "connection refused" in res.reason


#: The health command the tests give with --spec-param (a spec cannot name one itself).
UNLESS_UNHEALTHY = "sh -c 'test -z \"$FSM_TEST_UNHEALTHY\"'"


def test_the_checks_budget_must_fit_the_rendezvous_join_timeout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsm_agent.cli import main

    assert health_budget(load_spec(str(SPEC))) == {"disk_ok": 5.0, "store_ok": 5.0,
                                                   "command_ok": 10.0}
    assert main(["run", "--standalone", "--rdzv-conf", "join_timeout=20", "--spec", str(SPEC),
                 str(ENV_WORKER)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "may take 20 s" in err and "join timeout (20 s)" in err


@pytest.mark.timeout(150)
def test_a_late_node_failing_a_check_leaves_and_the_job_goes_on(
    jobs: Jobs, tmp_path: Path
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "health", "--rdzv-conf",
            "last_call_timeout=1", "--monitor-interval", "0.1", "--spec", str(SPEC),
            "--spec-param", f"health_command={UNLESS_UNHEALTHY}"]
    first = jobs.start([*args, "--trace", str(tmp_path / "first.jsonl")], ENV_WORKER,
                       env={"SLEEP": "8"}, name="first")
    [alone] = first.wait_for("*.json", 1, 60)
    assert alone["WORLD_SIZE"] == "1"
    late = jobs.start([*args, "--trace", str(tmp_path / "late.jsonl")], ENV_WORKER,
                      env={"SLEEP": "8", "FSM_TEST_UNHEALTHY": "1"}, name="late")
    assert late.wait(60) == 75, late.output
    # one line saying why, naming the check
    [line] = [x for x in late.output.splitlines() if x.startswith("fsm-agent run: ")]
    assert line.startswith("fsm-agent run: left the job: command_succeeds: command sh -c ")
    assert line.endswith("exited 1 (exit 75)")
    assert not late.records()  # it never started a worker
    assert first.poll() is None  # the job goes on ...
    assert first.wait(60) == 0, first.output  # ... and finishes, without the late node
    assert [r["WORLD_SIZE"] for r in first.records()] == ["1"]
    assert "membership change" not in first.output
    [left] = [r for r in trace_records(tmp_path / "late.jsonl") if r.get("kind") == "step"]
    assert (left["source"], left["dest"]) == ("INIT", "LEFT")
    health = left["diagnostics"]["health"]  # type: ignore[index]
    assert [c["ok"] for c in health["checks"]] == [True, True, False]
    checks = [r for r in trace_records(tmp_path / "first.jsonl")
              if r.get("diagnostics", {}).get("health")]  # type: ignore[union-attr]
    assert len(checks) == 1 and checks[0]["dest"] == "HEALTHY"


def test_a_custom_check_from_the_vocabulary_makes_the_lifecycle_leave(tmp_path: Path) -> None:
    from fsm_agent import Lifecycle, Vocabulary
    from fsm_agent._core._health import LeftJob
    from fsm_agent.testing import RecordingDriver

    # The test spec, its all_of extended with a check the embedding program registers.
    text = SPEC.read_text().replace("all_of: [disk_ok, store_ok, command_ok]",
                                    "all_of: [disk_ok, gpu_ok]")
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    seen: list[str] = []

    def gpu_ok(ctx: object) -> bool:
        seen.append("gpu_ok")
        return False

    spec = load_spec(str(path), vocabulary=Vocabulary.builtin().extend(guards={"gpu_ok": gpu_ok}))
    driver = RecordingDriver(["HEALTHY", "SUCCEEDED"])
    lc = Lifecycle(spec, driver)
    with pytest.raises(LeftJob) as info:
        lc.run(0.0)
    assert info.value.exit_code == 75 and lc.exit_code == 75
    assert lc.state_name == "LEFT" and seen == ["gpu_ok"]
    assert not [c for c in driver.calls if c[0] == "rendezvous"]  # it never joined
