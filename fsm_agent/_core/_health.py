"""Node health checks, run before every (re)join of the rendezvous.

A node with a full disk, a rendezvous store it cannot reach or a broken device should not join a
job: it would fail (or hang) its peers after they waited for it. Each check returns a
:class:`CheckResult` with a one-line reason; a check never raises and never takes longer than
its time budget (the command check kills its process group when the budget is spent).

In a spec, checks are guards (parameterised kinds, ``GUARD_KINDS``) that gate the transitions
which rendezvous, and ``leave_job`` (``ACTION_KINDS``) is the terminal action of the state a
node goes to when one fails: the agent stops, does not touch the rendezvous (the others go on
without it), and ``fsm-agent run`` exits with the action's exit code and the failed check's
reason on one line (``docs/diagnosis.md``). A guard asks the driver to run the check
(``driver.check_health(check)``, so the torch driver can fill in the rendezvous store's address
and record the result for the trace); a driver without that method gets the check run directly.

Built-ins:

- :func:`disk_free`: at least ``min_free_bytes`` free on each of ``paths`` (for the user, not
  root's reserved blocks).
- :func:`store_reachable`: a TCP store at ``host:port`` answers a request within the budget (a
  real ``TCPStore`` client, not just a connect: a listening socket whose server is wedged fails).
- :func:`command_succeeds`: a user command exits 0 within the budget (``nvidia-smi``, a NIC
  test, a mount check); its last output line is the reason when it fails.
- ``clean_slate``: no process of the node's earlier attempts is left running; the driver ends
  those it finds and waits up to the budget (the torch driver: ``fsm_agent.torch._slate``). One
  still there is in uninterruptible sleep, and the node should not start beside it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._context import Kind
from ._context import KindExample as E
from ._driver import HealthDriver, capability
from ._units import format_bytes, parse_size

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["ACTION_KINDS", "GUARD_KINDS", "CheckResult", "HealthCheck", "LeftJob",
           "command_succeeds", "disk_free", "format_bytes", "health_budget",
           "store_reachable"]

log = logging.getLogger("fsm_agent")

#: The exit code of ``leave_job`` when a spec gives none: sysexits' EX_TEMPFAIL ("try again
#: later"), for a scheduler to replace the node and requeue.
UNHEALTHY_EXIT_CODE = 75


@attrs.frozen
class CheckResult:
    """One check's verdict: ``ok``, a one-line ``reason`` and how long it took (seconds)."""

    name: str
    ok: bool
    reason: str
    duration: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """For the trace."""
        return {"name": self.name, "ok": self.ok, "reason": self.reason,
                "duration_s": round(self.duration, 6)}


def _statvfs(path: str, timeout: float) -> os.statvfs_result:
    """``os.statvfs`` that gives up after ``timeout`` (a dead network mount blocks for ever; the
    thread is left behind, as a thread in the kernel cannot be stopped)."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(_try(os.statvfs, path)), daemon=True,
                         name="fsm-agent-statvfs")
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"no answer within {timeout:g} s (a hung mount?)")
    if isinstance(box[0], OSError):
        raise box[0]
    return box[0]  # type: ignore[no-any-return]


def _try(fn: Callable[[str], Any], arg: str) -> Any:
    try:
        return fn(arg)
    except OSError as e:
        return e


def disk_free(paths: Sequence[str], min_free_bytes: int, *, timeout: float = 10.0,
              name: str = "disk_free") -> CheckResult:
    """At least ``min_free_bytes`` available to unprivileged users on every path."""
    t0 = time.monotonic()
    if not paths:
        return CheckResult(name, True, "no paths configured")
    short = []
    for path in paths:
        try:
            st = _statvfs(path, max(0.001, timeout - (time.monotonic() - t0)))
        except (OSError, TimeoutError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            return CheckResult(name, False, f"{path}: {why}", time.monotonic() - t0)
        free = st.f_bavail * st.f_frsize
        if free < min_free_bytes:
            short.append(f"{path} has {format_bytes(free)} free, needs "
                         f"{format_bytes(min_free_bytes)}")
    took = time.monotonic() - t0
    if short:
        return CheckResult(name, False, "; ".join(short), took)
    return CheckResult(name, True, f"{len(paths)} path(s) with >= {format_bytes(min_free_bytes)} "
                       "free", took)


def store_reachable(host: str, port: int, timeout: float, *,
                    name: str = "store_reachable") -> CheckResult:
    """A TCP store at ``host:port`` answers within ``timeout`` seconds."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    t0 = time.monotonic()
    try:
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)
        store.check(["fsm_agent/health"])  # a round trip: the server answers, not just listens
    except (RuntimeError, OSError, ValueError) as e:
        # torch's store errors (DistStoreError, DistNetworkError) are RuntimeErrors, a socket's
        # OSErrors (TimeoutError): not Exception, or a termination signal that torch's handler
        # raised here (its SignalException) became "not reachable" and the node left the job
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return CheckResult(name, False, f"store {host}:{port} not reachable within "
                           f"{timeout:g} s: {msg}", time.monotonic() - t0)
    took = time.monotonic() - t0
    return CheckResult(name, True, f"store {host}:{port} answered in {took * 1000:.0f} ms", took)


