"""Restart reliability: N fail-once gloo jobs under ``fsm-agent run`` and under ``torchrun``.

Each run is ``LAUNCHER --standalone --nproc-per-node 2 --max-restarts 1 examples/fail_once.py``:
rank 1 exits on the first attempt, so every run needs exactly one restart, after which both
ranks must init gloo again and finish. A run is

- ``ok``: exit 0 and both ranks printed "attempt 1: done";
- ``failed``: any other exit (with torch's shared store: gloo connected to the first attempt's
  ports, the restart was burned, the job failed);
- ``hung``: not finished within ``--timeout`` (then stopped with SIGTERM, later SIGKILL).

Launchers alternate run by run, so machine load hits both alike. Prints one line per run and a
summary table (counts, median and max seconds); exits 1 if ``fsm-agent`` had any failure or
hang. ``--smoke`` does one run per launcher (for CI: checks the script works, not reliability).
``--etcd-v2 HOST:PORT`` runs each job on torch's etcd-v2 rendezvous instead (an etcd 3.4 with
``--enable-v2``, python-etcd installed), one node, a run id of its own.

    python bench/restart_reliability.py --runs 30
    python bench/restart_reliability.py --runs 5 --etcd-v2 127.0.0.1:2379
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "fail_once.py"
TOKEN_VAR = "FSM_AGENT_BENCH_TOKEN"
LAUNCHERS = {
    "fsm-agent": [sys.executable, "-m", "fsm_agent", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def _token_pids(token: str) -> list[int]:
    needle = f"{TOKEN_VAR}={token}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _kill_leftovers(token: str) -> int:
    # torch starts each worker in its own session, so killing the launcher's group is not enough.
    left = _token_pids(token)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def one_run(launcher: str, args: argparse.Namespace, workdir: Path) -> tuple[str, float, str]:
    """Run one job; return (outcome, seconds, last lines of output)."""
    token = uuid.uuid4().hex
    env = dict(os.environ, PYTHONWARNINGS="ignore", **{TOKEN_VAR: token})
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # measure the defaults
    # --standalone is c10d on an embedded store; --etcd-v2 a one-node job on torch's etcd-v2
    # rendezvous (a run id of its own each run: etcd keeps a closed run's state)
    rdzv = (["--nnodes", "1", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", args.etcd_v2,
             "--rdzv-id", f"bench-{token[:12]}"] if args.etcd_v2 else ["--standalone"])
    cmd = [*LAUNCHERS[launcher], *rdzv, "--nproc-per-node", str(args.nproc),
           "--max-restarts", "1", "--monitor-interval", str(args.monitor_interval),
           str(args.script)]
    log = workdir / f"{launcher}-{token[:8]}.txt"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=workdir, start_new_session=True)
        try:
            rc = proc.wait(args.timeout)
            outcome = None
        except subprocess.TimeoutExpired:
            outcome = "hung"
            proc.send_signal(signal.SIGTERM)  # let the agent stop its workers
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = proc.returncode
    seconds = time.monotonic() - start
    leftovers = _kill_leftovers(token)
    text = log.read_text(errors="replace")
    if outcome is None:
        done = all(f"[rank {r}] attempt 1: done" in text for r in range(args.nproc))
        outcome = "ok" if rc == 0 and done else "failed"
    if leftovers:
        outcome += f"+{leftovers}left"
    if outcome == "ok" and not args.keep_logs:
        log.unlink()
    tail = " | ".join(line.strip()[:160] for line in text.strip().splitlines()[-2:])
    return outcome, seconds, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per launcher (default 30)")
    parser.add_argument("--launchers", default="fsm-agent,torchrun",
                        help="comma-separated, from: " + ", ".join(LAUNCHERS))
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before a run counts as hung (default 120)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--monitor-interval", type=float, default=0.1)
    parser.add_argument("--script", type=Path, default=SCRIPT)
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep logs here (default: a temporary dir; failed runs' logs kept)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs of ok runs too")
    parser.add_argument("--smoke", action="store_true", help="one run per launcher")
    parser.add_argument("--etcd-v2", metavar="HOST:PORT", default=None,
                        help="rendezvous on torch's etcd-v2 backend at this etcd (its v2 API "
                             "on: etcd --enable-v2) instead of --standalone")
    args = parser.parse_args(argv)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    unknown = [name for name in launchers if name not in LAUNCHERS]
    if unknown:
        parser.error(f"--launchers: unknown {', '.join(unknown)} (known: {', '.join(LAUNCHERS)})")
    if not args.script.is_file():
        parser.error(f"--script: no such file {args.script}")
    runs = 1 if args.smoke else args.runs
    workdir = args.logs or Path(tempfile.mkdtemp(prefix="restart_reliability-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"# {runs} fail-once run(s) per launcher; logs of failed runs in {workdir}", flush=True)
    results: dict[str, list[tuple[str, float]]] = {name: [] for name in launchers}
    for i in range(runs):
        for name in launchers:
            outcome, seconds, tail = one_run(name, args, workdir)
            results[name].append((outcome, seconds))
            note = "" if outcome == "ok" else f"  <- {tail}"
            print(f"run {i + 1:3d} {name:<10} {outcome:<8} {seconds:6.1f}s{note}", flush=True)
    print()
    print(f"{'launcher':<10} {'runs':>5} {'ok':>5} {'failed':>7} {'hung':>5} "
          f"{'median s':>9} {'max s':>7}")
    for name, rs in results.items():
        outcomes = [o.split("+")[0] for o, _ in rs]
        secs = [s for _, s in rs]
        print(f"{name:<10} {len(rs):5d} {outcomes.count('ok'):5d} {outcomes.count('failed'):7d} "
              f"{outcomes.count('hung'):5d} {statistics.median(secs):9.1f} {max(secs):7.1f}")
    ours = results.get("fsm-agent", [])
    return 0 if all(o == "ok" for o, _ in ours) else 1


if __name__ == "__main__":
    sys.exit(main())
