"""The job protocol's store operations: ``MemoryStore`` and ``EtcdJobStore`` (on a real etcd)
behave as torch's ``TCPStore`` for every operation the protocol uses (each test runs on all
three), and ``JobChannel`` on top of each."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from fsm_agent._core._job import JobChannel, JobOutcome, JobOver, MemoryStore


@pytest.fixture(params=["memory", "tcp", "etcd"])
def store(request: pytest.FixtureRequest) -> Iterator[object]:
    if request.param == "memory":
        yield MemoryStore(timeout=0.2)
        return
    if request.param == "etcd":
        import etcd as python_etcd

        from fsm_agent.torch._etcd import EtcdJobStore

        server = request.getfixturevalue("etcd")
        client = python_etcd.Client("127.0.0.1", server.port, read_timeout=5)
        yield EtcdJobStore(client, "/test/fsm_agent", timeout=0.2)
        return
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=0.2))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                           timeout=timedelta(seconds=0.2))
    yield client
    del client, server


def test_compare_set_semantics(store: object) -> None:
    s = store
    assert s.compare_set("k", "", "v1") == b"v1"  # type: ignore[attr-defined]
    assert s.compare_set("k", "", "v2") == b"v1"  # type: ignore[attr-defined]
    assert s.compare_set("k", "v1", "v3") == b"v3"  # type: ignore[attr-defined]
    # absent key, non-empty expectation: nothing set, the expectation comes back
    assert s.compare_set("m", "x", "y") == b"x"  # type: ignore[attr-defined]
    assert not s.check(["m"])  # type: ignore[attr-defined]


def test_add_check_get(store: object) -> None:
    s = store
    assert s.add("n", 1) == 1  # type: ignore[attr-defined]
    assert s.add("n", 0) == 1  # type: ignore[attr-defined]
    assert s.add("n", 2) == 3  # type: ignore[attr-defined]
    assert s.get("n") == b"3"  # type: ignore[attr-defined]
    assert s.check(["n"]) and not s.check(["n", "zz"])  # type: ignore[attr-defined]
    s.set("t", "text")  # type: ignore[attr-defined]
    assert s.get("t") == b"text"  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="timeout"):
        s.get("never")  # type: ignore[attr-defined]


def _channels(store: object, n: int) -> list[JobChannel]:
    return [JobChannel(store, "job1", f"node{i}", poll_interval=0.0) for i in range(n)]  # type: ignore[arg-type]


def test_a_refused_announcement_is_ignored_and_replaced_by_a_real_one(store: object) -> None:
    # What the torch agent's vet refuses (an announcer that is no node of the rendezvous) holds
    # the outcome key, but ends nobody, and the first real announcement takes its place.
    a, b = _channels(store, 2)
    for channel in (a, b):
        channel.vet = lambda outcome: outcome.node.startswith("node")
    forged = JobOutcome(exit_code=7, node="intruder", reason="forged")
    store.compare_set(a.outcome_key, "", forged.encode())  # type: ignore[attr-defined]
    assert a.poll() is None and b.poll() is None
    won = b.announce(3, "no retry")
    assert won == JobOutcome(exit_code=3, node="node1", reason="no retry")
    assert a.poll() == won and a.announce(1, "too late") == won
    assert a.acks() == 2


def test_the_first_announcement_wins_and_everyone_reads_it(store: object) -> None:
    a, b, c = _channels(store, 3)
    assert c.poll() is None
    won = a.announce(3, "no retry")
    assert won == JobOutcome(exit_code=3, node="node0", reason="no retry")
    assert b.announce(1, "budget spent") == won  # too late: b adopts a's
    assert c.poll() == won
    assert a.acks() == 3  # a and b by announcing, c by reading


def test_ledger_counts_a_round_once_and_riders_keep_their_restart(store: object) -> None:
    a, b = _channels(store, 2)
    assert a.restarts_left("5", 1) == 1 and b.restarts_left("5", 1) == 1
    assert a.claim_restart("5", 1) == 1
    # b saw the same failure of round 5: it rides along, nothing more is counted
    assert b.restarts_left("5", 1) == 1
    assert b.claim_restart("5", 1) == 1
    assert [r for r, _ in a.ledger()] == ["5"]
    # the next round's failure finds the budget spent
    assert a.restarts_left("6", 1) == 0
    with pytest.raises(JobOver) as info:
        b.claim_restart("6", 1)
    assert info.value.trigger == "job_failed"
    assert a.poll() == info.value.outcome and "budget" in info.value.outcome.reason


def test_concurrent_claims_never_exceed_the_budget(store: object) -> None:
    # 8 agents, each claiming a different round at once: exactly max_restarts claims succeed.
    if type(store).__name__ == "TCPStore":  # the etcd client's connection pool is shared
        pytest.skip("one TCPStore client is not shared by threads")
    chans = _channels(store, 8)
    results: list[object] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        try:
            out: object = chans[i].claim_restart(str(i), 3)
        except JobOver as e:
            out = e
        with lock:
            results.append(out)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for r in results if isinstance(r, int)) == 3
    assert len(chans[0].ledger()) == 3


def test_a_window_counts_recent_claims(store: object) -> None:
    now = [1000.0]
    ch = JobChannel(store, "w", "n", wall=lambda: now[0])  # type: ignore[arg-type]
    ch.claim_restart("1", 2, window=60)
    now[0] += 30
    ch.claim_restart("2", 2, window=60)
    assert ch.restarts_left("3", 2, window=60) == 0
    now[0] += 31  # the first claim leaves the window
    assert ch.restart_count(window=60) == 1
    assert ch.restart_count(window=math.inf) == 2
    assert ch.claim_restart("3", 2, window=60) == 2


def test_finishing_and_acks(store: object) -> None:
    a, b = _channels(store, 2)
    assert not b.finishing()
    a.mark_finishing()
    assert b.finishing()
    a.announce(1, "x")
    assert not a.wait_acks(2, timeout=0.05)
    assert b.poll() is not None
    assert a.wait_acks(2, timeout=0.5)


def test_polls_are_paced() -> None:
    store = MemoryStore()
    t = [0.0]
    ch = JobChannel(store, "p", "n", poll_interval=0.2, clock=lambda: t[0])
    assert ch.poll() is None
    JobChannel(store, "p", "m").announce(1, "x")
    t[0] = 0.1
    assert ch.poll() is None  # not looked: within the interval
    assert ch.poll(force=True) is not None
    assert store.ops["check"] == 2


def test_a_closed_memory_store_fails_like_a_dead_tcp_store() -> None:
    store = MemoryStore()
    ch = JobChannel(store, "c", "n", poll_interval=0.0)
    store.close()
    with pytest.raises(ConnectionError):
        ch.poll()


def test_unreadable_announcements_still_fail_the_job() -> None:
    out = JobOutcome.decode(b"not json")
    assert out.exit_code == 1 and "unreadable" in out.reason


class _Result:
    def __init__(self, failed: bool) -> None:
        self._failed = failed

    def is_failed(self) -> bool:
        return self._failed


class _Agent:
    def __init__(self, job: object) -> None:
        self.job = job


def test_a_store_lost_after_the_workers_succeeded_leaves_the_outcome_alone() -> None:
    pytest.importorskip("torch")
    from fsm_agent.torch._job import AgentJob, JobFailed
    from fsm_agent.torch._launch import job_failure

    store = MemoryStore()
    job = AgentJob(JobChannel(store, "l", "n", poll_interval=0.0))
    assert job_failure(_Agent(job), _Result(False)) is None  # nothing known
    store.close()
    assert job.check() is not None and job.lost is not None
    # seen at the exit barrier after success: logged there, the success stands (as torch)
    assert job_failure(_Agent(job), _Result(False)) is None
    # anywhere else (failed workers, or no result: the run raised), the lost store is the outcome
    for result in (_Result(True), None):
        failed = job_failure(_Agent(job), result)
        assert isinstance(failed, JobFailed) and failed.store_lost and failed.exit_code == 1


def test_an_announced_failure_fails_even_an_agent_whose_workers_succeeded() -> None:
    pytest.importorskip("torch")
    from fsm_agent.torch._job import AgentJob, JobFailed
    from fsm_agent.torch._launch import job_failure

    store = MemoryStore()
    job = AgentJob(JobChannel(store, "a", "n", poll_interval=0.0))
    JobChannel(store, "a", "other").announce(3, "no restarts left")
    assert job.check() is not None
    failed = job_failure(_Agent(job), _Result(False))
    assert isinstance(failed, JobFailed) and failed.exit_code == 3 and not failed.store_lost


def test_a_signal_during_a_store_call_is_the_signal_not_a_lost_store() -> None:
    # torch raises SignalException from its handler wherever the main thread is; a poll of the
    # store is a common place. The agent must end as the signal says (128+N), not as lost.
    pytest.importorskip("torch")
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from fsm_agent.torch._job import AgentJob

    class SignalledStore(MemoryStore):
        def check(self, keys: list[str]) -> bool:
            raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)

    job = AgentJob(JobChannel(SignalledStore(), "s", "n", poll_interval=0.0))
    with pytest.raises(SignalException):
        job.check(force=True)
    assert job.lost is None and job.outcome is None
    with pytest.raises(SignalException):
        job.rendezvous_poll(restart=False)


def test_an_etcd_that_is_gone_is_a_lost_store(etcd: object) -> None:
    # python-etcd raises its own errors (EtcdConnectionFailed); the agent reads a lost store
    # from STORE_ERRORS (RuntimeError, OSError), so they come out as ConnectionError
    import etcd as python_etcd

    from fsm_agent.torch._etcd import EtcdJobStore
    from fsm_agent.torch._job import STORE_ERRORS

    client = python_etcd.Client("127.0.0.1", etcd.port, read_timeout=2)  # type: ignore[attr-defined]
    store = EtcdJobStore(client, "/test/fsm_agent", timeout=0.2)
    assert store.compare_set("k", "", "v") == b"v"
    etcd.stop()  # type: ignore[attr-defined]
    for call in (lambda: store.check(["k"]), lambda: store.add("n", 1),
                 lambda: store.compare_set("k", "v", "w"), lambda: store.set("k", "x")):
        with pytest.raises(ConnectionError, match="etcd") as info:
            call()
        assert isinstance(info.value, STORE_ERRORS)
