"""The agent's side of hang handling: the spec's ``hung`` trigger, its failures, its stacks.

A spec opts in with two well-known names (``docs/diagnosis.md``):

- the trigger ``hung`` (declared under ``triggers:``), with a transition from the state that
  watches the workers, typically ``HEALTHY --hung--> UNHEALTHY / capture_stacks``, after which
  the spec's failure policy decides as for any unhealthy group;
- the parameter ``hang_timeout`` (a duration; ``inf`` turns detection off): a group whose
  workers all made no progress for that long is hung (``fsm_agent.torch._progress``).

torch's own timer API (``TORCHELASTIC_ENABLE_FILE_TIMER=1``, ``fsm_agent.torch._heartbeat``)
delivers an expired deadline as ``hung`` too when the spec handles it, so the stacks are taken
before anything is killed; otherwise it keeps its behaviour (kill the hung worker, report the
group unhealthy).

What the agent does when a hang is found: it makes the group's observation UNHEALTHY with a
failure per hung rank (``exitcode`` the SIGTERM the stop will send, ``message`` saying for how
long it made no progress), so that guards, the failure policy and the final failure summary see
the hung ranks; then it returns ``hung`` from its wait, and the engine fires it. The
``capture_stacks`` action then writes every worker's stacks under the run's log directory
(``<log dir>/<run>/stacks/attempt_<n>/rank_<r>.txt``) and names the files in the failures and
the trace (``diagnostics``).
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fsm_agent.torch._stacks import StackDump, capture_stacks

__all__ = ["HANG_TIMEOUT_PARAM", "HUNG_TRIGGER", "HungRank", "hang_failures", "stacks_dir",
           "take_stacks"]

logger = logging.getLogger("fsm_agent.torch")

HUNG_TRIGGER = "hung"
HANG_TIMEOUT_PARAM = "hang_timeout"


@attrs.frozen
class HungRank:
    """One hung worker, as the agent reports it."""

    local_rank: int
    global_rank: int
    pid: int
    idle_for: float | None  # seconds without progress (None: a torch timer expired)
    description: str
    exited: bool = False

    def as_dict(self) -> dict[str, Any]:
        """For the trace's ``diagnostics``."""
        return {"rank": self.global_rank, "local_rank": self.local_rank, "pid": self.pid,
                "idle_s": None if self.idle_for is None else round(self.idle_for, 3),
                "exited": self.exited, "why": self.description}


def hang_failures(hung: Sequence[HungRank], error_files: Mapping[int, str]) -> dict[int, Any]:
    """torch ``ProcessFailure``s for the hung ranks (global rank -> failure)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    out = {}
    for h in hung:
        # The worker is alive: no error file, and the exit code is the signal the stop sends.
        failure = ProcessFailure(local_rank=h.local_rank, pid=h.pid,
                                 exitcode=-int(signal.SIGTERM),
                                 error_file=error_files.get(h.local_rank, ""))
        failure.message = h.description
        out[h.global_rank] = failure
    return out


def stacks_dir(error_files: Mapping[int, str]) -> str:
    """``<log dir>/<run>/stacks/attempt_<n>`` from torch's error-file paths
    (``<log dir>/<run>/attempt_<n>/<local rank>/error.json``, relative to the agent's working
    directory for a relative ``--log-dir``); a fresh temporary directory when the logs go
    nowhere (``--log-dir /dev/null``)."""
    for path in error_files.values():
        if path and path != os.devnull:
            attempt = os.path.dirname(os.path.dirname(os.path.abspath(path)))
            run = os.path.dirname(attempt)
            return os.path.join(run, "stacks", os.path.basename(attempt))
    return tempfile.mkdtemp(prefix="fsm_agent_stacks_")


def take_stacks(
    workers: Mapping[int, tuple[int, int]],
    error_files: Mapping[int, str],
    *,
    role: str,
    reason: str,
) -> list[tuple[int, StackDump]]:
    """Dump every worker's stacks; ``workers``: local rank -> (global rank, pid). Returns
    (global rank, dump) pairs."""
    out_dir = stacks_dir(error_files)
    when = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
    host = socket.gethostname()
    labels = {f"rank_{g}": pid for g, pid in workers.values()}
    header = (f"# fsm-agent: stacks taken {when} on {host} before stopping the workers of "
              f"role {role!r} ({reason})")
    ranks = {f"rank_{g}": g for g, _ in workers.values()}
    dumps = capture_stacks(labels, out_dir, header=header)
    logger.warning("[%s] stacks of %d worker(s) saved in %s%s", role, len(dumps), out_dir,
                   "" if all(d.method == "py-spy" for d in dumps) else
                   f" (without Python frames: {next(d.error for d in dumps if d.error)})")
    return [(ranks[d.label], d) for d in dumps]
