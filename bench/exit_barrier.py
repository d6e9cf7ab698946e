"""Exit barrier release: N agents on loopback, staggered arrivals, many rounds.

    python bench/exit_barrier.py [--smoke] [--json OUT] [--agents 8] [--rounds 12]

Release = from the last agent's arrival to the last agent leaving. Implementations, all on the
same store keys (torch's ``_barrier_nonblocking``), so agents of either kind still meet:

``torch``     torch's ``store_util.barrier``: one blocking ``store.wait`` (push: the store
              answers when the last member's key is set; a signal waits for the timeout).
``fsm``       fsm-agent's ``interruptible_barrier`` (``fsm_agent.torch._barrier``): the same
              blocking wait, on a connection of its own that a signal shuts down, so that
              signals are handled at once.

Each agent is a process of its own (forked from this one), as real agents are: with threads in
one process the GIL hand-offs between 8 agents would be part of the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("torch", "fsm")


def _agent(port: int, rank: int, world: int, impl: str, rounds: int, stagger: float,
           out: Any) -> None:
    """One agent process: its own store connection, ``rounds`` barriers, times sent to ``out``."""
    import torch.distributed as dist
    import torch.distributed.elastic.utils.store as store_util

    store = dist.PrefixStore(impl, dist.TCPStore("127.0.0.1", port, world, False,
                                                 timeout=timedelta(seconds=60)))
    if impl == "torch":
        def barrier(prefix: str) -> None:
            store_util.barrier(store=store, world_size=world, key_prefix=prefix,
                               barrier_timeout=30)
    else:
        from fsm_agent.torch._barrier import interruptible_barrier

        def barrier(prefix: str) -> None:
            interruptible_barrier(store=store, world_size=world, key_prefix=prefix, timeout=30)

    store_util.barrier(store=store, world_size=world, key_prefix="start", barrier_timeout=60)
    times = []
    for r in range(rounds):
        # a different agent arrives last each round, the others spread before it
        order = (rank + r) % world
        time.sleep(stagger * order / max(world - 1, 1))
        t0 = time.monotonic()
        barrier(f"round{r}")
        times.append((r, t0, time.monotonic()))
    out.send(times)
    out.close()


def measure(impl: str, agents: int, rounds: int, stagger: float) -> list[float]:
    """One process per agent (forked once torch is imported, before any store exists), each
    with its own store connection, as real agents have: the release mechanics of N agents."""
    import multiprocessing as mp
    import socket

    import torch.distributed as dist

    if impl == "fsm":
        import fsm_agent.torch._barrier  # noqa: F401  (imported before the fork, as agents have)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for rank in range(agents):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_agent, args=(port, rank, agents, impl, rounds, stagger, writer),
                           daemon=True)
        proc.start()
        writer.close()
        pipes.append(reader)
        procs.append(proc)
    server = dist.TCPStore("127.0.0.1", port, agents, True, timeout=timedelta(seconds=60),
                           wait_for_workers=False)
    per_round: dict[int, list[tuple[float, float]]] = {}
    try:
        for reader in pipes:
            if reader.poll(120):
                for r, t0, t1 in reader.recv():
                    per_round.setdefault(r, []).append((t0, t1))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        del server
    return [max(t1 for _, t1 in v) - max(t0 for t0, _ in v)
            for _, v in sorted(per_round.items()) if len(v) == agents]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset")
    args = parser.parse_args(argv)
    rounds = 4 if args.smoke else args.rounds
    reps = 1 if args.smoke else 3
    figures: dict[str, Any] = {"agents": args.agents, "rounds": rounds * reps}
    impls = args.impls.split(",")
    samples: dict[str, list[float]] = {impl: [] for impl in impls}
    for rep in range(reps):  # the implementations take turns, so load from elsewhere hits both
        for impl in impls if rep % 2 == 0 else impls[::-1]:
            samples[impl] += measure(impl, args.agents, rounds, stagger=0.3)
    for impl, got in samples.items():
        figures[impl] = {"median_s": statistics.median(got) if got else None,
                         "max_s": max(got) if got else None, "samples": got}
        med = figures[impl]["median_s"]
        print(f"{impl:6s} release median {med * 1e3 if med else float('nan'):7.1f} ms "
              f"(n={len(got)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
