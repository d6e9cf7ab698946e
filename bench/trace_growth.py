"""How a healthy job's trace grows with time, at torchrun's default ``--monitor-interval 0.1``.

    python bench/trace_growth.py [--seconds 120] [--smoke] [--json OUT]

Runs one real ``fsm-agent run --standalone --nproc-per-node 1 --trace FILE`` job whose worker
sleeps for ``--seconds``, and samples the trace file's size every second. With folding (see
docs/diagnosis.md) the size stops changing once the workers run: the figure is the growth rate
over the run's second half, in bytes per hour (0 when constant), and the size a 30-minute run
would reach. For comparison, the unfolded size: the healthy ticks the fold counts times the
size of one tick record (what the writer wrote before folding).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLEEP = "import os, time; time.sleep(float(os.environ['RUN_FOR']))\n"


def measure(seconds: float, interval: float = 0.1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fsm_agent_trace_growth_") as tmp:
        script = Path(tmp) / "sleep.py"
        script.write_text(SLEEP)
        trace = Path(tmp) / "trace.jsonl"
        env = dict(os.environ, RUN_FOR=str(seconds), LOGLEVEL="WARNING")
        cmd = [sys.executable, "-m", "fsm_agent", "run", "--standalone", "--nproc-per-node", "1",
               "--monitor-interval", str(interval), "--trace", str(trace), str(script)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        samples: list[tuple[float, int]] = []
        try:
            while proc.poll() is None:
                if trace.exists():
                    samples.append((time.monotonic() - t0, trace.stat().st_size))
                time.sleep(1.0)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        final = trace.stat().st_size
    ticks = sum(r.get("count", 1) for r in records if r.get("trigger") == "healthy")
    tick_record = [r for r in records if r.get("trigger") == "healthy"]
    one = dict(tick_record[0]) if tick_record else {}
    for key in ("count", "last_wall_time", "last_monotonic_time"):
        one.pop(key, None)
    tick_bytes = len(json.dumps(one)) + 1 if one else 0
    half = [(t, s) for t, s in samples if t >= seconds / 2 and t <= seconds]
    growth = 0.0
    if len(half) >= 2 and half[-1][0] > half[0][0]:
        growth = (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0]) * 3600
    return {
        "seconds": seconds,
        "monitor_interval": interval,
        "exit_code": rc,
        "records": len(records),
        "healthy_ticks": ticks,
        "final_bytes": final,
        "growth_bytes_per_hour_second_half": growth,
        "projected_30min_bytes": final + growth / 2,
        "unfolded_bytes_estimate": final + max(0, ticks - 1) * tick_bytes,
        "tick_record_bytes": tick_bytes,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--smoke", action="store_true", help="a 6 s run")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    runs = [measure(6.0)] if args.smoke else [measure(args.seconds / 2), measure(args.seconds)]
    for r in runs:
        print(f"{r['seconds']:.0f} s healthy run at --monitor-interval {r['monitor_interval']}: "
              f"{r['records']} records for {r['healthy_ticks']} healthy ticks, "
              f"{r['final_bytes']} bytes (unfolded: ~{r['unfolded_bytes_estimate']} bytes); "
              f"growth over the second half {r['growth_bytes_per_hour_second_half']:.0f} B/h; "
              f"a 30-minute run: {r['projected_30min_bytes']:.0f} bytes")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
