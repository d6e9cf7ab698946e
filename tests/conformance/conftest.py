"""Conformance tests run with logging off (``--long``, in tests/conftest.py, runs 100,000
differential scripts per preset instead of 1,000)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet_logging() -> object:
    # Barrier failures log a traceback each; and with logging already off, the kit skips
    # logging.disable() per run, which clears every logger's cache (torch has hundreds).
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(saved)
