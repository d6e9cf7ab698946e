"""Exit barrier release: N agents on loopback, staggered arrivals, many rounds.

    python bench/exit_barrier.py [--smoke] [--json OUT] [--agents 8] [--rounds 12]

Release = from the last agent's arrival to the last agent leaving. Implementations, all on the
same store keys (torch's ``_barrier_nonblocking``), so agents of either kind still meet:

``torch``     torch's ``store_util.barrier``: one blocking ``store.wait`` (push: the store
              answers when the last member's key is set; a signal waits for the timeout).
``fsm``       fsm-agent's ``interruptible_barrier`` (``fsm_agent.torch._barrier``): polls
              ``store.check`` with sleeps doubling from 5 ms to 100 ms, so that signals are
              handled.
``push``      a proposal (this file): a daemon thread waits on its own store connection
              (``store.clone()``) with torch's blocking wait; the main thread waits on an event
              in 0.1 s slices, so signals are handled as promptly as with ``fsm``, and the
              release is the store's push.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("torch", "fsm", "push")


def push_barrier(store: Any, world_size: int, key_prefix: str, timeout: float) -> None:
    """The ``push`` proposal: interruptible, and released by the store's own notification."""
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    deadline = time.monotonic() + timeout
    last = _barrier_nonblocking(store=store, world_size=world_size, key_prefix=key_prefix)
    if store.check([last]):
        return
    waiter = store.clone()  # its own connection: a blocking wait there holds up nobody else
    done = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.wait([last], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="exit-barrier-wait", daemon=True).start()
    while not done.wait(0.1):  # signal handlers run between two slices
        if time.monotonic() >= deadline:
            raise TimeoutError(f"exit barrier: not every agent arrived within {timeout:g} s")
    if errors:
        raise errors[0]


def _agent(port: int, rank: int, world: int, impl: str, rounds: int, stagger: float,
           out: list[tuple[int, float, float]], tag: str) -> None:
    import torch.distributed as dist
    import torch.distributed.elastic.utils.store as store_util

    store = dist.PrefixStore(tag, dist.TCPStore("127.0.0.1", port, world, False,
                                                timeout=timedelta(seconds=60)))
    if impl == "torch":
        def barrier(prefix: str) -> None:
            store_util.barrier(store=store, world_size=world, key_prefix=prefix,
                               barrier_timeout=30)
    elif impl == "fsm":
        from fsm_agent.torch._barrier import interruptible_barrier

        def barrier(prefix: str) -> None:
            interruptible_barrier(store=store, world_size=world, key_prefix=prefix, timeout=30)
    else:
        def barrier(prefix: str) -> None:
            push_barrier(store, world, prefix, 30)

    store_util.barrier(store=store, world_size=world, key_prefix="start", barrier_timeout=60)
    for r in range(rounds):
        # a different agent arrives last each round, the others spread before it
        order = (rank + r) % world
        time.sleep(stagger * order / max(world - 1, 1))
        t0 = time.monotonic()
        barrier(f"round{r}")
        out.append((r, t0, time.monotonic()))


def measure(impl: str, agents: int, rounds: int, stagger: float) -> list[float]:
    """One thread per agent, each with its own store connection (the store calls release the
    GIL while they block): the release mechanics of N agents without N torch imports."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, agents, True, timeout=timedelta(seconds=60),
                           wait_for_workers=False)
    outs: list[list[tuple[int, float, float]]] = [[] for _ in range(agents)]
    threads = [
        threading.Thread(target=_agent, args=(server.port, rank, agents, impl, rounds, stagger,
                                              outs[rank], impl), daemon=True)
        for rank in range(agents)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    per_round: dict[int, list[tuple[float, float]]] = {}
    for out in outs:
        for r, t0, t1 in out:
            per_round.setdefault(r, []).append((t0, t1))
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
    figures: dict[str, Any] = {"agents": args.agents, "rounds": rounds}
    for impl in args.impls.split(","):
        samples = measure(impl, args.agents, rounds, stagger=0.3)
        figures[impl] = {"median_s": statistics.median(samples) if samples else None,
                         "max_s": max(samples) if samples else None, "samples": samples}
        med = figures[impl]["median_s"]
        print(f"{impl:6s} release median {med * 1e3 if med else float('nan'):7.1f} ms "
              f"(n={len(samples)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
