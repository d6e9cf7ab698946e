"""Fixtures of the diagram, trace, replay and diff tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Spec

from ._helpers import run_traced


@pytest.fixture
def traced(tmp_path: Path):
    """A callable: run_traced into a fresh file in tmp_path, returning the path."""
    counter = iter(range(1000))

    def make(spec: Spec | str, script: Sequence[Any], **kw: Any) -> Path:
        path = tmp_path / f"trace{next(counter)}.jsonl"
        run_traced(path, spec, script, **kw)
        return path

    return make
