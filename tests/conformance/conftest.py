"""``pytest tests/conformance --long``: 100,000 differential scripts per preset instead of 1,000.

The option sets FSM_AGENT_CONFORMANCE_LONG, which ``_support`` reads (the variable also works on
its own, e.g. from a root-level pytest run, where this conftest's option is not registered).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="conformance: run 100,000 differential scripts per preset")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long", default=False):
        os.environ["FSM_AGENT_CONFORMANCE_LONG"] = "1"
