"""A two-rank gloo job that hangs, then crashes, then succeeds: material for ``fsm-agent report``.

Attempt 0: both ranks receive from each other before sending, so neither ever sends (a deadlock:
nothing in the script tells anyone). Attempt 1: rank 1 raises ``ValueError`` (recorded in its
error file by torch's ``@record``) and rank 0 loses its peer. Attempt 2: the ranks exchange a
tensor and finish. ``examples/report_demo.py`` runs it on two agents under the ``resilient``
preset with ``--spec-param hang_timeout=3s`` and writes the report.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def wait_for_peer(peer: int) -> None:
    buf = torch.zeros(1)
    dist.recv(buf, src=peer)  # the peer is receiving too: nobody sends


def load_batch(index: int) -> None:
    raise ValueError(f"bad batch {index}: 0 samples")


@record
def main() -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    peer = 1 - rank
    if attempt == 0:
        wait_for_peer(peer)
    if attempt == 1 and rank == 1:
        load_batch(17)
    out, buf = torch.ones(1), torch.zeros(1)
    if rank == 0:
        dist.send(out, dst=peer)
        dist.recv(buf, src=peer)
    else:
        dist.recv(buf, src=peer)
        dist.send(out, dst=peer)
    print(f"[rank {rank}] attempt {attempt}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
