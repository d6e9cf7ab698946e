"""No worker outlives its agent: a sentinel process ends them when the agent dies, SIGKILL included.

torch starts each worker in a session of its own, and an agent killed with SIGKILL (the OOM
killer, a scheduler's hard kill) runs no handler: its workers and everything they started (a
dataloader's forked children, a ``setsid`` daemon) run on, holding GPUs and ports
(pytorch/pytorch#76287; torchrun does the same). A thread of the agent cannot help: it dies with it.

:class:`SentinelMixin` starts one small process when the agent runs (``python -c`` with the
standard library only, in a session of its own, deaf to SIGINT, SIGTERM and SIGHUP). The agent
holds the write end of a pipe whose read end is the sentinel's stdin; the kernel closes it when
the agent ends, however it ends. The sentinel then ends every process that carries the agent's
token, ``FSM_AGENT_SENTINEL=<uuid>`` in its environment: the agent sets it in its own
environment before any worker starts, torch hands the environment on to the workers (warm ones
forked by ``--preload`` included), and they to their children, double-forked and ``setsid`` ones
included. Each process is signalled through a pidfd opened before its environment is read, so a
pid reused meanwhile is never signalled; no process without the token is, and neither is the
agent, nor, while the agent lives, a multiprocessing forkserver or resource tracker it started
itself (an agent run inside a longer-lived process, whose later runs use them). It sweeps until
none is left (at most 5 s), then exits. When the agent ends normally it
closes the pipe itself and waits for that sweep, so that what its stopped workers left behind
ends too.

A process that clears its environment, or one in uninterruptible sleep, escapes it. Linux only
(``pidfd_open``, Linux 5.3); elsewhere the agent runs without a sentinel, as torch's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

from fsm_agent._core._templatefile import take_sentinel_token

__all__ = ["TOKEN_VAR", "Sentinel", "SentinelMixin"]

logger = logging.getLogger("fsm_agent.torch")

#: The environment variable whose value marks the agent's workers and their descendants.
TOKEN_VAR = "FSM_AGENT_SENTINEL"
#: How long the sentinel sweeps, and how long the agent waits for it at a normal end.
SWEEP_TIMEOUT = 5.0

# The sentinel itself (argv: token, the agent's pid). Standard library only: it starts fast.
_CODE = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
token, agent = sys.argv[1], int(sys.argv[2])
needle = ("%s=%s" % (sys.argv[3], token)).encode()
while os.read(0, 4096):
    pass  # end of file: the agent has ended
me = os.getpid()
# the living agent's own multiprocessing helpers (a forkserver, a resource tracker) carry the
# token when they started during a run; they are the agent process's, not its workers'
HELPERS = (b"multiprocessing.forkserver import main",
           b"multiprocessing.resource_tracker import main")
def stat(pid):
    with open("/proc/%s/stat" % pid, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()  # state, ppid, ... starttime at [19]
born = int(stat(me)[19])  # the sentinel starts before any worker does
start = time.monotonic()
deadline = start + float(sys.argv[4])
while True:
    left = pending = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (me, agent):
            continue
        try:
            fd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read()
            if not env:
                # a kernel thread, a zombie, or a process inside execve: its parent may have
                # returned from vfork before the new environment is in place. One started
                # since the sentinel, still running, is looked at again (for a second at most)
                fields = stat(entry)
                if (fields[0] != b"Z" and int(fields[1]) not in (0, 2)
                        and int(fields[19]) >= born):
                    pending += 1
                continue
            if needle not in env.split(b"\0"):
                continue
            ppid = int(stat(entry)[1])
            if ppid == agent:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmdline = f.read()
                if any(h in cmdline for h in HELPERS):
                    continue
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            left += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    now = time.monotonic()
    if now > deadline or not (left or (pending and now < start + 1.0)):
        break
    time.sleep(0.05)
"""


class Sentinel:
    """The sentinel process of one agent run (module docstring)."""

    def __init__(self) -> None:
        # reserved when `fsm-agent run --preload` launched its template before the agent
        self.token = take_sentinel_token()
        self.proc: subprocess.Popen[bytes] | None = None
        self._write: int | None = None

    def start(self) -> bool:
        """Start the sentinel and mark this process's future children; False if it cannot."""
        if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
            return False
        read, write = os.pipe()  # both close-on-exec: no worker holds the write end
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CODE, self.token, str(os.getpid()), TOKEN_VAR,
                 str(SWEEP_TIMEOUT)],
                stdin=read, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as e:
            os.close(write)
            logger.warning("no sentinel (%s): workers may outlive an agent killed with "
                           "SIGKILL, as under torch", e)
            return False
        finally:
            os.close(read)
        self._write = write
        os.environ[TOKEN_VAR] = self.token
        logger.debug("sentinel pid %s for token %s", self.proc.pid, self.token)
        return True

    def close(self) -> None:
        """A normal end: let the sentinel sweep what is left, and wait for it (bounded)."""
        if os.environ.get(TOKEN_VAR) == self.token:
            del os.environ[TOKEN_VAR]
        write, self._write = self._write, None
        if write is not None:
            os.close(write)
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(SWEEP_TIMEOUT + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class SentinelMixin:
    """For ``LocalElasticAgent`` subclasses: a :class:`Sentinel` for each ``run()``, unless
    ``sentinel=False``. The token is in this process's environment while ``run()`` runs: a
    program that embeds the agent and starts processes of its own meanwhile (from another
    thread) marks them too, and they end with the run; pass ``sentinel=False`` to keep them."""

    def __init__(self, *args: Any, sentinel: bool = True, **kwargs: Any) -> None:
        self._fsm_sentinel = sentinel
        super().__init__(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        sentinel = Sentinel() if self._fsm_sentinel else None
        if sentinel is not None:
            sentinel.start()
        try:
            return super().run(*args, **kwargs)  # type: ignore[misc]
        finally:
            if sentinel is not None:
                sentinel.close()
