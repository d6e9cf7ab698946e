"""The agent hosting the rendezvous store dies (SIGKILL) while another agent waits at the exit
barrier or in the rendezvous: the survivor leaves at once with a clear message (at the barrier,
its workers having succeeded, with success, as torch; in the rendezvous with the job's failure),
and no worker of it is left.

A SIGKILLed agent cannot stop its own workers (no handler runs; torch starts workers in their own
sessions, so they are not in the agent's process group): the test stops the dead host's workers
itself, and docs/reliability.md says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from reliability_helpers import FAST, Job, Jobs, free_port, wait_gone


def kill_host(host: Job) -> None:
    os.kill(host.pid, signal.SIGKILL)
    host.wait(10)
    for rec in host.records("*_start.json"):  # its orphaned workers (see the module docstring)
        for key in ("pid", "child_pid"):
            if rec.get(key):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(rec[key]), signal.SIGKILL)  # type: ignore[call-overload]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_survivor_at_the_exit_barrier_leaves_when_the_store_host_dies(jobs: Jobs) -> None:
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "loss",
              "--exit-barrier-timeout", "60", "--shutdown-timeout", "3", *FAST]
    host = jobs.start(common, env={"SLEEP": "120"}, name="host")
    host.wait_listening(port, 80)  # the first agent binds the endpoint: it hosts the store
    survivor = jobs.start(common, env={"SPAWN_CHILD": "1"}, name="survivor")
    survivor.wait_output("Waiting 60 seconds for other agents", 80)
    [rec] = survivor.records("*_start.json")
    kill_host(host)
    killed = time.monotonic()
    rc = survivor.wait(30)
    took = time.monotonic() - killed
    out = survivor.output
    assert took < 15, f"{took:.1f} s after the host died (barrier timeout 60 s):\n{out[-3000:]}"
    # Its workers had succeeded: a lost store at the barrier is logged as torch logs it, and
    # the outcome stands (fsm_agent.torch._launch.job_failure), whichever of the barrier's wait
    # and the job protocol's poll sees it first.
    assert "Error waiting on exit barrier" in out, out[-3000:]
    assert rc == 0, out[-3000:]
    assert "fsm-agent run: " not in out, out[-3000:]  # no failure verdict
    assert not wait_gone([int(rec["pid"]), int(rec["child_pid"])], 5)  # type: ignore[call-overload]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_survivor_in_rendezvous_leaves_when_the_store_host_dies(jobs: Jobs) -> None:
    port = free_port()
    # Three nodes needed, two come: both wait in the rendezvous.
    common = ["--nnodes", "3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "loss2",
              "--rdzv-conf", "join_timeout=40", *FAST]
    host = jobs.start(common, name="host")
    host.wait_listening(port, 80)
    survivor = jobs.start(common, name="survivor")
    survivor.wait_output("Rendezvous'ing worker group", 80)
    time.sleep(2)  # let it join the round
    kill_host(host)
    killed = time.monotonic()
    rc = survivor.wait(60)
    took = time.monotonic() - killed
    out = survivor.output
    last = survivor.final_message()
    assert rc == 1, out[-3000:]
    assert took < 40, f"{took:.1f} s (join timeout 40 s)"
    # The rendezvous' join loop polls the store (docs/job-protocol.md): the lost store is the
    # outcome, before torch's rendezvous gives up on it.
    assert last.startswith("fsm-agent run: the rendezvous store is unreachable"), last
    assert "no agent can rendezvous again" in last, last
    assert not survivor.records("*_start.json")  # no worker was ever started
