"""A worker that checkpoints when the drain signal comes (the preemption tests).

Writes ``start_r{rank}.json`` into OUT_DIR when it starts (pid, the attempt) and, on the drain
signal, ``drained_r{rank}.json`` (the signal number, when it came), then sleeps DRAIN_TAKES
seconds (a checkpoint), writes ``checkpointed_r{rank}.json`` and exits with DRAIN_EXIT.

Environment:
  DRAIN_SIGNAL  the signal it handles (default SIGUSR1)
  DRAIN_TAKES   seconds its handler takes before it exits (default 0.3)
  DRAIN_EXIT    the exit code after the drain (default 0: a checkpoint, not the end of the job)
  IGNORE_DRAIN  "1": ignore the drain signal (the agent must kill it at drain_timeout)
  HOLD_TERM     "1": ignore SIGTERM once the checkpoint has begun (only SIGKILL ends it then)
  FAIL_ATTEMPT  the restart count on which the worker exits 1 at once (default: none)
"""

import json
import os
import signal
import sys
import time

OUT = os.environ["OUT_DIR"]
RANK = os.environ["RANK"]
ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def write(name: str, data: dict) -> None:
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def on_drain(signum: int, frame: object) -> None:
    if os.environ.get("HOLD_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write(f"drained_r{RANK}.json", {"pid": os.getpid(), "signal": signum, "time": time.time()})
    time.sleep(float(os.environ.get("DRAIN_TAKES", "0.3")))
    write(f"checkpointed_r{RANK}.json", {"pid": os.getpid(), "time": time.time()})
    sys.exit(int(os.environ.get("DRAIN_EXIT", "0")))


sig = getattr(signal, os.environ.get("DRAIN_SIGNAL", "SIGUSR1"))
signal.signal(sig, signal.SIG_IGN if os.environ.get("IGNORE_DRAIN") == "1" else on_drain)
write(f"start_r{RANK}.json", {"pid": os.getpid(), "attempt": ATTEMPT, "time": time.time()})
if os.environ.get("FAIL_ATTEMPT") == ATTEMPT:
    sys.exit(1)
while True:
    time.sleep(0.05)
