"""The public namespaces: every exported name exists and is documented, and the README and docs/
show imports from public modules only."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ["fsm_agent", "fsm_agent.trace", "fsm_agent.diagram", "fsm_agent.testing",
          "fsm_agent.torch"]
PRIVATE_IMPORT = re.compile(r"^\s*(?:from|import)\s+fsm_agent(?:\.\w+)*\._\w+", re.M)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_export_exists_and_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, name
    for attr in module.__all__:
        obj = getattr(module, attr)  # raises if an export is missing
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and \
                obj.__module__.startswith("fsm_agent"):
            assert inspect.getdoc(obj), f"{name}.{attr} has no docstring"


def test_public_namespaces_re_export_the_private_objects() -> None:
    from fsm_agent import diagram, trace
    from fsm_agent.diagram import _render as _diagram
    from fsm_agent.torch import _launch, launch
    from fsm_agent.trace import _replay
    from fsm_agent.trace import _writer as _trace

    assert trace.open_trace is _trace.open_trace and trace.replay is _replay.replay
    assert trace.TraceWriter is _trace.JsonlTraceWriter
    assert diagram.render is _diagram.render
    assert launch is _launch.launch


@pytest.mark.parametrize(("old", "new"), [("Trace", "ConformanceTrace"),
                                          ("Divergence", "IntendedDivergence")])
def test_the_kits_old_class_names_warn_and_give_the_renamed_class(old: str, new: str) -> None:
    import fsm_agent.testing as testing

    with pytest.warns(DeprecationWarning, match=rf"fsm_agent\.testing\.{old} is deprecated; "
                                                rf"use {new}$"):
        value = getattr(testing, old)
    assert value is getattr(testing, new)
    assert old not in testing.__all__ and new in testing.__all__
    with pytest.warns(DeprecationWarning):  # a second use warns again: the old name is not cached
        getattr(testing, old)


def test_docs_import_public_modules_only() -> None:
    offenders = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in PRIVATE_IMPORT.finditer(doc.read_text()):
            line = doc.read_text().count("\n", 0, m.start()) + 1
            offenders.append(f"{doc.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not offenders, offenders
