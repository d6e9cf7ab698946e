"""Helpers shared by the diagram, trace, replay and diff tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Lifecycle, Spec, load_spec
from fsm_agent.testing import RecordingDriver
from fsm_agent.trace._writer import JsonlTraceWriter

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
SPECS = ROOT / "specs"


def run_traced(
    path: Path,
    spec: Spec | str,
    script: Sequence[Any],
    *,
    max_restarts: int = 1,
    **driver_kw: Any,
) -> BaseException | None:
    """Run a lifecycle on a RecordingDriver with a trace writer; return what it raised, if any."""
    spec = load_spec(spec)
    with JsonlTraceWriter(path, spec=spec, group_rank=0) as writer:
        lc = Lifecycle(spec, RecordingDriver(script, **driver_kw), max_restarts=max_restarts,
                       listeners=[writer])
        try:
            lc.run(0.0)
        except Exception as e:
            return e
    return None


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def write_lines(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
