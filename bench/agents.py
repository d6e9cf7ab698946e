"""Agent benchmarks: fsm-agent and torchrun on the same worker script, alternately.

Each function launches real agents (``bench/_probe.py``: the launcher's own ``main`` with timing
probes) with tiny workers (``bench/workers/crash_restart.py``, no torch import), and returns raw
samples; ``bench/run_all.py`` takes medians and ratios. All times are CLOCK_MONOTONIC, which
every process on one Linux machine shares.

Launchers: ``torchrun`` (torch's ``torch.distributed.run``) and ``fsm`` (``fsm-agent run``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PROBE = BENCH / "_probe.py"
WORKER = BENCH / "workers" / "crash_restart.py"
LAUNCHERS = ("torchrun", "fsm")
RUN_TIMEOUT = 120.0


def launcher_argv(launcher: str) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, str(PROBE), "torchrun"]
    if launcher == "fsm":
        return [sys.executable, str(PROBE), "fsm-agent", "run", "--spec", "torchrun"]
    raise ValueError(f"unknown launcher {launcher!r} (known: {', '.join(LAUNCHERS)})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    """One job: its agents' probe events and its workers' events."""

    launcher: str
    t_launch: float
    returncodes: list[int]
    events: list[dict[str, Any]]  # from every agent of the job
    workers: list[tuple[str, int, int, float, int]]  # (kind, rank, attempt, t, pid)
    extra: dict[str, Any] = field(default_factory=dict)

    def worker_times(self, kind: str, attempt: int | None = None) -> list[float]:
        return [t for k, _r, a, t, _p in self.workers if k == kind and attempt in (None, a)]

    def agent_events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["name"] == name]


def _read_workers(path: Path) -> list[tuple[str, int, int, float, int]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            kind, rank, attempt, t, pid = line.split()
            out.append((kind, int(rank), int(attempt), float(t), int(pid)))
    return out


def _reap_workers(workers: Sequence[tuple[str, int, int, float, int]]) -> None:
    # Workers run in their own sessions (torch starts them so): if an agent was killed, make sure
    # none of its workers outlives the benchmark.
    for _k, _r, _a, _t, pid in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _reap_leftovers(worker_file: Path) -> list[str]:
    """Kill every process still carrying this job's ``BENCH_OUT`` (an agent's child it did not
    stop: a worker that never got to record its start, a preload template) and describe each.

    The job's agents are gone by now, so anything found is a process the launcher left behind:
    the caller reports it, this only makes sure it does not outlive the benchmark.
    """
    marker = f"BENCH_OUT={worker_file}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
        found.append(f"{proc.name}: {cmd.strip()[:120]}")
    return found


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fsm-bench-") as d:
        yield Path(d)


def run_job(
    launcher: str,
    *,
    nproc: int,
    worker_args: Sequence[object],
    max_restarts: int,
    monitor_interval: float,
    nnodes: int = 1,
    on_running: Any = None,
    timeout: float = RUN_TIMEOUT,
    imports: str = "",
    preload: bool = False,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Launch one job (``nnodes`` agents on loopback) and wait for it to end.

    ``on_running(run_dir, pids)`` is called once every worker of the first attempt has started
    (the CPU benchmark samples the agents then). ``imports``: modules every worker imports after
    its start event (``BENCH_IMPORT``); ``preload``: fsm-agent preloads them (``--preload``).
    """
    with _workdir() as wd:
        worker_file = wd / "workers.txt"
        env = {**os.environ, "BENCH_OUT": str(worker_file), "PYTHONUNBUFFERED": "1"}
        env.pop("OMP_NUM_THREADS", None)
        if imports:
            env["BENCH_IMPORT"] = imports
        env.update(extra_env or {})
        common = [
            "--nproc-per-node", str(nproc),
            "--max-restarts", str(max_restarts),
            "--monitor-interval", str(monitor_interval),
        ]
        if nnodes == 1:
            topology = ["--standalone"]
        else:
            port = free_port()
            topology = [
                "--nnodes", str(nnodes),
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"bench-{port}",
            ]
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        t_launch = time.monotonic()
        for node in range(nnodes):
            log = open(wd / f"agent{node}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            node_env = {**env, "BENCH_EVENTS": str(wd / f"events{node}.jsonl")}
            warm = ["--preload", imports] if preload and launcher == "fsm" and imports else []
            argv = [
                *launcher_argv(launcher), *topology, *common, *warm,
                str(WORKER), *[str(a) for a in worker_args],
            ]
            procs.append(
                subprocess.Popen(argv, env=node_env, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=ROOT, start_new_session=True)
            )
        try:
            if on_running is not None:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    started = [w for w in _read_workers(worker_file) if w[0] == "start"]
                    if len(started) >= nproc * nnodes:
                        on_running(wd, [p.pid for p in procs])
                        break
                    if all(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.05)
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    p.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for log in logs:
                log.close()
            workers = _read_workers(worker_file)
            _reap_workers(workers)
            leftovers = _reap_leftovers(worker_file)
        events: list[dict[str, Any]] = []
        for node in range(nnodes):
            path = wd / f"events{node}.jsonl"
            if path.exists():
                events += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        run = Run(launcher, t_launch, [p.returncode for p in procs], events, workers,
                  {"leftovers": leftovers})
        if not workers or not events:
            tail = b"".join((wd / f"agent{n}.log").read_bytes()[-3000:] for n in range(nnodes))
            raise RuntimeError(
                f"{launcher} job produced no {'worker' if not workers else 'agent'} events; "
                f"agent log tail:\n{tail.decode(errors='replace')}"
            )
        run.extra["log_tail"] = (wd / "agent0.log").read_bytes()[-2000:].decode(errors="replace")
        return run


# -- measures ------------------------------------------------------------------------------------


def detection(launcher: str, interval: float, crashes: int) -> list[float]:
    """Worker exit -> the agent's FAILED observation, seconds; ``crashes`` samples from one job."""
    run = run_job(
        launcher, nproc=2, worker_args=[crashes, 1, 0.3, 0.1],
        max_restarts=crashes - 1, monitor_interval=interval,
    )
    failed = sorted(e["t1"] for e in run.agent_events("observe") if e.get("state") == "FAILED")
    samples = []
    for attempt in range(crashes):
        crash = run.worker_times("crash", attempt)
        after = [t for t in failed if crash and t >= crash[0]]
        if crash and after:
            samples.append(after[0] - crash[0])
    return samples


def _schedstat_ns(pid: int) -> int:
    """CPU time of every live thread of ``pid`` (ns; not its children)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def agent_cpu(launcher: str, seconds: float, interval: float) -> float:
    """Agent CPU (fraction of one core) while 4 workers sleep ``seconds``."""
    box: dict[str, float] = {}

    def sample(_wd: Path, pids: list[int]) -> None:
        time.sleep(0.5)
        c0, t0 = _schedstat_ns(pids[0]), time.monotonic()
        time.sleep(max(seconds - 1.5, 0.5))
        c1, t1 = _schedstat_ns(pids[0]), time.monotonic()
        box["cpu"] = (c1 - c0) / 1e9 / (t1 - t0)

    run_job(
        launcher, nproc=4, worker_args=[0, 0, 0, seconds], max_restarts=0,
        monitor_interval=interval, on_running=sample,
    )
    return box["cpu"]


def restart(launcher: str, nproc: int, restarts: int, interval: float = 0.1,
            nnodes: int = 1) -> tuple[list[float], list[dict[str, float]], Run]:
    """Crash -> every restarted worker running user code (s), one sample per restart.

    Also returns where each restart's time went, from the probes of the agent whose worker
    crashed (the first agent when there are several).
    """
    run = run_job(
        launcher, nproc=nproc, worker_args=[restarts, 0, 0.4, 0.3, 0.0 if nnodes == 1 else 0.15],
        max_restarts=restarts, monitor_interval=interval, nnodes=nnodes,
    )
    samples, phases = [], []
    for attempt in range(1, restarts + 1):
        crash = run.worker_times("crash", attempt - 1)
        starts = run.worker_times("start", attempt)
        if not crash or len(starts) < nproc * nnodes:
            continue
        t_crash, t_all = crash[0], max(starts)
        samples.append(t_all - t_crash)
        # the crashing worker's agent: the one whose observe(FAILED) follows the crash first
        failed = sorted(
            (e for e in run.agent_events("observe") if e.get("state") == "FAILED"
             and e["t1"] >= t_crash), key=lambda e: e["t1"],
        )
        if not failed:
            continue
        pid = failed[0]["pid"]
        mine = [e for e in run.events if e["pid"] == pid and e["t0"] >= t_crash - 0.001]

        def first(name: str, mine: list[dict[str, Any]] = mine) -> dict[str, Any] | None:
            return next((e for e in mine if e["name"] == name), None)

        rdzv, start = first("rendezvous"), first("start_workers")
        if rdzv is None or start is None:
            continue
        in_rdzv = [e for e in mine if rdzv["t0"] <= e["t0"] and e["t1"] <= rdzv["t1"]]
        phases.append({
            "detect": failed[0]["t1"] - t_crash,
            "stop": rdzv["t0"] - failed[0]["t1"],
            "rendezvous": rdzv["t1"] - rdzv["t0"],
            "rdzv_sleeps": sum(e["t1"] - e["t0"] for e in in_rdzv if e["name"] == "rdzv_delay"),
            "rdzv_store_ops": float(sum(1 for e in in_rdzv if e["name"].startswith("store_"))),
            "start_workers": start["t1"] - start["t0"],
            "to_user_code": t_all - start["t1"],
            "total": t_all - t_crash,
        })
    return samples, phases, run


def exit_barrier_release(run: Run) -> float | None:
    """From the last agent's arrival at the exit barrier to the last agent leaving it (s)."""
    barriers = run.agent_events("exit_barrier")
    if len(barriers) < 2:
        return None
    return max(e["t1"] for e in barriers) - max(e["t0"] for e in barriers)


def startup(run: Run, nproc: int) -> float | None:
    """Launch -> every first-attempt worker running user code (s)."""
    starts = run.worker_times("start", 0)
    if len(starts) < nproc:
        return None
    return max(starts) - run.t_launch


def warm_restart(launcher: str, nproc: int, *, preload: bool, imports: str = "torch",
                 restarts: int = 1, crash: str = "os_exit",
                 full_exit: bool = False) -> dict[str, list[float]]:
    """A fail-once job whose workers import ``imports``: from the crash to every restarted worker
    past its imports ("imported", the worker's own clock), one sample per restart; and from the
    launch to every first-attempt worker past them (``first``). ``crash``: how the crashing
    worker ends (``BENCH_CRASH`` of ``bench/workers/crash_restart.py``); ``full_exit``: a
    worker forked from the template ends with the interpreter's teardown
    (``FSM_AGENT_PRELOAD_FULL_EXIT``), as before issue 22."""
    run = run_job(
        launcher, nproc=nproc, worker_args=[restarts, 0, 0.4, 0.3], max_restarts=restarts,
        monitor_interval=0.1, imports=imports, preload=preload,
        extra_env={"BENCH_CRASH": crash, **({"FSM_AGENT_PRELOAD_FULL_EXIT": "1"} if full_exit
                                            else {})},
    )
    out: dict[str, list[float]] = {"restart": [], "first": []}
    first = run.worker_times("imported", 0)
    if len(first) >= nproc:
        out["first"].append(max(first) - run.t_launch)
    for attempt in range(1, restarts + 1):
        crash = run.worker_times("crash", attempt - 1)
        ready = run.worker_times("imported", attempt)
        if crash and len(ready) >= nproc:
            out["restart"].append(max(ready) - crash[0])
    if not out["restart"]:
        raise RuntimeError(f"{launcher} warm-restart job had no complete restart; agent log "
                           f"tail:\n{run.extra.get('log_tail', '')}")
    return out


def import_startup(launcher: str, nproc: int, *, preload: bool,
                   imports: str = "torch") -> float:
    """One job of ``nproc`` workers that import ``imports`` and finish: from the launch to the
    last worker past its imports (the first attempt, forked from the template with
    ``preload``)."""
    run = run_job(launcher, nproc=nproc, worker_args=[0, 0, 0.0, 0.1], max_restarts=0,
                  monitor_interval=0.1, imports=imports, preload=preload)
    ready = run.worker_times("imported", 0)
    if len(ready) < nproc:
        raise RuntimeError(f"{launcher}: {len(ready)} of {nproc} workers got past the imports; "
                           f"agent log tail:\n{run.extra.get('log_tail', '')}")
    return max(ready) - run.t_launch


def _agents_cpu_ns(pids: Sequence[int]) -> list[int | None]:
    out: list[int | None] = []
    for pid in pids:
        try:
            out.append(_schedstat_ns(pid))
        except OSError:
            out.append(None)
    return out


def curve_point(launcher: str, nnodes: int, nproc: int, steady: float,
                timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """One job of ``nnodes`` agents x ``nproc`` workers (nothing imported): start, a steady
    window of ``steady`` seconds while the workers sleep, one crash, one restart, finish.

    Returns start-up (launch -> every worker running), the restart (crash -> every restarted
    worker running), each agent's CPU during the steady window (fraction of a core; the agent
    that hosts the store serves every request too), the store requests all agents made during
    their first rendezvous (first agent in -> last agent out) and during the steady window (as
    counts and per second), the exit barrier's release (several agents), and anything the job
    left running (killed, and reported as ``leftovers``).
    """
    box: dict[str, Any] = {}

    def sample(_wd: Path, pids: list[int]) -> None:
        time.sleep(0.5)
        c0, t0 = _agents_cpu_ns(pids), time.monotonic()
        time.sleep(max(steady - 1.0, 0.5))
        c1, t1 = _agents_cpu_ns(pids), time.monotonic()
        box["window"] = (t0, t1)
        box["cpu"] = [(b - a) / 1e9 / (t1 - t0) for a, b in zip(c0, c1, strict=True)
                      if a is not None and b is not None]

    t_start = time.monotonic()
    # the finishing agents arrive at the exit barrier spread over at most 1.5 s
    stagger = 0.0 if nnodes == 1 else min(0.15, 1.5 / nnodes)
    run = run_job(
        launcher, nproc=nproc, worker_args=[1, 0, steady, 0.3, stagger],
        max_restarts=1, monitor_interval=0.1, nnodes=nnodes, on_running=sample,
        extra_env={"BENCH_STORE_REQS": "1"}, timeout=timeout,
    )
    wall = time.monotonic() - t_start
    crash = run.worker_times("crash", 0)
    restarted = run.worker_times("start", 1)
    requests = sorted(e["t0"] for e in run.agent_events("store_req"))
    request_ops = [(e["t0"], e.get("op", "?")) for e in run.agent_events("store_req")]

    def count(t0: float, t1: float) -> int:
        return sum(1 for t in requests if t0 <= t <= t1)

    first_rdzv: dict[int, dict[str, Any]] = {}
    for e in sorted(run.agent_events("rendezvous"), key=lambda e: e["t0"]):
        first_rdzv.setdefault(e["pid"], e)
    out: dict[str, Any] = {
        "startup": startup(run, nproc * nnodes),
        "restart": (max(restarted) - crash[0]) if crash and len(restarted) >= nproc * nnodes
        else None,
        "cpu": box.get("cpu", []),
        "exit_barrier": exit_barrier_release(run) if nnodes > 1 else None,
        "wall": wall,
        "returncodes": run.returncodes,
        "leftovers": run.extra["leftovers"],
        "store_requests": len(requests),
    }
    if len(first_rdzv) == nnodes:
        r0 = min(e["t0"] for e in first_rdzv.values())
        r1 = max(e["t1"] for e in first_rdzv.values())
        out["rdzv_s"] = r1 - r0
        out["store_rdzv_n"] = count(r0, r1)
        out["store_rdzv_per_s"] = count(r0, r1) / (r1 - r0) if r1 > r0 else None
    window = box.get("window")
    if window:
        out["store_steady_n"] = count(*window)
        out["store_steady_per_s"] = count(*window) / (window[1] - window[0])
        ops: dict[str, int] = {}
        for t, op in request_ops:
            if window[0] <= t <= window[1]:
                ops[op] = ops.get(op, 0) + 1
        out["store_steady_ops"] = ops
    return out
