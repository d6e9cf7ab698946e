"""A worker's error file that cannot be read is a failure with a message, not the agent's end.

torch reads each failed worker's error file (``TORCHELASTIC_ERROR_FILE``, written by
``@record``) in ``ProcessFailure.__post_init__`` and re-raises whatever goes wrong: a file that is
not UTF-8, not JSON, or whose ``message`` is neither a string nor an object with
``extraInfo.timestamp``. The exception leaves ``_monitor_workers``, so the agent ends at the first
failure with its restarts unused and no rank named (torchrun does the same).

:func:`tolerant_error_files` swaps ``multiprocessing.api``'s ``ProcessFailure`` for a factory
during one look at the workers (its failures are still plain ``ProcessFailure``, so results
pickle as before): a file torch cannot read becomes the failure's message
(``unreadable error file PATH (UnicodeDecodeError: ...)``), its ``error_file`` ``<N/A>`` so that
nothing reads it again (torchrun's ``@record`` copies the root cause's file), and the failure goes
through the lifecycle like any other. torch touch points: feature ``error_files`` of
``fsm_agent/torch/_compat.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from fsm_agent.torch._compat import enabled

__all__ = ["tolerant_error_files"]

logger = logging.getLogger("fsm_agent.torch")


def _tolerant_failure(*, local_rank: int, pid: int, exitcode: int, error_file: str) -> Any:
    """torch's ``ProcessFailure(...)``, or, when torch cannot read ``error_file``, one built as
    if there were none, whose message says why. Always a plain ``ProcessFailure``: results are
    pickled (to other processes, to torch's tests) where this module may not exist."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    try:
        return ProcessFailure(local_rank=local_rank, pid=pid, exitcode=exitcode,
                              error_file=error_file)
    except Exception as e:  # whatever torch could not make of the file
        failure = ProcessFailure(local_rank=local_rank, pid=pid, exitcode=exitcode,
                                 error_file="<N/A>")  # torch's mark for "no error file"
        failure.message = (f"unreadable error file {error_file} ({type(e).__name__}: "
                           f"{str(e)[:200]})")
        logger.warning("local rank %s (pid %s, exit code %s): %s", local_rank, pid, exitcode,
                       failure.message)
        return failure


@contextlib.contextmanager
def tolerant_error_files() -> Iterator[None]:
    """Within this block, the failures torch builds tolerate an unreadable error file."""
    if not enabled("error_files"):
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    original = api.ProcessFailure
    api.ProcessFailure = _tolerant_failure
    try:
        yield
    finally:
        api.ProcessFailure = original
