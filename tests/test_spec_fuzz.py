"""Fuzzing the spec loader: whatever the bytes, the answer is a Spec or a SpecError with a place.

Mutations start from the valid specs (presets and the compact test spec) and break them at the
data level (deleted keys, wrong types, unknown names, extra entries) and at the text level
(random bytes, non-UTF-8, YAML tags that try to build objects, duplicated lines, huge files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_agent import Spec, SpecError, parse_spec
from fsm_agent._core._spec import MAX_SPEC_BYTES

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    (ROOT / "specs" / "torchelastic.yaml").read_text(),
    (ROOT / "specs" / "torchrun.yaml").read_text(),
    (ROOT / "tests" / "specs" / "good" / "compact.yaml").read_text(),
]
DATA = [yaml.safe_load(s) for s in SOURCES]

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["HEALTHY", "FAILED", "always", "exit_barrier",
                                           "has_restarts_left", "__import__", "os.system"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


@st.composite
def mutated_data(draw: st.DrawFn) -> Any:
    import copy

    data = copy.deepcopy(draw(st.sampled_from(DATA)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _get(data, path[:-1])
        op = draw(st.sampled_from(["delete", "replace", "duplicate", "add_key"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(values)
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
    return data


def _assert_located(result: Spec | SpecError, text_lines: int) -> None:
    if isinstance(result, Spec):
        return
    assert result.problems
    for p in result.problems:
        assert p.path == "fuzz.yaml"
        assert p.message
        assert p.line is not None, str(p)
        assert 1 <= p.line <= text_lines + 1, str(p)


def _load(source: str | bytes) -> Spec | SpecError:
    try:
        return parse_spec(source, path="fuzz.yaml")
    except SpecError as e:
        return e


@FUZZ
@given(mutated_data())
def test_data_mutations_give_a_located_spec_error(data: Any) -> None:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    _assert_located(_load(text), text.count("\n"))


@st.composite
def mutated_bytes(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SOURCES)).encode())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["insert", "delete", "flip", "tag", "dup_line"]))
        if op == "insert":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del raw[pos:pos + draw(st.integers(1, 20))]
        elif op == "flip" and pos < len(raw):
            raw[pos] = draw(st.integers(0, 255))
        elif op == "tag":
            tag = draw(st.sampled_from([
                b"!!python/object/apply:os.system ['touch /tmp/fsm_agent_fuzz_pwned'] ",
                b"!!python/name:os.system ", b"!!binary ", b"!custom ", b"!!set ",
                b"&a [*a] ",
            ]))
            nl = raw.find(b": ", pos)
            if nl >= 0:
                raw[nl + 2:nl + 2] = tag
        else:
            start = raw.rfind(b"\n", 0, pos) + 1
            end = raw.find(b"\n", pos)
            if end > start:
                raw[end + 1:end + 1] = raw[start:end + 1]
    return bytes(raw)


@FUZZ
@given(mutated_bytes())
def test_byte_mutations_give_a_located_spec_error(raw: bytes) -> None:
    _assert_located(_load(raw), raw.count(b"\n"))
    assert not Path("/tmp/fsm_agent_fuzz_pwned").exists()


def test_huge_file_is_refused_without_parsing() -> None:
    raw = SOURCES[0].encode() + b"#" * MAX_SPEC_BYTES
    err = _load(raw)
    assert isinstance(err, SpecError)
    assert "at most" in str(err)


def test_alias_bombs_are_refused() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        bomb += f"{'b' * i}: &{'a' * (i + 1)} [" + ", ".join([f"*{'a' * i}"] * 10) + "]\n"
    err = _load(bomb)
    assert isinstance(err, SpecError)
    assert "too large" in str(err)


def test_cycles_without_exits_are_refused() -> None:
    restart = "dest: HEALTHY, actions: [rendezvous, start_workers]}"
    text = SOURCES[2].replace(f"source: STOPPED, {restart}", "source: STOPPED, dest: UNHEALTHY}")
    assert text != SOURCES[2]
    err = _load(text)
    assert isinstance(err, SpecError)
    assert "cycle" in str(err)
