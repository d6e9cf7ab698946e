"""Stable rank slots (``fsm_agent.torch._slots``, the resilient spec's ``stable_slots``).

On torch's real c10d rendezvous (a TCPStore on loopback, torch's handlers in threads), then with
real ``fsm-agent run`` agents, an ``fsm-agent store`` and a spare.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fsm_test_procs import FAST, Job, Jobs, jobs_fixture, standalone_store, stop_store
from membership_trace import assert_membership_trace

from fsm_agent.torch._slots import assign_slots, install_stable_slots, spares_wait

SLOT_WORKER = Path(__file__).parent / "scripts" / "slot_worker.py"


def test_assign_slots_keeps_what_it_can_and_fills_in_sorted_order() -> None:
    assert assign_slots({}, ["c", "a", "b"]) == {"a": 0, "b": 1, "c": 2}  # torch's order
    assert assign_slots({"a": 0, "b": 1}, ["b", "c"]) == {"b": 1, "c": 0}
    assert assign_slots({"a": 0, "b": 1, "c": 2}, ["a", "c"]) == {"a": 0, "c": 1}  # shrunk
    assert assign_slots({"a": 0, "b": 1, "c": 2}, ["c", "d", "e", "f"]) == \
        {"c": 2, "d": 0, "e": 1, "f": 3}
    assert assign_slots({"a": 5, "b": 5}, ["a", "b"]) == {"a": 0, "b": 1}  # garbage in


def test_a_round_that_completes_full_turns_its_waiting_nodes_into_spares() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    nodes = [dyn._NodeDesc("127.0.0.1", pid, 0) for pid in (1, 2, 3, 4)]
    state = dyn._RendezvousState()
    state.participants = {nodes[0]: 0, nodes[1]: 1}
    state.wait_list = {nodes[2], nodes[3]}
    spares_wait(state, max_nodes=3)  # room left: they wait for the next round (torch's growth)
    assert state.wait_list == {nodes[2], nodes[3]} and not state.redundancy_list
    spares_wait(state, max_nodes=2)  # full: nobody can join, nothing to restart for
    assert not state.wait_list and state.redundancy_list == {nodes[2], nodes[3]}


# -- torch's real rendezvous, in threads ---------------------------------------------------------


@pytest.fixture
def store() -> Iterator[Any]:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=30))
    yield server
    del server


def _handler(store: Any, run_id: str, stable: bool, *, attempts: int = 2) -> Any:
    """One of three nodes' c10d handler, keep-alive every 1 s, dropped after ``attempts``."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
    handler = dyn.DynamicRendezvousHandler.from_backend(
        run_id, client, C10dRendezvousBackend(client, run_id), min_nodes=3, max_nodes=3,
        local_addr="127.0.0.1",
        timeout=dyn.RendezvousTimeout(join=timedelta(seconds=30),
                                      last_call=timedelta(seconds=1)),
        keep_alive_interval=1, keep_alive_max_attempt=attempts)
    if stable:
        assert install_stable_slots(handler)
    return handler


def _round(pool: ThreadPoolExecutor, handlers: list[Any]) -> list[int]:
    """One rendezvous round of every handler at once: their group ranks, in order."""
    for h in handlers:  # as the agent's WorkerStoreIsolation: a worker store per round
        h._bootstrap_store_info = None
        h._shared_tcp_store_server = None
    futures = [pool.submit(h.next_rendezvous) for h in handlers]
    return [f.result(timeout=60).rank for f in futures]


def _lose(handler: Any) -> None:
    """The node is gone: its keep-alive stops, and its heartbeat expires (2 x 1 s)."""
    handler._stop_heartbeats()
    time.sleep(3.5)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stable", [True, False], ids=["stable", "torch"])
def test_survivors_keep_their_rank_and_a_newcomer_takes_the_lost_one(
        store: Any, stable: bool) -> None:
    run_id = uuid.uuid4().hex
    made: list[Any] = []

    def new() -> Any:
        made.append(_handler(store, run_id, stable))
        return made[-1]

    try:
        with ThreadPoolExecutor(3) as pool:
            n0, n1, n2 = new(), new(), new()  # one process: ordered by local_id
            assert _round(pool, [n0, n1, n2]) == [0, 1, 2]
            _lose(n0)
            n3 = new()
            ranks = _round(pool, [n1, n2, n3])
            # torch numbers the round afresh: n1 and n2 move down, the newcomer is last
            assert ranks == ([1, 2, 0] if stable else [0, 1, 2])
            _lose(n2)
            n4 = new()
            ranks = _round(pool, [n1, n3, n4])
            assert ranks == ([1, 0, 2] if stable else [0, 1, 2])
            world = {h._state_holder.state.round for h in (n1, n3, n4)}
            assert len(world) == 1  # one round, read the same by all
            slots = getattr(n1._state_holder.state, "slots", None)
            if stable:
                assert slots == {n1._this_node: 1, n3._this_node: 0, n4._this_node: 2}
            else:
                assert slots is None  # torch's executor: nothing of ours in the state
    finally:
        for h in made:
            h._stop_heartbeats()


