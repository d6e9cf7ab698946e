"""How fast the conformance kit finds and shrinks the off-by-one mutant (target: < 10 s).

    python bench/conformance_speed.py            # 9 seeds per measure
    python bench/conformance_speed.py --smoke    # 2 seeds, for CI

The mutant (``tests/conformance/mutants.py:OffByOneMaxRestarts``) restarts while
``remaining_restarts >= 0``: one restart more than max_restarts allows. Measures, each a median
over seeds, all in this session:

* find+shrink: ``run_conformance`` (the default, one script per example) until it raises, with
  the counterexample shrunk;
* find only: the same with shrinking off, to show where the time goes;
* stateful find+shrink: ``run_conformance(..., stateful=True)`` (the RuleBasedStateMachine);
* baseline: the time per example of a passing run (torch's copy of the loop with the switch
  off, 200 examples), so that find+shrink can be read as "worth N examples" on any machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import Phase, settings  # noqa: E402

from fsm_agent.testing import ConformanceFailure, default_settings, run_conformance  # noqa: E402
from tests.conformance.mutants import OffByOneMaxRestarts, TorchLoop  # noqa: E402

TARGET_S = 10.0


def _time_failure(kit_settings: Any, seed: int, stateful: bool = False) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        run_conformance(OffByOneMaxRestarts, spec="torchrun", settings=kit_settings, seed=seed,
                        stateful=stateful)
    except ConformanceFailure as e:
        return time.perf_counter() - t0, str(e)
    raise SystemExit(f"seed {seed}: the kit did not find the off-by-one mutant")


def _ticks_in(table: str) -> int:
    return len([line for line in table.splitlines() if re.match(r"^\d+ +\| (?!\(none)", line)])


def _measure(label: str, fn: Callable[[int], tuple[float, str]], seeds: range) -> dict[str, Any]:
    times, ticks = [], []
    for seed in seeds:
        seconds, table = fn(seed)
        times.append(seconds)
        ticks.append(_ticks_in(table))
        print(f"  {label:<24} seed {seed:>2}: {seconds:6.2f} s, counterexample of {ticks[-1]} "
              "tick(s)", flush=True)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "ticks": ticks, "samples_s": times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="2 seeds per measure")
    p.add_argument("--seeds", type=int, default=None, help="seeds per measure (default 9)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    n = args.seeds or (2 if args.smoke else 9)
    seeds = range(1, n + 1)
    logging.disable(logging.CRITICAL)
    base = settings(default_settings(1_000), database=None)
    print(f"conformance kit speed, {n} seeds, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")

    t0 = time.perf_counter()
    run_conformance(TorchLoop, spec="torchrun", settings=settings(base, max_examples=200), seed=0)
    per_example = (time.perf_counter() - t0) / 200
    print(f"  baseline: {per_example * 1e3:.2f} ms per example (200 passing examples)")

    results = {
        "find+shrink": _measure("find+shrink", lambda s: _time_failure(base, s), seeds),
        "find only": _measure("find only", lambda s: _time_failure(
            settings(base, phases=[Phase.generate]), s), seeds),
        "stateful find+shrink": _measure("stateful find+shrink", lambda s: _time_failure(
            settings(base, stateful_step_count=12), s, stateful=True), seeds),
    }
    print()
    print(f"{'measure':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'x baseline':>11}  target")
    for name, r in results.items():
        target = f"< {TARGET_S:g} s: {'met' if r['median_s'] < TARGET_S else 'MISSED'}" \
            if name == "find+shrink" else ""
        print(f"{name:<22} {r['median_s']:9.2f} {r['min_s']:7.2f} {r['max_s']:7.2f} "
              f"{r['median_s'] / per_example:11.0f}  {target}")
    if args.json:
        args.json.write_text(json.dumps({"baseline_s_per_example": per_example, **results},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
