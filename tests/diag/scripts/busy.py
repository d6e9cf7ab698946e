"""Ranks of which one spins instead of blocking: an unmodified busy hang.

On attempt 0 rank SPIN_RANK (default 1) spins in a Python function for ever while the other
ranks wait for it in ``all_reduce``; on later attempts they all reduce and finish. Each rank
writes ``a{attempt}_r{rank}_{event}.json`` (pid, time) into OUT_DIR: ``waiting`` (just before the
all_reduce), ``spinning`` (just before the spin), ``done``.
"""

import json
import os
import time

import torch
import torch.distributed as dist


def record(event: str) -> None:
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    path = os.path.join(os.environ["OUT_DIR"], f"a{attempt}_r{rank}_{event}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "time": time.time()}, f)
    os.replace(path + ".tmp", path)


def spin_forever() -> None:
    x = 0
    while True:
        x += 1


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        if rank == int(os.environ.get("SPIN_RANK", "1")):
            record("spinning")
            spin_forever()
        record("waiting")
    dist.all_reduce(torch.ones(1))
    record("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
