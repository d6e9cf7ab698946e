"""Options for the whole suite, and where the processes it starts put their temporary files."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# torch's agents make a torchelastic_* log directory in the temporary directory for every job run
# without --log-dir, and never remove it (torchrun leaves them too). Processes the suite starts
# get a temporary directory of their own, removed when the session ends; this process keeps the
# usual one (pytest's tmp_path lives there, kept for failures).
_OWN_TMP: str | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="conformance: run 100,000 differential scripts per preset")


def pytest_configure(config: pytest.Config) -> None:
    global _OWN_TMP
    # The variable is what tests/conformance/_support reads, so it also works on its own.
    if config.getoption("--long", default=False):
        os.environ["FSM_AGENT_CONFORMANCE_LONG"] = "1"
    tempfile.gettempdir()  # fixed for this process before the variable changes
    _OWN_TMP = tempfile.mkdtemp(prefix="fsm-agent-tests-")
    os.environ["TMPDIR"] = _OWN_TMP


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_TMP is not None:
        shutil.rmtree(_OWN_TMP, ignore_errors=True)
