"""The template process of warm starts (``fsm_agent.torch._preload``): imports, then forks workers.

Run by the agent as ``python [-u] -c CODE THIS_FILE SETUP``, loaded from its file under a private
module name (never as ``fsm_agent.torch._template``: that would import the package, and torch,
into every worker). Standard library only (modules that torch imports anyway), since every
worker inherits what this process imported.

Protocol (``SOCK_SEQPACKET``, one JSON object per message, descriptors alongside):

- template to agent: ``{"op": "ready"}`` or ``{"op": "failed", "error": ...}`` once, after the
  imports; ``{"op": "spawned", "id", "pid"}`` with the child's pidfd, or ``{"op": "error", "id",
  "error"}``, per request; ``{"op": "exit", "pid", "status"}`` (a raw wait status) whenever it
  reaps a child;
- agent to template: ``{"op": "spawn", "id", "argv", "env", "cwd", "status_path"}`` with the
  child's stdin, stdout and stderr. End of file: the template exits;
- worker to agent, in the file ``status_path``: its exit code as text (``3``, ``-2`` for death
  by SIGINT), written as the interpreter is about to exit with it. The agent reads it only when
  the template, which reaps the worker and knows its real status, died first. A file, not a
  descriptor: the worker's open descriptors stay those of a cold start.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

_MAX_MESSAGE = 1 << 20
_DEVICES = ("/dev/nvidia", "/dev/dri", "/dev/kfd", "/dev/accel")

_worker_pid = 0  # the worker this process became (its own children must not report)
_captured: tuple[bytes, bytes] = (b"", b"")  # what the imports wrote to stdout and stderr
# descriptors the imported modules opened: a worker keeps them
_own_fds: frozenset[int] = frozenset()


# -- the agent's side: how a template is launched (here so that ``fsm-agent run`` can launch one
# before it imports torch: fsm_agent.torch's package imports torch) ------------------------------

_CODE = ("import importlib.util as u, sys; s = u.spec_from_file_location('_fsm_agent_template', "
         "sys.argv[1]); m = u.module_from_spec(s); sys.modules[s.name] = m; "
         "s.loader.exec_module(m); m.main(sys.argv[2])")


def launch(interpreter: str, flags: Sequence[str], modules: Sequence[str],
           main: Sequence[str], env: dict[str, str] | None = None) -> tuple[Any, socket.socket]:
    """Start a template process (``subprocess.Popen``) and return it with the agent's end of its
    control socket; ``OSError`` if the interpreter cannot start."""
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    setup = {"modules": list(modules), "main": list(main), "flags": list(flags),
             "fd": theirs.fileno()}
    try:
        proc = subprocess.Popen(
            [interpreter, *flags, "-c", _CODE, os.path.abspath(__file__), json.dumps(setup)],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # the terminal's signals are for the agent, not for it
        )
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


#: Variables the agent sets for itself and its workers' environments (which replace the
#: template's), before the template would start: what the modules import with does not
#: depend on them, so a template launched without them is the agent's own.
AGENT_ONLY_ENV = ("FSM_AGENT_PROGRESS_DIR", "TORCHELASTIC_SIGNALS_TO_HANDLE")
#: A template ``fsm-agent run`` launched at its start: ((interpreter, flags, modules, main),
#: environment, process, socket, monotonic start time), until the agent takes it.
_prestarted: tuple[tuple[Any, ...], dict[str, str], Any, socket.socket, float] | None = None


def prestart(interpreter: str, flags: Sequence[str], modules: Sequence[str],
             main: Sequence[str], env: dict[str, str]) -> None:
    """Launch a template now, with environment ``env``, for :func:`take_prestarted` to hand to
    the agent if the agent's own template would be this one; ended at exit otherwise."""
    global _prestarted  # noqa: PLW0603 - one per process, taken once
    import atexit
    import time

    if _prestarted is not None:
        return  # launched already (bench/_probe.py launches it before fsm_agent.cli does)
    try:
        proc, sock = launch(interpreter, flags, modules, main, env)
    except OSError:
        return  # the agent's own attempt reports it
    key = (interpreter, tuple(flags), tuple(modules), tuple(main))
    _prestarted = (key, dict(env), proc, sock, time.monotonic())
    atexit.register(discard_prestarted)


