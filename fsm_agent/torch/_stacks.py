"""Every thread's Python stack of a worker, captured from outside before the worker is stopped.

``py-spy dump`` (a dependency: its wheel ships the binary) reads a live Python process's memory
and prints each thread's stack, with no change to the worker and without stopping it for more
than a few milliseconds. It needs permission to read the worker's memory (ptrace access): as
root it has it; as another user it has it for that user's own processes only when the kernel
allows tracing non-descendants (``kernel.yama.ptrace_scope`` 0; Ubuntu's default is 1, under
which only root or a process with ``CAP_SYS_PTRACE`` may); in a container it may also need
``--cap-add SYS_PTRACE``.

Where py-spy cannot (no permission, no py-spy, not a Python process, a timeout), the dump says
so on its first lines, with the reason and what would make it work, and records what ``/proc``
still shows without any permission beyond the process owner's: each thread's name, state and
kernel wait channel (what it is blocked in: ``futex_wait_queue``, ``do_epoll_wait``, ...), and
the kernel stack where readable. One file per worker; :func:`capture_stacks` returns where each
went and how it was taken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

__all__ = ["StackDump", "capture_stacks", "find_py_spy", "main_thread_frames", "parse_main_thread",
           "stack_functions"]

#: Seconds py-spy may take per worker before the /proc fallback is used instead.
PY_SPY_TIMEOUT = 10.0

_HOW_TO_ENABLE = (
    "py-spy needs ptrace access to the worker: run the agent as root, or as the workers' user "
    "with kernel.yama.ptrace_scope=0 (sysctl), or give it CAP_SYS_PTRACE (in a container: "
    "--cap-add SYS_PTRACE)"
)


@attrs.frozen
class StackDump:
    """Where one worker's stacks were written and how they were taken.

    ``method``: ``"py-spy"`` (Python stacks of every thread) or ``"proc"`` (the fallback:
    thread names, states and kernel wait channels only); ``error``: why py-spy was not used.
    """

    label: str
    pid: int
    path: str
    method: str
    error: str | None = None

    def describe(self) -> str:
        """One line: where, and how if not with py-spy."""
        if self.method == "py-spy":
            return f"stacks: {self.path}"
        return f"stacks (no Python frames: {self.error}): {self.path}"


def find_py_spy() -> str | None:
    """The ``py-spy`` binary: beside this interpreter's scripts, else on ``PATH``."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(folder, "py-spy")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def _proc_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_view(pid: int) -> str:
    """What /proc says about every thread of ``pid``."""
    lines = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError as e:
        return f"(cannot list the threads of {pid}: {e.strerror})\n"
    cmdline = _proc_text(f"/proc/{pid}/cmdline")
    if cmdline:
        lines.append(f"Process {pid}: {cmdline.replace(chr(0), ' ')}")
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        name = _proc_text(f"{base}/comm") or "?"
        stat = _proc_text(f"{base}/stat")
        state = stat.rsplit(")", 1)[1].split()[0] if stat else "?"
        # "0" when the kernel hides it from another user, or when the thread is running
        wchan = _proc_text(f"{base}/wchan") or "0"
        where = "(not shown)" if wchan == "0" else wchan
        main = " (main thread)" if tid == pid else ""
        lines.append(f"Thread {tid}{main} {name!r}: state {state}, waiting in {where}")
        kstack = _proc_text(f"{base}/stack")
        if kstack:
            lines.extend(f"    [kernel] {frame}" for frame in kstack.splitlines())
    return "\n".join(lines) + "\n"


def _py_spy_error(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or proc.stdout or "").strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if "ermission" in text or "Operation not permitted" in text:
        return f"py-spy was refused access to the process ({first}); {_HOW_TO_ENABLE}"
    return f"py-spy failed (exit {proc.returncode}): {first or 'no output'}"


def _unique(path: Path) -> Path:
    if not path.exists():
        return path
    stem, suffix = path.stem, path.suffix
    for i in range(1, 1000):
        candidate = path.with_name(f"{stem}.{i}{suffix}")
        if not candidate.exists():
            return candidate
    return path


