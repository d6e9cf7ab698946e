"""The ``slurm`` and ``slurm_pgid`` fixtures: see ``slurm_cluster``.

Each is one cluster per test module and pytest process (under ``pytest -n 2`` a worker that runs a
test of this directory starts its own, on ports of its own), and a clean slate per test: after each
test every job is cancelled and every process that carries the test's directory in its environment
(the agent, its workers, the batch script) must be gone, or the test fails naming them.

Without Slurm or without root the tests skip with the reason, except where
``FSM_AGENT_REQUIRE_SLURM=1`` (``.ci/run`` sets it, after installing Slurm): there they fail, so
that CI never passes by testing nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import BINARIES, INSTALL, SlurmCluster, unavailable


def _cluster(tmp_path_factory: pytest.TempPathFactory, proctrack: str) -> Iterator[SlurmCluster]:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        unavailable(f"Slurm is not installed (no {', '.join(missing)} on PATH): {INSTALL}")
    if os.geteuid() != 0:
        unavailable("the Slurm fixture runs slurmd, slurmctld and munged as root")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), proctrack)
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
    assert not left, f"still running once the cluster stopped (killed): {left}"


# Module scope, not session: the daemons are children of this pytest process, and every other
# test's leak check (fsm_test_procs.kill_leftovers) counts this process's descendants, so they
# must be gone before a test of another module runs in this process.
@pytest.fixture(scope="module")
def _slurm_linuxproc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory, "proctrack/linuxproc")


@pytest.fixture(scope="module")
def _slurm_pgid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory, "proctrack/pgid")


def _per_test(cluster: SlurmCluster, tmp_path: Path) -> Iterator[SlurmCluster]:
    yield cluster
    left = cluster.end_test(tmp_path)
    assert not left, f"left running after the test (killed): {left}"


@pytest.fixture
def slurm(_slurm_linuxproc: SlurmCluster, tmp_path: Path) -> Iterator[SlurmCluster]:
    """A cluster with ProctrackType=proctrack/linuxproc: Slurm signals every process of a step,
    as proctrack/cgroup does on a real cluster. The test's jobs use ``tmp_path`` as OUT_DIR."""
    yield from _per_test(_slurm_linuxproc, tmp_path)


@pytest.fixture
def slurm_pgid(_slurm_pgid: SlurmCluster, tmp_path: Path) -> Iterator[SlurmCluster]:
    """A cluster with ProctrackType=proctrack/pgid: Slurm signals the task's process group only
    (fsm-agent's workers, in sessions of their own, are not in it)."""
    yield from _per_test(_slurm_pgid, tmp_path)
