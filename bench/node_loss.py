"""From a node's loss to the spare's workers running: a two-node job with a spare, on loopback.

    python bench/node_loss.py [--runs 5] [--smoke] [--json OUT]

Each run starts ``fsm-agent store``, two agents A and B (``--nnodes 2:2``, one worker each) and,
once both run, a spare C; then SIGKILLs the agent of group rank 0 and its worker (the machine is
lost for good) and measures, from the kill:

- ``noticed``: the survivor's log line that names the lost node (``lost node(s) of the job``;
  fsm-agent only) - torch's keep-alive expiring, then the next monitor tick or the failure;
- ``spare running``: the spare's worker started (it writes its ranks when it runs).

Scenarios (the worker scripts of tests/agent/scripts):

``collective``  every rank in a gloo all_reduce loop: the survivor's worker fails at once
                ("Connection closed by peer"); fsm-agent's resilient classifies it peer_lost
                (``--max-restarts 0``); torchrun restarts it as any failure (``--max-restarts 3``,
                the baseline, same store and keep-alive settings)
``idle``        every rank sleeping (between two collectives): nothing fails; fsm-agent's
                survivor notices the loss on a monitor tick; torchrun never does (its workers
                would block at the next collective), so it has no baseline row

Keep-alive ``keep_alive_interval=1,keep_alive_max_attempt=3`` (torch's defaults are 5 s and 3:
add 4 x 4 s to ``noticed``). Launchers alternate run by run; medians, then min and max. Runs that
did not get the spare running within 60 s are counted as failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "agent" / "scripts"
WORKERS = {"collective": SCRIPTS / "allreduce_worker.py", "idle": SCRIPTS / "slot_worker.py"}
LAUNCHERS = {
    "fsm-agent": [sys.executable, "-m", "fsm_agent", "run", "--spec", "resilient",
                  "--max-restarts", "0"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--max-restarts", "3"],
}
STORE = [sys.executable, "-m", "fsm_agent", "store", "--host", "127.0.0.1", "--port", "0"]
CONF = ("is_host=0,join_timeout=120,last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=3")
# glog's prefix: W1207 01:44:39.715000 (month, day, local time)
_LOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) ", re.M)


class Proc:
    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "out").mkdir(exist_ok=True)
        self.cwd, self.log = cwd, cwd / "output.txt"
        with open(self.log, "wb") as f:
            self.p = subprocess.Popen(cmd, cwd=cwd, env={**env, "OUT_DIR": str(cwd / "out")},
                                      stdout=f, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        found = []
        for f in sorted((self.cwd / "out").glob("slot_*.json")):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(f.read_text()))
        return found

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()


def _until(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.02)
    return bool(done())


def _log_time(line_match: re.Match[str]) -> float:
    month, day, hh, mm, ss = line_match.groups()
    now = datetime.now()
    seconds = float(ss)
    stamp = datetime(now.year, int(month), int(day), int(hh), int(mm), int(seconds),
                     round((seconds % 1) * 1e6) % 1_000_000)
    return stamp.timestamp()


def _noticed(text: str) -> float | None:
    for line in text.splitlines():
        if "lost node(s) of the job" in line:
            m = _LOG_TIME.match(line)
            if m:
                return _log_time(m)
    return None


def one_run(launcher: str, scenario: str, where: Path, n: int) -> dict[str, Any]:
    """One loss; the seconds from the kill to the survivor's notice and the spare's worker."""
    procs: list[Proc] = []
    env = {**os.environ, "STOP_FILE": str(where / "stop"), "PYTHONUNBUFFERED": "1"}
    run_id = f"loss{n}"
    try:
        store = Proc(STORE, where / "store", env)
        procs.append(store)
        if not _until(lambda: "listening on" in store.output(), 60):
            return {"ok": False, "why": "store did not start"}
        port = re.search(r"listening on 127\.0\.0\.1:(\d+) ", store.output()).group(1)  # type: ignore[union-attr]
        cmd = [*LAUNCHERS[launcher], "--nnodes", "2:2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", run_id, "--rdzv-conf", CONF, "--monitor-interval", "0.1",
               str(WORKERS[scenario])]
        nodes = [Proc(cmd, where / name, env) for name in ("a", "b")]
        procs += nodes
        if not _until(lambda: all(p.records() for p in nodes), 90):
            return {"ok": False, "why": "the first round did not start"}
        spare = Proc(cmd, where / "c", env)
        procs.append(spare)
        time.sleep(3)
        ranks = {p: p.records()[0] for p in nodes}
        lost = next(p for p in nodes if ranks[p]["group_rank"] == 0)
        survivor = next(p for p in nodes if p is not lost)
        killed = time.time()
        lost.kill()
        for rec in lost.records():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(rec["pid"]), signal.SIGKILL)
        if not _until(lambda: spare.records(), 60):
            return {"ok": False, "why": "the spare's worker did not start within 60 s"}
        running = float(spare.records()[0]["time"]) - killed
        seen = _noticed(survivor.output())
        (where / "stop").touch()
        for p in (survivor, spare):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.p.wait(60)
        return {"ok": survivor.p.returncode == 0 and spare.p.returncode == 0,
                "noticed": None if seen is None else seen - killed, "spare_running": running}
    finally:
        for p in reversed(procs):
            if p.p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per launcher and scenario")
    parser.add_argument("--smoke", action="store_true", help="one run of each (checks it works)")
    parser.add_argument("--json", type=Path, help="write the raw runs here")
    args = parser.parse_args(argv)
    runs = 1 if args.smoke else args.runs
    if runs < 1:
        parser.error("--runs must be at least 1")
    base = Path(tempfile.mkdtemp(prefix="node_loss_"))
    results: dict[str, list[dict[str, Any]]] = {}
    cases = [("fsm-agent", "collective"), ("torchrun", "collective"), ("fsm-agent", "idle")]
    try:
        for i in range(runs):
            for launcher, scenario in cases:  # alternate: load hits each alike
                r = one_run(launcher, scenario, base / f"{launcher}-{scenario}-{i}", i)
                results.setdefault(f"{launcher} {scenario}", []).append(r)
                print(f"run {i + 1}/{runs} {launcher:9} {scenario:10} {r}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n| launcher, scenario | ok | noticed (median, min-max) | spare running (median, "
          "min-max) |\n|---|---|---|---|")
    summary: dict[str, Any] = {}
    for name, rows in results.items():
        good = [r for r in rows if r.get("ok")]
        noticed = _stats([r["noticed"] for r in good if r.get("noticed") is not None])
        running = _stats([r["spare_running"] for r in good])
        summary[name] = {"ok": len(good), "runs": len(rows), "noticed": noticed,
                         "spare_running": running}

        def cell(s: dict[str, float | None]) -> str:
            if s["median"] is None:
                return "-"
            return f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})"

        print(f"| {name} | {len(good)}/{len(rows)} | {cell(noticed)} | {cell(running)} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    fsm_ok = all(s["ok"] == s["runs"] for n, s in summary.items() if n.startswith("fsm-agent"))
    return 0 if fsm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
