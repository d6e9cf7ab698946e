"""The JSON Lines trace: what the writer records per transition, and how the reader fails."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm_agent import Lifecycle
from fsm_agent.testing import RecordingDriver
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._schema import TraceError
from fsm_agent.trace._writer import JsonlTraceWriter, open_trace

from ._helpers import DATA, lines, run_traced, write_lines

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagrams.md"


def test_one_record_per_transition_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    run_traced(path, "torchelastic", ["HEALTHY", "FAILED", "SUCCEEDED"], max_restarts=1)
    header, *steps = lines(path)
    assert header["kind"] == "header"
    assert header["spec"] == "torchelastic"
    assert header["group_rank"] == 0
    # start; healthy (stay); failed -> STOPPED; always -> HEALTHY; succeeded -> SUCCEEDED
    assert [(s["source"], s["trigger"], s["dest"]) for s in steps] == [
        ("INIT", "start", "HEALTHY"),
        ("HEALTHY", "healthy", "HEALTHY"),
        ("HEALTHY", "failed", "STOPPED"),
        ("STOPPED", "always", "HEALTHY"),
        ("HEALTHY", "succeeded", "SUCCEEDED"),
    ]
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5]
    assert all(s["group_rank"] == 0 and s["role"] == "default" for s in steps)
    failed = steps[2]
    assert failed["guards"] == [{"name": "has_restarts_left", "value": True}]
    assert [(a["name"], a["kind"], a["outcome"]) for a in failed["actions"]] == [
        ("consume_restart", "action", "ok"), ("stop_workers", "action", "ok")]
    assert all(a["duration_s"] >= 0 for a in failed["actions"])
    assert (failed["remaining_restarts"], failed["restart_count"]) == (0, 1)
    assert failed["observed"] == "FAILED"
    # RecordingDriver's FAILED result carries torch's ProcessFailure for rank 0, exit code 1.
    assert failed["failures"]["0"]["exitcode"] == 1
    assert steps[1]["guards"] == [{"name": "nodes_waiting", "value": False}]
    assert steps[-1]["actions"][0]["name"] == "exit_barrier"
    assert steps[-1]["actions"][0]["kind"] == "enter"
    walls = [s["wall_time"] for s in steps]
    monos = [s["monotonic_time"] for s in steps]
    assert walls == sorted(walls) and monos == sorted(monos)


def test_each_record_is_on_disk_when_the_next_transition_starts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    seen: list[int] = []

    writer = JsonlTraceWriter(path, spec="torchrun")

    def reader(step: object) -> None:
        # Runs after the writer, before the engine goes on: the file must already hold the line.
        seen.append(len(path.read_text().splitlines()))

    lc = Lifecycle("torchrun", RecordingDriver(["HEALTHY", "SUCCEEDED"]), listeners=[writer,
                                                                                      reader])
    lc.run(0.0)
    writer.close()
    assert seen == [2, 3, 4]  # header + 1, + 2, + 3 records


def test_a_killed_writer_loses_nothing_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # The engine's Steps, fed straight to the writer: the child need not import torch (which
    # Lifecycle.start() does, for its WorkerState return value).
    script = textwrap.dedent(f"""
        import os
        from fsm_agent import Step
        from fsm_agent.trace._writer import JsonlTraceWriter

        writer = JsonlTraceWriter({str(path)!r}, spec="torchelastic")
        writer(Step("start", "INIT", 1.0, 1.0, "default", dest="HEALTHY"))
        for i in range(2):
            writer(Step("healthy", "HEALTHY", 2.0 + i, 2.0 + i, "default", dest="HEALTHY",
                        guards=[("nodes_waiting", False)], observed="HEALTHY"))
        os._exit(9)  # no flush, no atexit, no close: as a SIGKILL would
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()
    (trace,) = read_trace(path)
    # the two identical ticks are one folded record, its count and last time already on disk
    assert [(r.trigger, r.count) for r in trace.records] == [("start", 1), ("healthy", 2)]
    assert trace.records[-1].guards == [("nodes_waiting", False)]
    assert trace.records[-1].data["last_wall_time"] == 3.0


