"""Wake the agent's monitor loop when a worker process exits, instead of polling.

torch's agent sleeps ``monitor_interval`` between two looks at its workers, so a dead worker is
noticed on the next tick only (0.1 s by default in torchrun) and the agent wakes ten times a second
to find out nothing happened. :class:`WorkerExitWaker` replaces that ``time.sleep`` with a wait that
returns as soon as any watched worker exits, and otherwise after the same timeout, so the periodic
tick that drives health and membership checks (``num_nodes_waiting``) is unchanged::

    waker = WorkerExitWaker()
    waker.watch(pcontext)              # after every start of the workers
    while True:
        woke = waker.wait(monitor_interval)   # True: a worker exited, look now
        result = monitor()
        ...
    waker.close()

The waker only says *when* to look; torch's own ``PContext`` still decides *what* happened (exit
codes, error files, return values), so a spurious or missed wake-up can cost at most one tick,
never a wrong result.

Backends, chosen once per waker (``backend=`` forces one, for tests and for odd platforms):

``pidfd``
    Linux 5.3+: ``os.pidfd_open(pid)`` per worker, all in one ``select.poll`` set. A
    pidfd refers to the process itself, not to its number, becomes readable when the process
    terminates, and does not reap it, so torch's ``Popen.poll()`` / ``Process.join()`` still get
    the exit code. Works for both of torch's contexts (``SubprocessContext``: binaries, the
    torchrun case; ``MultiprocessContext``: functions).
``thread``
    Other POSIX systems: one daemon thread per worker blocked in ``os.waitid(P_PID, pid,
    WEXITED | WNOWAIT)``; ``WNOWAIT`` leaves the child for torch to reap.
``tick``
    Nothing to watch with (or no POSIX): ``wait()`` sleeps the whole timeout, exactly torch's
    behaviour.

Why not SIGCHLD with ``signal.set_wakeup_fd``: the handler and the wakeup fd are process-wide
(one owner; asyncio and others claim the wakeup fd), work from the main thread only, and SIGCHLD
coalesces and fires for every child, including ones the agent did not start.

For ``MultiprocessContext`` a worker that returns successfully does not exit until the agent has
read its return value, so the waker also watches each worker's return-value pipe (torch's private
``_ret_vals`` queues, used only when present).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["WorkerExitWaker", "available_backends", "default_backend", "fast_popen_waits"]

_BACKENDS = ("pidfd", "thread", "tick")


class _Poller:
    """``select.poll`` with a payload per fd: one system call per wait and little Python around
    it (the wait runs ten times a second for as long as the job lives, ``selectors`` costs about
    twice the CPU of ``time.sleep`` per call here, this about 1.3 times)."""

    __slots__ = ("_data", "_poll")

    def __init__(self) -> None:
        self._poll = select.poll()
        self._data: dict[int, Any] = {}

    def register(self, fd: int, data: Any) -> None:
        if fd in self._data:
            raise KeyError(fd)
        self._poll.register(fd, select.POLLIN)
        self._data[fd] = data

    def unregister(self, fd: int) -> None:
        if self._data.pop(fd, _MISSING) is not _MISSING:
            self._poll.unregister(fd)

    def items(self) -> list[tuple[int, Any]]:
        return list(self._data.items())

    def poll(self, timeout: float) -> list[tuple[int, Any]]:
        ready = self._poll.poll(timeout * 1000.0)
        return [(fd, self._data[fd]) for fd, _ in ready if fd in self._data] if ready else []


_MISSING = object()


def _pidfd_works() -> bool:
    """Whether ``pidfd_open`` exists and the kernel (or a seccomp filter) allows it."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:  # ENOSYS on kernels < 5.3, EPERM under some sandboxes
        return False
    os.close(fd)
    return True


def available_backends() -> tuple[str, ...]:
    """The backends that work in this process, best first (``tick`` always works)."""
    found: list[str] = []
    if sys.platform.startswith("linux") and _pidfd_works():
        found.append("pidfd")
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        found.append("thread")
    found.append("tick")
    return tuple(found)


def default_backend() -> str:
    """The backend a :class:`WorkerExitWaker` uses unless told otherwise."""
    return available_backends()[0]


def _reaped(handle: Any) -> bool:
    """Whether torch already reaped this worker (a ``Popen`` or a ``multiprocessing.Process``).

    A reaped child's pid may be reused, so its pidfd would watch a stranger; such a worker has
    exited and is reported at once instead.
    """
    popen = getattr(handle, "_popen", handle)  # multiprocessing.Process keeps its Popen there
    return getattr(popen, "returncode", None) is not None


