"""``fsm-agent run`` whose trace writer is slow to record a step into BACKOFF (a loaded
machine's late write, made certain): the order of the "restarting in" log line and the
BACKOFF record is then the product's, not the scheduler's."""

import sys
import time

from fsm_agent.cli import main
from fsm_agent.trace._writer import TraceWriter

DELAY = 0.5
_record = TraceWriter.__call__


def _slow_record(self: TraceWriter, step: object) -> None:
    if getattr(step, "dest", None) == "BACKOFF":
        time.sleep(DELAY)
    _record(self, step)  # type: ignore[arg-type]


TraceWriter.__call__ = _slow_record  # type: ignore[method-assign]
sys.exit(main(["run", *sys.argv[1:]]))
