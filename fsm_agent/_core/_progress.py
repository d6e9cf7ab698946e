"""Progress across attempts: did the restart help?

A crash loop that restarts from the same checkpoint every time spends the whole restart budget
(and the cluster's time) without moving. NVIDIA's ft_launcher gives up when the checkpoint has
not advanced for a few cycles; here the same is a guard a spec names.

Two sources of progress, neither needing more than a line in the training script:

- the newest modification time of the files under ``checkpoint_path`` (a spec parameter, a
  glob: ``/ckpt/run42/step_*``; a directory counts every file below it);
- a step number each worker reports with :func:`progress` (``fsm_agent.progress(step)``),
  written to a file per local rank in the directory the agent names in the workers'
  environment (:data:`PROGRESS_DIR_ENV`); outside an agent it does nothing.

The agent takes a :class:`Mark` (the best step, the newest checkpoint) when the workers start and
again when they fail: an attempt made progress when its mark at the failure is beyond its mark at
the start. ``ctx.stalled_restarts`` counts the restarts in a row whose attempt failed (or hung)
without progress (the first attempt is not a restart; an attempt whose progress cannot be
known, no source being set, counts as progress), and the guard kind
``no_progress_restarts_at_least`` holds once it reaches its count. The driver provides the
marks (``progress_mark()``, optional: a driver without it never stalls).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._context import Kind
from ._context import KindExample as E
from ._driver import ProgressDriver, capability

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["GUARD_KINDS", "PROGRESS_DIR_ENV", "Mark", "newest_mtime", "note_attempt_end",
           "note_attempt_start", "progress", "read_steps"]

log = logging.getLogger("fsm_agent")

#: The environment variable naming the directory :func:`progress` writes to.
PROGRESS_DIR_ENV = "FSM_AGENT_PROGRESS_DIR"
#: The most files a checkpoint glob is searched through, and for how long (seconds): a glob
#: over a huge tree must not stall the agent's decision.
MAX_FILES = 10_000
MAX_SECONDS = 2.0


def progress(step: int) -> None:
    """Tell the agent this worker reached ``step`` (a number that grows as training advances).

    One small file write (atomic: the agent never reads half a number); does nothing when the
    process was not started by ``fsm-agent run`` (no :data:`PROGRESS_DIR_ENV`).
    """
    directory = os.environ.get(PROGRESS_DIR_ENV)
    if not directory:
        return
    rank = os.environ.get("LOCAL_RANK", "0")
    path = os.path.join(directory, f"rank{rank}")
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):  # a full disk must not crash the training step
        with open(tmp, "w") as f:
            f.write(str(int(step)))
        os.replace(tmp, path)


def read_steps(directory: str) -> dict[str, int]:
    """The step each local rank last reported (file name -> step); unreadable files skipped."""
    out: dict[str, int] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not name.startswith("rank") or name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                out[name] = int(f.read(64).strip())
        except (OSError, ValueError):
            continue
    return out


def newest_mtime(pattern: str, *, max_files: int = MAX_FILES,
                 max_seconds: float = MAX_SECONDS) -> float | None:
    """The newest modification time of the files matching ``pattern`` (a directory: every file
    below it); None when nothing matches. Bounded by ``max_files`` and ``max_seconds``."""
    if not pattern:
        return None
    deadline = time.monotonic() + max_seconds
    newest: float | None = None
    seen = 0

    def consider(path: str) -> None:
        nonlocal newest
        with contextlib.suppress(OSError):
            mtime = os.stat(path).st_mtime
            newest = mtime if newest is None else max(newest, mtime)

    for match in glob.iglob(os.path.expanduser(pattern), recursive=True):
        paths = [match]
        if os.path.isdir(match):
            paths = (os.path.join(root, f) for root, _, files in os.walk(match) for f in files)  # type: ignore[assignment]
        for path in paths:
            consider(path)
            seen += 1
            if seen >= max_files or time.monotonic() > deadline:
                log.warning("checkpoint_path %r: stopped looking after %d files", pattern, seen)
                return newest
    return newest


@attrs.frozen
class Mark:
    """Where training stood: the best step reported (None: none) and the newest checkpoint's
    modification time (None: none, or no ``checkpoint_path``)."""

    step: int | None = None
    checkpoint: float | None = None

    @property
    def known(self) -> bool:
        """Whether any source of progress has said anything."""
        return self.step is not None or self.checkpoint is not None

    def beyond(self, before: Mark) -> bool | None:
        """Whether this mark is past ``before``; None when neither says anything."""
        if not self.known and not before.known:
            return None
        moved = False
        if self.step is not None and (before.step is None or self.step > before.step):
            moved = True
        if self.checkpoint is not None and (before.checkpoint is None
                                            or self.checkpoint > before.checkpoint):
            moved = True
        return moved

    def as_dict(self) -> dict[str, object]:
        """For the trace."""
        return {"step": self.step, "checkpoint_mtime": self.checkpoint}


def _mark(ctx: Context) -> Mark | None:
    take = capability(ctx.driver, ProgressDriver.progress_mark)
    if take is None:
        return None
    try:
        found = take()
    except ctx.fatal_exceptions:
        raise
    except Exception:  # a progress source that fails says nothing; it never ends the job
        log.exception("[%s] progress_mark failed", ctx.role)
        return None
    return found if isinstance(found, Mark) else None


def note_attempt_start(ctx: Context) -> None:
    """The workers just started: remember where training stands."""
    ctx.attempts += 1
    ctx.progress_start = _mark(ctx)
    ctx.progressed = None


def note_attempt_end(ctx: Context) -> None:
    """The attempt failed: did it move past its start? Counts the stalled restarts in a row."""
    start, now = ctx.progress_start, _mark(ctx)
    if now is None or start is None:
        return
    moved = now.beyond(start)
    ctx.progressed = moved
    restart = ctx.attempts >= 2
    if moved is False and restart:
        ctx.stalled_restarts += 1
    elif moved is not False:
        ctx.stalled_restarts = 0
    report = capability(ctx.driver, ProgressDriver.note_progress)
    if report is not None:
        report({"start": start.as_dict(), "end": now.as_dict(), "progressed": moved,
                "attempt": ctx.attempts - 1, "stalled_restarts": ctx.stalled_restarts})


def _no_progress_restarts_at_least(count: int) -> Callable[[Context], bool]:
    if count < 0:
        raise ValueError(f"count must be >= 0 (0 turns the check off), got {count}")
    return lambda ctx: count > 0 and ctx.stalled_restarts >= count


#: ``no_progress_restarts_at_least``: the last `count` restarts in a row made no progress.
GUARD_KINDS: dict[str, Kind] = {
    "no_progress_restarts_at_least": Kind(
        _no_progress_restarts_at_least, {"count": "int"}, "count",
        description="the last `count` restarts in a row each failed without progress (0: "
        "never)",
        examples=(E(2, True, context={"stalled_restarts": 2}),
                  E(2, False, context={"stalled_restarts": 1}),
                  E(0, False, context={"stalled_restarts": 5}))),
}
