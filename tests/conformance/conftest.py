"""Conformance tests run with logging off (``--long``, in tests/conftest.py, runs 100,000
differential scripts per preset instead of 1,000); a vendored copy of torch elastic, built once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType

import pytest


@pytest.fixture(autouse=True)
def _quiet_logging() -> object:
    # Barrier failures log a traceback each; and with logging already off, the kit skips
    # logging.disable() per run, which clears every logger's cache (torch has hundreds).
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(saved)


@pytest.fixture(scope="session")
def vendored_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """``agent.server.api`` of a vendored copy of torch elastic (see ``vendored.py``)."""
    from .vendored import unload, vendor_torch_elastic

    root = tmp_path_factory.mktemp("vendored")
    try:
        yield vendor_torch_elastic(root)
    finally:
        unload(root)
