"""Measure proposed engine speed-ups without changing ``fsm_agent/_core/_engine.py``.

    python bench/engine_proposals.py

Each proposal is applied to a subclass or a copy, in this process only, and timed against the
engine as it is, on the healthy tick (the commonest observation: the state stays HEALTHY).

Proposal A, "internal fast path": when the current state's candidates for a trigger are known
at compile time and the one that is enabled stays in the same state and has no actions (the
``HEALTHY --healthy [unless nodes_waiting]`` tick), evaluate its guards directly and skip
``transitions``' ``Event.trigger`` (an ``EventData``, the condition objects, nine
``logger.debug`` calls, the state-exit/enter bookkeeping). Any other case goes through
``transitions`` as today, so the machine still decides every state change.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cost import NullDriver


def _median_us(fn: Any, n: int, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def main() -> int:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    from fsm_agent import Lifecycle, load_spec
    from fsm_agent._core._compile import compile_spec

    spec = load_spec("torchrun")
    healthy = RunResult(state=WorkerState.HEALTHY)
    compiled = compile_spec(spec)

    # A: per (state, trigger), the candidates as transitions holds them
    fast: dict[tuple[str, str], list[tuple[list[Any], bool]]] = {}
    for trigger, event in compiled.events.items():
        for source, candidates in event.transitions.items():
            plan = []
            for t in candidates:
                internal = t.dest is None and not t.before and not t.after and not t.prepare
                plan.append((t.conditions, internal))
            fast[(source, trigger)] = plan

    class FastLifecycle(Lifecycle):
        __slots__ = ()

        def _fire(self, trigger: str) -> None:
            ctx = self._ctx
            if not self._listeners:
                plan = fast.get((ctx.state, trigger))
                if plan:
                    ctx.memo.clear()
                    for conditions, internal in plan:
                        # condition.check(event_data) calls our guard wrapper with an EventData;
                        # the wrappers only read .model, so a stand-in is enough here
                        ev = _Ev(ctx)
                        if all(bool(c.func(ev)) == c.target for c in conditions):
                            if internal:
                                return
                            break
            super()._fire(trigger)

    class _Ev:
        __slots__ = ("model",)

        def __init__(self, model: Any) -> None:
            self.model = model

    results = {}
    for name, cls in (("engine as is", Lifecycle), ("A: internal fast path", FastLifecycle)):
        lc = cls(spec, NullDriver(), max_restarts=3)
        lc.start()
        results[name] = _median_us(lambda lc=lc: lc.observe(healthy), 20_000)
    for name, us in results.items():
        print(f"{name:28s} {us:6.2f} us per healthy observe()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
