"""A worker whose failure no retry can help: writes ``start_r{rank}.json`` into OUT_DIR (once per
attempt: the file name has the restart count) and exits with EXIT_CODE (default 3) at once."""

import json
import os
import sys
import time

RANK = os.environ["RANK"]
ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
with open(os.path.join(os.environ["OUT_DIR"], f"start_r{RANK}_a{ATTEMPT}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "attempt": ATTEMPT, "time": time.time()}, f)
sys.exit(int(os.environ.get("EXIT_CODE", "3")))
