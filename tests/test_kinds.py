"""Every built-in guard kind against its own declared examples, and docs/spec-format.md's tables
of kinds against the declarations they are generated from.

Each example (``fsm_agent.KindExample``) goes through what a user's spec goes through: the kind
is instantiated under a spec's ``guards:``, the spec is parsed and checked, a lifecycle compiles
it, and the guard is evaluated on that lifecycle's ``Context`` with the example's observation.
A kind with no examples fails here unless it says why (``Kind.untested``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Kind, KindExample, Lifecycle, VirtualClock, Vocabulary, parse_spec
from fsm_agent._core._kind_table import spec_format_tables, with_tables
from fsm_agent.testing import RecordingDriver, make_result

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "spec-format.md"
BUILTIN = Vocabulary.builtin()

# The smallest spec a lifecycle runs: the guard under test is declared, named by no transition.
_STATES = {"INIT": {"initial": True}, "HEALTHY": {}, "UNHEALTHY": {}, "STOPPED": {},
           "SUCCEEDED": {"final": True}, "FAILED": {"final": True}, "UNKNOWN": {"final": True}}
_TRANSITIONS = [
    {"trigger": "start", "source": "INIT", "dest": "HEALTHY",
     "actions": ["rendezvous", "start_workers"]},
    {"trigger": ["healthy", "failed"], "source": "HEALTHY", "dest": "HEALTHY"},
    {"trigger": "unhealthy", "source": "HEALTHY", "dest": "UNHEALTHY"},
    {"trigger": "always", "source": "UNHEALTHY", "dest": "HEALTHY"},
    {"trigger": "succeeded", "source": "HEALTHY", "dest": "SUCCEEDED"},
    {"trigger": ["unknown", "init", "stopped"], "source": "HEALTHY", "dest": "UNKNOWN"},
    {"trigger": "probe", "source": "HEALTHY", "dest": "STOPPED",
     "actions": ["consume_restart", "stop_workers"], "guards": ["has_restarts_left"]},
    {"trigger": "probe", "source": "HEALTHY", "dest": "FAILED", "unless": ["has_restarts_left"]},
    {"trigger": "always", "source": "STOPPED", "dest": "HEALTHY",
     "actions": ["rendezvous", "start_workers"]},
]


def _spec_args(kind: Kind, args: Any) -> tuple[Any, dict[str, Any]]:
    """The example's argument as a spec writes it: a user-only value through a parameter."""
    named = dict(args) if isinstance(args, dict) else {kind.positional: args}
    params = {}
    for name in kind.user_only & set(named):
        params[f"user_{name}"] = named[name]
        named[name] = f"user_{name}"
    return (named if isinstance(args, dict) or params else args), params


def _driver(attributes: Any) -> RecordingDriver:
    methods = {k: staticmethod(v) if callable(v) else v for k, v in attributes.items()}
    return type("ExampleDriver", (RecordingDriver,), methods)([])


def _observation(failures: Any) -> Any:
    if not failures:
        return make_result("HEALTHY")
    return make_result("FAILED", ranks=range(len(failures)),
                       exitcode={r: f["exitcode"] for r, f in enumerate(failures)},
                       error={r: f.get("message") for r, f in enumerate(failures)})


def evaluate(name: str, example: KindExample) -> bool:
    """The value of a guard of kind ``name`` with the example's arguments, on its context."""
    kind = BUILTIN.guard_kinds[name]
    args, user = _spec_args(kind, example.args)
    vocab = BUILTIN.extend(guards={g: (lambda ctx, v=v: v) for g, v in example.guards.items()})
    spec = parse_spec(json.dumps({
        "name": f"example_of_{name}", "description": f"an example of {name}",
        "params": {p: {"type": "str", "default": ""} for p in user},
        "guards": {"subject": {name: args}},
        "triggers": ["probe"], "states": _STATES, "transitions": _TRANSITIONS,
        **example.spec}), vocabulary=vocab)
    lc = Lifecycle(spec, _driver(example.driver), clock=VirtualClock(example.now), params=user)
    ctx = lc.context
    ctx.observed = _observation(example.failures)
    for field, value in example.context.items():
        assert hasattr(ctx, field), f"an example of {name} sets {field}, not a Context field"
        setattr(ctx, field, value)
    ctx.memo.clear()
    return ctx.check("subject")


@pytest.mark.parametrize("name", sorted(BUILTIN.guard_kinds))
def test_every_guard_kind_gets_its_examples_right(name: str) -> None:
    kind = BUILTIN.guard_kinds[name]
    if kind.untested:
        assert not kind.examples, f"{name}: examples and a reason to have none"
        pytest.skip(f"{name}: {kind.untested}")
    outcomes = {e.expect for e in kind.examples}
    assert outcomes == {True, False}, (
        f"{name}: declare examples (Kind.examples) where it holds and where it does not, or "
        f"say in Kind.untested why its inputs cannot be written as data")
    wrong = [(e.args, e.expect) for e in kind.examples if evaluate(name, e) is not e.expect]
    assert not wrong, f"{name}: these examples (args, expected) come out the other way: {wrong}"


def test_every_module_s_guard_kinds_are_built_in() -> None:
    # A kind declared in a vocabulary module but not added to the built-in vocabulary would
    # escape the test above.
    modules = sorted(p.stem for p in (ROOT / "fsm_agent" / "_core").glob("_*.py")
                     if not p.stem.startswith("__"))
    declared = {}
    for stem in modules:
        module = importlib.import_module(f"fsm_agent._core.{stem}")
        declared.update(getattr(module, "GUARD_KINDS", {}))
    assert declared and declared.keys() <= BUILTIN.guard_kinds.keys()


def test_the_docs_tables_of_kinds_are_generated_from_the_kinds() -> None:
    text = DOC.read_text()
    assert with_tables(text) == text, (
        "docs/spec-format.md's tables of kinds are stale: run python tools/generated_docs.py")
    tables = spec_format_tables()
    assert all(f"| `{name}` |" in tables["guard-kinds"] for name in BUILTIN.guard_kinds)
    assert all(kind.description for kind in (*BUILTIN.guard_kinds.values(),
                                             *BUILTIN.action_kinds.values()))
