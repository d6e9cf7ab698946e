"""Every performance figure, fsm-agent beside torchrun, in one session.

    python bench/run_all.py                  # the full run (about 12-14 minutes on 2 quiet cores)
    python bench/run_all.py --smoke          # every measure once, small (about 2-3 minutes)
    python bench/run_all.py --only curves    # some measures; the others kept from the last run

Writes ``docs/performance.md`` (tables: fsm-agent, torchrun, ratio, target) and PNG plots under
``docs/performance/`` (when matplotlib is installed: ``pip install 'fsm-agent[bench]'``), and
the raw samples as JSON (``--json``, default ``bench/results.json``). A ``--smoke`` run writes
all of that under ``$TMPDIR/fsm-bench-smoke/`` instead (unless ``--doc``/``--json`` say where),
so it never replaces the published figures. The launchers take turns
(torchrun, fsm-agent, torchrun, ...) so that load from elsewhere on the machine falls on both.
Figures are medians; ratios are fsm-agent / torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import agents  # noqa: E402  (bench/ is not a package)

DOC = ROOT / "docs" / "performance.md"
PLOTS = ROOT / "docs" / "performance"
SMOKE_DIR = Path(tempfile.gettempdir()) / "fsm-bench-smoke"
LABEL = {"fsm": "fsm-agent", "torchrun": "torchrun"}
MEASURES = ("startup", "engine", "detection", "cpu", "restart", "warm", "scale", "barrier",
            "curves", "store", "store_scale")
#: The store load: steady requests per agent (torch's keep-alive included), at most.
STORE_GOAL = 0.5


def med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ms(x: float | None) -> str:
    return "n/a" if x is None else (f"{x * 1e3:.1f} ms" if x < 10 else f"{x:.1f} s")


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def alternate(
    reps: int, launchers: Sequence[str], fn: Callable[[str], Any]
) -> dict[str, list[Any]]:
    """Run ``fn(launcher)`` ``reps`` times per launcher, taking turns."""
    out: dict[str, list[Any]] = {name: [] for name in launchers}
    for rep in range(reps):
        order = list(launchers) if rep % 2 == 0 else list(reversed(launchers))
        for name in order:
            try:
                out[name].append(fn(name))
            except Exception as exc:  # one failed job must not lose the whole session's figures
                log(f"  {name}: {type(exc).__name__}: {str(exc)[:300]}")
    return out


# -- the measures --------------------------------------------------------------------------------


def bench_detection(smoke: bool) -> dict[str, Any]:
    reps, crashes = (1, 3) if smoke else (3, 5)
    configs = {"torchrun@0.1": ("torchrun", 0.1), "fsm@0.1": ("fsm", 0.1), "fsm@5": ("fsm", 5.0)}
    out: dict[str, list[float]] = {k: [] for k in configs}
    for rep in range(reps):
        for key, (launcher, interval) in (configs.items() if rep % 2 == 0
                                          else reversed(configs.items())):
            try:
                out[key] += agents.detection(launcher, interval, crashes)
            except Exception as exc:
                log(f"  detection {key}: {type(exc).__name__}: {str(exc)[:300]}")
    log("detection: " + ", ".join(f"{k} {ms(med(v))}" for k, v in out.items()))
    return out


def bench_cpu(smoke: bool) -> dict[str, Any]:
    seconds, reps = (4.0, 1) if smoke else (20.0, 2)
    configs = {"torchrun@0.1": ("torchrun", 0.1), "fsm@0.1": ("fsm", 0.1), "fsm@1": ("fsm", 1.0)}
    out: dict[str, list[float]] = {k: [] for k in configs}
    for rep in range(reps):
        for key, (launcher, interval) in (configs.items() if rep % 2 == 0
                                          else reversed(configs.items())):
            try:
                out[key].append(agents.agent_cpu(launcher, seconds, interval))
            except Exception as exc:
                log(f"  cpu {key}: {type(exc).__name__}: {str(exc)[:300]}")
    log("cpu: " + ", ".join(f"{k} {100 * (med(v) or 0):.3f}%" for k, v in out.items()))
    return {"seconds": seconds, **out}


def bench_restart(smoke: bool) -> dict[str, Any]:
    sizes, reps, restarts = ([2, 8], 1, 2) if smoke else ([2, 8], 2, 3)
    out: dict[str, Any] = {}
    for n in sizes:
        runs = alternate(
            reps, ["torchrun", "fsm"], lambda L, n=n: agents.restart(L, n, restarts)[:2]
        )
        out[str(n)] = {
            L: {"samples": [s for r in rs for s in r[0]], "phases": [p for r in rs for p in r[1]]}
            for L, rs in runs.items()
        }
        log(f"restart {n} workers: " + ", ".join(
            f"{L} {ms(med(v['samples']))}" for L, v in out[str(n)].items()))
    return out


def bench_scale(smoke: bool) -> dict[str, Any]:
    """64 workers on one agent, and 8 agents x 4 workers: start, fail once, recover, finish."""
    single, multi = (16, (4, 2)) if smoke else (64, (8, 4))
    cases = {f"1x{single}": (1, single), f"{multi[0]}x{multi[1]}": multi}
    out: dict[str, Any] = {}
    for name, (nnodes, nproc) in cases.items():
        # their start-up and exit barrier release are rows of the summary, and one job's
        # start-up varies by 0.3 s: five 64-worker jobs (about 5 s each on a quiet machine) and
        # three multi-agent ones (about 15 s) per launcher
        reps = 1 if smoke else (5 if nnodes == 1 else 3)
        def job(launcher: str, nnodes: int = nnodes, nproc: int = nproc) -> dict[str, Any]:
            t0 = time.monotonic()
            samples, phases, run = agents.restart(launcher, nproc, 1, nnodes=nnodes)
            wall = time.monotonic() - t0
            det = [p["detect"] for p in phases]
            return {
                "startup": agents.startup(run, nproc * nnodes),
                "restart": samples[0] if samples else None,
                "detect": det[0] if det else None,
                "exit_barrier": agents.exit_barrier_release(run),
                "wall": wall,
                "returncodes": run.returncodes,
                "phases": phases,
            }

        out[name] = {"nnodes": nnodes, "nproc": nproc,
                     **alternate(reps, ["torchrun", "fsm"], job)}
        log(f"scale {name}: " + ", ".join(
            f"{L} restart {ms(med([r['restart'] for r in out[name][L] if r['restart']]))}"
            for L in ("torchrun", "fsm")))
    return out


def bench_warm(smoke: bool) -> dict[str, Any]:
    """The warm restart: a fail-once job whose 2 workers import torch; from the crash to
    every restarted worker's line after ``import torch`` (the workers' own clocks). fsm-agent with
    ``--preload torch`` against torchrun; fsm-agent cold as a reference (full run only)."""
    reps, restarts = (1, 1) if smoke else (2, 3)
    configs = {"torchrun": ("torchrun", False), "fsm --preload": ("fsm", True)}
    if not smoke:
        configs["fsm cold"] = ("fsm", False)
    out: dict[str, Any] = {"nproc": 2, "imports": "torch",
                           **{k: {"restart": [], "first": []} for k in configs}}
    for rep in range(reps):
        for key, (launcher, preload) in (configs.items() if rep % 2 == 0
                                         else reversed(configs.items())):
            try:
                got = agents.warm_restart(launcher, 2, preload=preload, restarts=restarts)
            except Exception as exc:
                log(f"  warm {key}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            for k in ("restart", "first"):
                out[key][k] += got[k]
    log("warm restart: " + ", ".join(f"{k} {ms(med(out[k]['restart']))}" for k in configs))
    out["crashes"] = bench_real_crashes(smoke)
    out["startup"] = bench_preload_startup(smoke)
    return out


def bench_preload_startup(smoke: bool) -> dict[str, Any]:
    """The preloaded start-up: launch -> every worker of a 1 x 8 job past ``import torch``,
    fsm-agent ``--preload torch`` (the first attempt forked from the template) against torchrun."""
    nproc, reps = (4, 1) if smoke else (8, 3)
    launchers = {"torchrun": ("torchrun", False), "fsm --preload": ("fsm", True)}
    runs = alternate(reps, list(launchers), lambda key: agents.import_startup(
        launchers[key][0], nproc, preload=launchers[key][1]))
    log(f"preloaded start-up 1x{nproc}: " + ", ".join(f"{k} {ms(med(v))}" for k, v in runs.items()))
    return {"nproc": nproc, **runs}


#: Real crashes (``BENCH_CRASH`` of ``bench/workers/crash_restart.py``): the crashing
#: interpreter tears down before the process is gone, unlike the ``os._exit(1)`` above.
REAL_CRASHES = {"sys_exit": "`sys.exit(1)`", "exception": "an uncaught exception"}


def bench_real_crashes(smoke: bool) -> dict[str, Any]:
    """The warm restart after a real crash, fsm-agent ``--preload torch`` against torchrun."""
    reps, restarts = (1, 1) if smoke else (2, 3)
    launchers = {"torchrun": ("torchrun", False), "fsm --preload": ("fsm", True)}
    if not smoke:  # the forked worker's interpreter teardown kept: what the fast exit saves
        launchers["fsm --preload, full exit"] = ("fsm", True)
    out: dict[str, Any] = {}
    for crash in REAL_CRASHES:
        runs = alternate(reps, list(launchers), lambda key, crash=crash: agents.warm_restart(
            launchers[key][0], 2, preload=launchers[key][1], restarts=restarts, crash=crash,
            full_exit=key.endswith("full exit")))
        out[crash] = {key: [s for got in rs for s in got["restart"]] for key, rs in runs.items()}
        log(f"real crash {crash}: " + ", ".join(
            f"{k} {ms(med(v))}" for k, v in out[crash].items()))
    return out


#: The scale curves: workers per agent on one agent, and agents of one worker on loopback.
CURVE_WORKERS, CURVE_AGENTS = (1, 8, 64), (2, 8, 32)
SMOKE_WORKERS, SMOKE_AGENTS = (1, 4), (2,)


def curve_timeout(nnodes: int, nproc: int) -> float:
    """Generous for 2 cores: each agent imports torch (~3 s of CPU), each worker starts Python."""
    return 60.0 + 8.0 * nnodes + 0.5 * nnodes * nproc


def _curve_job(launcher: str, nnodes: int, nproc: int, steady: float,
               timeout: float) -> dict[str, Any]:
    # a point that fails (32 agents on 2 cores may) is a row saying so, not a missing row
    try:
        return agents.curve_point(launcher, nnodes, nproc, steady, timeout=timeout)
    except Exception as exc:
        log(f"  {launcher} {nnodes}x{nproc}: {type(exc).__name__}: {str(exc)[:300]}")
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", "cpu": [],
                "leftovers": [], "returncodes": []}


def bench_curves(smoke: bool) -> dict[str, Any]:
    """Restart latency, agent CPU and store requests against workers per agent and agents."""
    workers, nodes = (SMOKE_WORKERS, SMOKE_AGENTS) if smoke else (CURVE_WORKERS, CURVE_AGENTS)
    steady = 2.5 if smoke else 4.0
    points = [(1, n) for n in workers] + [(n, 1) for n in nodes]
    out: dict[str, Any] = {"steady_s": steady, "points": []}
    for nnodes, nproc in points:
        # one job per point and launcher (the whole run must stay under 15 minutes; 32 agents
        # is about 50 s a job), two at the cheap points both curves start from
        reps = 2 if not smoke and nnodes * nproc <= 2 else 1
        timeout = curve_timeout(nnodes, nproc)
        runs = alternate(reps, ["torchrun", "fsm"], lambda L, a=nnodes, w=nproc, t=timeout:
                         _curve_job(L, a, w, steady, t))
        for L, rows in runs.items():
            for r in rows:
                if r["leftovers"]:
                    log(f"  {L} {nnodes}x{nproc}: killed {len(r['leftovers'])} processes left "
                        f"running: {r['leftovers'][:3]}")
        point = {"nnodes": nnodes, "nproc": nproc, "timeout_s": timeout, **runs}
        out["points"].append(point)
        log(f"curves {nnodes}x{nproc}: " + ", ".join(
            f"{L} restart {ms(med(_vals(runs[L], 'restart')))} cpu "
            f"{100 * (med([c for r in runs[L] for c in r['cpu']]) or 0):.3f}% store "
            f"{med(_vals(runs[L], 'store_steady_per_s')) or 0:.1f}/s" for L in runs))
    return out


def bench_store(smoke: bool) -> dict[str, Any]:
    """The store load as a new user sees it: 4 healthy agents, one sleeping worker each,
    c10d on loopback; every store request of the agents in a steady window, per agent."""
    nnodes, steady, reps = (4, 3.0, 1) if smoke else (4, 10.0, 2)
    timeout = curve_timeout(nnodes, 1) + steady
    runs = alternate(reps, ["torchrun", "fsm"],
                     lambda L: _curve_job(L, nnodes, 1, steady, timeout))
    out: dict[str, Any] = {"nnodes": nnodes, "steady_s": steady}
    for L, rows in runs.items():
        out[L] = [{"per_agent": r["store_steady_per_s"] / nnodes,
                   "ops": r.get("store_steady_ops", {}), "returncodes": r["returncodes"]}
                  for r in rows if r.get("store_steady_per_s") is not None]
    log("store: " + ", ".join(
        f"{L} {med([r['per_agent'] for r in out[L]]) or 0:.2f} req/s per agent"
        for L in ("torchrun", "fsm")))
    return out


def run_script(script: str, smoke: bool) -> dict[str, Any]:
    out_json = BENCH / f".{script}.json"
    cmd = [sys.executable, str(BENCH / f"{script}.py"), "--json", str(out_json)]
    if smoke:
        cmd.append("--smoke")
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads(out_json.read_text())
    out_json.unlink()
    return data


# -- report ----------------------------------------------------------------------------------


def _vals(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def render(results: dict[str, Any], command: str, smoke: bool) -> str:
    lines: list[str] = []
    add = lines.append
    env = results["env"]
    add("# Performance: fsm-agent beside torchrun")
    add("")
    add("Produced by:")
    add("")
    add("```")
    add(command)
    add("```")
    add("")
    add(f"{env['date']} · {env['cpus']} CPUs · Linux {env['kernel']} · Python {env['python']} · "
        f"torch {env['torch']} · waker backend `{env['waker']}` · measuring time "
        f"{env['wall_s']:.0f} s"
        + (" · **smoke run: small samples, indicative only**" if smoke else "")
        + (f" · {env['partial']}" if env.get("partial") else ""))
    add("")
    add("fsm-agent is `fsm-agent run --spec torchrun`, torchrun is `torch.distributed.run`; both")
    add("run in `bench/_probe.py`, which wraps torch's own agent methods with identical timing")
    add("probes, on the same worker script (`bench/workers/crash_restart.py`, no torch import).")
    add("Launchers take turns within the session. Figures are medians (n = number of samples);")
    add("ratio is fsm-agent / torchrun. Jobs are single node (`--standalone`) unless said.")
    add("")

    # summary table
    det, cpu, rst = results.get("detection", {}), results.get("cpu", {}), results.get("restart", {})
    add("## Summary")
    add("")
    add("Targets marked (#13) are the scale targets: at or ahead of torchrun, same run, same "
        "interval.")
    add("A row without figures was not measured in this run.")
    add("")
    add("| measure | fsm-agent | torchrun | ratio | target | verdict |")
    add("|---|---|---|---|---|---|")

    def row(measure: str, f: float | None, t: float | None, fmt: Callable[[float | None], str],
            target: str, limit: float) -> None:
        """One fsm-agent / torchrun row whose target is a ratio (``limit``)."""
        ok = None if f is None or t is None or t == 0 else f / t <= limit
        add(f"| {measure} | {fmt(f)} | {fmt(t)} | {ratio(f, t)} | {target} | {_verdict(ok)} |")

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.3f}% of a core"

    if det:
        f1, f5, t1 = med(det["fsm@0.1"]), med(det["fsm@5"]), med(det["torchrun@0.1"])
        ok = None if f1 is None or t1 is None else (
            f1 <= 0.005 and (f5 is None or f5 <= 0.005) and f1 <= t1 / 5)
        add(f"| detection latency, monitor interval 0.1 s (n={len(det['fsm@0.1'])}/"
            f"{len(det['torchrun@0.1'])}) | {ms(f1)} | {ms(t1)} | {ratio(f1, t1)} | "
            f"<= 5 ms and <= 0.2x | {_verdict(ok)} |")
        add(f"| detection latency, fsm-agent at monitor interval 5 s (n={len(det['fsm@5'])}) | "
            f"{ms(f5)} | (torchrun: ~2.5 s, half the interval) | | <= 5 ms | "
            f"{_verdict(None if f5 is None else f5 <= 0.005)} |")
    seconds = f"{cpu['seconds']:.0f} s" if cpu else ""
    row(f"agent CPU, 4 workers sleeping {seconds}, both at 0.1 s (n={len(cpu.get('fsm@0.1', []))}/"
        f"{len(cpu.get('torchrun@0.1', []))})", med(cpu.get("fsm@0.1", [])),
        med(cpu.get("torchrun@0.1", [])), pct, "<= 0.5x (#13)", 0.5)
    if cpu:
        row("agent CPU, fsm-agent at 1 s against torchrun at 0.1 s (failures still seen at once)",
            med(cpu["fsm@1"]), med(cpu["torchrun@0.1"]), pct, "<= 0.5x", 0.5)
    for n, by in rst.items():
        row(f"restart latency, {n} workers (n={len(by['fsm']['samples'])}/"
            f"{len(by['torchrun']['samples'])})", med(by["fsm"]["samples"]),
            med(by["torchrun"]["samples"]), ms, "<= 0.8x", 0.8)
    warm = results.get("warm", {})
    wf, wt = warm.get("fsm --preload", {}).get("restart", []), warm.get("torchrun", {}).get(
        "restart", [])
    row(f"warm restart: crash -> restarted workers past `import torch`, fsm-agent `--preload "
        f"torch` (n={len(wf)}/{len(wt)})", med(wf), med(wt), ms, "<= 0.25x (#13)", 0.25)
    for crash, how in REAL_CRASHES.items():
        got = warm.get("crashes", {}).get(crash, {})
        cf, ct = got.get("fsm --preload", []), got.get("torchrun", [])
        row(f"real crash ({how}, torch imported), warm restart: crash -> restarted workers "
            f"past `import torch`, fsm-agent `--preload torch` (n={len(cf)}/{len(ct)})",
            med(cf), med(ct), ms, "<= 0.25x (#22)", 0.25)
    ps = warm.get("startup", {})
    pf, pt = ps.get("fsm --preload", []), ps.get("torchrun", [])
    row(f"preloaded start-up, 1 x {ps.get('nproc', 8)} workers importing torch: launch -> every "
        f"worker past "
        f"`import torch`, fsm-agent `--preload torch` (n={len(pf)}/{len(pt)})",
        med(pf), med(pt), ms, "<= 0.3x (#22)", 0.3)
    scale = results.get("scale", {})
    for label, pick in (("1 x 64", lambda v: v["nnodes"] == 1),
                        ("8 x 4", lambda v: v["nnodes"] > 1)):
        case = next((v for v in scale.values() if pick(v)), None)
        name = label if case is None else f"{case['nnodes']} x {case['nproc']}"
        rows = case or {"fsm": [], "torchrun": []}
        fs, ts = _vals(rows["fsm"], "startup"), _vals(rows["torchrun"], "startup")
        row(f"start-up, {name} workers: launch -> every worker running (n={len(fs)}/{len(ts)})",
            med(fs), med(ts), ms, "<= 1x (#13)", 1.0)
    multi = next((v for v in scale.values() if v["nnodes"] > 1), None)
    fb = _vals(multi["fsm"], "exit_barrier") if multi else []
    tb = _vals(multi["torchrun"], "exit_barrier") if multi else []
    row(f"exit barrier release, {multi['nnodes'] if multi else 8} agents (last arrival -> all "
        f"left; n={len(fb)}/{len(tb)})", med(fb), med(tb), ms, "<= 1x (#13)", 1.0)
    bar = results.get("barrier")
    if bar:
        f, t = bar["fsm"]["median_s"], bar["torch"]["median_s"]
        n = len(bar["fsm"]["samples"])
        add(f"| exit barrier release, {bar['agents']} agents, barrier alone (n={n})"
            f" | {ms(f)} | {ms(t)} | {ratio(f, t)} | <= 50 ms | "
            f"{_verdict(None if f is None else f <= 0.05)} |")
    eng = results.get("engine")
    if eng:
        f, t = eng["observe_healthy_us"], eng["torch_tick_us"]
        add(f"| engine: one observe() of a healthy tick, against torch's loop body on the same "
            f"no-op driver | {f:.1f} us | {t:.1f} us | {f / t:.2f} | <= 15 us; <= 1x (#13) | "
            f"{_verdict(f <= 15 and f <= t)} |")
        for key, target in (("build_10000_s", 0.5), ("build_100000_s", 5.0)):
            if key in eng:
                count = int(key.split("_")[1])
                add(f"| engine: build {count:,} lifecycles | {eng[key]:.2f} s | "
                    f"add_model route: {eng['add_model_s']:.2f} s for {eng['add_model_count']:,} "
                    f"| | < {target} s | {_verdict(eng[key] < target)} |")
        add(f"| engine: {eng['observations']:,} observations over {eng['population']:,} "
            f"lifecycles | {eng['observations_s']:.2f} s | | | "
            f"{'< 30 s' if not smoke else '(smoke size)'} | "
            f"{_verdict(None if smoke else eng['observations_s'] < 30)} |")
    else:
        add("| engine: one observe() of a healthy tick, against torch's loop body | n/a | n/a | "
            "n/a | <= 1x (#13) | n/a |")
    st = results.get("startup")
    if st:
        for name in ("import fsm_agent", "fsm-agent check", "fsm-agent diagram", "fsm-agent diff"):
            f = st[name]
            add(f"| start-up: `{name}` (wall; CPU {f['cpu_median_s'] * 1e3:.0f} ms; torch imported:"
                f" {'yes' if f['imports_torch'] else 'no'}) | {ms(f['median_s'])} | "
                f"`import torch`: {ms(st['import torch']['median_s'])} | | < 0.3 s | "
                f"{_verdict(f['median_s'] < 0.3 and not f['imports_torch'])} |")
    render_store_rows(results, add)
    add("")

    if det:
        add("## Failure detection")
        add("")
        add("Worker exit (the worker's own timestamp just before `os._exit(1)`) to the agent's")
        add("`_monitor_workers` returning FAILED (the observation the lifecycle receives next).")
        add("torchrun finds the exit on its next tick; fsm-agent waits on a pidfd per worker")
        add("(`fsm_agent/torch/_wakeup.py`) and looks at once, so its figure does not depend on")
        add("the interval. What remains is torch's own `_poll()`: reaping, then SIGTERM to the")
        add("other workers and waiting for them before it reports the failure.")
        add("")
        add("| config | n | median | min | max |")
        add("|---|---|---|---|---|")
        for k, v in det.items():
            add(f"| {k} | {len(v)} | {ms(med(v))} | {ms(min(v) if v else None)} | "
                f"{ms(max(v) if v else None)} |")
        add("")
    if rst:
        add("## Restart latency and where it goes")
        add("")
        add("From the crash (worker timestamp) to the last restarted worker running its first line")
        add("of user code. Phases from the probes of the crashing agent (medians):")
        add("")
        keys = ["detect", "stop", "rendezvous", "rdzv_sleeps", "rdzv_store_ops", "start_workers",
                "to_user_code", "total"]
        add("| workers | launcher | n | " + " | ".join(keys) + " |")
        add("|---|---|---|" + "---|" * len(keys))
        for n, by in rst.items():
            for L in ("torchrun", "fsm"):
                ph = by[L]["phases"]
                cells = []
                for k in keys:
                    v = med(_vals(ph, k))
                    cells.append("n/a" if v is None else (f"{v:.0f}" if k == "rdzv_store_ops"
                                                          else ms(v)))
                add(f"| {n} | {LABEL[L]} | {len(ph)} | " + " | ".join(cells) + " |")
        add("")
        add("`rendezvous` is torch's `_rendezvous` (the c10d `next_rendezvous` plus rank")
        add("assignment); `rdzv_sleeps` the part of it spent in the rendezvous' own `_delay`;")
        add("`rdzv_store_ops` its state reads and writes on the store; `to_user_code` the worker")
        add("processes' start (fork, exec, interpreter start-up) after `_start_workers` returned.")
        add("")
    if scale:
        add("## Scale")
        add("")
        add("Each job starts, has one worker crash, restarts once and finishes. Multi-agent jobs")
        add("run N agent processes on loopback with the c10d rendezvous (`--nnodes N")
        add("--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT`). `startup`: launch to every")
        add("worker running; `exit barrier`: last agent's arrival to the last agent leaving.")
        add("")
        add("| job | launcher | n | startup | detect | restart | exit barrier | wall |")
        add("|---|---|---|---|---|---|---|---|")
        for case in scale.values():
            for L in ("torchrun", "fsm"):
                rows = case[L]
                add(f"| {case['nnodes']} x {case['nproc']} | {LABEL[L]} | {len(rows)} | "
                    + " | ".join(ms(med(_vals(rows, k)))
                                 for k in ("startup", "detect", "restart", "exit_barrier", "wall"))
                    + " |")
        add("")
    if warm:
        add("## Warm restart (`--preload`)")
        add("")
        add(f"A fail-once job of {warm['nproc']} workers that import `{warm['imports']}` first")
        add("(`BENCH_IMPORT`): `restart` is the crash (the worker's timestamp) to the last")
        add("restarted worker's line after the import, `first` the launch to the first attempt's.")
        add("fsm-agent `--preload` forks the workers from a template that imported the modules")
        add("once; cold, each worker imports them itself, as under torchrun.")
        add("")
        add("| launcher | n | restart | min | max | first start |")
        add("|---|---|---|---|---|---|")
        for key in ("torchrun", "fsm --preload", "fsm cold"):
            if key in warm:
                r = warm[key]["restart"]
                add(f"| {key.replace('fsm', 'fsm-agent')} | {len(r)} | {ms(med(r))} | "
                    f"{ms(min(r) if r else None)} | {ms(max(r) if r else None)} | "
                    f"{ms(med(warm[key]['first']))} |")
        add("")
        crashes = warm.get("crashes", {})
        if crashes:
            add("The same job (fsm-agent `--preload torch` against torchrun) when the crash is a")
            add("real one, whose interpreter, with torch imported, tears down before the process")
            add("is gone (`BENCH_CRASH`): from the crash to the last restarted worker past")
            add("`import torch`. `full exit`: the forked worker ends with the interpreter's")
            add("teardown (`FSM_AGENT_PRELOAD_FULL_EXIT=1`), as every warm worker did before")
            add("the fast exit (`fsm_agent/torch/_template.py`).")
            add("")
            add("| crash | launcher | n | restart | min | max |")
            add("|---|---|---|---|---|---|")
            for crash, by in crashes.items():
                for key, r in by.items():
                    add(f"| {REAL_CRASHES.get(crash, crash)} | {key.replace('fsm', 'fsm-agent')} "
                        f"| {len(r)} | {ms(med(r))} | {ms(min(r) if r else None)} | "
                        f"{ms(max(r) if r else None)} |")
            add("")
        ps = warm.get("startup", {})
        if ps:
            add(f"Start-up of a 1 x {ps['nproc']} job whose workers import `torch` and finish:")
            add("from the launch to the last worker past `import torch` (fsm-agent `--preload")
            add("torch`: the first attempt forked from the template, which `fsm-agent run`")
            add("launches before it imports torch itself).")
            add("")
            add("| launcher | n | start-up | min | max |")
            add("|---|---|---|---|---|")
            for key in ("torchrun", "fsm --preload"):
                r = ps.get(key, [])
                add(f"| {key.replace('fsm', 'fsm-agent')} | {len(r)} | {ms(med(r))} | "
                    f"{ms(min(r) if r else None)} | {ms(max(r) if r else None)} |")
            add("")
    curves = results.get("curves")
    if curves:
        render_curves(curves, add)
    if results.get("store") or results.get("store_scale"):
        render_store(results, add)
    if eng:
        add("## Engine cost")
        add("")
        add("`bench/engine_cost.py`: a `torchrun`-preset Lifecycle on a no-op driver, so only the")
        add("engine is timed (in-process, warm; one tick in a live agent costs more, with cold")
        add("caches every 0.1 s).")
        add("")
        add("| figure | value |")
        add("|---|---|")
        for k, v in eng.items():
            add(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v:,} |")
        add("")
    if st:
        add("## Start-up")
        add("")
        add("Fresh interpreter per run, median wall and CPU time (`bench/startup.py`).")
        add("")
        add("| command | wall | CPU | imports torch |")
        add("|---|---|---|---|")
        for name, f in st.items():
            add(f"| `{name}` | {ms(f['median_s'])} | {ms(f['cpu_median_s'])} | "
                f"{ {True: 'yes', False: 'no'}.get(f.get('imports_torch'), '') } |")
        add("")
    if results.get("plots"):
        add("## Plots")
        add("")
        for p in results["plots"]:
            add(f"![{Path(p).stem}](performance/{Path(p).name})")
            add("")
    elif results.get("plots_note"):
        add(f"Plots: {results['plots_note']}")
        add("")
    notes = results.get("notes")
    if notes:
        add("## Notes")
        add("")
        lines.extend(notes)
        add("")
    return "\n".join(lines)


def _curve_cells(rows: list[dict[str, Any]]) -> list[str]:
    ok = [r for r in rows if "error" not in r]
    cpu = [c for r in ok for c in r["cpu"]]
    rdzv, steady = _vals(ok, "store_rdzv_per_s"), _vals(ok, "store_steady_per_s")
    problems = [r["error"] for r in rows if "error" in r]
    problems += [f"exit codes {r['returncodes']}" for r in ok if any(r["returncodes"])]
    problems += [f"{len(r['leftovers'])} processes left running (killed)"
                 for r in ok if r["leftovers"]]
    return [
        str(len(ok)),
        ms(med(_vals(ok, "startup"))),
        ms(med(_vals(ok, "restart"))),
        "n/a" if not cpu else f"{100 * statistics.median(cpu):.3f}% / {100 * max(cpu):.3f}%",
        "n/a" if not rdzv else f"{statistics.median(rdzv):.0f} (in {ms(med(_vals(ok, 'rdzv_s')))})",
        "n/a" if not steady else f"{statistics.median(steady):.1f}",
        "n/a" if not ok or not _vals(ok, "store_rdzv_n") else
        f"{statistics.median(_vals(ok, 'store_rdzv_n')):.0f}",
        "; ".join(problems) or "",
    ]


def render_curves(curves: dict[str, Any], add: Callable[[str], None]) -> None:
    add("## Cost as the work grows")
    add("")
    add("One job per row and launcher, at `--monitor-interval 0.1`, workers that import nothing:")
    add("start, a steady window of "
        f"{curves['steady_s']:.0f} s while the workers sleep, one crash, one restart, finish.")
    add("Rows `1 x W` are one agent (`--standalone`) with W workers; rows `A x 1` are A agents on")
    add("loopback (c10d rendezvous), one worker each. `start-up`: launch -> every worker running;")
    add("`restart`: crash -> every restarted worker running; `agent CPU`: each agent's CPU in the")
    add("steady window, median / max over the agents (the max is the agent that hosts the store);")
    add("`store req/s`: requests to the store by all agents (`BENCH_STORE_REQS`, every")
    add("`TCPStore`/`PrefixStore` call), during the first rendezvous (first agent in -> last out)")
    add("and in the steady window; `rdzv requests`: the rendezvous' requests in all.")
    add("")
    add("| agents x workers | launcher | n | start-up | restart | agent CPU (median / max) | "
        "store req/s, rendezvous | store req/s, steady | rdzv requests | problems |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for p in curves["points"]:
        for L in ("torchrun", "fsm"):
            add(f"| {p['nnodes']} x {p['nproc']} | {LABEL[L]} | "
                + " | ".join(_curve_cells(p.get(L, []))) + " |")
    add("")


def _store_medians(store: dict[str, Any]) -> tuple[float | None, float | None]:
    return (med([r["per_agent"] for r in store.get("fsm", [])]),
            med([r["per_agent"] for r in store.get("torchrun", [])]))


def render_store_rows(results: dict[str, Any], add: Callable[[str], None]) -> None:
    """The summary's rows for the store: the store load, and the scale harness's goals."""
    store = results.get("store") or {}
    f, t = _store_medians(store)
    n = (len(store.get("fsm", [])), len(store.get("torchrun", [])))
    ok = None if f is None or t is None else f <= STORE_GOAL and f < t
    add(f"| store load: steady requests per agent, {store.get('nnodes', 4)} healthy agents "
        f"(torch's own included; n={n[0]}/{n[1]}) | "
        + " | ".join("n/a" if x is None else f"{x:.2f}/s" for x in (f, t))
        + f" | {ratio(f, t)} | <= {STORE_GOAL}/s and below torchrun (#22) | {_verdict(ok)} |")
    scale = results.get("store_scale") or {}
    goal = scale.get("goals") or {}
    size = goal.get("agents", 4096)
    learn, host = goal.get("learn_p99_s"), goal.get("host_cpu")
    add(f"| store scale: announcement -> the last of {size:,} agents knows it, p99 "
        f"(`bench/store_scale.py`) | {ms(learn)} | | | <= 5 s at 4,096 (#22) | "
        f"{_verdict(goal.get('learn_met') if goal else None)} |")
    add(f"| store scale: the store host's CPU, {size:,} healthy agents | "
        + ("n/a" if host is None else f"{host:.3f} cores")
        + f" | | | < 0.5 core at 4,096 (#22) | "
        f"{_verdict(goal.get('host_met') if goal else None)} |")
    exact = "n/a" if not goal else ("exact" if goal.get("ledger_exact") else "wrong")
    add(f"| store scale: restart ledger under a failure storm (every agent claims the same "
        f"round at once) | {exact} | | | one entry per round (#22) | "
        f"{_verdict(goal.get('ledger_exact') if goal else None)} |")


def render_store(results: dict[str, Any], add: Callable[[str], None]) -> None:
    """The store section: the store load of real agents and the scale harness's curves."""
    add("## The rendezvous store at scale")
    add("")
    store = results.get("store")
    if store:
        add(f"Real agents: {store['nnodes']} agents on loopback (c10d), one sleeping worker "
            f"each, every `TCPStore`/`PrefixStore` call of the agents in a "
            f"{store['steady_s']:.0f} s steady window (`BENCH_STORE_REQS`), per agent; by "
            "operation, summed over the agents and runs:")
        add("")
        add("| launcher | n | requests per agent per second | by operation |")
        add("|---|---|---|---|")
        for L in ("torchrun", "fsm"):
            rows = store.get(L, [])
            ops: dict[str, int] = {}
            for r in rows:
                for k, v in r["ops"].items():
                    ops[k] = ops.get(k, 0) + v
            per = med([r["per_agent"] for r in rows])
            add(f"| {LABEL[L]} | {len(rows)} | {'n/a' if per is None else f'{per:.2f}'} | "
                + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) + " |")
        add("")
    scale = results.get("store_scale")
    if scale:
        add("Simulated agents (`bench/store_scale.py`): the real `JobChannel`/`AgentJob` code "
            "of N agents in a few client processes, one `TCPStore` server process (libuv), "
            f"loopback, {scale['cores']} cores; `watch` is the agents' scheme, `poll` the 0.2 s "
            "poll they had before. Steady: a "
            f"{scale['steady_s']:.0f} s window of healthy agents ticking once a second; "
            "`learn`: one agent's announcement to each agent knowing it; `storm`: every agent "
            "claims the same round's restart at once, until every claim returned. torch's own "
            "rendezvous traffic is not simulated.")
        add("")
        add("| agents | scheme | client processes | store req/s | per agent | store host CPU | "
            "learn p50 | learn p99 | learn max | knew it | storm | ledger |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in scale["rows"]:
            storm = max((s["s"] for s in r["storm"]), default=None)
            storm_cpu = max((s["host_cpu_s"] for s in r["storm"]), default=0.0)
            add(f"| {r['agents']:,} | {r['mode']} | {r['procs']} | {r['req_per_s']:.1f} | "
                f"{r['req_per_agent_s']:.3f} | {100 * r['host_cpu']:.1f}% | "
                f"{ms(r.get('learn_p50'))} | {ms(r.get('learn_p99'))} | "
                f"{ms(r.get('learn_max'))} | {r['learnt']}/{r['agents']} | {ms(storm)} "
                f"({storm_cpu:.2f} s host CPU) | "
                f"{'exact' if r['ledger_exact'] else r['ledger']} |")
        add("")


def _save(fig: Any, path: Path, plt: Any, dpi: int = 110) -> str:
    """Lay out, write and close one figure; its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)


def plot(results: dict[str, Any], where: Path = PLOTS) -> list[str]:
    """PNGs into ``where`` (the doc's ``performance/`` folder)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        results["plots_note"] = ("not drawn: matplotlib is not installed "
                                 "(`pip install 'fsm-agent[bench]'`).")
        return []
    where.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    det = results.get("detection")
    if det:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        keys = [k for k in det if det[k]]
        ax.boxplot([[x * 1e3 for x in det[k]] for k in keys])
        ax.set_xticks(range(1, len(keys) + 1), keys)
        ax.set_yscale("log")
        ax.set_ylabel("worker exit -> FAILED observed (ms, log)")
        ax.set_title("Failure detection latency")
        written.append(_save(fig, where / "detection.png", plt))

    rst = results.get("restart")
    if rst:
        phases = ["detect", "stop", "rendezvous", "start_workers", "to_user_code"]
        labels, stacks = [], []
        for n, by in rst.items():
            for L in ("torchrun", "fsm"):
                ph = by[L]["phases"]
                labels.append(f"{LABEL[L]}\n{n} workers")
                stacks.append([(med(_vals(ph, k)) or 0) * 1e3 for k in phases])
        fig, ax = plt.subplots(figsize=(7, 3.6))
        bottom = [0.0] * len(labels)
        for i, k in enumerate(phases):
            vals = [s[i] for s in stacks]
            ax.bar(labels, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_ylabel("ms (medians)")
        ax.set_title("Restart latency: crash -> restarted workers in user code")
        ax.legend(fontsize=7)
        written.append(_save(fig, where / "restart_phases.png", plt))

    scale = results.get("scale")
    if rst or scale:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        for L, marker, color in (("torchrun", "o", "tab:blue"), ("fsm", "s", "tab:orange")):
            pts: list[tuple[int, float]] = []
            multi_pts: list[tuple[int, float, str]] = []
            for n, by in (rst or {}).items():
                v = med(by[L]["samples"])
                if v is not None:
                    pts.append((int(n), v * 1e3))
            for case in (scale or {}).values():
                v = med(_vals(case[L], "restart"))
                if v is None:
                    continue
                size = case["nnodes"] * case["nproc"]
                if case["nnodes"] == 1:
                    pts.append((size, v * 1e3))
                else:
                    multi_pts.append((size, v * 1e3, f"{case['nnodes']}x{case['nproc']}"))
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                    label=f"{LABEL[L]}, one agent")
            for x, y, tag in multi_pts:
                ax.scatter([x], [y], marker="D", color=color, s=50,
                           label=f"{LABEL[L]}, {tag} agents x workers")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers in the job")
        ax.set_ylabel("restart latency (ms, median)")
        ax.set_title("Restart latency vs job size")
        ax.legend(fontsize=7)
        written.append(_save(fig, where / "scale.png", plt))

    curves = results.get("curves")
    if curves and curves.get("points"):
        written += plot_curves(curves, where, plt)
    return written


def plot_curves(curves: dict[str, Any], where: Path, plt: Any) -> list[str]:
    """curves.png: restart, agent CPU and start-up against workers per agent and agents;
    store_requests.png: store requests/s during rendezvous and steady, against agents."""
    axes_of = {"workers": [p for p in curves["points"] if p["nnodes"] == 1],
               "agents": [p for p in curves["points"] if p["nproc"] == 1]}
    styles = (("torchrun", "o", "tab:blue"), ("fsm", "s", "tab:orange"))

    Rows = list[dict[str, Any]]

    def series(points: Rows, L: str, x_key: str,
               value: Callable[[Rows], float | None]) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for p in sorted(points, key=lambda p: p[x_key]):
            ok = [r for r in p.get(L, []) if "error" not in r]
            v = value(ok) if ok else None
            if v is not None:
                xs.append(p[x_key])
                ys.append(v)
        return xs, ys

    figures: list[tuple[str, Callable[[list[dict[str, Any]]], float | None]]] = [
        ("restart latency (ms)", lambda ok: (med(_vals(ok, "restart")) or 0) * 1e3 or None),
        ("agent CPU (% of a core, median)",
         lambda ok: 100 * (med([c for r in ok for c in r["cpu"]]) or 0) or None),
        ("start-up (s)", lambda ok: med(_vals(ok, "startup"))),
    ]
    fig, grid = plt.subplots(2, 3, figsize=(11, 6))
    rows_of = (("workers", "nproc", "workers on one agent"),
               ("agents", "nnodes", "agents, 1 worker each"))
    for row_i, (axis, x_key, xlabel) in enumerate(rows_of):
        # one agent with one worker is where both curves start
        points = axes_of[axis] + ([p for p in axes_of["workers"] if p["nproc"] == 1]
                                  if axis == "agents" else [])
        for col, (ylabel, value) in enumerate(figures):
            ax = grid[row_i][col]
            for L, marker, color in styles:
                xs, ys = series(points, L, x_key, value)
                ax.plot(xs, ys, marker=marker, color=color, label=LABEL[L])
                if axis == "agents" and col == 1:  # the agent that hosts the store
                    xs, ys = series(points, L, x_key, lambda ok: 100 * max(
                        (c for r in ok for c in r["cpu"]), default=0) or None)
                    ax.plot(xs, ys, ":", marker=marker, color=color,
                            label=f"{LABEL[L]}, busiest (store host)")
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.legend(fontsize=7)
    fig.suptitle("Cost as the work grows (monitor interval 0.1 s)")
    written = [_save(fig, where / "curves.png", plt, dpi=100)]

    fig, ax = plt.subplots(figsize=(6, 3.6))
    single = [p for p in axes_of["workers"] if p["nproc"] == 1]
    for L, marker, color in styles:
        for key, line, what in (("store_rdzv_per_s", "-", "rendezvous"),
                                ("store_steady_per_s", "--", "steady")):
            # one agent's rendezvous is a few requests in milliseconds: no rate worth a point
            points = axes_of["agents"] + (single if what == "steady" else [])
            xs, ys = series(points, L, "nnodes", lambda ok, k=key: med(_vals(ok, k)))
            ax.plot(xs, ys, line, marker=marker, color=color, label=f"{LABEL[L]}, {what}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("agents (1 worker each)")
    ax.set_ylabel("store requests/s, all agents")
    ax.set_title("Store load vs agents")
    ax.legend(fontsize=7)
    written.append(_save(fig, where / "store_requests.png", plt))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every measure once, small")
    parser.add_argument("--only", nargs="*", default=None,
                        choices=list(MEASURES),
                        help="run only these measures")
    parser.add_argument("--doc", type=Path, help=f"Markdown out (default {DOC}; with --smoke, "
                        f"{SMOKE_DIR / 'performance.md'})")
    parser.add_argument("--json", type=Path, help="raw results (default bench/results.json; "
                        "with --smoke, beside the smoke doc)")
    parser.add_argument("--no-doc", action="store_true",
                        help="print, write neither the doc nor the plots")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only rewrite the doc and plots from an earlier run's results")
    args = parser.parse_args(argv)
    # a smoke run (CI, development) must never replace the published figures or plots
    if args.doc is None:
        args.doc = SMOKE_DIR / "performance.md" if args.smoke else DOC
    if args.json is None:
        args.json = SMOKE_DIR / "results.json" if args.smoke else BENCH / "results.json"
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.render:
        results = json.loads(args.render.read_text())
        results["plots"] = plot(results, args.doc.parent / "performance")
        notes_file = BENCH / "notes.md"
        if notes_file.exists():
            results["notes"] = notes_file.read_text().splitlines()
        args.doc.write_text(render(results, results["command"], results.get("smoke", False)) + "\n")
        log(f"wrote {args.doc} from {args.render}")
        return 0
    # a SIGTERM must unwind through run_job's cleanup, which stops the agents it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    wanted = args.only or list(MEASURES)
    t0 = time.monotonic()
    import torch

    from fsm_agent.torch._wakeup import default_backend

    previous: dict[str, Any] = {}
    if args.only and args.json.exists():  # a partial run updates the sections it measured
        previous = json.loads(args.json.read_text())
    results: dict[str, Any] = {"env": {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(), "kernel": platform.release(),
        "python": platform.python_version(), "torch": torch.__version__,
        "waker": default_backend(),
    }}
    steps: dict[str, Callable[[], Any]] = {
        "startup": lambda: run_script("startup", args.smoke),
        "engine": lambda: run_script("engine_cost", args.smoke),
        "detection": lambda: bench_detection(args.smoke),
        "cpu": lambda: bench_cpu(args.smoke),
        "restart": lambda: bench_restart(args.smoke),
        "scale": lambda: bench_scale(args.smoke),
        "barrier": lambda: run_script("exit_barrier", args.smoke),
        "warm": lambda: bench_warm(args.smoke),
        "curves": lambda: bench_curves(args.smoke),
        "store": lambda: bench_store(args.smoke),
        "store_scale": lambda: run_script("store_scale", args.smoke),
    }
    for name in wanted:
        log(f"{name} ...")
        try:
            results[name] = steps[name]()
        except Exception as exc:
            log(f"{name} failed: {type(exc).__name__}: {exc}")
    results["env"]["wall_s"] = time.monotonic() - t0
    if previous:
        for key in MEASURES:
            if key not in results and key in previous:
                results[key] = previous[key]
        results["env"]["partial"] = f"{', '.join(wanted)} re-measured at {results['env']['date']}"
        results["env"]["date"] = previous["env"]["date"]
        results["env"]["wall_s"] += previous["env"].get("wall_s", 0.0)
    try:
        results["plots"] = [] if args.no_doc else plot(results, args.doc.parent / "performance")
    except Exception as exc:  # a plotting problem must not cost the figures
        results["plots"], results["plots_note"] = [], f"not drawn: {type(exc).__name__}: {exc}"
    command = "python bench/run_all.py" + (" --smoke" if args.smoke else "")
    if previous:
        again = f"python bench/run_all.py --only {' '.join(wanted)}"
        command = f"{previous.get('command', command)}\n{again}"
    notes_file = BENCH / "notes.md"
    if notes_file.exists():
        results["notes"] = notes_file.read_text().splitlines()
    results["command"], results["smoke"] = command, args.smoke
    text = render(results, command, args.smoke)
    args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.no_doc:
        print(text)
    else:
        args.doc.write_text(text + "\n")
        log(f"wrote {args.doc} and {args.json} ({results['env']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
