"""What an agent keeps per restart (agent RSS once grew about 7 KB per restart).

The end-of-run summary's ``RunRecorder`` (``fsm-agent run`` always installs it) kept every step
record as Python dicts, about 5 KB per restart for the whole run. It now keeps the finished
records as compressed JSON: the Python objects it holds stay bounded however many restarts
there were, and ``analysis()`` reads exactly the records the old recorder held.
``bench/restart_memory.py`` measures the agent's RSS per restart beside torchrun's.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from typing import Any

from fsm_agent import Lifecycle, load_spec
from fsm_agent._readers._analysis import analyse
from fsm_agent._readers._summary import RunRecorder, format_text
from fsm_agent.testing import RecordingDriver, make_result
from fsm_agent.trace._reader import Trace, TraceRecord
from fsm_agent.trace._writer import step_record


class OldRecorder:
    """The recorder as it was before the fix: every record a dict, for the comparison."""

    every_tick = False

    def __init__(self, *, fields: Callable[[], Mapping[str, Any]] | None = None,
                 **static: Any) -> None:
        self._fields = fields
        self._static = static
        self.records: list[dict[str, Any]] = []
        self._seq = 0

    def __call__(self, step: Any) -> None:
        self._seq += 1
        record = step_record(step, self._seq, self._static)
        if self._fields is not None:
            record.update(self._fields())
        last = self.records[-1] if self.records else None
        noop = (record["source"] == record["dest"] and not record["actions"]
                and record["error"] is None and not record.get("diagnostics"))
        if noop and last is not None and last.get("count") is not None and all(
                last.get(k) == record.get(k) for k in ("trigger", "source", "guards",
                                                       "remaining_restarts", "observed")):
            last["count"] += 1
            last["last_wall_time"] = record["wall_time"]
            last["last_monotonic_time"] = record["monotonic_time"]
            return
        if noop:
            record.update(count=1, last_wall_time=record["wall_time"],
                          last_monotonic_time=record["monotonic_time"])
        self.records.append(record)


def _restarts(n: int, *listeners: Any, spec: str = "torchelastic") -> Lifecycle:
    """A lifecycle through ``n`` failure restarts, a few healthy ticks between two."""
    lc = Lifecycle(spec, RecordingDriver(), max_restarts=n + 5, listeners=listeners)
    lc.start()
    for i in range(n):
        for _ in range(3):
            lc.observe(make_result("HEALTHY", tick=i))
        lc.observe(make_result("FAILED", tick=i, ranks=(0, 1), error="ValueError: bad batch"))
    return lc


def _reachable_containers(root: object) -> int:
    """Objects the garbage collector tracks (dicts, lists, ...) reachable from ``root``."""
    seen = {id(root)}
    todo = [root]
    while todo:
        for ref in gc.get_referents(todo.pop()):
            if gc.is_tracked(ref) and id(ref) not in seen and not isinstance(ref, type):
                seen.add(id(ref))
                todo.append(ref)
    return len(seen)


def test_recorder_objects_stay_bounded_over_restarts() -> None:
    counts = {}
    for n in (40, 400):
        recorder = RunRecorder(node="n", pid=1, run_id="r")
        _restarts(n, recorder)
        assert recorder.analysis().lanes[0].records > 2 * n  # every restart is still there
        counts[n] = _reachable_containers(recorder)
    # Before the fix: about 40 dicts and lists per restart (15,000 more for 360 restarts).
    # Now: the last record and at most CHUNK_RECORDS pending lines as Python objects, the rest
    # in bytes, which hold no objects; only the list of chunks grows (one item per chunk).
    assert counts[400] - counts[40] < 50, counts


def test_recorder_analysis_is_unchanged() -> None:
    spec = load_spec("torchelastic")
    ticks = iter(range(10**6))

    def fields() -> dict[str, Any]:
        # what the agent's trace_fields give: sometimes diagnostics, once values JSON cannot
        # give back equal (a tuple, a NaN), which must be kept as they are
        i = next(ticks)
        if i % 7 == 3:
            return {"group_rank": 0, "diagnostics": {"progress": {"attempt": i, "moved": None}}}
        if i == 50:
            return {"group_rank": 0, "diagnostics": {"odd": (1, 2), "nan": math.nan}}
        return {"group_rank": 0}

    old, new = OldRecorder(node="n", pid=1, run_id="r"), RunRecorder(node="n", pid=1, run_id="r")
    shared = iter(())

    def both(step: Any) -> None:
        nonlocal shared
        f = fields()
        shared = iter([f, f])
        old(step)
        new(step)

    old._fields = new._fields = lambda: next(shared)
    lc = _restarts(120, both)
    lc.observe(make_result("SUCCEEDED"))
    got = new.records()
    assert len(got) == len(old.records) > 240
    # equal, NaN aside (nan != nan): the record holding it is the very same object
    assert [r for r in got if "nan" not in r.get("diagnostics", {})] == \
        [r for r in old.records if "nan" not in r.get("diagnostics", {})]
    odd = [r for r in got if "odd" in r.get("diagnostics", {})]
    assert len(odd) == 1 and odd[0]["diagnostics"]["odd"] == (1, 2)
    header = {"node": "n", "pid": 1, "run_id": "r", "spec": spec.name}
    before = analyse([Trace("<this run>", header, None, tuple(
        TraceRecord(i, r) for i, r in enumerate(old.records, 1)))], spec)
    after = new.analysis(spec)
    assert format_text(after) == format_text(before)
    assert after.incidents == before.incidents and after.lanes == before.lanes
    assert after.restarts_used == before.restarts_used == 120
