"""Bench worker: record when user code starts, optionally crash, then sleep or finish.

Imports nothing heavy (no torch) unless ``BENCH_IMPORT=torch[,...]`` says so: most benchmarks
time the agents, not the workers' imports; the warm-restart one times exactly that (an
"imported" event after the imports). Every event is one O_APPEND write of one line to
$BENCH_OUT (atomic for short lines), stamped with CLOCK_MONOTONIC, which is system-wide on Linux
and so comparable with the agent's.

The "generation" of a worker is the number of crashes recorded before it started: unlike
TORCHELASTIC_RESTART_COUNT it is the same on every agent (an agent restarted for a membership
change keeps its restart count).

How the crashing rank ends: ``BENCH_CRASH`` = ``os_exit`` (the default: ``os._exit(1)``, no
interpreter teardown), ``sys_exit`` (``sys.exit(1)``) or ``exception`` (an uncaught
``RuntimeError``): the last two are real crashes, whose interpreter tears down (with torch
imported, hundreds of milliseconds) before the process is gone.

argv: crash_attempts crash_rank crash_after_s finish_after_s [stagger_s]
  generations < crash_attempts: rank crash_rank exits 1 after crash_after_s (plus jitter); the
  other ranks sleep until the agent stops them (at most 90 s, so that a benchmark killed half-way
  leaves nothing behind for long). Later generations sleep finish_after_s + stagger_s *
  GROUP_RANK and exit 0 (the stagger spreads the agents' arrivals at the exit barrier).
"""

import os
import sys
import time

T0 = time.monotonic()
OUT = os.environ["BENCH_OUT"]
rank = int(os.environ["RANK"])


def generation() -> int:
    try:
        with open(OUT) as f:
            return sum(1 for line in f if line.startswith("crash "))
    except FileNotFoundError:
        return 0


def started(gen: int) -> int:
    with open(OUT) as f:
        return sum(1 for line in f if line.startswith("start ") and line.split()[2] == str(gen))


def record(kind: str, gen: int, t: float) -> None:
    line = f"{kind} {rank} {gen} {t:.6f} {os.getpid()}\n"
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


gen = generation()
record("start", gen, T0)
if os.environ.get("BENCH_IMPORT"):
    # a real worker's first seconds: what --preload saves ("imported": its next line)
    import importlib

    for name in os.environ["BENCH_IMPORT"].split(","):
        importlib.import_module(name)
    record("imported", gen, time.monotonic())
crash_attempts, crash_rank = int(sys.argv[1]), int(sys.argv[2])
crash_after, finish_after = float(sys.argv[3]), float(sys.argv[4])
if gen < crash_attempts:
    if rank == crash_rank:
        # crash only once every worker of this generation runs (64 workers take seconds to
        # start on 2 cores), so that a late starter is not counted in the next generation
        world = int(os.environ["WORLD_SIZE"])
        give_up = time.monotonic() + 60
        while started(gen) < world and time.monotonic() < give_up:
            time.sleep(0.01)
        # jitter so that the crash falls anywhere within the agent's monitor tick
        jitter = (os.getpid() * 7919 % 1000) / 1000 * 0.25
        time.sleep(crash_after + jitter)
        how = os.environ.get("BENCH_CRASH", "os_exit")
        record("crash", gen, time.monotonic())
        if how == "sys_exit":
            sys.exit(1)
        if how == "exception":
            raise RuntimeError(f"bench crash of rank {rank} in generation {gen}")
        os._exit(1)
    time.sleep(90)
    sys.exit(3)
stagger = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
time.sleep(finish_after + stagger * int(os.environ.get("GROUP_RANK", "0")))
record("finish", gen, time.monotonic())