def take_prestarted(interpreter: str, flags: Sequence[str], modules: Sequence[str],
                    main: Sequence[str]) -> tuple[Any, socket.socket, float] | None:
    """The template :func:`prestart` launched (process, socket, start time) if it was launched
    for this command, these modules and the environment the agent has now (what a template
    launched now would import with); else ``None``, and that template is ended."""
    global _prestarted
    held, _prestarted = _prestarted, None
    if held is None:
        return None
    key, env, proc, sock, started = held
    # Both sides without the agent's own variables: the early template inherited them from
    # the agent's caller if it exported them (a shell, or a program that ran torch's launcher
    # in its own process before), and the agent may have set them since.
    if key != (interpreter, tuple(flags), tuple(modules), tuple(main)) or \
            _template_env(env) != _template_env(os.environ):
        _end(proc, sock)
        return None
    return proc, sock, started


def _template_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in AGENT_ONLY_ENV}


def discard_prestarted() -> None:
    """End the template :func:`prestart` launched, if nobody took it."""
    global _prestarted
    held, _prestarted = _prestarted, None
    if held is not None:
        _end(held[2], held[3])


def _end(proc: Any, sock: socket.socket) -> None:
    sock.close()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: its group id is still its own
    proc.wait()


# -- the template's side -------------------------------------------------------------------------


class _Become(BaseException):
    """Raised in a freshly forked child to leave the template's loop and become a worker."""

    def __init__(self, request: dict[str, Any], fds: list[int]) -> None:
        super().__init__()
        self.request, self.fds = request, fds


def main(setup_json: str) -> None:
    """The template: import, report, then fork workers on request until the agent closes the
    control socket. A forked child leaves the loop through ``_Become`` and runs the worker from
    here, so that the worker's own exceptions and exit reach the interpreter as in a cold start.
    """
    setup = json.loads(setup_json)
    sock = socket.socket(fileno=setup["fd"])
    try:
        _serve(sock, setup)
    except _Become as child:
        request, fds = child.request, child.fds
    else:
        sys.exit(0)
    status_path = str(request.get("status_path", ""))
    # Outside the handler: the worker's own exceptions must not carry _Become as their context.
    ended: BaseException | None = None
    try:
        _become_worker(request, fds, setup["main"], sock)
    except BaseException as e:  # every way out of __main__, as the interpreter sees them
        ended = e
    if os.environ.get(FULL_EXIT_VAR, "") not in ("", "0"):
        # the interpreter's own way out, teardown included: of the template's objects too,
        # which the collector skips while they are frozen
        import gc

        gc.unfreeze()
        _report(status_path, _code_of(ended))
        if ended is not None:
            raise ended
        return
    _fast_exit(status_path, ended)


#: Set (not ``0``) in a worker's environment, this makes a forked worker end as the interpreter
#: does, teardown included (C++ static destructors, objects' finalizers), instead of
#: :func:`_fast_exit`.
FULL_EXIT_VAR = "FSM_AGENT_PRELOAD_FULL_EXIT"
# what the interpreter exits with when flushing stdout or stderr fails at the end (Py_RunMain)
_FLUSH_FAILED = 120


def _code_of(ended: BaseException | None) -> int:
    """The exit code (negative: the signal) the interpreter ends with after ``ended``."""
    if ended is None:
        return 0
    if isinstance(ended, SystemExit):
        return _exit_code(ended.code)
    if isinstance(ended, KeyboardInterrupt):
        return -signal.SIGINT  # the interpreter kills itself with SIGINT
    return 1  # the traceback, then exit code 1


def _fast_exit(status_path: str, ended: BaseException | None) -> None:
    """End the worker as ``Py_RunMain`` does after ``__main__`` (with ``ended``, what left it),
    without the interpreter's teardown: with torch imported that teardown (every module's
    objects released, in a process whose memory is the template's copy-on-write pages) takes
    0.3-0.8 s, during which the agent cannot restart the group.

    Kept, in the interpreter's order: the flush of ``sys.stdout`` and ``sys.stderr`` as
    ``__main__`` ends; when an exception ended it, the flush of C's stdio and the exception's
    report (``SystemExit``'s message, the traceback through ``sys.excepthook``); the join of
    non-daemon threads and ``threading._register_atexit`` callbacks; the ``atexit`` handlers
    (``logging.shutdown``, ``weakref.finalize``, multiprocessing's); the flush of the standard
    streams again (exit code 120 if that fails, as the interpreter) and, beyond what a teardown
    is sure to do, of every other file object the worker opened; then C's stdio (``exit()``
    flushes it, ``os._exit`` would not). Not kept: objects' ``__del__`` at teardown and C/C++
    exit handlers (static destructors), hence :data:`FULL_EXIT_VAR`.
    """
    code = _code_of(ended)
    _flush_standard_streams()
    if ended is not None:
        _flush_c_stdio()
        if not isinstance(ended, SystemExit):
            _print_uncaught(ended)
        elif ended.code is not None and not isinstance(ended.code, int):
            with contextlib.suppress(Exception):
                print(ended.code, file=sys.stderr)
    del ended  # its traceback holds the worker's frames
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
    import atexit

    atexit._run_exitfuncs()
    if not _flush_files() and code >= 0:
        code = _FLUSH_FAILED
    _flush_c_stdio()
    if os.getpid() == _worker_pid:  # not a process the worker forked that left __main__ too
        _report(status_path, code)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF if code >= 0 else 128 - code)


