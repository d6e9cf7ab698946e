"""The trace writer's cost per step: the record of one ``Step`` and one JSON line on disk.

    python bench/trace_writer.py [--smoke] [--json OUT]

Times, each as the median of 7 rounds:

- ``step_record`` of a restart step (two torch ``ProcessFailure``s, two actions, a guard) and of
  a healthy tick, against the hand-written record the writer built before the record was derived
  from ``fsm_agent.trace._schema.STEP_FIELDS`` (kept below as the baseline, run in the same
  process);
- a ``Lifecycle`` with a ``JsonlTraceWriter`` on a real file: a healthy tick (folded: one
  ``pwrite``) and a restart (two appended lines), against the same lifecycle with a listener
  that does nothing.

Run it on two checkouts (``PYTHONPATH=CHECKOUT python bench/trace_writer.py``) to compare them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _paired_medians_us(fns: Mapping[str, Callable[[], None]], n: int, rounds: int = 7
                       ) -> dict[str, float]:
    """Each of ``fns`` timed in turn within every round (so a load that comes and goes costs
    them alike), as the median per call."""
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(ts) / n * 1e6 for label, ts in times.items()}


def _failure_json_of_this_checkout() -> Callable[[Any], Any]:
    try:
        from fsm_agent._core._step import _failure_json
    except ImportError:  # a checkout from before the record's rows moved beside Step
        try:
            from fsm_agent.trace._schema import _failure_json  # type: ignore[attr-defined,no-redef]
        except ImportError:  # a checkout from before the record was derived
            from fsm_agent.trace._writer import _failure_json  # type: ignore[attr-defined,no-redef]
    return _failure_json


_failure_json: Callable[[Any], Any] = lambda f: f  # noqa: E731 (set by measure())


def hand_written_record(step: Any, seq: int, static: Mapping[str, Any] | None = None
                        ) -> dict[str, Any]:
    """The baseline: ``step_record`` as it was, every field listed by hand."""
    record: dict[str, Any] = {
        "kind": "step",
        "seq": seq,
        "wall_time": step.wall_time,
        "monotonic_time": step.monotonic_time,
        "role": step.role,
        "trigger": step.trigger,
        "source": step.source,
        "dest": step.dest,
        "guards": [{"name": name, "value": bool(value)} for name, value in step.guards],
        "actions": [
            {"name": a.name, "kind": a.kind, "duration_s": a.duration, "outcome": a.outcome,
             "error": a.error}
            for a in step.actions
        ],
        "remaining_restarts": step.remaining_restarts,
        "restart_count": step.restart_count,
        "observed": step.observed,
        "failures": {str(rank): _failure_json(f) for rank, f in dict(step.failures).items()},
        "error": step.error,
        "rule": step.rule,
        "timer": step.timer,
    }
    if static:
        record.update(static)
    return record


class NullDriver:
    def rendezvous(self) -> None: ...
    def start_workers(self) -> None: ...
    def stop_workers(self) -> None: ...
    def monitor(self) -> Any: ...
    def num_nodes_waiting(self) -> int:
        return 0
    def exit_barrier(self, timeout: float) -> None: ...
    def put_metric(self, name: str, value: int) -> None: ...


def measure(smoke: bool) -> dict[str, Any]:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    import fsm_agent
    from fsm_agent import ActionRecord, Lifecycle, Step, load_spec
    from fsm_agent.trace._writer import JsonlTraceWriter, step_record

    global _failure_json
    _failure_json = _failure_json_of_this_checkout()
    out: dict[str, Any] = {"fsm_agent": os.path.dirname(fsm_agent.__file__)}
    n = 2_000 if smoke else 50_000
    failures = {r: ProcessFailure(local_rank=r, pid=1000 + r, exitcode=1, error_file="/nonexistent")
                for r in (0, 1)}
    restart = Step(trigger="failed", source="HEALTHY", wall_time=time.time(),
                   monotonic_time=time.monotonic(), role="default", dest="STOPPED",
                   guards=[("has_restarts_left", True)],
                   actions=[ActionRecord("consume_restart", "action", 4.6e-06, "ok"),
                            ActionRecord("stop_workers", "action", 0.0119, "ok")],
                   remaining_restarts=1, restart_count=1, observed="FAILED", failures=failures,
                   rule="retry", timer=None)
    tick = Step(trigger="healthy", source="HEALTHY", wall_time=time.time(),
                monotonic_time=time.monotonic(), role="default", dest="HEALTHY",
                remaining_restarts=3, observed="HEALTHY")
    static = {"node": "vm", "group_rank": 0}
    for name, step in (("restart", restart), ("tick", tick)):
        assert json.dumps(step_record(step, 7, static)) == json.dumps(
            hand_written_record(step, 7, static)), name  # the same bytes, or the bench is moot
        runs = {}
        for label, fn in (("derived", step_record), ("hand_written", hand_written_record)):
            def run(fn: Any = fn, step: Any = step) -> None:
                for i in range(n):
                    fn(step, i, static)
            runs[label] = run
        for label, us in _paired_medians_us(runs, n).items():
            out[f"step_record_{name}_{label}_us"] = us
        out[f"step_record_{name}_ratio"] = (out[f"step_record_{name}_derived_us"]
                                            / out[f"step_record_{name}_hand_written_us"])

    spec = load_spec("torchrun")
    healthy = RunResult(state=WorkerState.HEALTHY)
    failed = RunResult(state=WorkerState.FAILED, failures=failures)
    with tempfile.TemporaryDirectory(prefix="fsm_agent_trace_writer_") as tmp:
        writer = JsonlTraceWriter(Path(tmp) / "t.jsonl", spec=spec, node="vm")
        ticks, restarts = {}, {}
        for label, listener in (("writer", writer), ("null_listener", lambda step: None)):
            lc = Lifecycle(spec, NullDriver(), max_restarts=10**9, listeners=[listener])
            lc.start()

            def tick_run(lc: Any = lc) -> None:
                for _ in range(n):
                    lc.observe(healthy)

            def restart_run(lc: Any = lc) -> None:
                for _ in range(n // 10):
                    lc.observe(failed)
                    lc.observe(healthy)  # back to a fresh fold, as a real restart is

            ticks[label], restarts[label] = tick_run, restart_run
        for label, us in _paired_medians_us(ticks, n).items():
            out[f"tick_{label}_us"] = us
        for label, us in _paired_medians_us(restarts, n // 10).items():
            out[f"restart_{label}_us"] = us
        writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    out = measure(args.smoke)
    for key, value in out.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
