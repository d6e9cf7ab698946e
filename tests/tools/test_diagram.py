"""Diagrams drawn from specs: labels, markings, formats, the committed diagrams/ and traces."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fsm_agent import load_spec, parse_spec
from fsm_agent.cli.diagram import REGENERATE_COMMAND
from fsm_agent.cli.diagram import main as diagram_main
from fsm_agent.diagram._render import DiagramEngineMissing, regenerate, render, to_dot, to_mermaid

from ._helpers import DATA, ROOT, SPECS, lines

# A user spec that uses what the presets do not: several triggers and sources in one entry,
# exit actions, after actions and both guard kinds on one edge.
USER_SPEC = """
name: custom
description: A test spec.
states:
  INIT: {initial: true}
  HEALTHY: {exit: [stop_workers]}
  UNHEALTHY: {}
  STOPPED: {}
  SUCCEEDED: {final: true, enter: [exit_barrier]}
  FAILED: {final: true, enter: [raise_failure]}
  UNKNOWN: {final: true}
transitions:
  - {trigger: start, source: INIT, dest: HEALTHY, actions: [rendezvous, start_workers]}
  - {trigger: succeeded, source: HEALTHY, dest: SUCCEEDED}
  - trigger: [failed, init]
    source: HEALTHY
    dest: STOPPED
    guards: [has_restarts_left]
    unless: [nodes_waiting]
    actions: [consume_restart]
    after: [rendezvous]
  - trigger: [failed, init]
    source: HEALTHY
    dest: FAILED
    unless: [has_restarts_left]
  - trigger: [failed, init]
    source: HEALTHY
    dest: STOPPED
    guards: [has_restarts_left, nodes_waiting]
  - {trigger: always, source: STOPPED, dest: HEALTHY, actions: [start_workers]}
  - {trigger: always, source: UNHEALTHY, dest: FAILED}
  - {trigger: healthy, source: HEALTHY, dest: HEALTHY}
  - {trigger: unhealthy, source: HEALTHY, dest: UNHEALTHY}
  - trigger: [unknown, stopped]
    source: HEALTHY
    dest: UNKNOWN
    after: [raise_invalid_state]
