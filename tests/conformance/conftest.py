"""``pytest tests/conformance --long``: 100,000 differential scripts per preset instead of 1,000.

The option sets FSM_AGENT_CONFORMANCE_LONG, which ``_support`` reads (the variable also works on
its own, e.g. from a root-level pytest run, where this conftest's option is not registered).
"""

from __future__ import annotations

import logging
import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="conformance: run 100,000 differential scripts per preset")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long", default=False):
        os.environ["FSM_AGENT_CONFORMANCE_LONG"] = "1"


@pytest.fixture(autouse=True)
def _quiet_logging() -> object:
    # Barrier failures log a traceback each; and with logging already off, the kit skips
    # logging.disable() per run, which clears every logger's cache (torch has hundreds).
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(saved)
