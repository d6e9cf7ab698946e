"""Tiny CPU DDP training (gloo) that checkpoints every epoch and resumes after a restart.

::

    fsm-agent run --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/train_ddp.py --epochs 4 --checkpoint-dir /tmp/ckpt --crash-at-epoch 2

Each rank fits the same linear model to its shard of a fixed synthetic data set. After every
epoch rank 0 writes ``checkpoint.pt`` (model, optimizer, next epoch) atomically; on start every
rank loads it if present, so a restarted group continues from the last finished epoch instead of
from scratch. ``--crash-at-epoch N`` makes the last rank exit with code 3 in epoch N of the first
attempt only (``TORCHELASTIC_RESTART_COUNT=0``), to show the restart.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=8)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--crash-at-epoch", type=int, default=None)
    parser.add_argument("--epoch-seconds", type=float, default=0.0,
                        help="sleep this long per epoch (time for a node to join or fail)")
    return parser.parse_args(argv)


def load_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["next_epoch"])


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    tmp = path.with_suffix(".tmp")
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "next_epoch": epoch + 1}
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a torn checkpoint


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.checkpoint_dir / "checkpoint.pt"
    start = load_checkpoint(ckpt, model.module, opt)
    print(f"[rank {rank}] attempt {attempt}: world_size={world}, resuming at epoch {start}",
          flush=True)

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64 * world, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    shard_x, shard_y = x[rank::world], y[rank::world]
    batch = max(1, len(shard_x) // args.steps_per_epoch)
    loss = torch.zeros(())
    for epoch in range(start, args.epochs):
        if attempt == 0 and epoch == args.crash_at_epoch and rank == world - 1:
            print(f"[rank {rank}] attempt {attempt}: crashing in epoch {epoch}", flush=True)
            os._exit(3)
        for step in range(args.steps_per_epoch):
            bx = shard_x[step * batch:(step + 1) * batch]
            by = shard_y[step * batch:(step + 1) * batch]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(bx), by)
            loss.backward()
            opt.step()
        time.sleep(args.epoch_seconds)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            save_checkpoint(ckpt, model.module, opt, epoch)
        dist.barrier()  # nobody starts the next epoch before its checkpoint exists
        print(f"[rank {rank}] epoch {epoch}: mean loss {total.item() / world:.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
