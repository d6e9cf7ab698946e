"""Resilient-preset test worker (no torch import, so it starts fast).

Writes ``a{attempt}_r{rank}_start.json`` into OUT_DIR when it starts (pid, the pid of its child if
SPAWN_CHILD is set, its own clock), sleeps SLEEP seconds, writes ``a{attempt}_r{rank}_exit.json``
and exits with its code for this attempt.

Environment:
  EXIT_CODES  comma-separated exit codes, one per attempt (TORCHELASTIC_RESTART_COUNT); the last
              one repeats (default "1": every attempt fails)
  EXIT_RANKS  comma-separated global ranks that exit with EXIT_CODES; the others sleep 60 s
              (default: every rank)
  SLEEP       seconds before exiting (default 0)
  SLEEPS      comma-separated seconds before exiting, one per attempt, the last one repeating
              (in place of SLEEP)
  SPAWN_CHILD "1": start a sleeping child process first (it must not outlive the stop)
"""

import json
import os
import subprocess
import sys
import time

env = os.environ
RANK = int(env["RANK"])
ATTEMPT = int(env["TORCHELASTIC_RESTART_COUNT"])


def write(event: str, **extra: object) -> None:
    out = os.path.join(env["OUT_DIR"], f"a{ATTEMPT}_r{RANK}_{event}.json")
    with open(out + ".tmp", "w") as f:
        json.dump({"attempt": ATTEMPT, "rank": RANK, "pid": os.getpid(), "time": time.time(),
                   **extra}, f)
    os.replace(out + ".tmp", out)


def main() -> int:
    extra = {}
    if env.get("SPAWN_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        extra["child_pid"] = child.pid
    write("start", **extra)
    ranks = env.get("EXIT_RANKS")
    if ranks and str(RANK) not in ranks.split(","):
        time.sleep(60)
        return 0
    sleeps = [float(s) for s in env.get("SLEEPS", env.get("SLEEP", "0")).split(",")]
    time.sleep(sleeps[min(ATTEMPT, len(sleeps) - 1)])
    codes = [int(c) for c in env.get("EXIT_CODES", "1").split(",")]
    code = codes[min(ATTEMPT, len(codes) - 1)]
    write("exit", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