def test_static_and_dynamic_fields(tmp_path: Path) -> None:
    rank = iter([4, 4, 7])
    out = io.StringIO()
    writer = JsonlTraceWriter(out, spec="torchrun", dynamic=lambda: {"group_rank": next(rank)},
                              node="n1")
    Lifecycle("torchrun", RecordingDriver(["HEALTHY", "SUCCEEDED"]), listeners=[writer]).run(0.0)
    records = [json.loads(x) for x in out.getvalue().splitlines()]
    assert records[0]["node"] == "n1"
    assert [r["group_rank"] for r in records[1:]] == [4, 4, 7]
    assert all(r["node"] == "n1" for r in records)
    with pytest.raises(ValueError, match="trigger"):
        JsonlTraceWriter(io.StringIO(), trigger="x")


def test_open_trace_appends_so_lifecycles_share_a_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    for _ in range(2):
        with open_trace(path, spec="torchrun") as w:
            Lifecycle("torchrun", RecordingDriver(["SUCCEEDED"]), listeners=[w]).run(0.0)
    traces = read_trace(path)
    assert [len(t.records) for t in traces] == [2, 2]
    assert [t.header_line for t in traces] == [1, 4]
    assert all(t.final_state == "SUCCEEDED" for t in traces)


def test_an_action_that_raised_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    err = run_traced(path, "torchelastic", ["FAILED"],
                     raises={"stop_workers": RuntimeError("boom")})
    assert err is not None
    last = lines(path)[-1]
    assert last["dest"] == "UNKNOWN"
    assert last["actions"][-1] == {**last["actions"][-1], "name": "stop_workers",
                                   "outcome": "raised", "error": "RuntimeError: boom"}
    assert "ActionError" in last["error"]


# -- reading bad files -----------------------------------------------------------------------


def _good(tmp_path: Path) -> list[str]:
    path = tmp_path / "good.jsonl"
    run_traced(path, "torchrun", ["HEALTHY", "SUCCEEDED"])
    return path.read_text().splitlines(keepends=True)


