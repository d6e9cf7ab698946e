"""What hang detection's progress samples cost the agent.

    python bench/progress_sampling.py [--workers 8] [--smoke] [--json OUT]

Starts ``--workers`` idle Python processes (as hung workers would be), then times, in this
process: one ``read_progress(pid)`` (the ``/proc/PID/task/PID/schedstat`` read the detector does
per worker per sample), one ``HangDetector.poll()`` of the whole group when a sample is due, and,
as a baseline in the same run, one read of ``/proc/PID/stat`` (what ``ps`` reads per process).
Medians over many repetitions; the CPU share is the poll's cost divided by the sample period
(``hang_timeout / 10``, between 0.05 s and 5 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fsm_agent.torch._progress import HangDetector, read_progress, sample_period_for  # noqa: E402


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
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
