"""Worker for the quarantine tests (no torch import): records its ranks like slot_worker, then,
with FAIL_CODE set, fails with that code once the gate of its attempt exists.

The attempt is the number of records this node's workers wrote before (OUT_DIR is the node's);
its gate is GATE_DIR/fail_<attempt>, so the test says when each failure happens. Without
FAIL_CODE it sleeps until STOP_FILE exists (at most 120 s) and exits 0, as slot_worker.
"""

import glob
import os
import sys
import time

from slot_worker import write_record

if __name__ == "__main__":
    env = os.environ
    attempt = len(glob.glob(os.path.join(env["OUT_DIR"], "slot_*.json")))
    write_record()
    code = int(env.get("FAIL_CODE", "0"))
    gate = os.path.join(env.get("GATE_DIR", ""), f"fail_{attempt}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(env["STOP_FILE"]):
        if code and os.path.exists(gate):
            sys.exit(code)
        time.sleep(0.05)
