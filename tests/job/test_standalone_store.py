"""``fsm-agent store``: the rendezvous store outside the nodes, so no node's loss takes it down.

Real processes on loopback: the store, then ``fsm-agent run`` agents given its endpoint and
``--rdzv-conf is_host=0`` (one worker each, ``node_worker.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from fsm_test_procs import alive, free_port, listening_addresses, standalone_store, stop_store
from job_helpers import Job, Jobs, nodes


@pytest.mark.timeout(120)
def test_agents_started_before_the_store_wait_for_it_and_none_hosts_it(jobs: Jobs) -> None:
    # With is_host=0 an agent never hosts, even on the store's machine before the store is up
    # (without it, the first agent binds the port and the store cannot start).
    port = free_port()
    args = nodes(2, "--rdzv-conf", "is_host=0,read_timeout=60", port=port, run_id="ext")
    a = jobs.start(args, env={"SLEEP": "3"}, name="node_a")
    time.sleep(2)
    store, _ = standalone_store(jobs, port)
    b = jobs.start(args, env={"SLEEP": "3"}, name="node_b")
    a.wait_for("start_*.json", 1, 60)
    b.wait_for("start_*.json", 1, 60)
    for agent in (a, b):  # clients only: the store's port is the store process's alone
        assert port not in [p for _, p in listening_addresses(agent.pid)], agent.output[-2000:]
    assert ("127.0.0.1", port) in listening_addresses(store.pid)
    assert a.wait(60) == 0 and b.wait(60) == 0, (a.output + b.output)[-4000:]
    starts = a.records("start_*.json") + b.records("start_*.json")
    assert sorted(r["group_rank"] for r in starts) == [0, 1]  # type: ignore[type-var]
    assert store.poll() is None  # the job is over, the store serves on
    stop_store(store)


def _kill_node(job: Job) -> None:
    """A node lost for good: its agent and workers SIGKILLed (no handler runs)."""
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    for rec in job.records("start_*.json"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(rec["pid"]), signal.SIGKILL)  # type: ignore[call-overload]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_first_node_lost_the_others_go_on_with_a_spare(jobs: Jobs) -> None:
    # Under torchrun the first agent hosts the store, and its loss ends every agent ("the
    # rendezvous store is unreachable", tests/reliability/test_store_loss.py). With the store
    # outside, B goes on: the spare C's arrival restarts it as a membership change, and the
    # new round (B and C; A's heartbeat has stopped) runs to the end.
    store, port = standalone_store(jobs)
    args = nodes(2, "--rdzv-conf", "is_host=0,keep_alive_interval=1,keep_alive_max_attempt=2",
                 "--max-restarts", "0", port=port, run_id="spare")
    # long enough for B's first group to be running when C arrives
    env = {"SLEEP": "30"}
    a = jobs.start(args, env=env, name="node_a")
    b = jobs.start(args, env=env, name="node_b")
    a.wait_for("start_*.json", 1, 60)
    b.wait_for("start_*.json", 1, 60)
    _kill_node(a)
    time.sleep(3)  # A's keep-alive is stale: the next round does not wait for it
    c = jobs.start(args, env=env, name="node_c")
    c.wait_for("start_*.json", 1, 90)
    # a membership change is no failure: B's second group starts as attempt 0 too
    first = min(b.records("start_a0_*.json"), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]
    assert b.wait(90) == 0, b.output[-4000:]
    assert c.wait(60) == 0, c.output[-4000:]
    assert not alive(int(first["pid"]))  # type: ignore[call-overload]
    starts = b.records("start_*.json") + c.records("start_*.json")
    assert all(int(r["world_size"]) == 2 for r in starts)  # type: ignore[call-overload]
    assert store.poll() is None
    stop_store(store)


@pytest.mark.timeout(60)
def test_a_taken_port_or_a_foreign_host_is_one_line_and_exit_2(jobs: Jobs) -> None:
    store, port = standalone_store(jobs)
    for argv, says in ((["--host", "127.0.0.1", "--port", str(port)], "already in use"),
                       (["--host", "192.0.2.1", "--port", str(free_port())],
                        "not an address of this machine"),
                       (["--host", "127.0.0.1", "--port", "65536"], "not a port")):
        done = subprocess.run([sys.executable, "-m", "fsm_agent", "store", *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done
        assert done.stdout == "" and done.stderr.count("\n") == 1, done
        assert done.stderr.startswith("fsm-agent store: error: ") and says in done.stderr
    stop_store(store)


@pytest.mark.timeout(120)
def test_a_late_agent_and_a_spare_never_needed_end_with_one_line_and_announce_nothing(
        jobs: Jobs) -> None:
    # C waits as a spare while A and B run; D comes after the job ended. torch's launcher
    # failed on both (an AttributeError for the spare; the late agent announced a failure
    # into the finished job's store).
    from datetime import timedelta

    from torch.distributed import TCPStore

    store, port = standalone_store(jobs)
    args = nodes(2, "--rdzv-conf", "is_host=0", port=port, run_id="late")
    # The workers run until the spare waits in the rendezvous: a spare that started after
    # the job ended (a slow start on a loaded machine) would be a late agent.
    gate = jobs.tmp_path / "spare_waits"
    env = {"SLEEP": "60", "GATE": str(gate)}
    a = jobs.start(args, env=env, name="node_a")
    b = jobs.start(args, env=env, name="node_b")
    a.wait_for("start_*.json", 1, 60)
    b.wait_for("start_*.json", 1, 60)
    spare = jobs.start(args, name="spare")
    _until_a_node_waits(port, "late", 60)
    gate.touch()
    assert a.wait(60) == 0 and b.wait(60) == 0, (a.output + b.output)[-4000:]
    assert spare.wait(60) == 0, spare.output[-3000:]
    assert "the job ended without needing this node" in spare.output, spare.output[-3000:]
    assert not spare.records("start_*.json")
    late = jobs.start(args, name="late")
    assert late.wait(60) == 1, late.output[-3000:]
    assert late.final_message() == ("fsm-agent run: left the job: the rendezvous of job 'late' "
                                    "is closed: the job has ended, there is nothing to join "
                                    "(exit 1)"), late.output[-3000:]
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert not client.check(["fsm_agent/job/late/outcome"])  # nobody announced a failure
    for job in (spare, late):
        assert "announced" not in job.output and "Traceback" not in job.output, job.output
    stop_store(store)


def _until_a_node_waits(port: int, run_id: str, within: float) -> None:
    """Wait until the c10d rendezvous of ``run_id`` holds a node beyond its participants."""
    import pickle
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    backend = C10dRendezvousBackend(client, run_id)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = backend.get_state()
        if got is not None:
            state = pickle.loads(got[0])
            if state.wait_list or state.redundancy_list:
                return
        time.sleep(0.05)
    raise AssertionError(f"no node waited in the rendezvous of {run_id!r} within {within} s")


@pytest.mark.timeout(120)
def test_the_store_stopped_under_a_running_job_ends_every_agent_naming_it(jobs: Jobs) -> None:
    store, port = standalone_store(jobs)
    args = nodes(2, "--rdzv-conf", "is_host=0", port=port, run_id="gone")
    a = jobs.start(args, env={"SLEEP": "120"}, name="node_a")
    b = jobs.start(args, env={"SLEEP": "120"}, name="node_b")
    a.wait_for("start_*.json", 1, 60)
    b.wait_for("start_*.json", 1, 60)
    stop_store(store)
    for agent in (a, b):
        assert agent.wait(60) == 1, agent.output[-3000:]
        last = agent.final_message()
        assert last.startswith("fsm-agent run: the rendezvous store is unreachable"), last
        # no agent hosted it: the message does not blame one
        assert "its host is gone (the node hosting it, or the fsm-agent store serving it)" \
            in last, last
