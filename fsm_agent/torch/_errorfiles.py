"""A worker's error file that cannot be read is a failure with a message, not the agent's end.

torch reads each failed worker's error file (``TORCHELASTIC_ERROR_FILE``, written by
``@record``) in ``ProcessFailure.__post_init__`` and re-raises whatever goes wrong: a file that is
not UTF-8, not JSON, or whose ``message`` is neither a string nor an object with
``extraInfo.timestamp``. The exception leaves ``_monitor_workers``, so the agent ends at the first
failure with its restarts unused and no rank named (torchrun does the same).

:func:`tolerant_error_files` swaps ``multiprocessing.api``'s ``ProcessFailure`` for a subclass
during one look at the workers: a file torch cannot read becomes the failure's message
(``unreadable error file PATH (UnicodeDecodeError: ...)``), its ``error_file`` ``<N/A>`` so that
nothing reads it again (torchrun's ``@record`` copies the root cause's file), and the failure goes
through the lifecycle like any other. torch touch points: feature ``error_files`` of
``fsm_agent/torch/_compat.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from fsm_agent.torch._compat import enabled

__all__ = ["tolerant_error_files"]

logger = logging.getLogger("fsm_agent.torch")

_TOLERANT: Any = None


def _tolerant_class() -> Any:
    global _TOLERANT  # noqa: PLW0603 - built once, on first use (torch is imported by then)
    if _TOLERANT is None:
        from torch.distributed.elastic.multiprocessing import errors

        class TolerantProcessFailure(errors.ProcessFailure):  # type: ignore[misc, name-defined]
            def __post_init__(self) -> None:
                try:
                    super().__post_init__()
                except Exception as e:  # whatever torch could not make of the file
                    path: str = getattr(self, "error_file", "?")
                    self.error_file_data = {"message": ""}
                    self.message = (f"unreadable error file {path} ({type(e).__name__}: "
                                    f"{str(e)[:200]})")
                    self.timestamp = int(time.time())
                    self.error_file = "<N/A>"  # torch's mark for "no error file"
                    logger.warning("local rank %s (pid %s, exit code %s): %s", self.local_rank,
                                   self.pid, self.exitcode, self.message)

        _TOLERANT = TolerantProcessFailure
    return _TOLERANT


@contextlib.contextmanager
def tolerant_error_files() -> Iterator[None]:
    """Within this block, the failures torch builds tolerate an unreadable error file."""
    if not enabled("error_files"):
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    original = api.ProcessFailure
    api.ProcessFailure = _tolerant_class()
    try:
        yield
    finally:
        api.ProcessFailure = original
