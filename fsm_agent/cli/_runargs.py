"""``fsm-agent run`` argument checks: one clear line and exit code 2, before anything starts.

torchrun accepts many values it cannot use and fails late: ``--max-restarts -1`` runs as "no
restarts", ``--monitor-interval 0`` busy-loops, ``--nnodes 2:1`` or a missing script fail only after
the rendezvous (or in every worker), a bad ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` fails with
"invalid literal for int()". :func:`parse_args` parses with torch's own parser and then checks
every value against what torch will do with it; any problem is an :class:`ArgError` whose message
is one line naming the flag (or variable) and the value.

Nothing here imports or runs user code: the script is looked up on disk (``--module``: on the
import path, without importing it).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["ArgError", "check_args", "parse_args"]

# Rendezvous settings (--rdzv-conf KEY=VALUE) that are durations in seconds.
_RDZV_DURATIONS = ("join_timeout", "last_call_timeout", "close_timeout", "timeout",
                   "read_timeout", "keep_alive_interval", "heartbeat")
# Keys only some backends read: any value passes through to the others, as under torchrun.
# `timeout` is etcd v1's rendezvous timeout and the static backend's TCPStore timeout.
_RDZV_BACKEND_ONLY = {"timeout": ("etcd", "static")}
_RDZV_COUNTS = ("keep_alive_max_attempt",)
_NPROC_NAMES = ("auto", "cpu", "gpu", "xpu")


class ArgError(ValueError):
    """A command-line argument cannot be used; ``str()`` is the one-line message."""


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, then :func:`check_args`; errors raise :class:`ArgError`.

    argparse's own errors (unknown flags, a missing script, ``--max-restarts x``) become an
    ``ArgError`` too, instead of argparse's usage block on stderr and ``SystemExit(2)``.
    ``--help`` still prints the help and exits 0.
    """
    def error(message: str) -> NoReturn:
        raise ArgError(message)

    parser.error = error  # type: ignore[method-assign]
    args = parser.parse_args(list(argv))
    check_args(args)
    return args


def _seconds(flag: str, value: object) -> None:
    from .._core._units import BadValue, check_seconds

    try:
        check_seconds(value)
    except BadValue as e:
        raise ArgError(f"{flag} {e}") from None


def _option_flags(args: argparse.Namespace) -> None:
    """The values of the flags ``AgentOptions`` declares, each by its field's ``check``."""
    from ..torch._options import AgentOptions

    for name, flag in AgentOptions.flags().items():
        if flag.check is not None and hasattr(args, name):
            try:
                flag.check(getattr(args, name))
            except ValueError as e:
                raise ArgError(f"{flag.names[0]} {e}") from None


def _nnodes(value: str) -> None:
    parts = value.split(":")
    try:
        bounds = [int(p) for p in parts]
    except ValueError:
        bounds = []
    ok = len(parts) in (1, 2) and len(bounds) == len(parts)
    if not ok or bounds[0] < 1 or bounds[-1] < bounds[0]:
        raise ArgError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got {value!r}")


def _rdzv_conf(value: str, backend: str) -> None:
    if not value.strip():
        return
    for item in value.split(","):
        key, sep, val = item.partition("=")
        key = key.strip()
        if not key or not sep:
            raise ArgError(f"--rdzv-conf must be KEY=VALUE[,KEY=VALUE...], got {item!r}")
        if backend not in _RDZV_BACKEND_ONLY.get(key, (backend,)):
            continue
        if key in _RDZV_DURATIONS:
            _seconds(f"--rdzv-conf {key}", val.strip())
        elif key in _RDZV_COUNTS and (not val.strip().isdigit() or int(val) < 1):
            raise ArgError(f"--rdzv-conf {key} must be an integer >= 1, got {val!r}")


