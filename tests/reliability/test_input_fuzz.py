"""Fuzzing ``fsm-agent replay``, ``diagram --trace`` and ``check`` with malformed traces and specs.

Every input, however broken (nesting bombs, huge lines, other encodings, stray bytes, cut files,
paths in every field), gives a result (exit 0 or 1, with its output) or exactly one line
``fsm-agent TOOL: error: ...`` and exit 2: never a traceback, never a raw control character on
the terminal, and never a read of a file that a trace names (every open is watched).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fsm_agent
from fsm_agent._core._spec import MAX_SPEC_BYTES
from fsm_agent.cli import check, diagram, replay

ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "tests" / "tools" / "data" / "fail_once_recover.jsonl").read_text().splitlines()
PRESETS = [(ROOT / "specs" / f"{name}.yaml").read_text() for name in ("torchelastic", "torchrun")]

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.large_base_example, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def bait(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Files a hostile trace may name: none of them may ever be opened."""
    d = tmp_path_factory.mktemp("bait")
    secret = d / "secret.yaml"
    secret.write_text(PRESETS[0])  # a valid spec: opening it would even work
    fifo = d / "fifo"
    os.mkfifo(fifo)
    link = d / "link.yaml"
    link.symlink_to(secret)
    return {"secret": str(secret), "fifo": str(fifo), "link": str(link),
            "relative": os.path.relpath(secret)}


