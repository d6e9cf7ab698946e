"""The agent's side of hang handling: the spec's ``hung`` trigger, its failures, its stacks.

A spec opts in with two well-known names (``docs/diagnosis.md``):

- the trigger ``hung`` (declared under ``triggers:``), with a transition from the state that
  watches the workers, typically ``HEALTHY --hung--> UNHEALTHY / capture_stacks``, after which
  the spec's failure policy decides as for any unhealthy group;
- the parameter ``hang_timeout`` (a duration; ``inf`` turns detection off): a group whose
  workers all made no progress for that long is hung (``fsm_agent.torch._progress``).

torch's own timer API (``TORCHELASTIC_ENABLE_FILE_TIMER=1``, ``fsm_agent.torch._file_timer``)
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
import json
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fsm_agent._core._files import printable
from fsm_agent.torch._stacks import StackDump, capture_stacks, parse_main_thread

__all__ = ["HungRank", "Suspects", "encode_suspects", "find_suspects", "hang_failures",
           "merge_suspects", "stacks_dir", "take_stacks"]

logger = logging.getLogger("fsm_agent.torch")


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


# the module that defines torch's collectives and point-to-point calls (the frame naming the
# call the user made: its callers are the script, its callees torch's internals)
_C10D_FILE = "torch/distributed/distributed_c10d.py"


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _collective(frames: tuple[str, ...]) -> str | None:
    """The torch.distributed call a main thread is in (``all_reduce``), if any: the outermost
    frame of distributed_c10d.py."""
    inside = [f for f in frames if _C10D_FILE in f]
    return _function(inside[-1]) if inside else None


@attrs.frozen
class Suspects:
    """Who a hung group waits for, from every rank's main-thread stack: ``waiting`` (global rank
    -> the collective it is in, a victim) and ``suspects`` (global rank -> its innermost frame,
    a rank elsewhere); ranks without Python frames are in neither."""

    waiting: Mapping[int, str]
    suspects: Mapping[int, str]

    @property
    def summary(self) -> str:
        """One line: ``rank 1 is not in the all_reduce that rank 0 waits in: spin_forever
        (busy.py:8)``; empty when the stacks say nothing."""
        calls = sorted(set(self.waiting.values()))
        waiting = ", ".join(str(r) for r in sorted(self.waiting))
        if self.suspects and self.waiting:
            where = ("; ".join(f"rank {r}: {f}" for r, f in sorted(self.suspects.items()))
                     if len(self.suspects) > 1 else next(iter(self.suspects.values())))
            ranks = ", ".join(str(r) for r in sorted(self.suspects))
            return (f"suspect: rank{'s' if len(self.suspects) > 1 else ''} {ranks} "
                    f"{'is' if len(self.suspects) == 1 else 'are'} not in the "
                    f"{'/'.join(calls)} that rank{'s' if len(self.waiting) > 1 else ''} "
                    f"{waiting} wait{'' if len(self.waiting) > 1 else 's'} in: {where}")
        if self.waiting:
            inside = "; ".join(f"rank {r}: {c}" for r, c in sorted(self.waiting.items()))
            return (f"every rank with a Python stack waits in a collective ({inside})"
                    + (": they do not match" if len(calls) > 1 else ""))
        return ""

    def about(self, rank: int) -> str:
        """What the stacks say of ``rank``, for its failure's message (empty if nothing)."""
        if rank in self.suspects and self.waiting:
            return f"; suspect: not in the collective the others wait in, in {self.suspects[rank]}"
        if rank in self.waiting:
            return f"; waiting in {self.waiting[rank]}"
        return ""

    def as_dict(self) -> dict[str, Any]:
        """For the trace's ``diagnostics``."""
        return {"waiting": {str(r): c for r, c in sorted(self.waiting.items())},
                "suspects": {str(r): f for r, f in sorted(self.suspects.items())},
                "summary": self.summary}


#: How much of a frame a node shares with the others (the note stays small on the store).
_FRAME_CHARS = 300


def encode_suspects(found: Suspects) -> bytes:
    """This node's part, for the other nodes (bounded: a frame is cut to 300 characters)."""
    return json.dumps({"waiting": {str(r): c[:_FRAME_CHARS] for r, c in found.waiting.items()},
                       "suspects": {str(r): f[:_FRAME_CHARS]
                                    for r, f in found.suspects.items()}}).encode()


def merge_suspects(notes: Sequence[bytes]) -> Suspects:
    """Every node's part merged: the job's suspects (a note that does not parse is skipped)."""
    waiting: dict[int, str] = {}
    suspects: dict[int, str] = {}
    for raw in notes:
        try:
            note = json.loads(raw)
            # another node's words, from the store: escaped for the terminal
            waiting.update({int(r): printable(c, _FRAME_CHARS)
                            for r, c in note["waiting"].items()})
            suspects.update({int(r): printable(f, _FRAME_CHARS)
                             for r, f in note["suspects"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return Suspects(waiting, suspects)


def find_suspects(dumps: Sequence[tuple[int, StackDump]]) -> Suspects:
    """Read the py-spy dumps (global rank, dump) and sort the ranks (:class:`Suspects`)."""
    waiting: dict[int, str] = {}
    suspects: dict[int, str] = {}
    for rank, dump in dumps:
        if dump.method != "py-spy":
            continue
        try:
            with open(dump.path, encoding="utf-8", errors="replace") as f:
                frames = parse_main_thread(f.read(1 << 20))
        except OSError:
            continue
        if not frames:
            continue
        call = _collective(frames)
        if call is not None:
            waiting[rank] = call
        else:
            suspects[rank] = frames[0]
    return Suspects(waiting, suspects)