def test_reader_names_the_line_cut_short_by_a_crash(tmp_path: Path) -> None:
    good = _good(tmp_path)
    bad = tmp_path / "cut.jsonl"
    bad.write_text("".join(good[:-1]) + good[-1][: len(good[-1]) // 2])
    with pytest.raises(TraceError) as e:
        read_trace(bad)
    assert e.value.line == len(good)
    assert str(e.value).startswith(f"{bad}:{len(good)}: ")
    assert "cut short" in str(e.value)


def test_reader_names_a_corrupt_line(tmp_path: Path) -> None:
    good = _good(tmp_path)
    bad = tmp_path / "corrupt.jsonl"
    bad.write_text("".join(good[:2]) + "{not json\n" + "".join(good[2:]))
    with pytest.raises(TraceError, match=rf"{bad}:3: not valid JSON"):
        read_trace(bad)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"kind": "step", "source": "INIT"}, "no 'trigger' field"),
        ({"kind": "header", "format": "other"}, "not an fsm-agent trace"),
        ({"kind": "header", "version": 99}, "newer than"),
        ({"kind": "weird"}, "unknown record kind"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_reader_rejects_malformed_records(tmp_path: Path, record: object, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TraceError, match=rf":1: .*{message}"):
        read_trace(path)


def test_reader_checks_field_types(tmp_path: Path) -> None:
    good = [json.loads(x) for x in _good(tmp_path)]
    good[1]["remaining_restarts"] = "3"
    path = write_lines(tmp_path / "t.jsonl", good)
    with pytest.raises(TraceError, match=r":2: field 'remaining_restarts' has the wrong type"):
        read_trace(path)


def test_reader_on_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="empty trace"):
        read_trace(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(tmp_path / "bin.jsonl")


def test_the_real_run_fixture_reads() -> None:
    (trace,) = read_trace(DATA / "fail_once_recover.jsonl")
    # fsm-agent run --trace names the spec and the node, and gives every step its group rank.
    assert trace.spec_name == "torchelastic"
    assert {"node", "pid", "run_id"} <= set(trace.header)
    assert all(r.data["group_rank"] == 0 for r in trace.records)
    assert trace.final_state == "SUCCEEDED"
    # Real torch ProcessFailures: two local ranks, the failing one exited with 1.
    (failed,) = [r.data for r in trace.records if r.trigger == "failed"]
    assert failed["observed"] == "FAILED"
    assert sorted(failed["failures"]) == ["0", "1"]
    assert 1 in {f["exitcode"] for f in failed["failures"].values()}


# -- the declared schema (fsm_agent/trace/_schema.py) ----------------------------------------


def test_the_writer_writes_exactly_the_declared_fields(tmp_path: Path) -> None:
    from fsm_agent.trace._schema import FOLD_FIELDS, HEADER_FIELDS, STEP_FIELDS

    path = tmp_path / "t.jsonl"
    run_traced(path, "torchelastic", ["HEALTHY", "HEALTHY", "HEALTHY", "FAILED", "SUCCEEDED"],
               max_restarts=1)
    header, *steps = lines(path)
    static = {"group_rank"}  # run_traced's static field
    assert set(header) - static <= {f.name for f in HEADER_FIELDS}, header
    declared = {f.name for f in (*STEP_FIELDS, *FOLD_FIELDS)}
    for step in steps:
        assert set(step) - static <= declared, step
        for f in (*STEP_FIELDS, *FOLD_FIELDS):
            if f.name in step:
                assert isinstance(step[f.name], f.types), (f.name, step[f.name])
    # every field the engine owns is written (diagnostics are the torch agent's, when any), in
    # the schema's order, then the static ones
    owned = [f.name for f in STEP_FIELDS if f.owned]
    for step in steps:
        assert list(step)[:len(owned)] == owned, step
    assert any("count" in s for s in steps)  # the healthy ticks folded


def test_every_step_attribute_has_one_record_row_beside_it() -> None:
    # A Step attribute without its row would be silently left out of every trace; a row without
    # its attribute would break the writer. Both are declared in fsm_agent/_core/_step.py.
    import attrs

    from fsm_agent import Step
    from fsm_agent._core._step import STEP_RECORD
    from fsm_agent.trace._schema import STEP_FIELDS

    rows = [f.name for f in STEP_RECORD]
    assert sorted(rows) == sorted(a.name for a in attrs.fields(Step))
    assert len(set(rows)) == len(rows) and all(f.from_step for f in STEP_RECORD)
    # what the writer sets itself, then the Step's rows in their order, then the agent's
    assert [f.name for f in STEP_FIELDS if f.from_step] == rows


def test_the_docs_show_the_declared_tables() -> None:
    from fsm_agent.trace._schema import with_trace_tables

    doc = DOC.read_text()
    assert with_trace_tables(doc) == doc, "docs/diagrams.md's trace tables are stale: run " \
        "python tools/generated_docs.py"


def test_the_table_command_rewrites_a_stale_table_and_only_it() -> None:
    from fsm_agent.trace._schema import STEP_FIELDS, field_table
    from fsm_agent.trace._schema import with_trace_tables as synced

    doc = DOC.read_text()
    stale = doc.replace("| `rule` |", "| `old_rule` |", 1)
    stale = stale.replace("<!-- trace-schema: step -->\n", "<!-- trace-schema: step -->\n"
                          "| `dropped` | a row the schema no longer has |\n", 1)
    assert stale != doc and synced(stale) == doc
    assert field_table(STEP_FIELDS) in synced(stale)
    with pytest.raises(ValueError, match="trace-schema: fold"):
        synced(doc.replace("<!-- trace-schema: fold -->\n", ""))


def test_the_run_summary_folds_as_the_trace_does(tmp_path: Path) -> None:
    # One fold rule: the recorder behind the end-of-run summary keeps the records the trace
    # writer writes, counts included.
    from fsm_agent import load_spec
    from fsm_agent._readers._summary import RunRecorder

    def group_ranks() -> Iterator[dict[str, int]]:
        # a field that changes between two quiet ticks (a re-rendezvous moved the group)
        for n in itertools.count():
            yield {"group_rank": 0 if n < 3 else 1}

    path = tmp_path / "t.jsonl"
    mine, theirs = group_ranks(), group_ranks()
    recorder = RunRecorder(fields=lambda: next(mine))
    script = ["HEALTHY"] * 5 + ["FAILED", "HEALTHY", "HEALTHY", "SUCCEEDED"]
    spec = load_spec("torchelastic")
    with JsonlTraceWriter(path, spec=spec, dynamic=lambda: next(theirs)) as writer:
        Lifecycle(spec, RecordingDriver(script), max_restarts=1,
                  listeners=[writer, recorder]).run(0.0)
    _, *written = lines(path)
    shown = [(r["seq"], r["trigger"], r.get("count"), r["group_rank"]) for r in written]
    # the quiet ticks fold, but not across the change
    assert [(t, c is not None, g) for _, t, c, g in shown[:3]] == [
        ("start", False, 0), ("healthy", True, 0), ("healthy", True, 1)], shown
    assert [(r["seq"], r["trigger"], r.get("count"), r["group_rank"])
            for r in recorder.records()] == shown


def test_a_step_record_keeps_its_bytes() -> None:
    # The format is stable: the record of a step with every field set, byte for byte.
    from fsm_agent import ActionRecord, Step
    from fsm_agent.trace._writer import _dumps, step_record

    step = Step(trigger="failed", source="HEALTHY", wall_time=1.5, monotonic_time=2.25,
                role="trainer", dest="BACKOFF", guards=[("has_restarts_left", 1)],
                actions=[ActionRecord("stop_workers", "action", 0.5, "ok")],
                remaining_restarts=2, restart_count=1, observed="FAILED",
                failures={3: {"exitcode": 1, "message": "m", "error_file_data": {"message": "m"}}},
                error=None, rule="retry", timer=float("inf"))
    assert _dumps(step_record(step, 4, {"node": "vm"})) == (
        '{"kind": "step", "seq": 4, "wall_time": 1.5, "monotonic_time": 2.25, "role": "trainer", '
        '"trigger": "failed", "source": "HEALTHY", "dest": "BACKOFF", "guards": [{"name": '
        '"has_restarts_left", "value": true}], "actions": [{"name": "stop_workers", "kind": '
        '"action", "duration_s": 0.5, "outcome": "ok", "error": null}], "remaining_restarts": '
        '2, "restart_count": 1, "observed": "FAILED", "failures": {"3": {"exitcode": 1, '
        '"error_file_data": {"message": "m"}}}, "error": null, "rule": "retry", "timer": '
        '"inf", "node": "vm"}\n')


def test_a_new_field_needs_only_its_schema_row(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A field the engine sets on its Step is written, kept by the run summary's recorder,
    # folded by, and refused when missing (if required), from its Field row alone.
    import attrs

    from fsm_agent import Step
    from fsm_agent._readers._summary import RunRecorder
    from fsm_agent.trace import _reader as _trace_reader
    from fsm_agent.trace import _writer as _trace
    from fsm_agent.trace._schema import STEP_FIELDS, Field

    @attrs.define(slots=True)
    class LaterStep(Step):
        attempt: str = "a"

    fields = (*STEP_FIELDS[:-1], Field("attempt", (str,), "the attempt", required=True,
                                       convert=str.upper), STEP_FIELDS[-1])
    monkeypatch.setattr(_trace, "STEP_FIELDS", fields)
    monkeypatch.setattr(_trace, "_record", _trace._compile_record()[0])
    monkeypatch.setattr(_trace_reader, "_STEP_FIELDS",
                        {f.name: f.types for f in fields if f.required})

    def tick(attempt: str) -> LaterStep:
        return LaterStep(trigger="healthy", source="HEALTHY", wall_time=1.0, monotonic_time=1.0,
                         role="default", dest="HEALTHY", attempt=attempt)

    path = tmp_path / "t.jsonl"
    recorder = RunRecorder()
    with JsonlTraceWriter(path, node="vm") as writer:
        for attempt in ("a", "a", "b"):
            writer(tick(attempt))
            recorder(tick(attempt))
    (trace,) = read_trace(path)
    assert [(r.data["attempt"], r.data.get("count")) for r in trace.records] == [("A", 2),
                                                                                ("B", 1)]
    keys = list(trace.records[1].data)
    assert keys[keys.index("timer"):][:3] == ["timer", "attempt", "node"]  # the schema's place
    assert [(r["attempt"], r.get("count")) for r in recorder.records()] == [("A", 2), ("B", 1)]
    record = dict(trace.records[1].data)
    del record["attempt"]
    with pytest.raises(TraceError, match="no 'attempt' field"):
        read_trace(write_lines(tmp_path / "old.jsonl", [trace.header, record]))


def test_an_undeclared_diagnostics_record_is_refused() -> None:
    pytest.importorskip("torch")
    from fsm_agent.torch._agent import LifecycleAgentMixin

    agent = LifecycleAgentMixin.__new__(LifecycleAgentMixin)
    with pytest.raises(ValueError, match="undeclared diagnostics record 'mood'"):
        agent._fsm_note("mood", {"ok": True})
    agent._fsm_note("drain", {"took_s": 1.0})
    assert agent.trace_fields()["diagnostics"] == {"drain": {"took_s": 1.0}}
