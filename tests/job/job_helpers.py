"""What the job-protocol tests share: the node worker, multi-node launch arguments, and the
``jobs`` fixture on ``fsm_test_procs`` (which fails a test that leaves any process behind). A
unique module name: several test directories have a ``conftest`` module."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fsm_test_procs import FAST, Job, Jobs, free_port, jobs_fixture

__all__ = ["NODE_WORKER", "Job", "Jobs", "jobs", "nodes"]

NODE_WORKER = Path(__file__).parent / "scripts" / "node_worker.py"
SHUTDOWN_TIMEOUT = 3


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Start real launcher processes (``node_worker.py`` by default); fail on any leftover."""
    yield from jobs_fixture(Jobs(tmp_path, shutdown_timeout=SHUTDOWN_TIMEOUT,
                                 default_script=NODE_WORKER))


def nodes(n: int, *extra: str, port: int | None = None, run_id: str = "job") -> list[str]:
    """Launcher arguments for one of ``n`` nodes of a c10d job on a loopback port."""
    port = free_port() if port is None else port
    return ["--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST, *extra]


def port_of(args: Sequence[str]) -> int:
    return int(args[args.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1])