@contextlib.contextmanager
def built_agent(preset: str, params: dict[str, Any] | None = None) -> Iterator[tuple[Any, Any]]:
    """An agent of ``preset`` on a fresh single-node c10d handler (not run): (agent, handler)."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry

    from fsm_agent.torch import FSMElasticAgent

    rdzv = RendezvousParameters(backend="c10d", endpoint="localhost:0",
                                run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1)
    handler = rdzv_registry.get_rendezvous_handler(rdzv)
    spec = WorkerSpec(role="trainer", local_world_size=1, entrypoint="true",
                      rdzv_handler=handler, max_restarts=0)
    try:
        yield FSMElasticAgent(spec, logs_specs=DefaultLogsSpecs(), lifecycle_spec=preset,
                              lifecycle_params=params), handler
    finally:
        handler.shutdown()


def test_the_torch_presets_keep_torchs_executor_and_resilient_gets_slots() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    kinds = {}
    for preset, params in (("torchrun", None), ("torchelastic", None), ("resilient", None),
                           ("resilient", {"stable_slots": False})):
        with built_agent(preset, params) as (_, handler):
            kinds[preset, bool(params)] = type(handler._op_executor).__name__
    plain = dyn._DistributedRendezvousOpExecutor.__name__
    assert kinds == {("torchrun", False): plain, ("torchelastic", False): plain,
                     ("resilient", False): "SlotsOpExecutor", ("resilient", True): plain}


# -- real agents, a standalone store and a spare ------------------------------------------------

SHUTDOWN_TIMEOUT = 3


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=SLOT_WORKER))


def _kill_node(job: Job) -> None:
    """A node lost for good: its agent and workers SIGKILLed (no handler runs)."""
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    for rec in job.records("slot_*.json"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(rec["pid"]), signal.SIGKILL)  # type: ignore[call-overload]


Record = dict[str, Any]


def lose_rank_0(first: list[Job], spare: Job) -> tuple[dict[Job, Record], Job, Job, Record,
                                                       Record]:
    """Kill the node of ``first`` (two nodes) in group rank 0 while ``spare`` waits; wait for
    the spare's workers and the survivor's next ones. Returns (first ranks by node, the lost
    node, the survivor, the spare's record, the survivor's new record)."""
    ranks = {job: job.records("slot_*.json")[0] for job in first}
    lost = next(j for j in first if ranks[j]["group_rank"] == 0)
    survivor = next(j for j in first if j is not lost)
    _kill_node(lost)
    got = spare.wait_for("slot_*.json", 1, 60)[0]
    deadline = time.monotonic() + 30
    while len(survivor.records("slot_*.json")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    again = max(survivor.records("slot_*.json"), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]
    assert again["pid"] != ranks[survivor]["pid"], survivor.output[-3000:]
    return ranks, lost, survivor, got, again


def two_nodes_and_a_spare(jobs: Jobs, args: list[str], env: dict[str, str]
                          ) -> tuple[list[Job], Job]:
    """Nodes A and B running (one worker record each), then C waiting as a spare (torch's
    redundancy list: no restart of A and B)."""
    first = [jobs.start(args, env=env, name=name) for name in ("node_a", "node_b")]
    for job in first:
        job.wait_for("slot_*.json", 1, 90)
    spare = jobs.start(args, env=env, name="node_c")
    time.sleep(3)
    assert not spare.records("slot_*.json")
    return first, spare


def spare_takes_rank_0(jobs: Jobs, args: list[str], stop: Path) -> Job:
    """:func:`two_nodes_and_a_spare`, then the rank-0 node lost: the spare gets its slot, the
    survivor keeps its own, both exit 0 once ``stop`` exists. Returns the survivor."""
    first, spare = two_nodes_and_a_spare(jobs, args, {"STOP_FILE": str(stop)})
    ranks, lost, survivor, got, again = lose_rank_0(first, spare)
    assert (got["group_rank"], got["rank"]) == (ranks[lost]["group_rank"], ranks[lost]["rank"])
    assert (again["group_rank"], again["rank"]) == \
        (ranks[survivor]["group_rank"], ranks[survivor]["rank"])
    stop.touch()
    assert survivor.wait(60) == 0, survivor.output[-4000:]
    assert spare.wait(60) == 0, spare.output[-4000:]
    assert_membership_trace(jobs)
    return survivor


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stable", [True, False], ids=["stable", "torch"])
def test_a_spare_takes_the_lost_nodes_ranks_and_the_survivor_keeps_its_own(
        jobs: Jobs, tmp_path: Path, stable: bool) -> None:
    # resilient's default, or stable_slots=false: torch's numbering (sorted by pid here, the
    # spare started last)
    store, port = standalone_store(jobs)
    stop = tmp_path / "stop"
    args = ["--spec", "resilient", "--nnodes", "2:2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "slots", "--max-restarts", "10",
            "--rdzv-conf", "is_host=0,join_timeout=120,last_call_timeout=1,"
                           "keep_alive_interval=1,keep_alive_max_attempt=2",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST,
            *([] if stable else ["--spec-param", "stable_slots=false"])]
    first, spare = two_nodes_and_a_spare(jobs, args, {"STOP_FILE": str(stop)})
    # lose the node of group rank 0: torch would then renumber the survivor to 0
    ranks, lost, survivor, got, again = lose_rank_0(first, spare)
    if stable:
        assert (got["group_rank"], got["rank"]) == \
            (ranks[lost]["group_rank"], ranks[lost]["rank"])
        assert (again["group_rank"], again["rank"]) == \
            (ranks[survivor]["group_rank"], ranks[survivor]["rank"])
        assert "stable slots" in survivor.output + spare.output
    else:  # the survivor moves down to the lost node's 0, the spare takes its 1
        assert (again["group_rank"], again["rank"], got["group_rank"], got["rank"]) == \
            (0, 0, 1, 1)
    assert got["world_size"] == again["world_size"] == 2
    stop.touch()
    assert survivor.wait(60) == 0, survivor.output[-4000:]
    assert spare.wait(60) == 0, spare.output[-4000:]
    assert_membership_trace(jobs)  # with stable slots only: torch's numbering is not the model's
    stop_store(store)
