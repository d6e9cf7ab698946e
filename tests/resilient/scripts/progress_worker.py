"""A worker that reports its steps with ``fsm_agent.progress`` and then crashes (the
no-progress tests).

Writes ``a{attempt}_r{rank}.json`` into OUT_DIR when it starts. On attempts listed in
PROGRESS_ATTEMPTS (comma-separated restart counts; default "0") it reports steps 1..STEPS
(default 3) beyond the best of the attempts before (or touches CHECKPOINT, a file path, once
per step, when set); then it exits 1, or, on attempts listed in HANG_ATTEMPTS, hangs (sleeps,
using no CPU time).
"""

import json
import os
import sys
import time

import fsm_agent

OUT = os.environ["OUT_DIR"]
RANK = os.environ["RANK"]
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
path = os.path.join(OUT, f"a{ATTEMPT}_r{RANK}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "attempt": ATTEMPT}, f)
os.replace(path + ".tmp", path)
if str(ATTEMPT) in os.environ.get("PROGRESS_ATTEMPTS", "0").split(","):
    checkpoint = os.environ.get("CHECKPOINT")
    for step in range(1, int(os.environ.get("STEPS", "3")) + 1):
        time.sleep(0.02)
        if checkpoint:
            with open(checkpoint, "a") as f:
                f.write(f"{ATTEMPT}:{step}\n")
        else:
            fsm_agent.progress(ATTEMPT * 100 + step)
if str(ATTEMPT) in os.environ.get("HANG_ATTEMPTS", "").split(","):
    while True:
        time.sleep(60)
sys.exit(1)
