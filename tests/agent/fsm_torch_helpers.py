"""What the fsm_agent.torch tests share: worker scripts, and the ``jobs`` fixture on
``fsm_test_procs`` (which also fails a test that leaves any process behind)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsm_test_procs import FAST, Job, Jobs, alive, free_port, jobs_fixture, summary

__all__ = [
    "ENV_WORKER", "EXAMPLES", "FAST", "RECORD_WORKER", "Job", "Jobs", "alive",
    "free_port", "jobs", "summary",
]

SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLES = Path(__file__).parents[2] / "examples"
ENV_WORKER = SCRIPTS / "env_worker.py"
RECORD_WORKER = SCRIPTS / "record_worker.py"


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Start real launcher processes; fail the test if any process of theirs is left behind."""
    yield from jobs_fixture(Jobs(tmp_path))