def command_succeeds(command: str | Sequence[str], timeout: float, *,
                     name: str = "command") -> CheckResult:
    """``command`` (a shell-style string or an argv list, run without a shell) exits 0 within
    ``timeout`` seconds. It runs in a process group of its own, which is killed once the command
    has ended or timed out: nothing it started outlives the check, and a background child that
    keeps its output open does not hold the check up."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    shown = command if isinstance(command, str) else shlex.join(argv)
    t0 = time.monotonic()
    # A file, not a pipe: a pipe is read until every holder closes it, a child included.
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            return CheckResult(name, False, f"command {shown}: cannot run: {e.strerror or e}",
                               time.monotonic() - t0)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also when a termination signal ends the wait
            took = time.monotonic() - t0
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # the command if it timed out, its children
        proc.wait()
        if timed_out:
            return CheckResult(name, False, f"command {shown} did not finish within "
                               f"{timeout:g} s (killed)", took)
        if proc.returncode == 0:
            return CheckResult(name, True, f"command {shown} exited 0", took)
        out.seek(max(0, out.seek(0, os.SEEK_END) - 4096))
        tail = out.read()
    last = next((ln.strip() for ln in reversed(tail.decode(errors="replace").splitlines())
                 if ln.strip()), "")
    code = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
            else f"exited {proc.returncode}")
    return CheckResult(name, False, f"command {shown} {code}" + (f": {last[:200]}" if last else ""),
                       took)


# ---------------------------------------------------------------------------------------------
# Checks as spec guards


@attrs.frozen
class HealthCheck:
    """One configured check: the guard's ``name`` in the spec, its ``kind`` and arguments."""

    name: str
    kind: str
    args: Mapping[str, Any]

    @property
    def budget(self) -> float:
        """The longest it may take (seconds)."""
        return float(self.args.get("timeout", 0.0))

    def run(self, store: tuple[str, int] | None = None,
            slate: Callable[[float], str | None] | None = None,
            quarantined: Callable[[], str | None] | None = None) -> CheckResult:
        """Run it; ``store``: the rendezvous store's (host, port), for ``store_reachable``
        without an ``endpoint`` of its own; ``slate``: the driver's ``clean_slate`` (ends what
        earlier attempts left, waits up to the timeout given, returns what survived as one line,
        None for none); ``quarantined``: the driver's look at this node's quarantine mark (its
        one line, None for none; ``fsm_agent._core._quarantine``)."""
        a = self.args
        if self.kind == "not_quarantined":
            if quarantined is None:
                return CheckResult(self.name, True, "skipped: this driver keeps no quarantine "
                                   "marks")
            t0 = time.monotonic()
            mark = quarantined()
            return CheckResult(self.name, mark is None, mark or "this node is not quarantined",
                               time.monotonic() - t0)
        if self.kind == "clean_slate":
            if slate is None:
                return CheckResult(self.name, True, "skipped: this driver does not track its "
                                   "workers' processes")
            t0 = time.monotonic()
            left = slate(a["timeout"])
            return CheckResult(self.name, left is None,
                               left or "no process of an earlier attempt is running",
                               time.monotonic() - t0)
        if self.kind == "disk_free":
            return disk_free(a["paths"], a["min_free"], timeout=a["timeout"], name=self.name)
        if self.kind == "command_succeeds":
            if not a["command"].strip():
                return CheckResult(self.name, True, "no command configured")
            return command_succeeds(a["command"], a["timeout"], name=self.name)
        if self.kind == "store_reachable":
            endpoint = a.get("endpoint") or ""
            if endpoint:
                host, _, port = endpoint.rpartition(":")
                return store_reachable(host, int(port), a["timeout"], name=self.name)
            if store is None:
                return CheckResult(self.name, True, "skipped: the rendezvous store's address "
                                   "is not known here (give the check an endpoint)")
            return store_reachable(store[0], store[1], a["timeout"], name=self.name)
        raise ValueError(f"unknown health check kind {self.kind!r}")


def _check_guard(check: HealthCheck) -> Callable[[Context], bool]:
    def guard(ctx: Context) -> bool:
        runner = capability(ctx.driver, HealthDriver.check_health)
        result = runner(check) if runner is not None else check.run()
        if not result.ok:
            log.warning("[%s] health check %s failed: %s", ctx.role, check.name, result.reason)
        return bool(result.ok)

    guard.health_check = check  # type: ignore[attr-defined]
    return guard


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive, finite duration, got {value!r}")
    return float(value)


def _disk_free_kind(paths: Sequence[str], min_free: str, timeout: float) -> Callable[..., bool]:
    return _check_guard(HealthCheck("disk_free", "disk_free", {
        "paths": tuple(paths), "min_free": parse_size(str(min_free)),
        "timeout": _positive("timeout", timeout)}))


def _store_kind(timeout: float, endpoint: str) -> Callable[..., bool]:
    if endpoint:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint must be HOST:PORT, got {endpoint!r}")
    return _check_guard(HealthCheck("store_reachable", "store_reachable", {
        "timeout": _positive("timeout", timeout), "endpoint": endpoint}))


