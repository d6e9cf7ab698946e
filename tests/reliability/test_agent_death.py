"""No worker outlives its agent (``fsm_agent/torch/_sentinel.py``): whatever ends the agent,
SIGKILL included, its workers and their whole families (children, a forked child, a
double-forked ``setsid`` daemon) end within 5 s. Under torchrun, and before, all of them ran on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import FAST, Job, Jobs, alive

FAMILY = Path(__file__).parent / "scripts" / "family_worker.py"
BOUND = 5.0


def _everyone(job: Job, pattern: str) -> list[int]:
    pids = []
    for rec in job.records(pattern):
        pids += [int(rec["pid"]), *(int(p) for p in rec["family"])]  # type: ignore[call-overload, union-attr]
    return pids


def _gone_within(pids: list[int], bound: float) -> float:
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        assert time.monotonic() - t0 < bound, [p for p in pids if alive(p)]
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("phase", ["running", "backoff"])
def test_an_agent_killed_with_sigkill_leaves_no_worker_and_no_descendant(
        jobs: Jobs, phase: str) -> None:
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *FAST]
    env = {}
    if phase == "backoff":  # attempt 0 fails; the agent waits 30 s before the restart
        args += ["--spec", "resilient", "--spec-param", "backoff_initial=30s",
                 "--spec-param", "backoff_jitter=0"]
        env = {"FAIL_ATTEMPT": "0"}
    job = jobs.start(args, FAMILY, env=env)
    job.wait_for("a0_r*.json", 2, 60)
    if phase == "backoff":
        job.wait_output("restarting in", 30)  # the backoff has begun
    pids = _everyone(job, "a0_r*.json")
    os.kill(job.pid, signal.SIGKILL)  # no handler runs: the OOM killer, a scheduler's kill -9
    job.wait(10)
    took = _gone_within(pids, BOUND)
    print(f"{phase}: {len(pids)} processes gone {took * 1000:.0f} ms after the agent's SIGKILL")


@pytest.mark.timeout(90)
def test_what_finished_workers_left_running_ends_with_the_job(jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST], FAMILY,
                     env={"EXIT_AFTER": "0.5"})
    assert job.wait(60) == 0, job.output[-3000:]
    _gone_within(_everyone(job, "a0_r*.json"), BOUND)


@pytest.mark.timeout(90)
def test_under_torchrun_the_family_runs_on(jobs: Jobs) -> None:
    # The premise, and a check that can fail: torch's agent leaves them all.
    from fsm_test_procs import wait_gone

    job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST], FAMILY,
                     launcher="torchrun")
    job.wait_for("a0_r*.json", 1, 60)
    pids = _everyone(job, "a0_r*.json")
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    time.sleep(BOUND)
    left = wait_gone(pids, 0)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert len(left) == len(pids), left  # every one was still running


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_on", ["its_own", "agent_a"])
def test_an_agent_killed_at_the_exit_barrier_leaves_nothing_of_its_finished_workers(
        jobs: Jobs, store_on: str) -> None:
    # Two nodes: A's workers finish (their families left running) and A waits at the exit
    # barrier for B, whose workers still run; A is SIGKILLed there.
    # - its_own: the store is an `fsm-agent store`; B's workers are not A's to end and run on.
    # - agent_a: A hosts the store. B learns that the store is lost as A's sentinel ends A's
    #   workers (both react to the same death) and stops its own workers itself ("A lost store
    #   is an outcome", docs/job-protocol.md): B ends with the store's loss and leaves nothing.
    from fsm_test_procs import free_port, standalone_store, stop_store

    store = None
    if store_on == "its_own":
        store, port = standalone_store(jobs)
        conf = ["--rdzv-conf", "is_host=0"]
    else:
        port, conf = free_port(), []
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "barrier", *conf, *FAST]
    a = jobs.start(args, FAMILY, env={"EXIT_AFTER": "0.5"}, name="a")
    if store is None:
        a.wait_listening(port, 60)
    b = jobs.start(args, FAMILY, name="b")
    a.wait_output("Waiting 300 seconds for other agents", 60)
    b.wait_for("a0_r*.json", 1, 30)
    pids = _everyone(a, "a0_r*.json")
    others = _everyone(b, "a0_r*.json")
    assert [p for p in pids if alive(p)], "the finished workers left their families running"
    os.kill(a.pid, signal.SIGKILL)
    a.wait(10)
    _gone_within(pids, BOUND)
    if store is None:
        assert b.wait(30) == 1, b.output[-3000:]
        assert "the rendezvous store is unreachable" in b.final_message(), b.output[-3000:]
        _gone_within(others, BOUND)
        return
    assert others and all(alive(p) for p in others)  # another agent's are not A's to end
    assert b.poll() is None, b.output[-3000:]
    os.kill(b.pid, signal.SIGTERM)  # stopped as a user would
    b.wait(30)
    _gone_within(others, BOUND)
    stop_store(store)


@pytest.mark.timeout(120)
def test_an_agent_killed_in_a_restarts_rendezvous_leaves_nothing_of_the_failed_attempt(
        jobs: Jobs) -> None:
    # Two nodes: A's workers fail (their families left behind, the setsid daemon out of reach
    # of the reaper) and A waits in the restart's rendezvous for B, whose agent is stopped
    # (SIGSTOP) so that the round cannot complete; A is SIGKILLed there.
    from fsm_test_procs import free_port

    port = free_port()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "rdzv", *FAST]
    a = jobs.start(args, FAMILY, env={"FAIL_ATTEMPT": "0", "GATE": "1"}, name="a")
    a.wait_listening(port, 60)
    b = jobs.start(args, FAMILY, name="b")
    a.wait_for("a0_r*.json", 1, 60)
    b.wait_for("a0_r*.json", 1, 60)
    os.kill(b.pid, signal.SIGSTOP)
    try:
        (a.out_dir / "gate").touch()  # A's worker fails now
        a.wait_output("restart 1 of 1", 30)
        time.sleep(1.0)  # into the rendezvous, which B cannot join
        assert a.poll() is None, a.output[-3000:]
        pids = _everyone(a, "a0_r*.json")
        assert not a.records("a1_r*.json")
        daemon = pids[-1]
        assert alive(daemon), "the failed attempt's setsid daemon is left while A waits"
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        took = _gone_within(pids, BOUND)
        print(f"rendezvous: the failed attempt's daemon gone {took * 1000:.0f} ms after the "
              "agent's SIGKILL")
    finally:
        os.kill(b.pid, signal.SIGCONT)
    os.kill(b.pid, signal.SIGTERM)
    b.wait(60)
    _gone_within(_everyone(b, "a0_r*.json"), BOUND)


@pytest.mark.timeout(90)
def test_an_agent_killed_with_sigkill_leaves_nothing_of_its_preload_template(
        jobs: Jobs, tmp_path: Path) -> None:
    # --preload: the workers are forked from a template process that imported the module, and
    # the module started a child of its own there, in a session of its own.
    import json

    started = tmp_path / "template.json"
    (tmp_path / "starts_a_daemon.py").write_text(
        "import json, os, subprocess\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(started)!r}, 'w').write(json.dumps([os.getpid(), p.pid]))\n")
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST, "--preload",
                      "starts_a_daemon"], FAMILY, env={"PYTHONPATH": str(tmp_path)})
    job.wait_for("a0_r*.json", 2, 60)
    assert "--preload starts_a_daemon: imported in" in job.output, job.output[-3000:]
    template, daemon = json.loads(started.read_text())
    pids = [template, daemon, *_everyone(job, "a0_r*.json")]
    assert all(alive(p) for p in pids)
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    took = _gone_within(pids, BOUND)
    print(f"preload: {len(pids)} processes gone {took * 1000:.0f} ms after the agent's SIGKILL")


_EMBEDDED = r"""
import json, os, subprocess, time
from multiprocessing import forkserver, get_context, resource_tracker
from fsm_agent.torch._sentinel import Sentinel

