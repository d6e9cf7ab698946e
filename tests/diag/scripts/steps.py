"""A healthy two-rank job whose steps each take STEP_SECONDS, in three kinds, each kind for a
third of STEPS steps in a row, every step ending in an all_reduce (a training step's sync):

- ``c``: one CPU-bound C call (``hashlib.pbkdf2_hmac``, its rounds measured at start to take
  STEP_SECONDS);
- ``py``: a Python loop until STEP_SECONDS have passed;
- ``coll``: rank 0 sleeps STEP_SECONDS while rank 1 waits for it in the all_reduce.

Writes ``a{attempt}_r{rank}_done.json`` (steps done) into OUT_DIR at the end.
"""

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

SECONDS = float(os.environ.get("STEP_SECONDS", "0.3"))
STEPS = int(os.environ.get("STEPS", "100"))


def rounds_for(seconds: float) -> int:
    n = 10_000
    while True:
        t0 = time.perf_counter()
        hashlib.pbkdf2_hmac("sha256", b"k", b"s", n)
        took = time.perf_counter() - t0
        if took > 0.05:
            return max(1, int(n * seconds / took))
        n *= 4


def c_step(rounds: int) -> None:
    hashlib.pbkdf2_hmac("sha256", b"k", b"s", rounds)


def py_step(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def coll_step(rank: int, seconds: float) -> None:
    if rank == 0:
        time.sleep(seconds)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rounds = rounds_for(SECONDS)
    kinds = ["c", "py", "coll"]
    for step in range(STEPS):
        kind = kinds[min(2, step * 3 // STEPS)]
        if kind == "c":
            c_step(rounds)
        elif kind == "py":
            py_step(SECONDS)
        else:
            coll_step(rank, SECONDS)
        dist.all_reduce(torch.ones(1))
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    path = os.path.join(os.environ["OUT_DIR"], f"a{attempt}_r{rank}_done.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"steps": STEPS}, f)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
