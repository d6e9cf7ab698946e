"""One job, one outcome: from one agent giving up to the last agent exiting, fsm-agent vs torchrun.

    python bench/job_outcome.py [--smoke] [--json OUT] [--agents 2,8] [--repeats 3] [--limit 60]

N agents as N nodes of one job on this machine (c10d rendezvous on a loopback port, one worker
each, ``--max-restarts 0``). The worker of the last node exits with code 3 a moment after all
workers started; every other worker would run for an hour. Measured: from that worker's exit
(the time it records just before exiting) to the last launcher's exit, and the exit codes. A job
whose agents have not all ended ``--limit`` seconds after the give-up counts as "> limit" (torch's
healthy agents wait for their own workers, then 300 s at the exit barrier for the one that left).
fsm-agent runs the ``torchrun`` preset (the same decisions as torchrun, plus the job-wide
announcement); torchrun is torch 2.13's. Agents are started one after the other, the
first one hosts the rendezvous store (the failing node never does). Repeats alternate the two
launchers. Goal (issue 11): under 2 s for 8 agents.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = {
    "fsm-agent": [sys.executable, "-m", "fsm_agent", "run", "--spec", "torchrun"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}

WORKER = r'''
import json, os, sys, time
g = int(os.environ["GROUP_RANK"])
out = os.environ["OUT_DIR"]
open(os.path.join(out, f"start{g}"), "w").write(str(time.time()))
open(os.path.join(out, f"pid{g}"), "w").write(str(os.getpid()))
n = int(os.environ["NODES"])
if g == n - 1:
    while len([f for f in os.listdir(out) if f.startswith("start")]) < n:
        time.sleep(0.01)
    time.sleep(0.5)
    open(os.path.join(out, "failed_at"), "w").write(str(time.time()))
    sys.exit(3)
time.sleep(float(os.environ["CAP"]))
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def one_job(launcher: str, nodes: int, limit: float, work: Path) -> dict[str, Any]:
    """Run one job; the time from the failing worker's exit to the last launcher's exit."""
    out = work / "out"
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True)
    script = work / "worker.py"
    script.write_text(WORKER)
    port = _port()
    args = ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--max-restarts", "0",
            "--monitor-interval", "0.1"]
    env = dict(os.environ, OUT_DIR=str(out), NODES=str(nodes), CAP="3600",
               PYTHONWARNINGS="ignore", LOGLEVEL="WARNING")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(nodes):
            log = open(work / f"agent{i}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen([*LAUNCHERS[launcher], *args, str(script)], env=env,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            if i == 0:  # the first agent hosts the store
                deadline = time.monotonic() + 120
                while not _listening(port) and time.monotonic() < deadline:
                    time.sleep(0.05)
        ended: dict[int, float] = {}
        marker = out / "failed_at"
        start_by = time.monotonic() + 180 + 10 * nodes  # agents start slowly on a busy machine
        failed_at: float | None = None
        while len(ended) < nodes:
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.time()
            if failed_at is None and marker.exists() and marker.read_text():
                failed_at = float(marker.read_text())
            if failed_at is None and time.monotonic() > start_by:
                break
            if failed_at is not None and time.time() > failed_at + limit:
                break
            time.sleep(0.005)
        codes = [p.returncode for p in procs]
        last = max(ended.values()) if len(ended) == nodes else None
        return {
            "launcher": launcher, "nodes": nodes,
            "to_last_exit": None if failed_at is None or last is None else last - failed_at,
            "to_first_exit": None if failed_at is None or not ended
            else min(ended.values()) - failed_at,
            "codes": codes,
            "all_ended": len(ended) == nodes,
        }
    finally:
        # torch's agents stop their workers on SIGTERM; workers live in sessions of their own,
        # so a SIGKILLed agent would leave them running: they are killed by pid too.
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        stop_by = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(max(0.1, stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in out.glob("pid*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(f.read_text()), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="2,8", help="comma-separated job sizes (nodes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=float, default=60.0,
                        help="give up measuring this long after the give-up (seconds)")
    parser.add_argument("--smoke", action="store_true", help="2 agents, 1 repeat, short cap")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sizes = [2] if args.smoke else [int(x) for x in args.agents.split(",")]
    repeats = 1 if args.smoke else args.repeats
    limit = 20.0 if args.smoke else args.limit
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-job-") as tmp:
        for nodes in sizes:
            for r in range(repeats):
                order = list(LAUNCHERS) if r % 2 == 0 else list(LAUNCHERS)[::-1]
                for launcher in order:
                    row = one_job(launcher, nodes, limit, Path(tmp) / f"{launcher}-{nodes}-{r}")
                    rows.append(row)
                    took = row["to_last_exit"]
                    print(f"{launcher:9s} {nodes} agents: last exit "
                          f"{f'> {limit:g} s' if took is None else f'{took:.2f} s'} after the "
                          f"give-up, exit codes {row['codes']}", file=sys.stderr, flush=True)
    summary = []
    for nodes in sizes:
        line: dict[str, Any] = {"nodes": nodes}
        for launcher in LAUNCHERS:
            vals = [r["to_last_exit"] if r["to_last_exit"] is not None else math.inf
                    for r in rows if r["launcher"] == launcher and r["nodes"] == nodes]
            line[launcher] = statistics.median(vals) if vals else None
            line[f"{launcher}_same_code"] = all(
                len(set(r["codes"])) == 1 for r in rows
                if r["launcher"] == launcher and r["nodes"] == nodes)
        summary.append(line)
    print("\n| agents | fsm-agent (median) | torchrun (median) | ratio | same exit code "
          "(fsm-agent / torchrun) |")
    print("|---|---|---|---|---|")
    def fmt(x: float | None) -> str:
        return "-" if x is None else (f"> {limit:g} s" if math.isinf(x) else f"{x:.2f} s")

    for line in summary:
        f, t = line["fsm-agent"], line["torchrun"]
        ratio = (f"> {limit / f:.0f}x" if t is not None and math.isinf(t) and f
                 else f"{t / f:.1f}x" if f and t else "-")
        print(f"| {line['nodes']} | {fmt(f)} | {fmt(t)} | {ratio} | "
              f"{line['fsm-agent_same_code']} / {line['torchrun_same_code']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary, "limit": limit},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
