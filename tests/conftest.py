"""Options for the whole suite."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="conformance: run 100,000 differential scripts per preset")


def pytest_configure(config: pytest.Config) -> None:
    # The variable is what tests/conformance/_support reads, so it also works on its own.
    if config.getoption("--long", default=False):
        os.environ["FSM_AGENT_CONFORMANCE_LONG"] = "1"
