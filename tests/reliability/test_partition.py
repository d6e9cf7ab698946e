"""An agent cut off from the rendezvous store's host (a network partition, in network namespaces).

Agent A hosts the c10d store in this network namespace; agent B runs in a namespace of its own,
joined to it by a veth pair. Taking A's end of the pair down is a partition as a dropped route
or a firewall's DROP makes it: B's packets go nowhere and nothing answers or resets its
connection, so torch's store client waits in its C++ call for as long as the cut lasts, whatever
the store's timeout. B must still act: within the store's timeout (``read_timeout``) it ends
with the store lost (the job protocol's outcome), and a signal is acted on at once.

Needs root and ``ip`` (CI runs as root); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_helpers import FAST, Job, Jobs, free_port, wait_gone

READ_TIMEOUT = 4

# A worker that fails once the test creates $FAIL_FILE, else sleeps until it is stopped.
WORKER = """\
import json, os, sys, time
path = os.path.join(os.environ["OUT_DIR"], f"start_{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"pid": os.getpid()}, f)
os.replace(path + ".tmp", path)  # the test reads it: never half-written
while not os.path.exists(os.environ["FAIL_FILE"]):
    time.sleep(0.05)
sys.exit(3)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Partition:
    """Network namespace ``ns`` joined to this one by a veth pair; :meth:`cut` drops the link."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.ns = f"fsm-{tag}"
        self.link = f"fsmh{tag}"  # this side (interface names: 15 characters at most)
        net = int(tag[:2], 16)
        self.host_ip = f"10.213.{net}.1"
        self.peer_ip = f"10.213.{net}.2"

    def create(self) -> None:
        peer = self.link.replace("fsmh", "fsmp")
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", self.ns)
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.link)
        _ip("link", "set", self.link, "up")
        _ip("-n", self.ns, "addr", "add", f"{self.peer_ip}/24", "dev", peer)
        _ip("-n", self.ns, "link", "set", peer, "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def cut(self) -> None:
        _ip("link", "set", self.link, "down")

    def remove(self) -> None:
        for args in (("netns", "del", self.ns), ("link", "del", self.link)):
            subprocess.run(["ip", *args], capture_output=True, timeout=10)


@pytest.fixture
def partition() -> Iterator[Partition]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip (CI runs as root)")
    p = Partition()
    try:
        p.create()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        p.remove()
        pytest.skip(f"cannot create a network namespace here: {e}")
    try:
        yield p
    finally:
        p.remove()


def _two_agents(jobs: Jobs, partition: Partition, tmp_path: Path, run_id: str,
                extra: tuple[str, ...] = ()) -> tuple[Job, Job, Path]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    fail_file = tmp_path / "fail"
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"{partition.host_ip}:{port}", "--rdzv-id", run_id,
              "--shutdown-timeout", "3",
              *FAST, *extra]
    env = {"FAIL_FILE": str(fail_file)}
    # the endpoint is no address of this host's name: say who hosts the store
    conf = f"read_timeout={READ_TIMEOUT},is_host="
    a = jobs.start([*common, "--rdzv-conf", conf + "1", "--local-addr", partition.host_ip],
                   script, env=env, name="a")
    a.wait_listening(port, 80)  # A hosts the store (B's connect timeout is read_timeout)
    b = jobs.start([*common, "--rdzv-conf", conf + "0", "--local-addr", partition.peer_ip],
                   script, env=env, name="b",
                   netns=partition.ns)
    a.wait_for("start_*.json", 1, 90)
    b.wait_for("start_*.json", 1, 90)
    return a, b, fail_file


def _stop(a: Job) -> None:
    """The other side went on; stop it as a user would (its workers with it)."""
    assert a.poll() is None, a.output[-3000:]
    os.kill(a.pid, signal.SIGTERM)
    a.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_partitioned_agent_whose_worker_fails_ends_with_the_store_lost(
        jobs: Jobs, partition: Partition, tmp_path: Path) -> None:
    a, b, fail_file = _two_agents(jobs, partition, tmp_path, "cut1", ("--max-restarts", "1"))
    [worker] = b.records("start_*.json")
    partition.cut()
    time.sleep(1)
    fail_file.touch()  # B's worker fails; B wants to restart: every store call goes unanswered
    failed = time.monotonic()
    rc = b.wait(60)
    took = time.monotonic() - failed
    out = b.output
    assert rc == 1, out[-3000:]
    # the restart's first store call, then the bound: read_timeout, plus a monitor tick and
    # the time torch takes to stop the failed group
    assert took < READ_TIMEOUT + 10, f"{took:.1f} s:\n{out[-3000:]}"
    last = b.final_message()
    assert "the rendezvous store is unreachable" in last, out[-3000:]
    assert "did not answer" in last and f"within {READ_TIMEOUT} s" in last, last
    assert "this agent cannot reach it" in last, last
    assert not wait_gone([int(worker["pid"])], 5)  # type: ignore[call-overload]
    _stop(a)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_partitioned_agent_acts_on_a_signal_at_once(
        jobs: Jobs, partition: Partition, tmp_path: Path, sig: signal.Signals) -> None:
    a, b, _ = _two_agents(jobs, partition, tmp_path, f"cut-{sig.name}")
    [worker] = b.records("start_*.json")
    partition.cut()
    time.sleep(READ_TIMEOUT / 2)  # B's store polls now wait on a store that never answers
    os.kill(b.pid, sig)
    sent = time.monotonic()
    assert not wait_gone([int(worker["pid"])], 3 + 2), b.output[-3000:]  # its shutdown timeout
    stopped = time.monotonic() - sent
    rc = b.wait(30)
    out = b.output
    assert rc != 0, out[-3000:]
    assert f"Received {sig.value} death signal" in out or sig.name in out, out[-3000:]
    assert stopped < 3 + 2, f"{stopped:.1f} s"
    _stop(a)
