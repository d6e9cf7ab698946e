"""Two ranks that each wait for the other: an unmodified deadlock (nothing fsm-agent specific).

On the attempts listed in DEADLOCK_ATTEMPTS (default "0") both ranks receive before sending, so
neither ever sends; on other attempts they exchange a tensor and finish. BUSY_SECONDS: rank 0
computes that long first, while rank 1 waits for it (slow, not hung). Each rank writes
``a{attempt}_r{rank}_waiting.json`` (pid, time) into OUT_DIR just before it blocks.
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


def wait_for_peer_forever(peer: int) -> None:
    buf = torch.zeros(1)
    dist.recv(buf, src=peer)  # the peer is receiving too: nobody sends


def exchange(peer: int) -> None:
    rank = dist.get_rank()
    out, buf = torch.ones(1), torch.zeros(1)
    if rank == 0:
        dist.send(out, dst=peer)
        dist.recv(buf, src=peer)
    else:
        dist.recv(buf, src=peer)
        dist.send(out, dst=peer)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if attempt in os.environ.get("DEADLOCK_ATTEMPTS", "0").split(","):
        record("waiting")
        wait_for_peer_forever(peer)
    busy = float(os.environ.get("BUSY_SECONDS", "0"))
    if rank == 0 and busy:
        end = time.monotonic() + busy
        while time.monotonic() < end:
            sum(range(10_000))
    exchange(peer)
    record("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
