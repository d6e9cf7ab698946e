"""The job's outcome reaches a watching agent without polling: ``OutcomeWatch``
(docs/job-protocol.md).

On torch's real ``TCPStore`` (a server on loopback) and on ``MemoryStore``: a watching agent
asks the store nothing while it waits, learns an announcement from the server's answer to its
blocked wait, sees the store's loss, and leaves no thread or connection behind when it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from fsm_agent._core._job import JobChannel, MemoryStore

torch_dist = pytest.importorskip("torch.distributed")

from fsm_agent.torch._job import AgentJob, connector  # noqa: E402


class Counted:
    """A store whose every call is counted by name (one request to the server each)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


def _client(port: int) -> Any:
    return torch_dist.TCPStore("127.0.0.1", port, is_master=False,
                               timeout=timedelta(seconds=30))


@pytest.fixture()
def server() -> Iterator[Any]:
    master = torch_dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                                 wait_for_workers=False)
    yield master


@pytest.fixture(params=["tcpstore", "memory"])
def stores(request: pytest.FixtureRequest, server: Any) -> Any:
    """(one agent's store, another agent's store, the watch's connection factory)."""
    if request.param == "memory":
        mem = MemoryStore()
        return mem, mem, mem.clone
    a, b = _client(server.port), _client(server.port)
    opener = connector(a)
    assert opener is not None
    return a, b, opener


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fsm-agent-watch")]


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def _settles(count: Callable[[], int], expected: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while count() != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_watching_agent_learns_the_outcome_without_asking_the_store(stores: Any) -> None:
    mine, theirs, connect = stores
    counted = Counted(mine)
    channel = JobChannel(counted, "w", "node0", poll_interval=0.0)
    watch = channel.watch(connect)
    assert watch.armed.wait(30)
    counted.calls.clear()
    # a wait loop's looks, as often as it likes: nothing reaches the store
    for _ in range(200):
        assert channel.poll() is None
    assert counted.calls == []
    JobChannel(theirs, "w", "node1").announce(3, "node1's workers failed")
    assert watch.wait(30)
    outcome = channel.poll()
    assert outcome is not None and outcome.exit_code == 3 and outcome.node == "node1"
    assert counted.calls == ["add"]  # the acknowledgement, nothing else
    channel.close()


def test_without_a_watch_every_look_is_a_store_request(stores: Any) -> None:
    # the cost the watch removes: the same loop on a polling channel
    mine, _theirs, _connect = stores
    counted = Counted(mine)
    channel = JobChannel(counted, "p", "node0", poll_interval=0.0)
    for _ in range(50):
        assert channel.poll() is None
    assert counted.calls == ["check"] * 50


def test_a_watch_started_after_the_announcement_finds_it(stores: Any) -> None:
    mine, theirs, connect = stores
    JobChannel(theirs, "late", "node1").announce(4, "early")
    channel = JobChannel(mine, "late", "node0")
    watch = channel.watch(connect)
    assert watch.wait(30)
    assert channel.poll() is not None and channel.outcome.exit_code == 4  # type: ignore[union-attr]
    channel.close()


def test_every_watcher_is_woken_by_one_announcement(stores: Any) -> None:
    mine, theirs, connect = stores
    channels = [JobChannel(mine, "many", f"node{i}") for i in range(6)]
    watches = [c.watch(connect) for c in channels]
    assert all(w.armed.wait(30) for w in watches)
    JobChannel(theirs, "many", "announcer").announce(2, "give up")
    assert all(w.wait(30) for w in watches)
    assert {c.poll().exit_code for c in channels} == {2}  # type: ignore[union-attr]
    for c in channels:
        c.close()


def test_a_watch_ends_with_the_agent_and_leaves_no_thread_or_connection(server: Any) -> None:
    before_threads, before_sockets = len(_watch_threads()), _sockets()
    store = _client(server.port)
    job = AgentJob(JobChannel(store, "end", "node0"), role="test")
    job.connect = connector(store)
    assert job.start_watch()
    watch = job.channel.watching
    assert watch is not None and watch.armed.wait(30)
    assert len(_watch_threads()) == before_threads + 1
    assert _sockets() > before_sockets + 1  # the agent's connection and the watch's
    job.close()
    assert not watch.alive
    assert len(_watch_threads()) == before_threads
    assert job.channel.watching is None  # the channel polls from now on
    del store, job, watch
    # The store's server runs in this process too: it closes its end of each connection when
    # its loop sees the client go, which on a loaded machine is a moment later. A leak never
    # settles.
    assert _settles(_sockets, before_sockets, 30), (_sockets(), before_sockets)


def test_a_lost_store_reaches_a_watching_agent() -> None:
    # the store's host is gone: the watch's wait fails at once, and the agent's next look
    # reports the store lost as a poll's error did
    host = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, datetime, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=30),"
         " wait_for_workers=False)\n"
         "print(s.port, flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        store = _client(port)
        job = AgentJob(JobChannel(store, "lost", "node0"), role="test")
        job.connect = connector(store)
        assert job.start_watch()
        watch = job.channel.watching
        assert watch is not None and watch.armed.wait(30)
        assert job.check() is None
        host.kill()
        host.wait(10)
        assert watch.wait(30)
        lost = job.check()
        assert lost is not None and job.only_store_lost
        assert "the rendezvous store is unreachable" in lost.reason
        job.close()
        assert not watch.alive
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(10)


def test_a_memory_store_wait_blocks_until_the_key_is_set_and_times_out() -> None:
    store = MemoryStore()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(store.wait(["k"]) is None))
    waiter.start()
    store.multi_set(["j", "k"], [b"1", b"2"])
    waiter.join(10)
    assert woke == [True]
    with pytest.raises(TimeoutError):
        store.wait(["absent"], timedelta(seconds=0.01))
    store.close()
    with pytest.raises(ConnectionError):
        store.wait(["k"])


def test_a_watch_that_cannot_connect_leaves_the_channel_polling() -> None:
    # no second connection is not the store's loss: the agent polls, as without a watch
    store = MemoryStore()

    def refuse() -> Any:
        raise OSError(24, "Too many open files")

    channel = JobChannel(store, "nofd", "node0", poll_interval=0.0)
    watch = channel.watch(refuse)
    assert watch.armed.wait(30)
    watch.stop()
    assert watch.error is None and channel.watching is None
    assert channel.poll() is None
    JobChannel(store, "nofd", "node1").announce(5, "failed")
    outcome = channel.poll()
    assert outcome is not None and outcome.exit_code == 5
