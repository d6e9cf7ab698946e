"""A two-rank gloo job whose last rank fails on purpose on the first attempt.

Run it under an elastic launcher with ``--max-restarts`` of at least 1::

    fsm-agent run --standalone --nproc-per-node 2 --max-restarts 1 examples/fail_once.py

Attempt 0: every rank joins the process group and runs an all-reduce, then the last rank exits
with code 3 while the others wait in a second all-reduce (so they are stopped by the agent, as in a
real crash). Attempt 1 (``TORCHELASTIC_RESTART_COUNT=1``): every rank all-reduces and exits 0.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fail_code = int(os.environ.get("FAIL_ONCE_EXIT_CODE", "3"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == world_size, t
    print(f"[rank {rank}] attempt {attempt}: all_reduce ok, world_size={world_size}", flush=True)
    if attempt == 0 and rank == world_size - 1:
        print(f"[rank {rank}] attempt {attempt}: failing on purpose", flush=True)
        sys.stdout.flush()
        os._exit(fail_code)
    if attempt == 0:
        # The failing rank never joins: this blocks until the agent stops us.
        dist.all_reduce(t)
    dist.destroy_process_group()
    print(f"[rank {rank}] attempt {attempt}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