def capture_stacks(
    pids: Mapping[str, int],
    out_dir: str | os.PathLike[str],
    *,
    py_spy: str | None = None,
    timeout: float = PY_SPY_TIMEOUT,
    header: str = "",
) -> list[StackDump]:
    """Dump every thread of each process in ``pids`` (label -> pid) to ``out_dir/LABEL.txt``.

    The dumps run in parallel, so the whole capture takes about as long as the slowest one
    (some tens of milliseconds per process with py-spy). Never raises for a process it cannot
    read: that process's file says why and holds the /proc fallback. ``header`` starts every
    file (why the stacks were taken).
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    binary = py_spy if py_spy is not None else find_py_spy()
    procs: dict[str, subprocess.Popen[str] | None] = {}
    started = time.monotonic()
    for label, pid in pids.items():
        if binary is None:
            procs[label] = None
            continue
        try:
            procs[label] = subprocess.Popen(
                [binary, "dump", "--pid", str(pid)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
        except OSError:
            procs[label] = None
    dumps = []
    for label, pid in pids.items():
        proc = procs[label]
        error: str | None
        body = ""
        if proc is None:
            error = ("py-spy is not installed (pip install py-spy)" if binary is None
                     else f"cannot run {binary}")
        else:
            left = max(0.1, timeout - (time.monotonic() - started))
            try:
                out, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                error = f"py-spy did not finish within {timeout:g} s"
            else:
                done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
                if proc.returncode == 0 and "Thread" in out:
                    error, body = None, out
                else:
                    error = _py_spy_error(done)
        path = _unique(folder / f"{label}.txt")
        with open(path, "w", encoding="utf-8") as f:
            if header:
                f.write(header.rstrip("\n") + "\n\n")
            if error is None:
                f.write(body)
            else:
                f.write(f"No Python stacks for pid {pid}: {error}.\n")
                f.write("What /proc shows instead (threads, states, kernel wait channels):\n\n")
                f.write(_proc_view(pid))
        dumps.append(StackDump(label, pid, str(path), "py-spy" if error is None else "proc",
                               error))
    return dumps


def stack_functions(text: str) -> Sequence[str]:
    """The function names of a py-spy dump, innermost first per thread (for tests and the
    report: which functions were the workers in)."""
    names = []
    for line in text.splitlines():
        if line.startswith("    ") and "(" in line:
            names.append(line.strip().split(" (", 1)[0])
    return names



def parse_main_thread(text: str, pid: int | None = None) -> tuple[str, ...]:
    """The main thread's frames in a py-spy dump, innermost first (``func (file:line)``; with
    ``--locals``, each frame's argument and local lines follow its own, joined by newlines).

    The main thread is the one named ``MainThread``, else the one whose id is ``pid`` (py-spy
    names no thread in a process that has only one), else the first listed.
    """
    threads: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append((line.rstrip(), []))
        elif threads and line.startswith("        ") and threads[-1][1]:
            frames = threads[-1][1]
            frames[-1] += "\n" + line.strip()
        elif threads and line.startswith("    ") and line.strip():
            threads[-1][1].append(line.strip())
    if not threads:
        return ()

    def pick() -> list[str]:
        for head, frames in threads:
            if head.endswith('"MainThread"'):
                return frames
        for head, frames in threads:
            if pid is not None and head.split()[1] in (str(pid), hex(pid)):
                return frames
        return threads[0][1]

    return tuple(pick())


def main_thread_frames(pid: int, py_spy: str, *, timeout: float = 2.0) -> tuple[str, ...] | None:
    """One py-spy dump of ``pid``'s main thread with its frames' arguments and locals
    (:func:`parse_main_thread`; innermost frame first); None when py-spy cannot read it (no
    permission, not Python, gone, too slow).

    ``--nonblocking``: a blocking dump stops the process (ptrace) to read it, which wakes a
    sleeping main thread and makes its CPU time move, so that the hang detector, which samples
    the CPU time too, would see a blocked rank run. A non-blocking read may now and then catch
    a stack mid-change; the detector then sees progress once, which delays a report and never
    makes one up.
    """
    try:
        proc = subprocess.run([py_spy, "dump", "--nonblocking", "--locals", "--pid", str(pid)],
                              capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return parse_main_thread(proc.stdout, pid) or None