def _print_uncaught(error: BaseException) -> None:
    """What ``PyErr_Print`` does with an exception that left ``__main__``."""
    sys.last_type, sys.last_value, sys.last_traceback = (
        type(error), error, error.__traceback__)
    hook = getattr(sys, "excepthook", None)
    try:
        if hook is None:
            raise RuntimeError("lost sys.excepthook")
        hook(type(error), error, error.__traceback__)
    except BaseException as hook_error:  # the interpreter reports both
        with contextlib.suppress(Exception):
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(type(error), error, error.__traceback__)


def _flush_standard_streams() -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr``; whether both flushed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:
            ok = False
    return ok


def _flush_files() -> bool:
    """Flush the standard streams and the worker's other open files; whether the standard
    streams flushed (the interpreter's exit code depends on it)."""
    import gc
    import io

    ok = _flush_standard_streams()
    # The template froze its own objects (gc.freeze), so this lists only the worker's: a few
    # thousand, not torch's 165,000. Text layers first, then the buffers under them.
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    files = [o for o in gc.get_objects() if isinstance(o, kinds)]
    files.sort(key=lambda f: not isinstance(f, io.TextIOWrapper))
    for f in [*files, sys.__stdout__, sys.__stderr__]:
        with contextlib.suppress(Exception):
            if f is not None and not f.closed:
                f.flush()
    return ok


def _flush_c_stdio() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


def _exit_code(code: object) -> int:
    """The exit code the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # printed to stderr


def _report(path: str, code: int) -> None:
    if path:
        with contextlib.suppress(OSError), open(path, "w") as f:
            f.write(str(code))


def _send(sock: socket.socket, msg: dict[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(msg).encode()], list(fds))


def _open_fds() -> set[int]:
    # the listing's own descriptor is in the list and closed again afterwards
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _preload(setup: dict[str, Any]) -> str | None:
    """Import the modules, capturing what they print; why they cannot serve, or ``None``."""
    global _captured, _own_fds  # noqa: PLW0603 - the fork hands them to every worker
    import importlib
    import tempfile

    # sys.path[0] as the workers will have it, so that a module beside the script imports
    main = setup["main"]
    sys.path[0] = os.getcwd() if main[0] == "-m" else os.path.dirname(os.path.realpath(main[0]))
    before = _open_fds()
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]  # noqa: SIM115 - closed below
    saved = [os.dup(1), os.dup(2)]
    for target, f, stream in zip((1, 2), files, (sys.stdout, sys.stderr), strict=True):
        stream.flush()
        os.dup2(f.fileno(), target)
    error: str | None = None
    try:
        for name in setup["modules"]:
            try:
                importlib.import_module(name)
            except BaseException as e:  # any failure, SystemExit included, means: no preload
                error = f"cannot import {name} ({type(e).__name__}: {e})"
                break
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), saved, strict=True):
            os.dup2(fd, target)
            os.close(fd)
    out: list[bytes] = []
    for f in files:
        f.seek(0)
        out.append(f.read())
        f.close()
    _captured = (out[0], out[1])
    _own_fds = frozenset(_open_fds() - before)
    return error or _unforkable()


def _unforkable() -> str | None:
    """Why a fork of this process would not make a usable worker, or ``None``."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate()
                          if t is not threading.main_thread())
        return f"the modules started Python threads ({names}), which a fork does not copy"
    torch = sys.modules.get("torch")
    if torch is not None:
        for kind in ("cuda", "xpu"):
            initialised = getattr(getattr(torch, kind, None), "is_initialized", None)
            try:
                if callable(initialised) and initialised():
                    return (f"the modules initialised {kind.upper()}, which a forked child "
                            f"cannot use")
            except Exception:  # a backend that cannot even say: not ours to judge
                continue
    for fd in _open_fds():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(_DEVICES):
            return f"the modules opened the device {target}, which a forked child cannot use"
    return None


