"""What hang detection's progress samples cost the agent.

    python bench/progress_sampling.py [--workers 8] [--smoke] [--json OUT]

Starts ``--workers`` idle Python processes (as hung workers would be), then times, in this
process: one ``read_progress(pid)`` (the ``/proc/PID/task/PID/schedstat`` read the detector does
per worker per sample), one ``HangDetector.poll()`` of the whole group when a sample is due, and,
as a baseline in the same run, one read of ``/proc/PID/stat`` (what ``ps`` reads per process).
Medians over many repetitions; the CPU share is the poll's cost divided by the sample period
(``hang_timeout / 10``, between 0.05 s and 5 s).

Then the cost of telling a spin from work: a worker whose main thread ran through a sample has
its main-thread stack read (one ``py-spy dump --nonblocking``). Timed on a worker that spins
with torch imported (a real worker's memory map): the wall time of one read and py-spy's own CPU
time (user + system, from the children's rusage), medians; the CPU share per running worker is
that CPU time divided by the sample period.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fsm_agent.torch._progress import HangDetector, read_progress, sample_period_for  # noqa: E402
from fsm_agent.torch._stacks import find_py_spy, main_thread_frames  # noqa: E402

SPINNER = "import torch\ndef spin():\n    x = 0\n    while True:\n        x += 1\nspin()\n"


def _stack_cost(reps: int) -> dict[str, float] | None:
    """Median wall and CPU time (ms) of one main-thread stack read of a spinning torch worker."""
    py_spy = find_py_spy()
    if py_spy is None:
        return None
    proc = subprocess.Popen([sys.executable, "-c", SPINNER])
    try:
        deadline = time.monotonic() + 60
        while main_thread_frames(proc.pid, py_spy) is None or "spin" not in (
                main_thread_frames(proc.pid, py_spy) or ("",))[0]:
            assert time.monotonic() < deadline, "the spinner never showed its stack"
            time.sleep(0.1)
        walls, cpus = [], []
        for _ in range(reps):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            main_thread_frames(proc.pid, py_spy)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    finally:
        proc.kill()
        proc.wait()
    return {"stack_wall_ms": statistics.median(walls) * 1000,
            "stack_cpu_ms": statistics.median(cpus) * 1000}


def _median_us(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    reps = 200 if args.smoke else 5000
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
             for _ in range(args.workers)]
    try:
        time.sleep(0.5)
        pids = {i: p.pid for i, p in enumerate(procs)}
        pid = procs[0].pid

        def stat() -> None:
            with open(f"/proc/{pid}/stat", "rb") as f:
                f.read()

        baseline = _median_us(stat, reps)
        one = _median_us(lambda: read_progress(pid), reps)
        detector = HangDetector(3600.0, period=1e-9)  # a sample due on every poll
        detector.watch(pids)
        poll = _median_us(detector.poll, reps // 4)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    out: dict[str, Any] = {
        "workers": args.workers,
        "proc_stat_read_us": baseline,
        "read_progress_us": one,
        "ratio_to_proc_stat_read": one / baseline,
        "poll_group_us": poll,
        "cpu_share": {},
    }
    print(f"baseline, one /proc/PID/stat read: {baseline:.1f} us")
    print(f"read_progress, one worker: {one:.1f} us ({one / baseline:.2f}x the baseline)")
    print(f"HangDetector.poll, {args.workers} workers: {poll:.1f} us")
    for timeout in (3.0, 60.0, 1800.0):
        period = sample_period_for(timeout)
        share = poll / 1e6 / period
        out["cpu_share"][str(timeout)] = share
        print(f"  hang_timeout {timeout:g} s: a sample every {period:g} s, "
              f"{share * 100:.4f} % of one core")
    stack = _stack_cost(10 if args.smoke else 100)
    out["stack"] = stack
    if stack is None:
        print("no py-spy: a spin is not told from work, no stack cost")
    else:
        print(f"one main-thread stack of a running worker: {stack['stack_wall_ms']:.1f} ms "
              f"wall, {stack['stack_cpu_ms']:.1f} ms of py-spy's CPU")
        for timeout in (3.0, 60.0, 1500.0):
            period = sample_period_for(timeout)
            share = stack["stack_cpu_ms"] / 1000 / period
            out["cpu_share"][f"stack {timeout}"] = share
            print(f"  hang_timeout {timeout:g} s: {share * 100:.3f} % of one core per running "
                  "worker")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
