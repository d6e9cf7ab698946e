"""A user's own driver and the targets that exited 2 before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from fsm_agent import Lifecycle
from fsm_agent.cli.conformance import main
from fsm_agent.testing._conformance import (
    ConformanceFailure,
    HarnessError,
    default_settings,
    run_conformance,
)

from . import user_drivers
from .seed_agent import SeedAgent

pytestmark = pytest.mark.timeout(120)

FEW = settings(default_settings(60), database=None)
REJECT = settings(default_settings(1_000), database=None)
DRIVERS = "tests.conformance.user_drivers"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])


def test_the_users_driver_is_the_one_the_lifecycle_calls() -> None:
    built: list[user_drivers.ClientDriver] = []

    def make_driver(world: Any) -> user_drivers.ClientDriver:
        built.append(user_drivers.ClientDriver(world))
        return built[-1]

    run_conformance(Lifecycle, "torchrun", FEW, seed=0, driver=make_driver)
    assert built and sum(d.calls for d in built) > len(built)


def test_a_wrong_driver_is_found_under_a_correct_lifecycle() -> None:
    with pytest.raises(ConformanceFailure, match="rendezvous"):
        run_conformance(Lifecycle, "torchrun", REJECT, seed=0,
                        driver=user_drivers.make_retrying_driver)


def test_a_driver_goes_with_a_factory_not_an_agent_class() -> None:
    with pytest.raises(HarnessError, match="agent class"):
        run_conformance(SeedAgent, "torchelastic", FEW, driver=user_drivers.make_client_driver)


def test_the_driver_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsm_agent:Lifecycle", "--driver", f"{DRIVERS}:make_client_driver",
                 "--spec", "torchrun", "--examples", "40", "--seed", "1"]) == 0
    assert "conforms" in capsys.readouterr().out
    code = main(["fsm_agent:Lifecycle", "--driver", f"{DRIVERS}:make_retrying_driver",
                 "--spec", "torchrun", "--examples", "500", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"--driver {DRIVERS}:make_retrying_driver" in out  # the reproduction keeps it
    assert main(["fsm_agent:Lifecycle", "--driver", f"{DRIVERS}:nothing_here"]) == 2
    assert "--driver" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["examples.subprocess_supervisor:make_supervisor",
                                    "fsm_agent.torch:FSMElasticAgent"])
def test_the_examples_supervisor_and_the_runners_agent_are_targets(
        target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([target, "--examples", "30", "--seed", "1"]) == 0, capsys.readouterr()
    assert f"OK: {target} conforms to spec 'torchelastic'" in capsys.readouterr().out
