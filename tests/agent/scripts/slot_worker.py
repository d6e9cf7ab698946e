"""Worker for the stable-slot tests (no torch import): records its ranks, then waits.

Writes ``slot_{pid}.json`` into OUT_DIR (pid, group rank, global rank, world size, restart
count, time), then sleeps until the file STOP_FILE exists (at most 120 s) and exits 0.
"""

import json
import os
import time


def write_record() -> None:
    """``slot_{pid}.json`` in OUT_DIR: this worker's ranks (also used by allreduce_worker)."""
    env = os.environ
    record = {"pid": os.getpid(), "group_rank": int(env["GROUP_RANK"]),
              "rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
              "attempt": int(env["TORCHELASTIC_RESTART_COUNT"]), "time": time.time()}
    path = os.path.join(env["OUT_DIR"], f"slot_{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    write_record()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["STOP_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