#: The signals whose handling the template changes for itself, and gives back to its workers.
_OWN_SIGNALS = (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# each one's disposition after the imports: what a cold worker has when its script starts
_worker_signals: dict[int, Any] = {}


def _serve(sock: socket.socket, setup: dict[str, Any]) -> None:
    # The imports run with the dispositions a cold worker imports with, so that a module that
    # installs a handler (a checkpoint on SIGTERM) keeps it in every worker.
    error = _preload(setup)
    _worker_signals.update((sig, signal.getsignal(sig)) for sig in _OWN_SIGNALS)
    if error is not None:
        _send(sock, {"op": "failed", "error": error})
        return
    # Signals for the agent are not for the template (it also has a session of its own); the
    # exits of its children come through SIGCHLD and the wake-up pipe.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # What the imports made moves out of the collector's generations: a worker's collections
    # then neither walk nor touch (copy on write) them, and _fast_exit lists only its own. No
    # gc.collect() first: 0.15 s with torch, on the way to the first workers.
    import gc

    gc.freeze()
    _send(sock, {"op": "ready"})
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _reap(sock)
        if sock.fileno() in ready:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 3)
            except OSError:
                return
            if not data:
                return  # the agent closed its end
            _handle(sock, json.loads(data), fds)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"op": "exit", "pid": pid, "status": status})


def _handle(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    if request.get("op") != "spawn" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        _send(sock, {"op": "error", "id": request.get("id"), "error": "bad request"})
        return
    try:
        pid = os.fork()
    except OSError as e:
        for fd in fds:
            os.close(fd)
        _send(sock, {"op": "error", "id": request["id"], "error": f"fork: {e}"})
        return
    if pid == 0:
        raise _Become(request, fds)
    for fd in fds:
        os.close(fd)
    # Opened before the child can be reaped (only this loop reaps), so it names the child itself.
    pidfd = os.pidfd_open(pid)
    try:
        _send(sock, {"op": "spawned", "id": request["id"], "pid": pid}, [pidfd])
    finally:
        os.close(pidfd)


def _become_worker(request: dict[str, Any], fds: list[int], main: list[str],
                   sock: socket.socket) -> None:
    """In the forked child: undo the template, take the worker's descriptors, environment and
    command line, and run its ``__main__``, as ``Popen`` and ``python [-u] SCRIPT`` would."""
    global _worker_pid  # noqa: PLW0603 - read by _fast_exit
    _worker_pid = os.getpid()
    os.setsid()  # Popen(start_new_session=True)
    signal.set_wakeup_fd(-1)
    for sig, handler in _worker_signals.items():
        # None: a handler installed from C, which Python cannot reinstall
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
    sock.detach()
    for fd in _open_fds() - {0, 1, 2} - _own_fds:  # Popen(close_fds=True)
        with contextlib.suppress(OSError):
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _reseed()
    for fd, data in zip((1, 2), _captured, strict=True):  # a cold worker prints it at import
        if data:
            with contextlib.suppress(OSError):
                os.write(fd, data)
    if not getattr(sys.stdout, "write_through", False):  # without -u: a tty is line-buffered
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(line_buffering=os.isatty(1))  # type: ignore[union-attr]
    sys.excepthook = _trimmed_excepthook
    argv = request["argv"]
    if main[0] == "-m":
        import runpy

        sys.argv = list(argv)
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(main[1])  # type: ignore[attr-defined]  # what -m does
        return
    _run_script(argv)


def _reseed() -> None:
    # random reseeds itself at fork (os.register_at_fork); these draw their seed at import
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        with contextlib.suppress(Exception):
            np_random.seed()
    generator = getattr(sys.modules.get("torch"), "default_generator", None)
    if generator is not None:
        with contextlib.suppress(Exception):
            generator.seed()


def _run_script(argv: list[str]) -> None:
    import builtins
    from importlib.machinery import SourceFileLoader

    script = argv[0]
    path = os.path.abspath(script)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None,
                     __loader__=SourceFileLoader("__main__", path), __spec__=None,
                     __annotations__={}, __builtins__=builtins, __file__=path, __cached__=None)
    exec(code, namespace)


def _trimmed_excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """The default hook, without the template's own frames at the top of the traceback."""
    ours = {__file__, "<string>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    # the default hook prints the exception's own traceback, not only the one it is given
    sys.__excepthook__(kind, value.with_traceback(tb), tb)
