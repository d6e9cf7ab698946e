"""The kit on NVIDIA's ft_launcher agent: ``nvidia-resiliency-ext`` 0.4.1 from PyPI (the last
release that vendors torch elastic, under ``fault_tolerance._torch_elastic_compat``), and 0.7.0
where it installs (Python 3.12 only: docs/conformance.md has the commands).

Installed by .ci/run with ``--no-deps`` (never touching torch), with the two pure imports its
``fault_tolerance`` package needs, ``psutil`` and ``defusedxml``; a test tool, not a dependency.
On Python 3.11 (CI) 0.4.1 is installed and the 0.7.0 test skips; in a 3.12 environment with
0.7.0 the 0.4.1 tests skip. 0.7.0's interface is also checked on 3.11 through a stand-in
(``test_nvrx_070_standin.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from fsm_agent.testing._agent_shape import agent_shape
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    default_settings,
    run_conformance,
)

pytestmark = pytest.mark.timeout(300)

REJECT = settings(default_settings(300), database=None)


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = ROOT / "examples" / "nvrx_0_7_0.yaml"


def _installed(wanted: str) -> None:
    pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.launcher",
                        reason=f"pip install --no-deps nvidia-resiliency-ext=={wanted} psutil "
                               "defusedxml")
    from importlib.metadata import version

    found = version("nvidia-resiliency-ext")
    if found != wanted:
        pytest.skip(f"nvidia-resiliency-ext {found} is installed, this test is for {wanted}")


@pytest.fixture(scope="module")
def nvrx_launcher() -> type:
    """0.4.1's LocalElasticAgent itself (its constructor's extras come from the nvrx target
    API)."""
    _installed("0.4.1")
    from nvidia_resiliency_ext.fault_tolerance.launcher import LocalElasticAgent

    return LocalElasticAgent  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def nvrx_agent() -> type:
    _installed("0.4.1")
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing import (
        DefaultLogsSpecs,
    )
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import LocalElasticAgent

    class FtLauncherAgent(LocalElasticAgent):  # type: ignore[misc]
        """ft_launcher's agent with what its constructor needs beyond a worker spec (its
        fault-tolerance config and logs spec: the documented thin subclass)."""

        def __init__(self, spec: Any, exit_barrier_timeout: float = 300.0,
                     log_dir: str | None = None) -> None:
            super().__init__(spec, FaultToleranceConfig(), DefaultLogsSpecs(log_dir=log_dir),
                             exit_barrier_timeout=exit_barrier_timeout)

    return FtLauncherAgent


def test_ft_launcher_agent_is_scripted_with_the_vendored_classes(nvrx_agent: type) -> None:
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api

    shape = agent_shape(nvrx_agent)
    assert shape.result_types.WorkerState is api.WorkerState
    assert shape.result_types.RunResult is api.RunResult
    assert shape.worker_spec is api.WorkerSpec
    compat = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat"
    assert [m.__name__ for m in shape.metric_modules] == [f"{compat}.metrics.api"]


def test_ft_launcher_gives_up_by_looking_at_stopped_workers(nvrx_agent: type) -> None:
    # The true difference from torch 2.13's loop: on giving up, 0.4.1's any-failed policy stops
    # the workers and then calls _monitor_workers once more, returning that result. The kit
    # finds it and shrinks it to one failure with no restart left.
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(nvrx_agent, spec="torchrun", settings=REJECT, seed=0)
    text = str(info.value)
    rows = [line.split("|") for line in text.splitlines()
            if re.match(r"^(start|\d+) +\|", line)]
    assert [r[0].strip() for r in rows] == ["start", "1", "2"]
    assert rows[1][1].strip() in ("FAILED", "UNHEALTHY") and rows[1][-1].strip().endswith("stop")
    assert rows[2][-1].strip() == "monitor  <-- differs"
    assert "monitor() while the workers are stopped" in text


def test_the_nvrx_target_api_builds_0_4_1_without_a_subclass(nvrx_launcher: type) -> None:
    # Its constructor's config and logs spec come from the declaration (the logs spec is the
    # vendored copy's, the one 0.4.1's launcher imports); the kit finds the same difference.
    with pytest.raises(HarnessError, match="needs fault_tol_cfg, logs_specs"):
        run_conformance(nvrx_launcher, spec="torchrun", settings=REJECT, seed=0)
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(nvrx_launcher, spec="torchrun", settings=REJECT, seed=0,
                        target_api="nvrx")
    text = str(info.value)
    assert "with target API nvrx does not conform" in text
    assert "monitor() while the workers are stopped" in text


def test_nvrx_0_7_0_real_agent() -> None:
    # Python 3.12 only (0.7.0's wheel is cp312): the real agent, with no adapter, conforms to
    # the example spec, and against torchrun shows the peer-opened restart it counts.
    _installed("0.7.0")
    from nvidia_resiliency_ext.fault_tolerance.launcher import LocalElasticAgent

    run_conformance(LocalElasticAgent, spec=EXAMPLE_SPEC, settings=REJECT, seed=0,
                    target_api="nvrx")
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(LocalElasticAgent, spec="torchrun", settings=REJECT, seed=0,
                        target_api="nvrx")
    text = str(info.value)
    assert re.search(r"^1 +\| HEALTHY +\| 1 ", text, re.M)
    assert "actual outcome:   return FAILED {}; state FAILED" in text
