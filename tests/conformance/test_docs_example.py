"""The fifteen-line example of docs/conformance.md (also in the README) runs as written."""

from __future__ import annotations

import re
import sys
import types
import unittest
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

pytestmark = pytest.mark.timeout(120)

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


class MyElasticAgent(SimpleElasticAgent):
    """A user's agent: torch's run loop, unchanged."""


class MyDriver:
    """A user's driver that wraps another and forwards every call."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_fifteen_line_example(monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"## In fifteen lines\n\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 16
    mypkg = types.ModuleType("mypkg")
    agent = types.ModuleType("mypkg.agent")
    supervisor = types.ModuleType("mypkg.supervisor")
    agent.MyElasticAgent = MyElasticAgent  # type: ignore[attr-defined]
    supervisor.MyDriver = MyDriver  # type: ignore[attr-defined]
    for name, mod in (("mypkg", mypkg), ("mypkg.agent", agent), ("mypkg.supervisor", supervisor)):
        monkeypatch.setitem(sys.modules, name, mod)
    # The example runs the kit's defaults; fewer examples keep this test cheap.
    import fsm_agent.testing._conformance as kit

    real = kit.default_settings
    monkeypatch.setattr(kit, "default_settings", lambda n=200: settings(real(40), database=None))
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    namespace["test_my_agent_behaves_like_torchrun"]()
    namespace["test_my_supervisor_behaves_like_torchelastic"]()
    assert issubclass(namespace["TestMyAgent"], unittest.TestCase)
