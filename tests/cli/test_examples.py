"""examples/subprocess_supervisor.py: a supervisor of its own embedding Lifecycle, run for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsm_agent import load_spec
from fsm_agent.trace import read_trace, replay

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "subprocess_supervisor.py"

pytestmark = pytest.mark.timeout(120)


def supervise(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=100)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def test_fail_once_restarts_and_succeeds(tmp_path: Path) -> None:
    proc = supervise(tmp_path, "--workers", "3", "--fail-once", "--trace", "run.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert "HEALTHY --failed--> STOPPED  / consume_restart, stop_workers" in proc.stdout
    assert proc.stdout.strip().endswith("result: SUCCEEDED after 1 restart(s)")
    # the trace it wrote follows its spec, step by step
    [lifecycle] = read_trace(tmp_path / "run.jsonl")
    result = replay(load_spec("torchelastic"), lifecycle)
    assert result.ok, result.divergence
    assert result.final_state == "SUCCEEDED"


@pytest.mark.parametrize(("spec", "says"), [
    ("torchelastic", "gave up: [default] exceeded max_restarts=1 (failed ranks: [1])"),
    ("torchrun", "result: FAILED after 1 restart(s)"),
])
def test_always_failing_gives_up_as_the_spec_says(tmp_path: Path, spec: str, says: str) -> None:
    proc = supervise(tmp_path, "--always-fail", "--spec", spec)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.count("--> HEALTHY  / rendezvous, start_workers") == 2  # start + 1 restart
    assert says in proc.stdout


def test_no_worker_left_behind_when_interrupted(tmp_path: Path) -> None:
    # workers that never finish: the supervisor is stopped by SIGINT mid-run
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--workers", "2"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WORKER_SECONDS": "60"})
    try:
        deadline = time.monotonic() + 60
        while len(children_of(proc.pid)) < 2:
            assert time.monotonic() < deadline, "workers never started"
            time.sleep(0.05)
        workers = children_of(proc.pid)
        proc.send_signal(2)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"), pid


def test_the_example_and_the_readme_count_the_drivers_methods_right() -> None:
    import fsm_agent

    methods = [n for n, v in vars(fsm_agent.Driver).items()
               if callable(v) and not n.startswith("_")]
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    count = words[len(methods)]
    assert f"``Driver`` of {count} small methods" in EXAMPLE.read_text()
    readme = (ROOT / "README.md").read_text()
    assert f"implements the {count}\nmethods of `fsm_agent.Driver`" in readme
    assert f"any object with these {count} methods is a fsm_agent.Driver" in readme
