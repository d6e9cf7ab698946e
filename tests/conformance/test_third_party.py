"""The kit on agents nobody here wrote: the ``torchelastic`` 0.2.2 package from PyPI (the seed's
own release) and a vendored copy of torch elastic (classes of its own, as forks ship them).

torchelastic 0.2.2 is installed by the README's set-up line and by CI (``pip install --no-deps
torchelastic==0.2.2``); .ci/run checks that it imports, so these tests never skip there.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings
from torch.distributed.elastic.agent.server import api as torch_api

from fsm_agent.cli.conformance import main
from fsm_agent.testing._agent_shape import agent_shape
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    default_settings,
    run_conformance,
    run_script,
)
from fsm_agent.testing._reference import Raised, Returned
from fsm_agent.testing._strategies import RunConfig, Tick

from .seed_agent import SeedAgent

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = ROOT / "examples" / "torchelastic_0_2_2.yaml"
LOCAL_AGENT = "torchelastic.agent.server.local_elastic_agent:LocalElasticAgent"
ACCEPT = settings(default_settings(150), database=None)
REJECT = settings(default_settings(1_000), database=None)


@pytest.fixture(scope="module")
def torchelastic_api() -> ModuleType:
    pytest.importorskip("torchelastic", reason="pip install --no-deps torchelastic==0.2.2")
    import torchelastic

    assert torchelastic.__version__ == "0.2.2"
    return importlib.import_module("torchelastic.agent.server.api")


@pytest.fixture(scope="module")
def local_agent(torchelastic_api: ModuleType) -> type:
    from torchelastic.agent.server.local_elastic_agent import LocalElasticAgent

    return LocalElasticAgent


# -- torchelastic 0.2.2 ----------------------------------------------------------------------


def test_torchelastic_agent_is_scripted_with_its_own_classes(torchelastic_api: ModuleType,
                                                           local_agent: type) -> None:
    shape = agent_shape(local_agent)
    assert shape.result_types.WorkerState is torchelastic_api.WorkerState
    assert shape.result_types.WorkerState is not torch_api.WorkerState
    assert shape.result_types.RunResult is torchelastic_api.RunResult
    assert shape.result_types.ProcessFailure is torchelastic_api.ProcessFailure
    assert shape.worker_spec is torchelastic_api.WorkerSpec
    # Its _exit_barrier calls torchelastic.utils.store.barrier; its metrics go through its own
    # copy of the metrics API; its constructor takes log_dir (the kit gives a scratch directory).
    assert [r.where for r in shape.routes] == ["torchelastic.utils.store.barrier"]
    assert [m.__name__ for m in shape.metric_modules] == ["torchelastic.metrics.api"]
    assert shape.keywords == {"exit_barrier_timeout", "log_dir"}


def test_torchelastic_gives_up_by_returning_after_the_barrier(local_agent: type) -> None:
    # The released _invoke_run, checked by hand on one script, beside the seed's: same calls,
    # then 0.2.2 returns the observed result where the seed raises.
    config = RunConfig(max_restarts=0, exit_barrier_timeout=9.0)
    script = [Tick("UNHEALTHY")]
    released = run_script(local_agent, config, script)
    seed = run_script(SeedAgent, config, script)
    assert released.events == seed.events == (
        ("rendezvous",), ("start_workers",), ("sleep", 0.1), ("monitor",),
        ("put_metric", "workers.default.remaining_restarts", 0),
        ("put_metric", "workers.default.unhealthy", 1),
        ("stop_workers",), ("exit_barrier", 9.0))
    assert released.outcome == Returned("UNHEALTHY", {}, {}, gave_up_after="UNHEALTHY")
    assert seed.outcome == Raised("WorkerGroupFailureException",
                                  "[default] exceeded max_restarts=0")
    assert released.state == seed.state == "FAILED"


def test_torchelastic_conforms_to_the_example_spec(local_agent: type) -> None:
    run_conformance(local_agent, spec=EXAMPLE_SPEC, settings=ACCEPT, seed=0)


def test_torchelastic_is_rejected_by_the_preset_showing_return_versus_raise(
        local_agent: type) -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(local_agent, spec="torchelastic", settings=REJECT, seed=0)
    text = str(info.value)
    lines = text.splitlines()
    assert "does not conform to spec 'torchelastic'" in lines[0]
    assert "max_restarts=0" in lines[1]
    # Shrunk: the start row and one tick that gives up, with nothing else going on.
    rows = [line.split("|") for line in lines if re.match(r"^(start|\d+) +\|", line)]
    assert [r[0].strip() for r in rows] == ["start", "1"]
    assert rows[1][1].strip() in ("FAILED", "UNHEALTHY")
    assert [c.strip() for c in rows[1][2:5]] == ["0", "ok", "-"]
    assert "stop, exit_barrier(300)" in rows[1][-1]
    assert ("expected outcome: raise WorkerGroupFailureException('[default] exceeded "
            "max_restarts=0')") in text
    assert re.search(r"actual outcome: +return (FAILED|UNHEALTHY) .*<-- differs", text)
    assert lines[-1] == "differs in: outcome"


def test_cli_accepts_torchelastic_against_the_example_and_rejects_it_against_the_preset(
        local_agent: type, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    example = "examples/torchelastic_0_2_2.yaml"
    assert main([LOCAL_AGENT, "--spec", example, "--examples", "100", "--seed", "3"]) == 0
    assert f"conforms to spec '{example}'" in capsys.readouterr().out
    assert main([LOCAL_AGENT, "--spec", "torchelastic", "--examples", "300", "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert "COUNTEREXAMPLE" in out and "raise WorkerGroupFailureException" in out
    assert "actual outcome:   return" in out


# -- a vendored copy of torch elastic -----------------------------------------------------------


def _type_checked(api: ModuleType) -> type:
    """The copy's own agent, failing loudly if the kit hands it anything but the copy's classes
    (both WorkerState enums are str enums, so a loop would not notice torch's on its own)."""

    class TypeChecked(api.SimpleElasticAgent):  # type: ignore[misc,name-defined]
        def _invoke_run(self, role: str = "default") -> Any:
            result = super()._invoke_run(role)
            kinds = {type(result), type(result.state), *map(type, result.failures.values())}
            if not kinds <= {api.RunResult, api.WorkerState, api.ProcessFailure}:
                raise TypeError(f"the kit built {sorted(map(repr, kinds))}")
            return result

    return TypeChecked


def test_vendored_agent_is_scripted_with_the_copys_classes(vendored_api: ModuleType) -> None:
    shape = agent_shape(vendored_api.SimpleElasticAgent)
    assert shape.result_types.WorkerState is vendored_api.WorkerState
    assert shape.result_types.WorkerState is not torch_api.WorkerState
    assert shape.result_types.RunResult is vendored_api.RunResult
    assert shape.worker_spec is vendored_api.WorkerSpec
    package = vendored_api.__name__.removesuffix(".agent.server.api")
    assert [r.where for r in shape.routes] == [f"{package}.utils.store.barrier"]
    assert [m.__name__ for m in shape.metric_modules] == [f"{package}.metrics.api"]


def test_vendored_agent_conforms_to_torchrun(vendored_api: ModuleType) -> None:
    run_conformance(_type_checked(vendored_api), spec="torchrun", settings=ACCEPT, seed=0)


def test_vendored_agent_with_a_bug_is_rejected(vendored_api: ModuleType) -> None:
    class BarrierFirst(vendored_api.SimpleElasticAgent):  # type: ignore[misc,name-defined]
        def _invoke_run(self, role: str = "default") -> Any:
            self._exit_barrier()  # the copy's barrier, before the workers even start
            return super()._invoke_run(role)

    with pytest.raises(ConformanceFailure, match=r"(?s)start .*exit_barrier\(300\), "
                                                 r"rendezvous, start  <-- differs"):
        run_conformance(BarrierFirst, spec="torchrun", settings=REJECT, seed=0)


def test_vendored_local_agent_needs_what_the_kit_cannot_give(vendored_api: ModuleType) -> None:
    local = importlib.import_module(
        vendored_api.__name__.replace(".api", ".local_elastic_agent")).LocalElasticAgent
    with pytest.raises(HarnessError, match=r"its constructor needs logs_specs"):
        run_conformance(local, spec="torchrun", settings=ACCEPT)


def test_a_target_api_file_supplies_torchs_local_agent_its_logs_spec(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # torch 2.13's real LocalElasticAgent needs logs_specs: exit 2 without a declaration, and
    # with a one-line target API it is checked as it is, and conforms to torchrun.
    declared = tmp_path / "local.yaml"
    declared.write_text("constructor:\n  logs_specs: "
                        "torch.distributed.elastic.multiprocessing:DefaultLogsSpecs\n")
    target = "torch.distributed.elastic.agent.server.local_elastic_agent:LocalElasticAgent"
    assert main([target, "--spec", "torchrun", "--examples", "50", "--seed", "1"]) == 2
    assert "needs logs_specs" in capsys.readouterr().err
    assert main([target, "--spec", "torchrun", "--target-api", str(declared),
                 "--examples", "100", "--seed", "1"]) == 0
    assert "conforms to spec 'torchrun'" in capsys.readouterr().out
