"""Engine cost: one observe(), building a Lifecycle, many lifecycles in one process.

    python bench/engine_cost.py [--smoke] [--json OUT]

Baseline in the same session: torch's own loop body for one tick (``put_metric`` twice, the
state comparisons, ``num_nodes_waiting``) on the same no-op driver, and ``transitions``'
``add_model`` route (one Machine holding every model), which the issue names as quadratic.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class NullDriver:
    """Every driver call is a no-op: what is timed is the engine alone."""

    def __init__(self) -> None:
        self.result: Any = None

    def rendezvous(self) -> None: ...
    def start_workers(self) -> None: ...
    def stop_workers(self) -> None: ...

    def monitor(self) -> Any:
        return self.result

    def num_nodes_waiting(self) -> int:
        return 0

    def exit_barrier(self, timeout: float) -> None: ...
    def put_metric(self, name: str, value: int) -> None: ...


def _best_of(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(smoke: bool) -> dict[str, Any]:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    from fsm_agent import Lifecycle, load_spec

    spec = load_spec("torchrun")
    healthy = RunResult(state=WorkerState.HEALTHY)
    failed = RunResult(state=WorkerState.FAILED)
    out: dict[str, Any] = {}

    # -- one observe() of a healthy tick (the common case), and a restart -----------------------
    n = 2_000 if smoke else 50_000
    lc = Lifecycle(spec, NullDriver(), max_restarts=10**9)
    lc.start()
    observe = lc.observe

    def ticks() -> None:
        for _ in range(n):
            observe(healthy)

    out["observe_healthy_us"] = _best_of(ticks, 5) / n * 1e6

    def restarts() -> None:
        for _ in range(n // 10):
            observe(failed)

    out["observe_restart_us"] = _best_of(restarts, 5) / (n // 10) * 1e6

    listened = Lifecycle(spec, NullDriver(), max_restarts=10**9, listeners=[lambda step: None])
    listened.start()

    def ticks_listened() -> None:
        for _ in range(n):
            listened.observe(healthy)

    out["observe_healthy_listener_us"] = _best_of(ticks_listened, 5) / n * 1e6

    # torch's own loop body for a HEALTHY tick, same driver calls (the baseline)
    from torch.distributed.elastic.metrics import put_metric

    driver = NullDriver()

    def torch_ticks() -> None:
        for _ in range(n):
            state = healthy.state
            put_metric("workers.default.remaining_restarts", 3)
            put_metric(f"workers.default.{state.name.lower()}", 1)
            # the same comparisons, in the same order, as torch's _invoke_run
            if state == WorkerState.SUCCEEDED or state in {
                WorkerState.UNHEALTHY,
                WorkerState.FAILED,
            }:
                pass
            elif state == WorkerState.HEALTHY:
                driver.num_nodes_waiting()

    out["torch_tick_us"] = _best_of(torch_ticks, 5) / n * 1e6

    # -- building lifecycles --------------------------------------------------------------------
    def build(count: int) -> list[Any]:
        return [Lifecycle(spec, NullDriver(), max_restarts=3) for _ in range(count)]

    out["build_one_us"] = _best_of(lambda: build(1000), 3) / 1000 * 1e6
    sizes = [1_000, 10_000] if smoke else [10_000, 100_000]
    for size in sizes:
        gc.collect()
        t0 = time.perf_counter()
        held = build(size)
        out[f"build_{size}_s"] = time.perf_counter() - t0
        del held

    # -- one million observations spread over the largest population ----------------------------
    size = sizes[-1]
    total = 10_000 if smoke else 1_000_000
    population = build(size)
    for item in population:
        item.start()
    gc.collect()
    t0 = time.perf_counter()
    for i in range(total):
        population[i % size].observe(healthy)
    out["observations"] = total
    out["population"] = size
    out["observations_s"] = time.perf_counter() - t0
    del population

    # -- the add_model route, for comparison (one Machine holding every model) ------------------
    from transitions import Machine

    names = [s.name for s in spec.states]

    def add_models(count: int) -> float:
        machine = Machine(model=None, states=names, initial=spec.initial, auto_transitions=False)
        machine.add_transition("start", "INIT", "HEALTHY")
        models = []
        t0 = time.perf_counter()
        for _ in range(count):
            model = type("Model", (), {})()
            machine.add_model(model)
            models.append(model)
        return time.perf_counter() - t0

    out["add_model_count"] = 2_000 if smoke else 10_000
    out["add_model_s"] = add_models(out["add_model_count"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small counts, a few seconds")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = measure(args.smoke)
    text = json.dumps(figures, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
