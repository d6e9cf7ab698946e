"""Fixtures for the job-protocol tests; the helpers live in ``job_helpers`` and
``etcd_server``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from etcd_server import EtcdServer, etcd_server
from job_helpers import Jobs, jobs

__all__ = ["etcd", "jobs"]


@pytest.fixture
def etcd(jobs: Jobs) -> Iterator[EtcdServer]:
    """A real etcd on loopback for one test, stopped (its data directory removed) before the
    ``jobs`` fixture's leak check, which would count it as a leftover (it depends on ``jobs``
    so that it is set up after it and torn down before it)."""
    server = etcd_server()
    try:
        yield server
    finally:
        server.stop()
