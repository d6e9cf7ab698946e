"""Options for the whole suite, and where the processes it starts put their temporary files."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# torch's agents make a torchelastic_* log directory in the temporary directory for every job run
# without --log-dir, and never remove it (torchrun leaves them too). Processes the suite starts
# get a temporary directory of their own, removed when the session ends; this process keeps the
# usual one (pytest's tmp_path lives there, kept for failures).
_OWN_TMP: str | None = None


def _torch_installed() -> bool:
    # origin too: a directory named torch on sys.path would be a namespace package (the torch
    # driver's tests are in tests/agent/ so that none is)
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin is not None


#: Without torch (the core on other Pythons, docs/compat.md), importing it skips: a test module
#: that imports it, directly or through a helper or the torch adapter, is skipped whole, a test
#: that imports it when it runs is skipped alone.
TORCH_INSTALLED = _torch_installed()


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise pytest.skip.Exception("torch is not installed", allow_module_level=True)


if not TORCH_INSTALLED:
    sys.meta_path.insert(0, _NoTorch())


#: Without torch these are not collected: they test the torch adapter.
_TORCH_DIRS = ("agent", "torch_upstream", "reliability", "perf", "slurm")
#: Tests that need torch without importing it: they start ``fsm-agent run`` or ``demo``, or run
#: README snippets and examples that use torch's result types. (Node id prefixes, so that a
#: renamed test fails the torch-free run instead of being skipped unseen.)
_NEEDS_TORCH = (
    "tests/cli/test_cli_pipes.py::test_no_traceback_when_the_reader_leaves[demo]",
    "tests/cli/test_cli_pipes.py::test_no_traceback_when_the_reader_leaves[run-help]",
    "tests/cli/test_examples.py::test_fail_once_restarts_and_succeeds",
    "tests/cli/test_examples.py::test_always_failing_gives_up_as_the_spec_says",
    "tests/cli/test_readme_snippets.py::test_snippet_runs",
    "tests/diag/test_report.py::test_the_analysis_names_the_root_cause_decisions_and_budget",
    "tests/diag/test_report.py::test_text_format_prints_the_summary",
    "tests/diag/test_report.py::test_the_report_renders_in_chromium",
    "tests/diag/test_report.py::test_the_readme_example_two_agents_hang_crash_and_recover",
    "tests/diag/test_trace_bounds.py::test_a_killed_writer_leaves",
    "tests/diag/test_trace_bounds.py::test_a_healthy_job_at_a_tenth_of_a_second",
    "tests/tools/test_replay_policy.py::test_a_real_run_records",
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if TORCH_INSTALLED:
        return None
    tests = Path(__file__).parent
    return True if collection_path.parent == tests and collection_path.name in _TORCH_DIRS \
        else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The slow tests first (a stable sort): pytest-xdist hands tests out in this order, so the
    # long ones overlap on the two workers instead of one of them ending the run alone.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not config.getoption("--long", default=False):
        long = pytest.mark.skip(reason="long: run with --long")
        for item in items:
            if item.get_closest_marker("long") is not None:
                item.add_marker(long)
    if TORCH_INSTALLED:
        return
    skip = pytest.mark.skip(reason="needs torch at run time (not installed)")
    for item in items:
        if item.nodeid.startswith(_NEEDS_TORCH):
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str | None:
    if TORCH_INSTALLED:
        return None
    return "torch is not installed: what imports it is skipped (docs/compat.md)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="conformance: run 100,000 differential scripts per preset; run the "
                          "tests marked long (every TLC configuration of every preset)")



def pytest_configure(config: pytest.Config) -> None:
    global _OWN_TMP
    # The variable is what tests/conformance/_support reads, so it also works on its own.
    if config.getoption("--long", default=False):
        os.environ["FSM_AGENT_CONFORMANCE_LONG"] = "1"
    tempfile.gettempdir()  # fixed for this process before the variable changes
    _OWN_TMP = tempfile.mkdtemp(prefix="fsm-agent-tests-")
    # pytest-xdist's workers inherit the variable, so their temporary directories (tmp_path too)
    # live in here: test_stacks.py's processes run as nobody and must reach theirs.
    os.chmod(_OWN_TMP, 0o755)
    os.environ["TMPDIR"] = _OWN_TMP


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_TMP is not None:
        shutil.rmtree(_OWN_TMP, ignore_errors=True)
