"""A lost node noticed where an agent waits, not only when its own workers fail
(docs/job-protocol.md, "Lost peers"): real ``fsm-agent run`` agents on an ``fsm-agent store``,
nodes SIGKILLed.

- while the workers run and talk to nobody (between two collectives), the survivor notices the
  loss on a monitor tick from torch's keep-alive and restarts at once (``node_replacements``,
  never ``--max-restarts``), so a waiting spare takes the lost node's slot;
- at the exit barrier, the survivor stops waiting for the lost node within the keep-alive's
  bound instead of the barrier's timeout (300 s by default).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsm_test_procs import FAST, Jobs, jobs_fixture
from test_slots import (
    SHUTDOWN_TIMEOUT,
    SLOT_WORKER,
    _kill_node,
    spare_takes_rank_0,
    standalone_store,
    stop_store,
)

# as test_peers: torch's keep-alive every second, a node dropped after three missed beats
INTERVAL, ATTEMPTS = 1, 3
# what the docs state for these settings: interval * (attempts + 1) + 1 s, plus a monitor tick
BOUND = INTERVAL * (ATTEMPTS + 1) + 1.0


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=SLOT_WORKER))


def _args(port: int, run_id: str) -> list[str]:
    return ["--spec", "resilient", "--nnodes", "2:2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id, "--max-restarts", "0",
            "--rdzv-conf", "is_host=0,join_timeout=120,last_call_timeout=1,"
                           f"keep_alive_interval={INTERVAL},keep_alive_max_attempt={ATTEMPTS}",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST]


@pytest.mark.timeout(150)
def test_a_node_lost_between_collectives_is_replaced_at_the_next_tick(
        jobs: Jobs, tmp_path: Path) -> None:
    store, port = standalone_store(jobs)
    # the workers sleep and never fail: only the survivor's monitor tick can notice the loss
    survivor = spare_takes_rank_0(jobs, _args(port, "between"), tmp_path / "stop")
    out = survivor.output
    assert "lost node(s) of the job" in out, out[-4000:]
    assert "restart 1 (budget node_replacements: 1 of inf used" in out, out[-4000:]
    # no worker failed: no failure rule ran, and --max-restarts 0 was never in the way
    assert "rule '" not in out, out[-4000:]
    stop_store(store)


@pytest.mark.timeout(150)
def test_the_exit_barrier_does_not_wait_for_a_lost_node(jobs: Jobs, tmp_path: Path) -> None:
    store, port = standalone_store(jobs)
    args = _args(port, "barrier")
    a = jobs.start(args, env={"STOP_FILE": str(tmp_path / "stop_a")}, name="node_a")
    b = jobs.start(args, env={"STOP_FILE": str(tmp_path / "stop_b")}, name="node_b")
    a_rec = a.wait_for("slot_*.json", 1, 90)[0]
    b.wait_for("slot_*.json", 1, 90)
    (tmp_path / "stop_a").touch()  # A's workers finish; B's go on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(int(a_rec["pid"]), 0)  # type: ignore[call-overload]
        except ProcessLookupError:
            break
        time.sleep(0.05)
    time.sleep(1.0)  # A waits at the exit barrier now
    assert a.poll() is None, a.output[-3000:]
    _kill_node(b)
    lost_at = time.monotonic()
    assert a.wait(60) == 0, a.output[-4000:]
    took = time.monotonic() - lost_at
    out = a.output
    assert re.search(r"exit barrier: lost node\(s\) of the job: .*; not waiting for it", out), \
        out[-4000:]
    # the keep-alive's bound, not the barrier's 300 s timeout (loose: a loaded machine)
    assert took < BOUND + 20, (took, out[-3000:])
    stop_store(store)
