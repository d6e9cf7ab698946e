"""Stack capture with py-spy, and the /proc fallback where py-spy is refused."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from diag_helpers import spawn, wait_line

from fsm_agent.torch._stacks import capture_stacks, find_py_spy, stack_functions

STUCK = """
import threading, time
def helper_waits_too():
    time.sleep(3600)
def deadlocked_here(lock):
    print("stuck", flush=True)
    lock.acquire()
threading.Thread(target=helper_waits_too, name="helper", daemon=True).start()
lock = threading.Lock(); lock.acquire()
deadlocked_here(lock)
"""

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can write (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="fsm_agent_stacks_test_"))
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_py_spy_is_installed_with_the_package() -> None:
    assert find_py_spy() is not None


def test_every_thread_of_every_process_is_dumped_in_parallel(tmp_path: Path) -> None:
    with spawn(STUCK) as a, spawn(STUCK) as b:
        assert wait_line(a) == wait_line(b) == "stuck"
        dumps = capture_stacks({"rank_0": a.pid, "rank_1": b.pid}, tmp_path / "stacks",
                               header="why: a test")
    assert [d.method for d in dumps] == ["py-spy", "py-spy"], dumps
    for d, pid in zip(dumps, (a.pid, b.pid), strict=True):
        text = Path(d.path).read_text()
        assert text.startswith("why: a test\n")
        names = stack_functions(text)
        assert "deadlocked_here" in names and "helper_waits_too" in names, text
        assert f"Thread {pid}" in text and '"helper"' in text
        assert d.describe() == f"stacks: {d.path}"
    # a second capture does not overwrite the first
    again = capture_stacks({"rank_0": os.getpid()}, tmp_path / "stacks")
    assert again[0].path.endswith("rank_0.1.txt")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run the capture as another user")
def test_without_ptrace_permission_the_dump_says_why_and_shows_what_proc_can(
    shared_dir: Path
) -> None:
    # The capture runs as nobody, the worker as root: py-spy is refused access.
    out = shared_dir
    with spawn(STUCK) as worker:
        assert wait_line(worker) == "stuck"
        code = ("import sys; from fsm_agent.torch._stacks import capture_stacks; "
                "d = capture_stacks({'rank_0': int(sys.argv[1])}, sys.argv[2])[0]; "
                "print(d.method, d.path, sep='|', flush=True); print(d.error, flush=True)")
        with spawn(code, argv=[str(worker.pid), str(out)], prefix=NOBODY) as cap:
            method_path = wait_line(cap)
            error = wait_line(cap)
    method, path = method_path.split("|")
    assert method == "proc"
    assert "refused access" in error and "CAP_SYS_PTRACE" in error
    text = Path(path).read_text()
    assert text.startswith(f"No Python stacks for pid {worker.pid}: py-spy was refused access")
    # the threads and their states still come from /proc
    assert f"Thread {worker.pid} (main thread)" in text and text.count("\nThread ") == 2, text


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and setpriv to run as an unprivileged user")
def test_py_spy_works_without_root_for_the_users_own_processes(shared_dir: Path) -> None:
    out = shared_dir
    with open("/proc/sys/kernel/yama/ptrace_scope") if os.path.exists(
            "/proc/sys/kernel/yama/ptrace_scope") else open(os.devnull) as f:
        scope = f.read().strip() or "0"
    if scope != "0":
        pytest.skip(f"kernel.yama.ptrace_scope={scope}: only root may read a sibling process")
    with spawn(STUCK, prefix=NOBODY) as worker:
        assert wait_line(worker) == "stuck"
        code = ("import sys; from fsm_agent.torch._stacks import capture_stacks; "
                "d = capture_stacks({'rank_0': int(sys.argv[1])}, sys.argv[2])[0]; "
                "print(d.method, d.path, sep='|', flush=True)")
        with spawn(code, argv=[str(worker.pid), str(out)], prefix=NOBODY) as cap:
            method, path = wait_line(cap).split("|")
    assert method == "py-spy"
    assert "deadlocked_here" in stack_functions(Path(path).read_text())


def test_without_py_spy_the_dump_says_so(tmp_path: Path) -> None:
    with spawn(STUCK) as worker:
        wait_line(worker)
        [d] = capture_stacks({"w": worker.pid}, tmp_path, py_spy=str(tmp_path / "nope"))
    assert d.method == "proc" and d.error is not None and "cannot run" in d.error
    [gone] = capture_stacks({"w": 2**22 + 7}, tmp_path)
    assert gone.method == "proc" and "cannot list the threads" in Path(gone.path).read_text()


ONE_THREAD = """Process 18427: python loop.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 18427 (active+gil)
    python_step (loop.py:5)
        Arguments:
            sec: 0.5
        Locals:
            x: 1481742
    main (loop.py:9)
        Locals:
            step: 1
    <module> (loop.py:10)
"""

TWO_THREADS = """Process 7: python busy.py

Thread 9 (idle): "Thread-1 (bg)"
    bg (busy.py:3)
Thread 7 (active+gil): "MainThread"
    spin_forever (busy.py:8)
    <module> (busy.py:9)
"""


def test_the_main_thread_is_found_named_or_by_its_id_with_each_frames_locals() -> None:
    from fsm_agent.torch._stacks import parse_main_thread

    assert parse_main_thread(TWO_THREADS) == ("spin_forever (busy.py:8)", "<module> (busy.py:9)")
    frames = parse_main_thread(ONE_THREAD, 18427)  # py-spy names no thread when there is one
    assert [f.split("\n")[0] for f in frames] == ["python_step (loop.py:5)", "main (loop.py:9)",
                                                  "<module> (loop.py:10)"]
    assert frames[1] == "main (loop.py:9)\nLocals:\nstep: 1"
    assert parse_main_thread("") == ()


def test_suspects_are_the_ranks_outside_the_collective_and_every_node_shares_its_part() -> None:
    from fsm_agent._core._job import JobChannel, MemoryStore
    from fsm_agent.torch._hang import Suspects, encode_suspects, merge_suspects

    node_a = Suspects({0: "all_reduce", 1: "all_reduce"}, {})
    node_b = Suspects({2: "all_reduce"}, {3: "spin_forever (busy.py:28)"})
    assert node_a.summary == ("every rank with a Python stack waits in a collective (rank 0: "
                              "all_reduce; rank 1: all_reduce)")
    assert node_b.summary == ("suspect: rank 3 is not in the all_reduce that rank 2 waits in: "
                              "spin_forever (busy.py:28)")
    store = MemoryStore()
    channels = [JobChannel(store, "job", n) for n in ("a", "b")]
    channels[0].share("suspects", "4", encode_suspects(node_a))
    channels[1].share("suspects", "4", encode_suspects(node_b))
    channels[1].share("suspects", "4", b"not json")
    merged = merge_suspects(channels[0].gather("suspects", "4", 2, 1.0))
    assert merged.summary == ("suspect: rank 3 is not in the all_reduce that ranks 0, 1, 2 wait "
                              "in: spin_forever (busy.py:28)")
    assert merged.about(0) == "; waiting in all_reduce"
    assert "in spin_forever (busy.py:28)" in merged.about(3)
    # a round of its own, and a node that never shares: the gather ends at its timeout
    assert channels[0].gather("suspects", "5", 2, 0.05) == []
    mixed = Suspects({0: "all_reduce", 1: "broadcast"}, {})
    assert mixed.summary.endswith(": they do not match")
