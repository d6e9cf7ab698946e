"""The agent's RSS growth per restart, fsm-agent beside torchrun (issue 27, item 6).

    python bench/restart_memory.py                     # 150 restarts, 3 jobs per launcher
    python bench/restart_memory.py --quick             # 30 restarts, 1 job each: a smoke run
    python bench/restart_memory.py --before TREE       # also fsm-agent from another checkout
    python bench/restart_memory.py --fsm-args=--shared-worker-store --launchers fsm
    python bench/restart_memory.py --json OUT

Each job is one real agent, ``--standalone --nproc-per-node 1 --max-restarts N
--monitor-interval 0.1``, whose worker is ``/bin/sh`` (``--no-python``): it appends its parent's
``VmRSS`` (``/proc/$PPID/status``: the agent's, read as each attempt starts) to a file and exits
1 at once, so the agent restarts N times and gives up. The figure per job is the least-squares
slope of the agent's RSS over the attempts, after the first ``--warmup`` (imports, first
allocations), in bytes per restart; per launcher, the median over the jobs. Launchers take turns
(torchrun, fsm-agent, ...) so that load from elsewhere falls on all of them. ``--before TREE``
adds ``fsm-before``: ``fsm-agent run`` with ``PYTHONPATH=TREE`` (a ``git worktree`` of an earlier
commit), for a before/after in the same session. fsm-agent runs its default spec with its
end-of-run summary (what ``fsm-agent run`` always keeps in memory), no ``--trace``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKER = ('grep VmRSS /proc/$PPID/status | tr -s " " | cut -d" " -f2 | sed "s/^/$PPID /" '
          '>> "$BENCH_OUT"; exit 1')


def launcher_argv(launcher: str) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, "-m", "fsm_agent", "run"]


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over 0, 1, 2, ..."""
    n = len(ys)
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def one_job(launcher: str, restarts: int, warmup: int, before: str | None,
            timeout: float, fsm_args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fsm-bench-rss-") as tmp:
        out = Path(tmp) / "rss.txt"
        env = dict(os.environ, BENCH_OUT=str(out), LOGLEVEL="ERROR")
        if launcher == "fsm-before" and before:
            env["PYTHONPATH"] = before + os.pathsep + env.get("PYTHONPATH", "")
        extra = fsm_args if launcher != "torchrun" else []
        cmd = [*launcher_argv(launcher), *extra, "--standalone", "--nproc-per-node", "1",
               "--max-restarts", str(restarts), "--monitor-interval", "0.1",
               "--no-python", "/bin/sh", "-c", WORKER]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
        seconds = time.monotonic() - t0
        rows = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    agent = [int(kb) * 1024 for pid, kb in rows if int(pid) == proc.pid]
    if len(agent) != len(rows) or len(agent) <= warmup + 2:
        raise RuntimeError(f"{launcher}: {len(agent)} of {len(rows)} attempts read the agent's "
                           f"RSS (rc {rc})")
    steady = agent[warmup:]
    return {"launcher": launcher, "rc": rc, "seconds": round(seconds, 2), "attempts": len(agent),
            "rss_first": agent[0], "rss_warm": steady[0], "rss_last": agent[-1],
            "bytes_per_restart": slope([float(x) for x in steady]),
            "rss": agent}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--restarts", type=int, default=150)
    ap.add_argument("--reps", type=int, default=3, help="jobs per launcher")
    ap.add_argument("--warmup", type=int, default=10, help="attempts left out of the slope")
    ap.add_argument("--before", metavar="TREE", help="also run fsm-agent from this checkout")
    ap.add_argument("--quick", action="store_true", help="30 restarts, one job per launcher")
    ap.add_argument("--fsm-args", default="", help="more fsm-agent run arguments (one string)")
    ap.add_argument("--launchers", default="torchrun,fsm", help="comma-separated (torchrun, fsm)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    restarts, reps = (30, 1) if args.quick else (args.restarts, args.reps)
    launchers = args.launchers.split(",") + (["fsm-before"] if args.before else [])
    jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in launchers}
    for rep in range(reps):
        order = launchers if rep % 2 == 0 else launchers[::-1]
        for name in order:
            job = one_job(name, restarts, args.warmup, args.before, args.timeout,
                          args.fsm_args.split())
            jobs[name].append(job)
            print(f"{name:10s} job {rep + 1}: {job['attempts']} attempts in {job['seconds']} s, "
                  f"RSS {job['rss_warm'] / 2**20:.1f} -> {job['rss_last'] / 2**20:.1f} MiB, "
                  f"{job['bytes_per_restart']:.0f} B per restart", flush=True)
    med = {name: statistics.median(j["bytes_per_restart"] for j in js) for name, js in jobs.items()}
    print(f"\nRSS growth per restart, median of {reps} job(s) of {restarts} restarts "
          f"(slope after the first {args.warmup} attempts):")
    for name in launchers:
        ratio = f", {med[name] / med['torchrun']:.2f}x torchrun" if name != "torchrun" \
            and med.get("torchrun", 0) > 0 else ""
        print(f"  {name:10s} {med[name]:7.0f} B{ratio}")
    if args.json:
        args.json.write_text(json.dumps({"restarts": restarts, "reps": reps, "median": med,
                                         "jobs": jobs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