"""


def _mermaid_edges(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if " --> " in line]


def test_mermaid_labels_every_edge_of_the_torchelastic_preset() -> None:
    text = to_mermaid(load_spec("torchelastic"))
    assert text.splitlines()[3] == "stateDiagram-v2"
    edges = _mermaid_edges(text)
    # Written from specs/torchelastic.yaml by hand: trigger [guards] / actions, !g for unless.
    for expected in [
        "[*] --> INIT",
        "INIT --> HEALTHY : start / rendezvous, start_workers",
        "HEALTHY --> SUCCEEDED : succeeded",
        "HEALTHY --> STOPPED : failed [has_restarts_left] / consume_restart, stop_workers",
        "HEALTHY --> FAILED : failed [!has_restarts_left] / announce_failure, stop_workers",
        "HEALTHY --> UNHEALTHY : unhealthy",
        "UNHEALTHY --> STOPPED : always [has_restarts_left] / consume_restart, stop_workers",
        "UNHEALTHY --> FAILED : always [!has_restarts_left] / announce_failure, stop_workers",
        "HEALTHY --> STOPPED : healthy [nodes_waiting] / stop_workers",
        "HEALTHY --> HEALTHY : healthy [!nodes_waiting]",
        "STOPPED --> HEALTHY : always / rendezvous, start_workers",
        "HEALTHY --> UNKNOWN : unknown / then raise_invalid_state",
        "HEALTHY --> INIT : init / then raise_invalid_state",
        "HEALTHY --> STOPPED : stopped / then raise_invalid_state",
        "INIT --> FAILED : job_failed / stop_workers",
        "HEALTHY --> FAILED : job_failed / stop_workers",
        "STOPPED --> FAILED : job_failed / stop_workers",
        "SUCCEEDED --> [*]",
        "FAILED --> [*]",
        "UNKNOWN --> [*]",
    ]:
        assert expected in edges
    assert len(edges) == 20  # 16 transitions, the start arrow and three final arrows
    lines = [x.strip() for x in text.splitlines()]
    # Named first: with only `ID : text` lines Mermaid would show the text instead of the name.
    assert lines.index('state "SUCCEEDED" as SUCCEEDED') < lines.index(
        "SUCCEEDED : entry / exit_barrier")
    assert "FAILED : entry / exit_barrier, raise_failure" in lines
    assert "class INIT initial" in lines
    assert "class SUCCEEDED,FAILED,UNKNOWN final" in lines


def test_mermaid_of_a_user_spec() -> None:
    spec = parse_spec(USER_SPEC, path="custom.yaml")
    text = to_mermaid(spec)
    edges = _mermaid_edges(text)
    assert ("HEALTHY --> STOPPED : failed|init [has_restarts_left & !nodes_waiting] / "
            "consume_restart then rendezvous") in edges
    assert "HEALTHY --> STOPPED : failed|init [has_restarts_left & nodes_waiting]" in edges
    assert "HEALTHY --> UNKNOWN : unknown|stopped / then raise_invalid_state" in edges
    assert "HEALTHY : exit / stop_workers" in [x.strip() for x in text.splitlines()]
    # Nothing a Mermaid parser would take for syntax inside a label.
    for line in edges:
        assert not re.search(r"[;#]", line.split(" : ", 1)[-1])


def test_dot_marks_initial_and_final_states() -> None:
    pgv = pytest.importorskip("pygraphviz")
    spec = load_spec("torchrun")
    graph = pgv.AGraph(string=to_dot(spec))
    assert graph.has_edge("__start", "INIT")
    for s in spec.states:
        node = graph.get_node(s.name)
        assert (node.attr["peripheries"] == "2") == s.final, s.name
        assert ("final state" in node.attr["label"]) == s.final
    assert "initial state" in graph.get_node("INIT").attr["label"]
    assert "entry / exit_barrier" in graph.get_node("SUCCEEDED").attr["label"]
    visible = [e for e in graph.edges() if e.attr["style"] != "invis" and e[0] != "__start"]
    assert len(visible) == sum(len(t.sources) for t in spec.transitions)
    labels = {(e[0], e[1], e.attr["label"]) for e in visible}
    assert ("HEALTHY", "FAILED",
            "failed [!has_restarts_left]\\n/ announce_failure, stop_workers") in labels


def test_svg_and_png_are_rendered_bytes() -> None:
    pytest.importorskip("pygraphviz")
    spec = load_spec("torchelastic")
    svg = render(spec, "svg")
    png = render(spec, "png")
    assert isinstance(svg, bytes) and isinstance(png, bytes)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    root = ET.fromstring(svg)
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {s.name for s in spec.states} <= texts
    assert "entry / exit_barrier, raise_failure" in texts
    assert isinstance(render(spec, "mermaid"), str) and isinstance(render(spec, "dot"), str)
    with pytest.raises(ValueError, match="unknown diagram format 'gif'"):
        render(spec, "gif")


def test_missing_graphviz_is_an_error_not_a_fallback(tmp_path: Path, monkeypatch,
                                                       capsys) -> None:
    monkeypatch.setitem(sys.modules, "pygraphviz", None)  # import now fails
    with pytest.raises(DiagramEngineMissing, match=r"pip install 'fsm-agent\[diagrams\]'"):
        render(load_spec("torchelastic"), "png")
    out = tmp_path / "x.png"
    assert diagram_main(["torchelastic", "-o", str(out)]) == 2
    assert "fsm-agent[diagrams]" in capsys.readouterr().err
    assert not out.exists()
    # Mermaid needs nothing.
    assert diagram_main(["torchelastic", "-o", str(tmp_path / "x.mmd")]) == 0


def test_cli_formats_and_outputs(tmp_path: Path, capsys) -> None:
    assert diagram_main(["torchrun"]) == 0
    assert capsys.readouterr().out == to_mermaid(load_spec("torchrun"))
    assert diagram_main(["torchrun", "--format", "dot"]) == 0
    assert capsys.readouterr().out.startswith('digraph "torchrun" {')
    # The extension picks the format; a contradicting --format is refused, never obeyed.
    assert diagram_main(["torchrun", "-o", str(tmp_path / "a.dot")]) == 0
    assert (tmp_path / "a.dot").read_text().startswith("digraph")
    assert diagram_main(["torchrun", "--format", "mermaid", "-o", str(tmp_path / "b.png")]) == 2
    assert "does not match" in capsys.readouterr().err
    assert not (tmp_path / "b.png").exists()
    assert diagram_main(["torchrun", "-o", str(tmp_path / "c.txt")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    user = tmp_path / "custom.yaml"
    user.write_text(USER_SPEC)
    assert diagram_main([str(user)]) == 0
    assert "title: custom" in capsys.readouterr().out
    assert diagram_main([str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and "Traceback" not in err
    assert diagram_main(["torchrun", "--check"]) == 2


def test_commands_do_not_import_torch(tmp_path: Path) -> None:
    trace = DATA / "fail_once_recover.jsonl"
    code = (
        "import sys\n"
        "from fsm_agent.cli import main\n"
        f"assert main(['diagram', 'torchelastic', '-o', {str(tmp_path / 'x.mmd')!r}]) == 0\n"
        f"assert main(['replay', {str(trace)!r}, '--spec', 'torchelastic']) == 0\n"
        f"assert main(['diagram', 'torchelastic', '--trace', {str(trace)!r}]) == 0\n"
        "assert main(['diff', 'torchelastic', 'torchrun']) == 1\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad[:5]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


# -- the committed diagrams ------------------------------------------------------------------


def _repo_specs():
    return [load_spec(p) for p in sorted(SPECS.glob("*.yaml"))]


def test_committed_diagrams_are_fresh() -> None:
    stale = regenerate(_repo_specs(), str(ROOT / "diagrams"), check=True)
    assert not stale, (f"stale or missing diagrams: {', '.join(stale)}; regenerate them with: "
                       f"{REGENERATE_COMMAND}")


def test_staleness_check_notices_a_changed_spec(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "diagrams", tmp_path / "diagrams")
    spec = load_spec("torchrun")
    changed = parse_spec((SPECS / "torchrun.yaml").read_text().replace(
        "Every worker finished successfully.", "Done."), path=spec.path)
    stale = regenerate([changed], str(tmp_path / "diagrams"), check=True)
    # The description shows only in the SVG (Mermaid draws actions, not prose).
    assert stale == [str(tmp_path / "diagrams" / "torchrun.svg")]
    (tmp_path / "diagrams" / "torchrun.mmd").write_text("stateDiagram-v2\n")
    assert len(regenerate([spec], str(tmp_path / "diagrams"), check=True)) == 1


def test_regenerate_writes_what_the_check_accepts(tmp_path: Path) -> None:
    pytest.importorskip("pygraphviz")
    specs = _repo_specs()
    written = regenerate(specs, str(tmp_path), check=False)
    assert len(written) == 2 * len(specs)
    assert regenerate(specs, str(tmp_path), check=True) == []
    assert regenerate(specs, str(tmp_path), check=False) == []  # unchanged files not rewritten


def test_cli_all_check(tmp_path: Path, capsys) -> None:
    assert diagram_main(["--all", "--check", "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert REGENERATE_COMMAND in err


# -- traces drawn on the spec ----------------------------------------------------------------


def test_trace_highlight_counts_edges_and_marks_the_end(capsys) -> None:
    trace = str(DATA / "fail_once_recover.jsonl")
    assert diagram_main(["torchelastic", "--trace", trace]) == 0
    edges = _mermaid_edges(capsys.readouterr().out)
    assert ("HEALTHY --> STOPPED : failed [has_restarts_left] / consume_restart, stop_workers "
            "✔ 1×") in edges
    assert "STOPPED --> HEALTHY : always / rendezvous, start_workers ✔ 1×" in edges
    ticks = sum(1 for r in lines(DATA / "fail_once_recover.jsonl") if r.get("trigger") == "healthy")
    assert f"HEALTHY --> HEALTHY : healthy [!nodes_waiting] ✔ {ticks}×" in edges
    assert ("HEALTHY --> FAILED : failed [!has_restarts_left] / announce_failure, stop_workers"
            in edges)


def test_trace_highlight_in_dot(traced) -> None:
    pgv = pytest.importorskip("pygraphviz")
    from fsm_agent.diagram._render import highlight_from_replay
    from fsm_agent.trace._reader import read_trace
    from fsm_agent.trace._replay import replay

    path = traced("torchelastic", ["FAILED"], raises={"stop_workers": RuntimeError("boom")})
    spec = load_spec("torchelastic")
    (trace,) = read_trace(path)
    graph = pgv.AGraph(string=to_dot(spec, highlight_from_replay(replay(spec, trace))))
    assert "ended here" in graph.get_node("UNKNOWN").attr["label"]
    start = graph.get_edge("INIT", "HEALTHY")
    assert "taken 1×" in start.attr["label"] and start.attr["penwidth"] == "2.5"
    # The failed action's move is no spec transition: drawn dashed, with the reason.
    raised = [e for e in graph.edges() if (e[0], e[1]) == ("HEALTHY", "UNKNOWN")
              and e.attr["style"] == "dashed"]
    assert len(raised) == 1 and "stop_workers raised" in raised[0].attr["label"]


def test_trace_with_several_lifecycles_adds_their_counts(tmp_path: Path, capsys) -> None:
    from ._helpers import run_traced

    path = tmp_path / "two.jsonl"
    run_traced(path, "torchrun", ["HEALTHY", "SUCCEEDED"])
    run_traced(path, "torchrun", ["SUCCEEDED"])  # appends a second lifecycle
    assert diagram_main(["torchrun", "--trace", str(path), "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert "2 lifecycles" in dot
    assert 'label="start\\n/ rendezvous, start_workers\\n✔ taken 2×"' in dot
    assert 'label="healthy [!nodes_waiting]\\n✔ taken 1×"' in dot