class Opens:
    """Every path opened (``open``, ``io.open``, ``os.open``) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real_open, real_os_open = builtins.open, os.open

        def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            self._saw(file)
            return real_open(file, *args, **kwargs)

        def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> int:
            self._saw(path)
            return real_os_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", spy_open)
        monkeypatch.setattr(io, "open", spy_open)
        monkeypatch.setattr(os, "open", spy_os_open)

    def _saw(self, path: Any) -> None:
        if isinstance(path, (str, os.PathLike)):
            self.paths.append(os.path.realpath(os.fspath(path)))

    def take(self) -> set[str]:
        # hypothesis's example database and modules imported on first use are not files the
        # tools were asked to read
        code = (os.path.realpath(os.path.dirname(fsm_agent.__file__)), os.path.realpath(sys.prefix))
        out = {p for p in self.paths
               if f"{os.sep}.hypothesis{os.sep}" not in p and not p.startswith(code)}
        self.paths = []
        return out


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[Opens]:
    yield Opens(monkeypatch)


def _printable_lines(text: str) -> bool:
    return all(line.isprintable() for line in text.split("\n"))


def assert_result_or_one_line(tool: str, code: int, out: str, err: str,
                              path: Path | None = None) -> None:
    """A result (0, 1) or one ``fsm-agent TOOL: error: ...`` line with exit 2; nothing raw."""
    what = err.split(": error: ", 1)[-1].replace(str(path), "F")[:50] if code == 2 else ""
    event(f"{tool} exit {code} {re.sub(r'[0-9]+', 'N', what)}")
    assert "Traceback" not in err
    assert _printable_lines(out) and _printable_lines(err), (out[-500:], err[-500:])
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1, err[-2000:]
        assert lines[0].startswith(f"fsm-agent {tool}: error: "), lines
        assert len(lines[0]) < 2100
    else:
        assert code in (0, 1), (code, err[-2000:])
        assert out.strip() or err.strip()


# --------------------------------------------------------------------------------------------
# Traces


PATHS = ["/etc/passwd", "/dev/zero", "../../../etc/shadow", "torchrun", "torchelastic",
         "resilient", "specs/torchrun.yaml", "~/.ssh/id_rsa", "-", "", "\x1b[2J\x1b]0;x\x07",
         "con\u202eevil"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=20), st.sampled_from(PATHS), st.integers(4000, 6000).map(lambda n: "a" * n),
    st.sampled_from(["HEALTHY", "FAILED", "UNKNOWN", "start", "signal", "always", "failed",
                     "consume_restart", "has_restarts_left", "incomplete", "header", "step"]),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10)
FIELDS = ["kind", "seq", "trigger", "source", "dest", "guards", "actions", "remaining_restarts",
          "restart_count", "observed", "failures", "error", "role", "format", "version", "spec",
          "spec_path", "preset", "group_rank"]
DEEP = "\x00DEEP\x00"


def _nest(depth: int, style: str) -> str:
    opener, closer = {"list": ("[", "]"), "dict": ('{"a": ', "}")}[style[:4]]
    inner = "1" if style[:4] == "dict" else ""
    closing = closer * depth if style.endswith("closed") else ""
    return opener * depth + inner + closing


@st.composite
def hostile_traces(draw: st.DrawFn, bait: dict[str, str]) -> bytes:
    records: list[Any] = [json.loads(x) for x in GOOD]
    deep: str | None = None
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["field", "header", "deep", "delete", "marker", "dup"]))
        i = draw(st.integers(0, len(records) - 1))
        rec = records[i]
        if op == "field" and isinstance(rec, dict):
            rec[draw(st.sampled_from(FIELDS) | st.text(max_size=6))] = draw(json_values)
        elif op == "header":
            field = draw(st.sampled_from(["spec", "spec_path", "preset", "format", "version"]))
            records[0][field] = draw(st.sampled_from(sorted(bait.values())) | json_values)
        elif op == "deep" and isinstance(rec, dict):
            rec[draw(st.sampled_from(FIELDS))] = DEEP
            deep = _nest(draw(st.integers(1, 120_000)),
                         draw(st.sampled_from(["list-closed", "list-open", "dict-closed"])))
        elif op == "delete" and len(records) > 1:
            del records[i]
        elif op == "marker":
            records.insert(i, {"kind": "incomplete", "seq": draw(json_values),
                               "error": draw(json_values)})
        elif op == "dup":
            records.insert(i, json.loads(json.dumps(rec)))
    text = "".join(json.dumps(r) + "\n" for r in records)
    if deep is not None:
        text = text.replace(json.dumps(DEEP), deep)
    raw = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["bytes", "cut", "huge", "newline"]))
        if op == "bytes":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=6) | st.sampled_from(
                [b"\xff", b"\xc3", b"\x00", b"\r", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\x1b[31m"]))
        elif op == "cut":
            del raw[pos:]
        elif op == "huge":
            raw[pos:pos] = draw(st.sampled_from([b"x", b" ", b"[", b"\n", b'"'])) * draw(
                st.integers(1000, 300_000))
        else:
            raw[pos:pos] = b"\n"
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["utf-16", "utf-8-sig", "latin-1"]))
    if encoding != "utf-8":
        raw = bytearray(bytes(raw).decode("utf-8", "replace").encode(encoding, "replace"))
    return bytes(raw)


class Counter:
    n = 0


@FUZZ
@given(data=st.data())
def test_replay_and_diagram_on_hostile_traces(tmp_path: Path, bait: dict[str, str],
                                              opens: Opens, capsys: pytest.CaptureFixture[str],
                                              data: st.DataObject) -> None:
    raw = data.draw(hostile_traces(bait))
    Counter.n += 1
    path = tmp_path / f"t{Counter.n}.jsonl"
    path.write_bytes(raw)
    tool = data.draw(st.sampled_from(["replay", "diagram"]))
    given_spec = data.draw(st.sampled_from([None, "torchrun", "torchelastic"]))
    if tool == "replay":
        args = [str(path)] + (["--spec", given_spec] if given_spec else [])
        code = replay.main(args)
    else:
        args = [*([given_spec] if given_spec else []), "--trace", str(path)]
        code = diagram.main(args)
    out, err = capsys.readouterr()
    assert_result_or_one_line(tool, code, out, err, path)
    opened = opens.take()
    assert not opened & {os.path.realpath(p) for p in bait.values()}, opened


# --------------------------------------------------------------------------------------------
# Specs


@st.composite
def hostile_specs(draw: st.DrawFn, bait: dict[str, str]) -> bytes:
    lines = draw(st.sampled_from(PRESETS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(["flow", "block", "path", "alias", "tag", "pad"]))
        if op == "flow":
            depth = draw(st.integers(1, 100_000))
            closed = draw(st.booleans())
            line = "x: " + "[" * depth + ("]" * depth if closed else "") + "\n"
        elif op == "block":
            depth = draw(st.integers(1, 900))
            line = "".join(" " * i + "a:\n" for i in range(depth)) + " " * depth + "b\n"
        elif op == "path":
            key = draw(st.sampled_from(["name", "description", "include", "spec_path", "<<",
                                        "$ref", "vocabulary"]))
            line = f"{key}: {json.dumps(draw(st.sampled_from(sorted(bait.values()) + PATHS)))}\n"
        elif op == "alias":
            line = "x: &a [" + ", ".join(["*a"] * 3) + "]\n" if draw(st.booleans()) else (
                "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
                + "".join(f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"]
                                                        * 9) + "]\n" for i in range(8)))
        elif op == "tag":
            line = "x: " + draw(st.sampled_from(["!!python/object/apply:os.system ['true']",
                                                 "!!python/name:os.system", "!!binary AAAA",
                                                 "!include /etc/passwd"])) + "\n"
        else:
            size = draw(st.integers(MAX_SPEC_BYTES - 4000, MAX_SPEC_BYTES + 10))
            line = "# " + "x" * max(0, size - sum(len(x) for x in lines) - 3) + "\n"
        lines.insert(at, line)
    raw = bytearray("".join(lines).encode("utf-8"))
    for _ in range(draw(st.integers(0, 2))):
        pos = draw(st.integers(0, len(raw)))
        raw[pos:pos] = draw(st.binary(min_size=1, max_size=4)
                            | st.sampled_from([b"\xff", b"\x00", b"\xef\xbb\xbf", b"\x1b[2J"]))
    encoding = draw(st.sampled_from(["utf-8"] * 5 + ["utf-16", "utf-32", "latin-1"]))
    if encoding != "utf-8":
        raw = bytearray(bytes(raw).decode("utf-8", "replace").encode(encoding, "replace"))
    return bytes(raw)


@FUZZ
@given(data=st.data())
def test_check_on_hostile_specs(tmp_path: Path, bait: dict[str, str], opens: Opens,
                                capsys: pytest.CaptureFixture[str], data: st.DataObject) -> None:
    raw = data.draw(hostile_specs(bait))
    Counter.n += 1
    path = tmp_path / f"s{Counter.n}.yaml"
    path.write_bytes(raw)
    code = check.main([str(path)])
    out, err = capsys.readouterr()
    assert_result_or_one_line("check", code, out, err, path)
    if code == 1:  # the spec's problems: every line names the file (and mostly the line)
        assert all(line.startswith(str(path)) for line in err.splitlines()), err[-2000:]
    opened = opens.take()
    assert not opened & {os.path.realpath(p) for p in bait.values()}, opened
    if code == 0:  # the watch works: the spec itself was read
        assert os.path.realpath(path) in opened
    assert opened <= {str(path), os.path.realpath(path)} | {
        os.path.realpath(ROOT / "specs" / f"{n}.yaml") for n in ("torchelastic", "torchrun",
                                                                 "resilient")}, opened


ARGS = ["{fifo}", "/dev/zero", "/dev/null", "{dir}", "{missing}", "{link_fifo}", "{link_zero}",
        "a\x00b", "x" * 5000, "\x1b[2J.yaml", "torchrun", "-"]


@FUZZ
@given(data=st.data())
def test_check_and_replay_on_hostile_paths(tmp_path: Path, opens: Opens,
                                           capsys: pytest.CaptureFixture[str],
                                           data: st.DataObject) -> None:
    where = {"fifo": str(tmp_path / "fifo"), "dir": str(tmp_path), "missing": str(tmp_path / "no"),
             "link_fifo": str(tmp_path / "lf"), "link_zero": str(tmp_path / "lz")}
    if not os.path.exists(where["fifo"]):
        os.mkfifo(where["fifo"])
        os.symlink(where["fifo"], where["link_fifo"])
        os.symlink("/dev/zero", where["link_zero"])
    arg = data.draw(st.sampled_from(ARGS)).format(**where)
    tool = data.draw(st.sampled_from(["check", "replay", "diagram"]))
    main = {"check": check.main, "replay": replay.main, "diagram": diagram.main}[tool]
    code = main([arg] if tool != "diagram" else ["--trace", arg])
    out, err = capsys.readouterr()
    if tool == "check" and arg == "torchrun":
        assert code == 0
    assert_result_or_one_line(tool, code, out, err)
    assert code == 2 or arg == "torchrun", (code, out, err)