def _pidfd_wait(pid: int, timeout: float) -> None:
    """Block until process ``pid`` terminates or ``timeout`` passes (without reaping it)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already, or pidfd unavailable: the caller's own wait decides
        return
    try:
        select.select([fd], [], [], max(timeout, 0.0))
    finally:
        os.close(fd)


def fast_popen_waits(pcontext: Any) -> int:
    """Let torch's ``SubprocessContext.close()`` see each worker's exit as it happens.

    On a failure, torch's ``_poll()`` closes the context before it reports: SIGTERM to every
    other worker, then ``Popen.wait(timeout)`` on each, which in CPython polls with sleeps that
    double from 0.5 ms (1-5 ms per worker here: 3 ms with 2 workers, 7 ms with 8). This gives each
    worker's ``Popen`` a ``wait`` that first blocks on the process' pidfd for up to ``timeout``
    and then calls the real ``wait``: same result, same ``TimeoutExpired``, same total bound.
    Only when pidfd works (Linux 5.3+); returns how many ``Popen`` objects were given it.
    ``MultiprocessContext`` needs nothing: ``Process.join`` already waits on a sentinel.
    """
    handlers = getattr(pcontext, "subprocess_handlers", None)
    if not handlers or "pidfd" not in available_backends():
        return 0
    done = 0
    for handler in handlers.values():
        proc = getattr(handler, "proc", None)
        if proc is None or "wait" in vars(proc):
            continue
        real_wait = proc.wait

        def wait(timeout: float | None = None, _proc: Any = proc, _real: Any = real_wait) -> Any:
            if timeout is not None and _proc.returncode is None:
                start = time.monotonic()
                _pidfd_wait(_proc.pid, timeout)
                timeout = max(timeout - (time.monotonic() - start), 0.0)
            return _real(timeout)

        proc.wait = wait
        done += 1
    return done


def _pcontext_targets(pcontext: Any) -> tuple[dict[int, int], dict[int, Any], dict[int, int]]:
    """(pid per local rank, process handle per local rank, return-value fd per local rank)."""
    pids: dict[int, int] = dict(pcontext.pids())
    handles: dict[int, Any] = {}
    ret_fds: dict[int, int] = {}
    handlers = getattr(pcontext, "subprocess_handlers", None)  # SubprocessContext
    if handlers:
        handles = {rank: h.proc for rank, h in handlers.items()}
    inner = getattr(pcontext, "_pc", None)  # MultiprocessContext -> torch.mp.ProcessContext
    if inner is not None:
        handles = dict(enumerate(getattr(inner, "processes", [])))
        for rank, queue in (getattr(pcontext, "_ret_vals", None) or {}).items():
            reader = getattr(queue, "_reader", None)
            if reader is not None:
                with contextlib.suppress(OSError, ValueError):
                    ret_fds[rank] = reader.fileno()
    return pids, handles, ret_fds


class WorkerExitWaker:
    """Wait for the next tick, or less if a watched worker exits first.

    Each exit is reported once: after ``wait()`` returned ``True`` for a worker, that worker is no
    longer watched, so one worker finishing early (exit code 0 while the others still run) cannot
    turn the loop into a busy poll. ``watch()`` replaces the watched set (call it after each start
    of the workers). Not thread-safe, except :meth:`wake`, which any thread may call.
    """

    def __init__(self, backend: str | None = None) -> None:
        if backend is None:
            backend = default_backend()
        if backend not in _BACKENDS:
            raise ValueError(f"unknown waker backend {backend!r} (known: {', '.join(_BACKENDS)})")
        if backend not in available_backends():
            raise ValueError(f"waker backend {backend!r} is not available on this system")
        self.backend: str = backend
        self._selector: _Poller | None = None
        self._wake_r, self._wake_w = -1, -1
        if backend != "tick":
            self._selector = _Poller()
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._selector.register(self._wake_r, None)
        self._pidfds: list[int] = []
        self._generation = 0
        self._lock = threading.Lock()
        self._exited: set[tuple[int, int]] = set()  # (generation, pid) reported by threads
        self._watched: set[int] = set()  # pids of the current generation not yet reported
        self._poked = False
        self._pending = 0  # exits found at watch() time (already reaped), reported by next wait()
        self.wakeups = 0  # wait() calls that returned early; for benchmarks and logs

    # -- watching -------------------------------------------------------------------------------

    def watch(self, target: Any, *, fast_close: bool = True) -> None:
        """Watch the workers of a torch ``PContext``, or a ``{local_rank: pid}`` mapping, or pids.

        Replaces whatever was watched before. Only children of this process can be watched by
        the ``thread`` backend (``pidfd`` takes any process). For a ``PContext``, ``fast_close``
        also applies :func:`fast_popen_waits`, so that the failure torch reports after closing
        the other workers is not held up by ``Popen.wait``'s polling.
        """
        handles: dict[int, Any] = {}
        ret_fds: dict[int, int] = {}
        if hasattr(target, "pids") and callable(target.pids):
            pids, handles, ret_fds = _pcontext_targets(target)
            if fast_close:
                fast_popen_waits(target)
        elif isinstance(target, Mapping):
            pids = {int(k): int(v) for k, v in target.items()}
        else:
            pids = dict(enumerate(int(p) for p in target))
        self.unwatch()
        self._generation += 1
        if self.backend == "tick":
            return
        for rank, pid in pids.items():
            handle = handles.get(rank)
            if handle is not None and _reaped(handle):
                self._pending += 1
                continue
            if self.backend == "pidfd":
                self._watch_pidfd(pid, handle)
            else:
                self._watch_thread(pid)
        assert self._selector is not None
        for fd in ret_fds.values():
            try:
                self._selector.register(fd, ("ret", fd))
            except (ValueError, KeyError, OSError):
                continue

    def _watch_pidfd(self, pid: int, handle: Any) -> None:
        assert self._selector is not None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pending += 1  # gone (and reaped) before we looked
            return
        if handle is not None and _reaped(handle):
            # reaped between the check above and pidfd_open: the fd may name a reused pid
            os.close(fd)
            self._pending += 1
            return
        self._pidfds.append(fd)
        self._selector.register(fd, ("pid", pid))

    def _watch_thread(self, pid: int) -> None:
        generation = self._generation
        self._watched.add(pid)

        def block() -> None:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # already reaped, or not our child: either way it is no longer running
            except OSError:
                return
            with self._lock:
                self._exited.add((generation, pid))
            self._nudge()

        threading.Thread(target=block, name=f"fsm-agent-waker-{pid}", daemon=True).start()

    def unwatch(self) -> None:
        """Stop watching the current workers (their fds are closed; threads are abandoned)."""
        if self._selector is not None:
            for fd, data in self._selector.items():
                if data is not None:
                    self._selector.unregister(fd)
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()
        self._watched.clear()
        self._pending = 0
        with self._lock:
            self._exited.clear()

    @property
    def watching(self) -> int:
        """How many workers are still watched (not yet reported as exited)."""
        if self.backend == "pidfd":
            return len(self._pidfds)
        return len(self._watched)

    # -- waiting --------------------------------------------------------------------------------

    def wake(self) -> None:
        """Make the current (or next) :meth:`wait` return ``True`` now; safe from any thread."""
        self._poked = True
        self._nudge()

    def _nudge(self) -> None:
        if self._wake_w < 0:
            return
        # BlockingIOError: the pipe is full, so a wake-up is pending anyway
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; return ``True`` early if a watched worker exited.

        A worker that exited since the last call (or before ``watch``) makes it return ``True`` at
        once. Signals behave as during ``time.sleep``: torch's handler raises ``SignalException``
        out of this call.
        """
        if self._pending:
            self._pending = 0
            self.wakeups += 1
            return True
        if self._selector is None:
            time.sleep(max(timeout, 0.0))
            return False
        remaining = max(timeout, 0.0)
        deadline = time.monotonic() + remaining
        while True:
            events = self._selector.poll(remaining)
            if not events:
                return False  # the common case: a plain tick
            if self._consume(events):
                self.wakeups += 1
                return True
            # only stale events (an exit of replaced workers): wait out the rest of the tick
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False

    def _consume(self, events: Iterable[tuple[int, Any]]) -> bool:
        assert self._selector is not None
        woke = False
        for fd, data in events:
            if data is None:  # the wake pipe
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                if self._poked:
                    self._poked = False
                    woke = True
                if self.backend == "thread":
                    woke |= self._collect_thread_exits()
                continue
            self._selector.unregister(fd)
            if data[0] == "pid":
                os.close(fd)
                self._pidfds.remove(fd)
            woke = True
        return woke

    def _collect_thread_exits(self) -> bool:
        with self._lock:
            mine = {pid for gen, pid in self._exited if gen == self._generation}
            self._exited.clear()
        fresh = mine & self._watched
        self._watched -= fresh
        return bool(fresh)  # exits of an earlier generation (workers already replaced) do not count

    def close(self) -> None:
        """Release fds; the waker must not be used afterwards."""
        self.unwatch()
        self._selector = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> WorkerExitWaker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WorkerExitWaker(backend={self.backend!r}, watching={self.watching})"
