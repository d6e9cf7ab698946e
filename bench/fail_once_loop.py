"""A fail-once job, 50 times in a row under ``fsm-agent run``: no hang, no spurious give-up.

Each run is ``fsm-agent run --standalone --nproc-per-node 2 --max-restarts 1 --trace T
examples/fail_once.py`` (gloo on loopback: rank 1 exits on attempt 0, both ranks must init gloo
again on attempt 1 and finish). A run counts as

- ``ok``: exit 0, both ranks printed "attempt 1: done", the trace ends in SUCCEEDED after exactly
  one restart, and no process of the run is left (found by a token in their environment);
- ``give-up``: any other exit code (the restart was burned or the job gave up);
- ``hang``: not finished within ``--timeout`` seconds (then SIGKILLed with its workers);
- ``leak``: finished, but a worker or worker child outlived it.

    python bench/fail_once_loop.py              # 50 runs (about 5-10 minutes on 2 cores)
    python bench/fail_once_loop.py --smoke      # 2 runs: checks the script works
    python bench/fail_once_loop.py --runs 200 --json results.json

Prints a line per run and a summary; exits 1 if any run was not ``ok``. ``bench/
restart_reliability.py`` (issue 6) runs the same job beside torchrun, for the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "fail_once.py"
TOKEN_VAR = "FSM_AGENT_BENCH_TOKEN"


def token_pids(token: str) -> list[int]:
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def kill_all(token: str) -> None:
    for pid in token_pids(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def one_run(n: int, workdir: Path, timeout: float) -> dict[str, object]:
    token = uuid.uuid4().hex
    trace = workdir / f"run{n}.jsonl"
    env = dict(os.environ, **{TOKEN_VAR: token, "PYTHONUNBUFFERED": "1",
                              "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    cmd = [sys.executable, "-m", "fsm_agent", "run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", "--monitor-interval", "0.1", "--trace", str(trace), str(JOB)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + 5
    while token_pids(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = token_pids(token)
    kill_all(token)
    restarts = None
    final = None
    if trace.exists():
        steps = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        steps = [s for s in steps if s.get("kind") == "step"]
        if steps:
            restarts, final = steps[-1]["restart_count"], steps[-1]["dest"]
    done = all(f"[rank {r}] attempt 1: done" in out for r in (0, 1))
    if rc is None:
        verdict = "hang"
    elif rc != 0:
        verdict = "give-up"
    elif leftover:
        verdict = "leak"
    elif done and restarts == 1 and final == "SUCCEEDED":
        verdict = "ok"
    else:
        verdict = "give-up"  # exit 0 without the restarted attempt finishing is no success
    return {"run": n, "verdict": verdict, "rc": rc, "seconds": round(seconds, 2),
            "restarts": restarts, "final": final, "leftover": leftover,
            "tail": out[-1500:] if verdict != "ok" else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is a hang")
    ap.add_argument("--smoke", action="store_true", help="2 runs")
    ap.add_argument("--json", type=Path, default=None, help="write every run's record here")
    args = ap.parse_args(argv)
    runs = 2 if args.smoke else args.runs
    results = []
    with tempfile.TemporaryDirectory(prefix="fail_once_loop_") as tmp:
        for n in range(runs):
            res = one_run(n, Path(tmp), args.timeout)
            results.append(res)
            print(f"run {n + 1:3d}/{runs}: {res['verdict']:8s} rc={res['rc']} "
                  f"{res['seconds']:6.2f} s restarts={res['restarts']}", flush=True)
            if res["tail"]:
                print(res["tail"], flush=True)
    counts = {v: sum(1 for r in results if r["verdict"] == v)
              for v in ("ok", "give-up", "hang", "leak")}
    secs = [float(r["seconds"]) for r in results]  # type: ignore[arg-type]
    print(f"\n{runs} runs: " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; seconds per run: median {statistics.median(secs):.2f}, max {max(secs):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "runs": results}, indent=1))
    return 0 if counts["ok"] == runs else 1


if __name__ == "__main__":
    sys.exit(main())
