"""Warm starts: workers forked from a template process that imported their modules once.

A real worker spends its first seconds importing (``import torch``: 2-4 s on 2 cores, more with
CUDA libraries and a model's own modules) before its first line of training code, at the first
start and again after every restart. ``fsm-agent run --preload torch`` (``FSMElasticAgent(...,
preload=["torch"])``) starts one *template* process when the agent starts: the same interpreter
and flags as the workers (``python -u``), which imports the listed modules and then waits. Every
start of a worker that torch's ``SubprocessContext`` would ``Popen`` as ``python -u SCRIPT ...``
(or ``-m MODULE``) is a ``fork()`` of the template instead, which then becomes that worker:

- a session and process group of its own (``setsid``, what ``start_new_session`` gives; the
  reaper of ``fsm_agent.torch._reaper`` stops the group as for a cold start);
- stdin, stdout and stderr the descriptors torch's handler would give ``Popen`` (the redirect
  files of ``--redirects``/``--log-dir``, which ``--tee`` and ``--local-ranks-filter`` read, or
  the agent's own), sent over the control socket; every other descriptor closed, as ``Popen``'s
  ``close_fds``, except those the preloaded modules opened themselves;
- the environment torch built for it (``os.environ`` replaced: ``RANK``, ``TORCHELASTIC_*``,
  ``TORCHELASTIC_ERROR_FILE`` ...), the agent's working directory at the time, ``sys.argv``,
  ``sys.path[0]`` and a ``__main__`` module as the interpreter sets them for a script or ``-m``;
- the signal dispositions a cold worker has when its script starts: the defaults, or what a
  preloaded module installed at import (the template imports with the defaults, then takes its
  own handling of SIGCHLD, SIGINT, SIGTERM and SIGHUP, which each worker gives back); fresh
  seeds for ``random``, ``numpy.random`` and torch's CPU generator (each cold process draws its
  own at import); the preload's import-time output written to its
  stdout/stderr first (a cold worker prints it when it imports);
- its own exit: ``SystemExit`` codes, a traceback and exit code 1 for an uncaught exception (the
  template's frames left out), death by SIGINT for an uncaught ``KeyboardInterrupt``, death by a
  signal; without the interpreter's teardown, but after its ``atexit`` handlers, thread joins
  and flushes (``_fast_exit`` in ``_template.py``; ``FSM_AGENT_PRELOAD_FULL_EXIT=1`` in the
  worker's environment for the whole teardown); the template reaps it and sends the status,
  which the agent's ``PreloadedProcess`` reports as ``Popen.returncode`` does (negative for a
  signal). The agent watches each worker
  through a pidfd the template opened at the fork, so a reused pid can never be signalled. If
  the template dies (the OOM killer, a stray ``pkill``), that is logged once and later workers
  start cold; the running ones keep their exit status, which each writes to a file of the
  agent's as it exits (a worker that dies by a signal meanwhile is reported killed, -9).

What a forked worker cannot share with a cold one, and what follows from it:

- its parent is the template, not the agent (``os.getppid()``);
- string hashing uses the template's seed (all workers of one agent alike; a cold start draws one
  per process unless ``PYTHONHASHSEED`` is set, which the template honours as well);
- a preloaded module runs its import-time code once, in the template, with the agent's
  environment: per-worker variables (``RANK``, ``LOCAL_RANK``, ``MASTER_PORT`` ...) are not set
  then. A module that reads them at import must not be preloaded.

The template refuses (one line, then every worker starts cold, as without ``--preload``) when a
module cannot be imported, or leaves a Python thread running, or initialises CUDA or opens a
device (``torch.cuda.is_initialized()``, an open ``/dev/nvidia*``, ``/dev/dri``, ``/dev/kfd`` or
``/dev/accel``): a forked child cannot use those. Workers whose command line is not the
template's interpreter with ``-u``/``-m`` (``--no-python``, ``--run-path``, a NUMA binding
wrapper) start cold. Linux only (``pidfd``, ``SOCK_SEQPACKET``).

torch touch points (feature ``preload`` of ``fsm_agent/torch/_compat.py``):
``SubprocessContext._start`` looks up ``get_subprocess_handler`` in
``torch.distributed.elastic.multiprocessing.api``'s globals, which :func:`serving` swaps for the
duration of one ``_start_workers``; the handler is torch's ``SubprocessHandler`` with ``_popen``
overridden, and the process object it returns provides what ``SubprocessContext`` and
``SubprocessHandler.close`` use of a ``Popen`` (``pid``, ``poll``, ``wait``, ``returncode``,
``send_signal``).
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

# The template runs _template.py loaded from its file under a private name, and so does the
# agent (fsm_agent._core._templatefile says why).
from fsm_agent._core._templatefile import load as template_module
from fsm_agent.torch._compat import enabled

__all__ = ["PreloadedProcess", "Template", "WarmStartMixin", "check_module_names", "serving"]

logger = logging.getLogger("fsm_agent.torch")

#: How long the agent waits for the template to fork a worker and answer.
SPAWN_TIMEOUT = 60.0
#: How long the template may take to import the modules (from its start); then it is killed
#: and every worker starts cold.
IMPORT_TIMEOUT = 300.0
#: How long the agent waits for the template's exit status of a worker whose pidfd says it ended.
STATUS_TIMEOUT = 10.0
_MAX_MESSAGE = 1 << 20
_DEVICES = ("/dev/nvidia", "/dev/dri", "/dev/kfd", "/dev/accel")


def check_module_names(names: Sequence[str]) -> list[str]:
    """The module names of ``--preload`` (``a,b.c``), or ``ValueError`` naming a bad one."""
    out = []
    for given in names:
        name = given.strip()
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"{name!r} is not a module name")
        out.append(name)
    return out


def available() -> str | None:
    """Why warm starts cannot work here, or ``None`` when they can."""
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return "needs os.pidfd_open (Linux 5.3, Python 3.9)"
    return None


# -- the agent's side --------------------------------------------------------------------------


class _Dead(Exception):
    """The template is gone (or never came up)."""


class Template:
    """The template process and the agent's end of its control socket.

    :meth:`start` launches it (it imports in the background); :meth:`spawn` forks a worker from
    it once it is ready; :meth:`close` ends it. Not thread-safe: the agent's main thread uses
    it (``_start_workers`` and the monitor look).
    """

    def __init__(self, modules: Sequence[str], interpreter: str, flags: Sequence[str],
                 main: Sequence[str], *, import_timeout: float = IMPORT_TIMEOUT) -> None:
        self.modules = tuple(modules)
        self.import_timeout = import_timeout
        self.interpreter = interpreter
        self.flags = tuple(flags)  # interpreter options before the script (-u)
        self.main = tuple(main)  # ("script.py",) or ("-m", "module")
        self.failed: str | None = None  # why it cannot serve, once known
        self.ready = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._started = time.monotonic()
        self._next_id = 0
        self._replies: dict[int, tuple[dict[str, Any], list[int]]] = {}
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._statuses: str | None = None

    def _status_dir(self) -> str:
        """A private directory for the workers' exit-code files (removed by :meth:`close`)."""
        if self._statuses is None:
            self._statuses = tempfile.mkdtemp(prefix="fsm-agent-preload-")
        return self._statuses

    @classmethod
    def for_command(cls, modules: Sequence[str], entrypoint: Any,
                    args: Sequence[Any]) -> Template | None:
        """A template for workers started as ``entrypoint *args``, or ``None`` (logged) when
        they are not started as ``python [-u] SCRIPT|-m MODULE``."""
        why = available()
        parsed = _parse_command(entrypoint, [str(a) for a in args]) if why is None else None
        if why is None and parsed is None:
            why = (f"the workers are not started as a Python script or module "
                   f"({entrypoint!r} {' '.join(str(a) for a in args[:2])} ...)")
        if why is not None or parsed is None:
            logger.warning("--preload %s: %s; workers start cold", ",".join(modules), why)
            return None
        flags, main, _rest = parsed
        return cls(modules, str(entrypoint), flags, main)

    def start(self) -> None:
        """Launch the template; it imports the modules while the agent goes on. A template
        ``fsm-agent run`` launched for this command before it imported torch is taken over."""
        tm = template_module()
        taken = tm.take_prestarted(self.interpreter, self.flags, self.modules, self.main)
        if taken is not None:
            self.proc, self._sock, self._started = taken
            logger.info("--preload %s: template pid %s importing since the agent started",
                        ",".join(self.modules), self.proc.pid)  # type: ignore[union-attr]
            return
        try:
            self.proc, self._sock = tm.launch(self.interpreter, self.flags, self.modules,
                                              self.main)
        except OSError as e:
            self._fail(f"cannot start {self.interpreter}: {e.strerror or e}")
            return
        logger.info("--preload %s: template pid %s importing", ",".join(self.modules),
                    self.proc.pid)  # type: ignore[union-attr]

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            logger.warning("--preload %s: %s; workers start cold", ",".join(self.modules), why)
        self.close(final=False)  # its running workers' exit-code files are still to be read

    def wait_ready(self) -> bool:
        """Wait (signals interrupt it) until the template has imported; whether it serves."""
        deadline = self._started + self.import_timeout
        while not self.ready and self.failed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                if self.proc is not None:  # not reaped yet: its group id is still its own
                    with contextlib.suppress(OSError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                self._fail(f"the modules did not import within {self.import_timeout:g} s "
                           "(a module that hangs at import?); the template is killed")
                break
            try:
                self._pump(min(1.0, left))
            except _Dead as e:
                self._fail(str(e))
        return self.ready

    def fits(self, args: Sequence[str]) -> bool:
        """Whether ``args`` (a worker's full command line) is this template's command."""
        if not args or args[0] != self.interpreter:
            return False
        parsed = _parse_command(args[0], list(args[1:]))
        return parsed is not None and parsed[0] == self.flags and parsed[1] == self.main

    def spawn(self, args: Sequence[str], env: dict[str, str], stdin: int, stdout: int,
              stderr: int) -> PreloadedProcess | None:
        """Fork a worker running ``args`` (its full command line); ``None`` if the template
        cannot (then logged once, and the caller starts the worker cold)."""
        if not self.wait_ready():
            return None
        parsed = _parse_command(args[0], list(args[1:]))
        assert parsed is not None and self._sock is not None
        self._next_id += 1
        # The worker writes its exit code there as it exits: its status when the template, its
        # parent, dies first (fsm_agent/torch/_template.py).
        status_path = os.path.join(self._status_dir(), str(self._next_id))
        request = {"op": "spawn", "id": self._next_id, "argv": parsed[2], "env": env,
                   "cwd": os.getcwd(), "status_path": status_path}
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin, stdout, stderr])
            deadline = time.monotonic() + SPAWN_TIMEOUT
            while self._next_id not in self._replies:
                if time.monotonic() >= deadline:
                    raise _Dead(f"no answer to a spawn within {SPAWN_TIMEOUT:g} s")
                self._pump(min(1.0, deadline - time.monotonic()))
        except (_Dead, OSError) as e:
            self._fail(str(e))
            return None
        reply, fds = self._replies.pop(self._next_id)
        if reply["op"] != "spawned" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self._fail(f"could not fork a worker: {reply.get('error', reply)}")
            return None
        return PreloadedProcess(self, int(reply["pid"]), fds[0], list(args), status_path)

    def exit_status(self, pid: int, timeout: float) -> int | None:
        """The raw wait status of worker ``pid`` once the template reaped it (``None`` on
        timeout; :data:`TEMPLATE_LOST` when the template died before it could say)."""
        deadline = time.monotonic() + timeout
        while pid not in self._exits:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self._pump(min(left, 1.0))
            except _Dead as e:
                self._fail(str(e))
                return TEMPLATE_LOST
        return self._exits[pid]

    def _pump(self, timeout: float) -> None:
        """Read what the template sent within ``timeout`` (replies, exits, readiness)."""
        sock = self._sock
        if sock is None:
            raise _Dead(self.failed or "the template is closed")
        with self._lock:
            ready, _, _ = select.select([sock], [], [], max(timeout, 0.0))
            while ready:
                try:
                    data, fds = _recv(sock, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as e:
                    raise _Dead(f"the template's control socket failed: {e}") from e
                if not data:
                    code = _ended_with(self.proc.pid) if self.proc is not None else None
                    raise _Dead(f"the template exited (status {code})")
                self._receive(json.loads(data), fds)

    def _receive(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg.get("op")
        if op == "exit":
            self._exits[int(msg["pid"])] = int(msg["status"])
        elif op == "ready":
            self.ready = True
            logger.info("--preload %s: imported in %.2f s (template pid %s)",
                        ",".join(self.modules), time.monotonic() - self._started,
                        self.proc.pid if self.proc else "?")
        elif op == "failed":
            self.failed = str(msg.get("error"))
            logger.warning("--preload %s: %s; workers start cold", ",".join(self.modules),
                           self.failed)
        elif "id" in msg:
            self._replies[int(msg["id"])] = (msg, fds)
            return
        for fd in fds:
            os.close(fd)

    def close(self, *, final: bool = True) -> None:
        """End the template (its workers are not touched: torch stops them); ``final``: also
        remove the workers' exit-code files (every worker has been waited for)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # the template exits on end-of-file
        proc = self.proc
        if proc is not None and proc.returncode is None:
            deadline = time.monotonic() + 5
            while _ended_with(proc.pid) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            # What a module started at import lives in the template's process group (the
            # workers have sessions of their own): it ends with the template. The template is
            # not reaped yet, so its pid, the group's id, cannot name another process.
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                proc.kill()  # if its group could not be signalled
            proc.wait()
        for _reply, fds in self._replies.values():
            for fd in fds:
                os.close(fd)
        self._replies.clear()
        statuses = self._statuses
        if final and statuses is not None:
            self._statuses = None
            shutil.rmtree(statuses, ignore_errors=True)


def _ended_with(pid: int) -> int | None:
    """The exit code of child ``pid`` if it has ended, without reaping it (None if running)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


#: :meth:`Template.exit_status` when the template died: only the worker's own report is left.
TEMPLATE_LOST = -1


class PreloadedProcess:
    """A worker forked by the template, as torch's ``SubprocessContext`` uses a ``Popen``."""

    stdin = stdout = stderr = None

    def __init__(self, template: Template, pid: int, pidfd: int, args: list[str],
                 status_path: str) -> None:
        self._template = template
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._pidfd: int | None = pidfd
        self._status_path = status_path

    def _settle(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for the process to end; take its status when it has."""
        if self.returncode is not None:
            return True
        pidfd = self._pidfd
        if pidfd is None:
            return True
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            return False
        status = self._template.exit_status(self.pid, STATUS_TIMEOUT)
        if status is None:  # ended, but the template has not reaped it yet
            return False
        self.returncode = (self._reported() if status == TEMPLATE_LOST
                           else os.waitstatus_to_exitcode(status))
        os.close(pidfd)
        self._pidfd = None
        with contextlib.suppress(OSError):
            os.unlink(self._status_path)
        return True

    def _reported(self) -> int:
        """The exit code the worker wrote as it exited; killed (-9) if it wrote none (a signal
        or ``os._exit``: only the dead template could have told)."""
        data = b""
        with contextlib.suppress(OSError), open(self._status_path, "rb") as f:
            data = f.read(64)
        try:
            return int(data)
        except ValueError:
            logger.warning("--preload: worker pid %s ended after the template died, without "
                           "saying how; reported as killed (SIGKILL)", self.pid)
            return -signal.SIGKILL


    def poll(self) -> int | None:
        self._settle(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._settle(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)

    def __repr__(self) -> str:
        return f"<PreloadedProcess pid={self.pid} returncode={self.returncode}>"


def _recv(sock: socket.socket, flags: int = 0) -> tuple[bytes, list[int]]:
    """One message and its descriptors (``socket.recv_fds`` before Python 3.12 drops
    ``flags``, so it cannot be non-blocking)."""
    size = socket.CMSG_LEN(4 * array.array("i").itemsize)
    data, ancdata, _flags, _addr = sock.recvmsg(_MAX_MESSAGE, size, flags)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _parse_command(entrypoint: Any, args: list[str]) -> tuple[tuple[str, ...],
                                                              tuple[str, ...], list[str]] | None:
    """(interpreter flags, main, sys.argv) of ``python [-u] SCRIPT|-m MODULE ARGS``, or None."""
    if not isinstance(entrypoint, str) or "python" not in os.path.basename(entrypoint):
        return None
    flags: list[str] = []
    rest = list(args)
    while rest and rest[0] == "-u":
        flags.append(rest.pop(0))
    if not rest:
        return None
    if rest[0] == "-m":
        if len(rest) < 2:
            return None
        return tuple(flags), ("-m", rest[1]), ["-m", *rest[2:]]
    if rest[0].startswith("-"):
        return None  # an option we do not reproduce
    return tuple(flags), (rest[0],), rest


class _Handlers:
    """``get_subprocess_handler`` for one ``_start_workers``: torch's handler, whose ``_popen``
    forks from the template when the command fits."""

    def __init__(self, template: Template) -> None:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            SubprocessHandler,
        )

        outer = self

        class PreloadedHandler(SubprocessHandler):  # type: ignore[misc]
            def _popen(self, args: tuple[str, ...], env: dict[str, str]) -> Any:
                proc = outer.spawn(args, env, self._stdout, self._stderr)
                return proc if proc is not None else super()._popen(args, env)

        self._cls = PreloadedHandler
        self._template = template
        self._said_cold = False

    def spawn(self, args: tuple[str, ...], env: dict[str, str], stdout: Any,
              stderr: Any) -> PreloadedProcess | None:
        template = self._template
        if template.failed is not None:
            return None
        if not template.fits(list(args)):
            if not self._said_cold:
                self._said_cold = True
                logger.warning("--preload: worker command %s is not the template's; it starts "
                               "cold", " ".join(args[:3]))
            return None
        return template.spawn(list(args), env, 0,
                              stdout.fileno() if stdout is not None else 1,
                              stderr.fileno() if stderr is not None else 2)

    def __call__(self, **kwargs: Any) -> Any:
        return self._cls(**kwargs)


@contextlib.contextmanager
def serving(template: Template | None) -> Iterator[None]:
    """Within this block, torch's ``SubprocessContext`` forks script workers from ``template``."""
    if template is None or template.failed is not None:
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "get_subprocess_handler", None)
    if not callable(original):  # a torch that starts its workers another way
        logger.warning("--preload: this torch has no get_subprocess_handler; workers start cold")
        yield
        return
    api.get_subprocess_handler = _Handlers(template)
    try:
        yield
    finally:
        api.get_subprocess_handler = original




class WarmStartMixin:
    """For ``LocalElasticAgent`` subclasses (before it among the bases): ``preload=[modules]``
    starts a template when the agent runs and forks script workers from it (module docstring).

    Empty ``preload`` (the default) changes nothing.
    """

    _worker_group: Any
    _fsm_template: Template | None = None

    def __init__(self, *args: Any, preload: Sequence[str] = (), **kwargs: Any) -> None:
        self._fsm_preload: list[str] = check_module_names(preload)
        super().__init__(*args, **kwargs)

    @property
    def template(self) -> Template | None:
        """The template of the current ``run()`` (``None`` without ``preload``)."""
        return self._fsm_template

    def run(self, *args: Any, **kwargs: Any) -> Any:
        template = None
        if self._fsm_preload and not enabled("preload"):
            logger.warning("--preload %s: not with this torch (see above); workers start cold",
                           ",".join(self._fsm_preload))
        elif self._fsm_preload:
            spec = self._worker_group.spec
            # started first: it imports while the agent joins the rendezvous
            template = Template.for_command(self._fsm_preload, spec.entrypoint, spec.args)
            if template is not None:
                template.start()
        if template is None:  # one `fsm-agent run` launched early is of no use: end it now
            template_module().discard_prestarted()
        self._fsm_template = template
        try:
            return super().run(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._fsm_template = None
            if template is not None:
                template.close()

    def _start_workers(self, worker_group: Any) -> Any:
        with serving(self._fsm_template):
            return super()._start_workers(worker_group)  # type: ignore[misc]
