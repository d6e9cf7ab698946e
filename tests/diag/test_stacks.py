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
