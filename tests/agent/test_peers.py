"""Lost peers from torch's rendezvous keep-alive (``fsm_agent.torch._peers``, the guard
``peer_lost`` of the resilient spec).

On torch's real c10d rendezvous (a TCPStore on loopback, torch's handlers in threads), then the
issue's scenario with real ``fsm-agent run`` agents: two nodes in a gloo all_reduce loop, a
spare, one node SIGKILLed, ``--max-restarts 0``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fsm_test_procs import FAST, Jobs, jobs_fixture
from test_slots import (
    SHUTDOWN_TIMEOUT,
    _handler,
    built_agent,
    spare_takes_rank_0,
    standalone_store,
    stop_store,
    store,
)

from fsm_agent.torch._peers import LOST_ATTR, PeerWatch, install_peer_watch

ALLREDUCE_WORKER = Path(__file__).parent / "scripts" / "allreduce_worker.py"
# keep_alive_interval, keep_alive_max_attempt: a node that joined first waits up to 1 s (torch's
# join loop) for the round, then beats 1 s later; 2 attempts would let torch drop it meanwhile
INTERVAL, ATTEMPTS = 1, 3  # INTERVAL as test_slots._handler's

__all__ = ["store"]  # the fixture, shared


@pytest.fixture
def round3(store: Any) -> Iterator[tuple[list[Any], list[PeerWatch]]]:
    """Three handlers with a watch each, after one completed round."""
    run_id = uuid.uuid4().hex
    handlers = [_handler(store, run_id, False, attempts=ATTEMPTS) for _ in range(3)]
    watches = []
    for h in handlers:
        watch = install_peer_watch(h)
        assert watch is not None
        watches.append(watch)
    try:
        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(h.next_rendezvous) for h in handlers]:
                f.result(timeout=60)
        for w in watches:
            w.round_started()
        yield handlers, watches
    finally:
        for h in handlers:
            h._stop_heartbeats()


def test_the_round_peers_are_the_other_participants(
        round3: tuple[list[Any], list[PeerWatch]]) -> None:
    handlers, watches = round3
    nodes = {h._this_node for h in handlers}
    for h, w in zip(handlers, watches, strict=True):
        assert w.peers == nodes - {h._this_node}
    assert watches[0].bound() == INTERVAL * (ATTEMPTS + 1) + 1


@pytest.mark.timeout(60)
def test_live_peers_are_not_lost_and_the_answer_comes_within_a_heartbeat(
        round3: tuple[list[Any], list[PeerWatch]]) -> None:
    _, watches = round3
    started = time.monotonic()
    assert watches[0].lost() == ()
    # every live peer beats within one keep_alive_interval (not the whole bound)
    assert time.monotonic() - started < watches[0].bound()


@pytest.mark.timeout(60)
def test_a_peer_whose_keep_alive_stopped_is_lost_even_after_another_swept_it(
        round3: tuple[list[Any], list[PeerWatch]]) -> None:
    handlers, watches = round3
    handlers[0]._stop_heartbeats()  # node 0 is gone: no more keep-alive
    # node 1 asks at once: it waits for node 0's heartbeat to expire (3 x 1 s), not forever
    assert watches[1].lost() == (str(handlers[0]._this_node),)
    # node 2 asks after node 1's next keep-alive wrote the swept state (node 0 gone from it):
    # the loss is on the state, not only in the sweeper's memory
    time.sleep(2 * INTERVAL)
    state = handlers[2]._state_holder.state
    assert handlers[0]._this_node not in state.last_heartbeats
    assert handlers[0]._this_node in getattr(state, LOST_ATTR)
    assert watches[2].lost() == (str(handlers[0]._this_node),)


@pytest.mark.timeout(60)
def test_a_tick_sees_a_loss_another_agent_swept_with_the_state_its_membership_check_reads(
        round3: tuple[list[Any], list[PeerWatch]]) -> None:
    # Node 0 is lost; node 2 sweeps it and writes the swept state. Node 1 (its keep-alive
    # stopped, so that nothing else refreshes its copy) last read the state before that: its
    # next tick's membership check reads it afresh, and peer_lost must answer from that read.
    handlers, watches = round3
    lost = str(handlers[0]._this_node)
    handlers[0]._stop_heartbeats()
    handlers[1]._stop_heartbeats()
    # node 1 may be swept with it (it beats no more either); a beat either wrote just before
    # its timer stopped reads as alive, so node 2 asks until the loss is found
    while lost not in watches[2].lost():
        pass
    time.sleep(2 * INTERVAL)  # node 2's next keep-alive writes the swept state
    assert watches[1].lost(wait=False) == ()  # the copy node 1 read before the sweep
    reads: list[int] = []
    assert watches[1].lost_at_tick(lambda: reads.append(handlers[1].num_nodes_waiting())) \
        == (lost,)
    assert reads == [0]
    # the membership check of the same tick answers from that read, asking the store nothing
    assert watches[1].lost_at_tick(lambda: reads.append(-1)) == (lost,)
    assert reads == [0]


@pytest.mark.timeout(60)
def test_a_peer_that_left_the_round_is_not_lost(
        round3: tuple[list[Any], list[PeerWatch]]) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    handlers, watches = round3
    # what next_rendezvous starts with on a restart: torch's exit op (no heartbeat any more)
    handlers[0]._op_executor.run(dyn._RendezvousExitOp(), time.monotonic() + 10)
    handlers[0]._stop_heartbeats()
    assert watches[1].lost() == ()


def test_the_torch_presets_leave_the_state_holder_alone() -> None:
    watched = {}
    for preset in ("torchrun", "torchelastic", "resilient"):
        with built_agent(preset) as (agent, handler):
            watched[preset] = ("_sanitize" in vars(handler._state_holder),
                               agent._fsm_peer_watch is not None)
    assert watched == {"torchrun": (False, False), "torchelastic": (False, False),
                       "resilient": (True, True)}


# -- the scenario: real agents, a standalone store, a spare, --max-restarts 0 ----------


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=ALLREDUCE_WORKER))


@pytest.mark.timeout(150)
def test_a_lost_node_is_replaced_by_the_spare_without_spending_max_restarts(
        jobs: Jobs, tmp_path: Path) -> None:
    store, port = standalone_store(jobs)
    args = ["--spec", "resilient", "--nnodes", "2:2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "peers", "--max-restarts", "0",
            "--rdzv-conf", "is_host=0,join_timeout=120,last_call_timeout=1,"
                           f"keep_alive_interval={INTERVAL},keep_alive_max_attempt={ATTEMPTS}",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST]
    # the survivor's worker fails in its next all_reduce; the spare takes the lost slot
    survivor = spare_takes_rank_0(jobs, args, tmp_path / "stop")
    # the survivor's workers failed, and the failure was the lost node's, not the user's budget
    assert "rule 'peer_lost'" in survivor.output, survivor.output[-4000:]
    assert "lost node(s) of the job" in survivor.output
    assert "rule 'retry'" not in survivor.output
    stop_store(store)
