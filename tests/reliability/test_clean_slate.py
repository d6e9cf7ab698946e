"""A clean slate before every (re)start (``fsm_agent/torch/_slate.py``): a process an earlier
attempt left running (a worker's ``setsid`` daemon, out of reach of torch's stop and of the
process-group reaper) is ended before the next attempt's workers start; one that survives
SIGKILL (uninterruptible sleep) makes a ``resilient`` node leave with 75, and is named in the
log under the torch presets, whose workers start beside it as torch's would.

The stand-in for uninterruptible sleep is cgroup v1's freezer: a frozen task is in state D and
a SIGKILL sent to it takes effect only once it is thawed, as with a process stuck on a dead
device. Under torch (and before this change) the daemon ran on beside the next attempt.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_helpers import FAST, Jobs, wait_gone

SLATE = Path(__file__).parent / "scripts" / "slate_worker.py"
FREEZER = Path("/sys/fs/cgroup/freezer")
QUICK_BACKOFF = ["--spec-param", "backoff_initial=100ms", "--spec-param", "backoff_jitter=0"]


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """``pids`` frozen in a cgroup v1 freezer group of their own (state D, SIGKILL held off)
    until the block ends; then thawed, and waited for if a SIGKILL was pending."""
    if not (FREEZER / "cgroup.procs").exists() or not os.access(FREEZER / "cgroup.procs",
                                                                 os.W_OK):
        pytest.skip("needs cgroup v1's freezer, writable (root): the stand-in for a process "
                    "in uninterruptible sleep")
    group = FREEZER / f"fsm-agent-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        for _ in range(500):
            if (group / "freezer.state").read_text().strip() == "FROZEN":
                break
        yield
    finally:
        (group / "freezer.state").write_text("THAWED")
        for pid in pids:
            with contextlib.suppress(OSError):
                (FREEZER / "cgroup.procs").write_text(str(pid))
        wait_gone(pids, 10)
        with contextlib.suppress(OSError):
            group.rmdir()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spec", ["torchelastic", "resilient"])
def test_a_restart_starts_only_once_the_previous_attempts_processes_are_gone(
        jobs: Jobs, spec: str) -> None:
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *FAST,
            "--spec", spec, *(QUICK_BACKOFF if spec == "resilient" else [])]
    job = jobs.start(args, SLATE)
    assert job.wait(60) == 0, job.output[-3000:]
    # what each attempt-1 worker saw of its predecessor's daemon as it started
    assert [r["previous"] for r in job.records("a1_r*.json")] == ["gone", "gone"], \
        job.output[-3000:]
    assert "of the previous attempt were still running" in job.output


@pytest.mark.timeout(90)
def test_a_process_that_survives_sigkill_makes_a_resilient_node_leave_with_75(
        jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", *FAST,
                      "--spec", "resilient", *QUICK_BACKOFF,
                      "--spec-param", "clean_slate_timeout=1s"], SLATE, env={"GATE": "1"})
    daemon = int(job.wait_for("a0_r*.json", 1, 60)[0]["daemon"])  # type: ignore[call-overload]
    with frozen([daemon]):
        (job.out_dir / "gate").touch()  # attempt 0 fails now, its daemon stuck
        assert job.wait(60) == 75, job.output[-3000:]
        verdict = job.final_message()
        assert "clean_slate" in verdict or "slate_ok" in verdict, verdict
        assert re.search(rf"pid {daemon} \([^)]*, uninterruptible sleep\)", verdict), verdict
    assert not job.records("a1_r*.json"), "a worker started beside the stuck process"


@pytest.mark.timeout(90)
def test_under_the_torch_presets_a_stuck_process_is_named_and_the_workers_start(
        jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", *FAST],
                     SLATE, env={"GATE": "1"})
    daemon = int(job.wait_for("a0_r*.json", 1, 60)[0]["daemon"])  # type: ignore[call-overload]
    with frozen([daemon]):
        (job.out_dir / "gate").touch()
        assert job.wait(60) == 0, job.output[-3000:]
        assert job.records("a1_r*.json")[0]["previous"] == "D"
    assert re.search(rf"pid {daemon} \([^)]*, uninterruptible sleep\)", job.output)
    assert "starting the workers beside them, as torch would" in job.output