def _command_kind(command: str, timeout: float) -> Callable[..., bool]:
    if command.strip():
        try:
            shlex.split(command)
        except ValueError as e:
            raise ValueError(f"command {command!r}: {e}") from None
    return _check_guard(HealthCheck("command_succeeds", "command_succeeds", {
        "command": command, "timeout": _positive("timeout", timeout)}))


def _slate_kind(timeout: float) -> Callable[..., bool]:
    return _check_guard(HealthCheck("clean_slate", "clean_slate",
                                    {"timeout": _positive("timeout", timeout)}))


def _not_quarantined_kind() -> Callable[..., bool]:
    return _check_guard(HealthCheck("not_quarantined", "not_quarantined", {}))


class LeftJob(Exception):
    """The agent left the job on purpose (a node health check failed): ``exit_code`` and a
    one-line ``reason``. Not a failure of the job: the other agents go on without this one."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


def _leave_job(exit_code: int) -> Callable[[Context], None]:
    if not 0 < exit_code < 256:
        raise ValueError(f"an exit code is between 1 and 255, got {exit_code}")

    def action(ctx: Context) -> None:
        ctx.exit_code = exit_code
        reason_of = capability(ctx.driver, HealthDriver.health_reason)
        reason = reason_of() if reason_of is not None else None
        raise LeftJob(reason or "a node health check failed", exit_code)

    return action


#: Health checks, as parameterised guard kinds (``guards: {disk_ok: {disk_free: ...}}``).
GUARD_KINDS: dict[str, Kind] = {
    "disk_free": Kind(
        _disk_free_kind, {"paths": "str_list", "min_free": "str", "timeout": "duration"}, None,
        {"timeout": 10.0},
        description="every path has `min_free` (a size: `10GB`) free (no paths: true)",
        examples=(E({"paths": ["/"], "min_free": "0B"}, True),
                  E({"paths": ["/"], "min_free": "1000000GB"}, False),
                  E({"paths": [], "min_free": "1000000GB"}, True))),
    "store_reachable": Kind(
        _store_kind, {"timeout": "duration", "endpoint": "str"}, "timeout", {"endpoint": ""},
        user_only={"endpoint"},
        description="the rendezvous store (or `HOST:PORT`) answers a request in time (a driver "
        "that does not know its store's address: true)",
        # port 1: nothing listens there, so the connection is refused
        examples=(E("1s", True), E({"timeout": "200ms", "endpoint": "127.0.0.1:1"}, False))),
    "command_succeeds": Kind(
        _command_kind, {"command": "str", "timeout": "duration"}, "command", {"timeout": 60.0},
        user_only={"command"},
        description="the command (run without a shell) exits 0 in time (an empty command: "
        "true)",
        examples=(E("true", True), E("false", False), E("", True),
                  E({"command": "sleep 5", "timeout": "100ms"}, False))),
    "clean_slate": Kind(
        _slate_kind, {"timeout": "duration"}, "timeout", {},
        description="no process of the node's earlier attempts is left: those the driver finds "
        "are SIGKILLed and gone within `timeout` (a driver that does not track its workers' "
        "processes: true)",
        untested="what it finds is the torch driver's table of worker processes "
        "(tests/reliability/test_clean_slate.py)"),
    "not_quarantined": Kind(
        _not_quarantined_kind, {}, None, {},
        description="this node carries no quarantine mark of the job (the driver's look at the "
        "mark; a driver that keeps none: true)",
        untested="the mark is on the job's rendezvous store (tests/agent/test_quarantine.py)"),
}

#: ``leave_job``: the terminal action of a node that failed its health checks.
ACTION_KINDS: dict[str, Kind] = {
    "leave_job": Kind(_leave_job, {"exit_code": "int"}, "exit_code",
                      {"exit_code": UNHEALTHY_EXIT_CODE}, terminal=True,
                      description="stop and leave the job (the others go on) with this exit "
                      "code and the failed health check's reason, without closing the "
                      "rendezvous: put it on the entry of the final state a failed check leads "
                      "to"),
}


def health_budget(spec: Any, values: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The time budget (seconds) of each health check a spec declares (guard name -> timeout),
    with its parameters bound to ``values`` (default: the spec's defaults)."""
    bound = dict(spec.defaults, **(values or {}))
    out: dict[str, float] = {}
    for inst in spec.guard_defs:
        kind = GUARD_KINDS.get(inst.kind)
        if kind is None:
            continue
        arg = inst.args.get("timeout", kind.defaults.get("timeout"))
        resolve = getattr(arg, "resolve", None)
        value = resolve(bound) if resolve is not None else arg
        if isinstance(value, (int, float)):
            out[inst.name] = float(value)
    return out


def health_checks(guards: Mapping[str, Callable[..., Any]]) -> dict[str, HealthCheck]:
    """The health checks among a lifecycle's guards (name -> check)."""
    out = {}
    for name, fn in guards.items():
        check = getattr(fn, "health_check", None)
        if isinstance(check, HealthCheck):
            out[name] = check
    return out
