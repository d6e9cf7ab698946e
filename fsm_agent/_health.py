"""Node health checks, run before every (re)join of the rendezvous.

A node with a full disk, a rendezvous store it cannot reach or a broken device should not join a
job: it would fail (or hang) its peers after they waited for it. Each check returns a
:class:`CheckResult` with a one-line reason; a check never raises and never takes longer than
its time budget (the command check kills its process group when the budget is spent).

Built-ins:

- :func:`disk_free`: at least ``min_free_bytes`` free on each of ``paths`` (for the user, not
  root's reserved blocks).
- :func:`store_reachable`: a TCP store at ``host:port`` answers a request within the budget (a
  real ``TCPStore`` client, not just a connect: a listening socket whose server is wedged fails).
- :func:`command_succeeds`: a user command exits 0 within the budget (``nvidia-smi``, a NIC
  test, a mount check); its last output line is the reason when it fails.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

import attrs

__all__ = ["CheckResult", "command_succeeds", "disk_free", "format_bytes", "run_checks",
           "store_reachable"]


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


def format_bytes(n: float) -> str:
    """``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def disk_free(paths: Sequence[str], min_free_bytes: int, *, name: str = "disk_free") -> CheckResult:
    """At least ``min_free_bytes`` available to unprivileged users on every path."""
    t0 = time.monotonic()
    short = []
    for path in paths:
        try:
            st = os.statvfs(path)
        except OSError as e:
            return CheckResult(name, False, f"{path}: {e.strerror or e}", time.monotonic() - t0)
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
    except Exception as e:  # torch raises RuntimeError/DistStoreError/TimeoutError variants
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return CheckResult(name, False, f"store {host}:{port} not reachable within "
                           f"{timeout:g} s: {msg}", time.monotonic() - t0)
    took = time.monotonic() - t0
    return CheckResult(name, True, f"store {host}:{port} answered in {took * 1000:.0f} ms", took)


def command_succeeds(command: str | Sequence[str], timeout: float, *,
                     name: str = "command") -> CheckResult:
    """``command`` (a shell-style string or an argv list, run without a shell) exits 0 within
    ``timeout`` seconds; on a timeout its whole process group is killed."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    shown = command if isinstance(command, str) else shlex.join(argv)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        return CheckResult(name, False, f"{shown!r}: cannot run: {e.strerror or e}",
                           time.monotonic() - t0)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        return CheckResult(name, False, f"{shown!r} did not finish within {timeout:g} s (killed)",
                           time.monotonic() - t0)
    took = time.monotonic() - t0
    if proc.returncode == 0:
        return CheckResult(name, True, f"{shown!r} exited 0", took)
    last = next((ln.strip() for ln in reversed(out.decode(errors="replace").splitlines())
                 if ln.strip()), "")
    code = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
            else f"exited {proc.returncode}")
    return CheckResult(name, False, f"{shown!r} {code}" + (f": {last[:200]}" if last else ""),
                       took)


def run_checks(checks: Sequence[tuple[str, Callable[[], CheckResult]]]) -> list[CheckResult]:
    """Run ``checks`` (name, check) in order and stop at the first that fails; a check that
    raises fails with the exception as its reason."""
    results = []
    for name, check in checks:
        t0 = time.monotonic()
        try:
            result = check()
        except Exception as e:
            result = CheckResult(name, False, f"{type(e).__name__}: {e}", time.monotonic() - t0)
        results.append(result)
        if not result.ok:
            break
    return results