sentinel = Sentinel()
assert sentinel.start()
# what an agent run inside a longer-lived process starts with the token in its environment:
# multiprocessing's helpers (torch's function workers use them) and a worker's leftover child
p = get_context("forkserver").Process(target=print)
p.start()
p.join()
resource_tracker.ensure_running()
helpers = {"forkserver": forkserver._forkserver._forkserver_pid,
           "resource_tracker": resource_tracker._resource_tracker._pid}
child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# what the sweep reads: empty while the child is still inside execve (vfork returns first)
with open("/proc/%d/environ" % child.pid, "rb") as f:
    marked = ("FSM_AGENT_SENTINEL=" + sentinel.token).encode() in f.read().split(b"\0")
sentinel.close()
try:
    child.wait(10)
    outcome = child.returncode
except subprocess.TimeoutExpired:  # not swept: say what the sentinel did, and end it here
    child.kill()
    child.wait()
    outcome = "survived"
time.sleep(0.2)
# still running: waitpid reaps nothing (they are this process's children)
running = {name: os.waitpid(pid, os.WNOHANG) == (0, 0) for name, pid in helpers.items()}
print(json.dumps({"running": running, "child": outcome, "child_marked": marked,
                  "sentinel_exit": sentinel.proc.returncode}))
"""


@pytest.mark.timeout(60)
def test_a_normal_end_sweeps_the_workers_leftovers_but_not_the_processs_own_helpers(
        tmp_path: Path) -> None:
    # An agent run inside a longer-lived process (a test harness, a Ray actor): its sentinel's
    # sweep at the end kills what carries the token, the workers' leftovers, but not the
    # process's multiprocessing forkserver and resource tracker, which started during the run
    # and which its next run uses (killed, they made that run fail with EOFError).
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _EMBEDDED], capture_output=True, text=True,
                         timeout=50, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # a failure shows whether the leftover carried the token and how the sentinel ended
    assert result["child"] == -signal.SIGKILL, result
    # both helpers outlived the sweep; they end with their process (their pipes close)
    assert result["running"] == {"forkserver": True, "resource_tracker": True}, result
