"""What the reliability tests share: their worker script, flags, and the ``jobs`` fixture on
``fsm_test_procs`` (which also fails a test that leaves any process behind)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsm_test_procs import (
    FAST,
    Job,
    Jobs,
    alive,
    descendants,
    free_port,
    jobs_fixture,
    summary,
    trace_records,
    wait_gone,
)

__all__ = [
    "FAST", "SHUTDOWN_TIMEOUT", "STANDALONE", "WORKER", "Job", "Jobs", "alive", "descendants",
    "free_port", "jobs", "summary", "trace_records", "wait_gone",
]

SCRIPTS = Path(__file__).parent / "scripts"
WORKER = SCRIPTS / "worker.py"
STANDALONE = ["--standalone", "--nproc-per-node", "2", *FAST]
# What the tests pass as --shutdown-timeout and TORCH_ELASTIC_SHUTDOWN_TIMEOUT: the bound within
# which a stopped worker (and its children) must be gone.
SHUTDOWN_TIMEOUT = 3


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Start real ``fsm-agent run`` jobs (``worker.py`` by default); fail on any leftover."""
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=WORKER))