def _script(args: argparse.Namespace) -> None:
    script = args.training_script
    if args.module and args.no_python:
        # torch refuses the pair too, later and as a traceback
        raise ArgError("--no-python and -m/--module cannot be used together")
    if args.module:
        top = script.split(".", 1)[0]
        path = [os.getcwd(), *sys.path]
        found = top.isidentifier() and (
            top in sys.builtin_module_names
            or importlib.machinery.PathFinder.find_spec(top, path) is not None
        )
        if not found:
            raise ArgError(f"-m {script}: no module named {top!r} on the import path")
        return
    if args.no_python:
        if os.sep in script or (os.altsep and os.altsep in script):
            if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                raise ArgError(f"--no-python {script}: no such executable file")
        elif shutil.which(script) is None:
            raise ArgError(f"--no-python {script}: not found on PATH")
        return
    if not os.path.exists(script):
        raise ArgError(f"training script {script!r}: no such file")
    if os.path.isdir(script):
        if not os.path.isfile(os.path.join(script, "__main__.py")):
            raise ArgError(f"training script {script!r}: a directory without __main__.py")
    elif not os.access(script, os.R_OK):
        raise ArgError(f"training script {script!r}: not readable")


def _log_dir(value: str | None) -> None:
    """torch makes ``--log-dir`` (if missing) and a directory per run inside it; a regular file
    there, or a directory that takes no new entries, fails late with a traceback (or, for
    ``--redirects``, once per worker). Tried here instead, leaving nothing behind."""
    if not value or value == os.devnull:
        return
    probe_in = value
    while not os.path.exists(probe_in):
        parent = os.path.dirname(os.path.abspath(probe_in))
        if parent == os.path.abspath(probe_in):
            break
        probe_in = parent
    if not os.path.isdir(probe_in):
        what = "a file" if probe_in == value else f"{probe_in} is not a directory"
        raise ArgError(f"--log-dir {value}: not a directory ({what})")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fsm-agent-probe-", dir=probe_in))
    except OSError as e:
        where = "in it" if probe_in == value else f"in {probe_in}"
        raise ArgError(f"--log-dir {value}: cannot create directories {where} "
                       f"({e.strerror or e})") from None


def _trace_file(value: str | None) -> None:
    """``--trace``: a regular file or a new one; a FIFO would block, a device never fills."""
    if not value:
        return
    from .._core._files import require_regular

    try:
        require_regular(value, missing_ok=True)
    except OSError as e:
        raise ArgError(f"--trace {value}: {e.strerror or e}") from None


def rdzv_backend_in_effect(args: argparse.Namespace) -> str:
    """The backend torchrun runs with: ``--standalone``, and the default ``static`` on one node
    without an endpoint or ``--master-port``, are c10d (``torch.distributed.run.run``)."""
    if args.standalone:
        return "c10d"
    if (args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None
            and int(args.nnodes.rpartition(":")[2]) == 1):
        return "c10d"
    return str(args.rdzv_backend)


def check_args(args: argparse.Namespace) -> None:
    """Check parsed ``fsm-agent run`` arguments; raise :class:`ArgError` on the first problem."""
    if args.max_restarts < 0:
        raise ArgError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    _seconds("--monitor-interval", args.monitor_interval)
    _option_flags(args)
    if args.shutdown_timeout is not None:
        _seconds("--shutdown-timeout", args.shutdown_timeout)
    else:
        # torch reads it with int(), and only when the agent is built.
        env = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        if env is not None and (not env.strip().isdigit() or int(env) < 1):
            raise ArgError(
                f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a whole number of seconds > 0, "
                f"got {env!r}"
            )
    _nnodes(args.nnodes)
    nproc = args.nproc_per_node
    if nproc not in _NPROC_NAMES and not (nproc.isdigit() and int(nproc) >= 1):
        raise ArgError(
            f"--nproc-per-node must be an integer >= 1 or one of {', '.join(_NPROC_NAMES)}, "
            f"got {nproc!r}"
        )
    if args.node_rank < 0:
        raise ArgError(f"--node-rank must be >= 0, got {args.node_rank}")
    if args.master_port is not None and not 0 <= args.master_port <= 65535:
        raise ArgError(f"--master-port must be a port number (0-65535), got {args.master_port}")
    _rdzv_conf(args.rdzv_conf, rdzv_backend_in_effect(args))
    _log_dir(args.log_dir)
    _trace_file(getattr(args, "trace", None))
    if getattr(args, "trace_backups", 1) < 0:
        raise ArgError(f"--trace-backups must be >= 0, got {args.trace_backups}")
    if getattr(args, "trace", None) is None and (
            getattr(args, "trace_max_size", None) is not None
            or getattr(args, "trace_backups", 1) != 1):
        raise ArgError("--trace-max-size and --trace-backups go with --trace FILE")
    _script(args)
