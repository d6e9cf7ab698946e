"""A clean slate before every (re)start: no process of an earlier attempt runs beside the next.

torch stops a worker group by signalling each worker's process group, and the reaper
(``fsm_agent.torch._reaper``) ends whatever is left in those groups; a process a worker moved
into a session of its own (``setsid``, a daemon's double fork) is in neither, and would run on
beside the next attempt's workers, holding their GPUs and ports. The sentinel
(``fsm_agent.torch._sentinel``) ends such processes only when the agent ends.

:class:`CleanSlateMixin` marks every worker of the agent with ``FSM_AGENT_WORKER=<token>`` in its
environment (one token per agent, so another agent on the machine is never touched); the
workers' descendants inherit it, double-forked and ``setsid`` ones included. Before every start
of the workers, any live process that carries the mark belongs to an earlier attempt: it is
SIGKILLed (through a pidfd opened before its environment is read, so a pid reused meanwhile is
never signalled) and waited for, at most :data:`START_TIMEOUT` seconds. A process that survives
SIGKILL that long is in uninterruptible sleep (a hung device or mount); under the torch presets
the log names it and its state and the workers start, as torch's would. A spec can ask for more
with the ``clean_slate`` health check (``resilient``: ``clean_slate_timeout``): the node then
leaves the job (``leave_job``, exit 75) instead of starting beside it.

A process that clears its environment escapes the mark. Linux only (``pidfd_open``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from typing import Any

import attrs

from fsm_agent.torch._compat import enabled

__all__ = ["START_TIMEOUT", "WORKER_VAR", "CleanSlateMixin", "Leftover", "clear", "describe",
           "leftovers"]

logger = logging.getLogger("fsm_agent.torch")

#: The environment variable whose value marks one agent's workers and their descendants.
WORKER_VAR = "FSM_AGENT_WORKER"
#: How long a start waits for the leftovers it killed (seconds) when no spec check asked first.
START_TIMEOUT = 5.0

_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped",
           "t": "traced", "I": "idle"}


@attrs.frozen
class Leftover:
    """A process of an earlier attempt: its pid, state letter (``/proc/PID/stat``) and command."""

    pid: int
    state: str
    command: str

    def describe(self) -> str:
        """``pid 123 (sleep 300, uninterruptible sleep)``."""
        return f"pid {self.pid} ({self.command}, {_STATES.get(self.state, self.state)})"


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, command) of a live process, None for a gone or zombie one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            head, _, tail = f.read().rpartition(b")")
    except OSError:
        return None
    state = tail.split()[0].decode() if tail.split() else "?"
    if state in ("Z", "X"):
        return None
    return state, head.partition(b"(")[2].decode(errors="replace")


def _marked(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def _needle(token: str) -> bytes:
    return f"{WORKER_VAR}={token}".encode()


def leftovers(token: str) -> list[Leftover]:
    """Live processes marked with ``token`` (this process excluded)."""
    needle, me, found = _needle(token), os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _marked(pid, needle):
            st = _stat(pid)
            if st is not None:
                found.append(Leftover(pid, *st))
    return found


def _kill_marked(needle: bytes) -> list[int]:
    """SIGKILL every live process marked with ``needle``; the pids signalled."""
    me, killed = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            if _marked(int(entry), needle) and _stat(int(entry)) is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed.append(int(entry))
        finally:
            os.close(fd)
    return killed


def clear(token: str, timeout: float) -> list[Leftover]:
    """SIGKILL every process marked with ``token``, wait up to ``timeout`` s for all to end;
    returns those still alive then (uninterruptible sleep), empty on a clean slate."""
    if not hasattr(os, "pidfd_open"):
        return []
    needle = _needle(token)
    killed = _kill_marked(needle)
    if not killed:
        return []
    logger.warning("%d process(es) of the previous attempt were still running (pids %s): "
                   "SIGKILL before the next start", len(killed), sorted(killed))
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        left = leftovers(token)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)
        _kill_marked(needle)  # one that forked meanwhile


def describe(left: list[Leftover], timeout: float) -> str:
    """One line: which processes survived SIGKILL for ``timeout`` s."""
    return (f"{len(left)} process(es) of the previous attempt survived SIGKILL for "
            f"{timeout:g} s: " + ", ".join(p.describe() for p in sorted(left, key=lambda p: p.pid)))


class CleanSlateMixin:
    """For ``LocalElasticAgent`` subclasses (module docstring): list it before
    ``LocalElasticAgent`` among the bases."""

    _fsm_slate_token: str = ""

    def _fsm_slate(self) -> str:
        if not self._fsm_slate_token:
            self._fsm_slate_token = uuid.uuid4().hex
        return self._fsm_slate_token

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # torch calls this with every worker's environment just before it starts them
        super()._setup_local_watchdog(envs)  # type: ignore[misc]
        if enabled("clean_slate"):
            for worker_env in envs.values():
                worker_env[WORKER_VAR] = self._fsm_slate()

    def _fsm_clear_slate(self, timeout: float) -> list[Leftover]:
        """End what earlier attempts left (module docstring); the processes that survived."""
        if not enabled("clean_slate") or not self._fsm_slate_token:
            return []
        return clear(self._fsm_slate_token, timeout)

    def _fsm_slate_reason(self, timeout: float) -> str | None:
        """The ``clean_slate`` health check's view (``fsm_agent._core._health``): what survived, as
        one line, or None."""
        left = self._fsm_clear_slate(timeout)
        return describe(left, timeout) if left else None

    def _start_workers(self, worker_group: Any) -> Any:
        left = self._fsm_clear_slate(START_TIMEOUT)
        if left:
            logger.warning("%s; starting the workers beside them, as torch would",
                           describe(left, START_TIMEOUT))
        return super()._start_workers(worker_group)  # type: ignore[misc]
