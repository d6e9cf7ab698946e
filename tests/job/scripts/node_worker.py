"""Worker for the multi-agent job tests: one per node (``--nproc-per-node 1``).

Writes ``start_a{attempt}_g{group_rank}.json`` into OUT_DIR (pid, attempt, group rank, time).

Environment:
  FAIL_GROUP_RANK  the group rank (node) whose worker fails, -1 for every node (default: none)
  FAIL_ATTEMPTS    on these restart counts ("all" or comma-separated; default "all")
  FAIL_CODE        its exit code (default 3)
  FAIL_AFTER       seconds it runs before failing (default 0.2)
  SLEEP            seconds every other worker runs before succeeding (default 120)
  GATE             a file: every other worker succeeds as soon as it exists (SLEEP still
                   bounds the wait)
  TRAP_TERM        "ignore": ignore SIGTERM (the agent stops it with SIGKILL after its shutdown
                   timeout, so the agent stays up that long)
"""

import json
import os
import signal
import sys
import time

env = os.environ
if env.get("TRAP_TERM") == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
group_rank = int(env["GROUP_RANK"])
attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
record = {"pid": os.getpid(), "attempt": attempt, "group_rank": group_rank, "time": time.time(),
          "world_size": int(env["WORLD_SIZE"])}
path = os.path.join(env["OUT_DIR"], f"start_a{attempt}_g{group_rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)

attempts = env.get("FAIL_ATTEMPTS", "all")
failing = env.get("FAIL_GROUP_RANK") is not None and int(env["FAIL_GROUP_RANK"]) in (-1, group_rank)
if failing and (attempts == "all" or str(attempt) in attempts.split(",")):
    time.sleep(float(env.get("FAIL_AFTER", "0.2")))
    sys.exit(int(env.get("FAIL_CODE", "3")))
deadline = time.monotonic() + float(env.get("SLEEP", "120"))
gate = env.get("GATE")
while time.monotonic() < deadline and not (gate and os.path.exists(gate)):
    time.sleep(min(0.05 if gate else 1.0, max(0.0, deadline - time.monotonic())))
