"""The package's layout: no import cycles among its modules, and the engine readable in a sitting.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a cycle that
only type checking sees still means two modules cannot be understood apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "fsm_agent"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        # The package's own __init__ is its public face: subpackages may import from it.
        out |= {c for c in candidates if c in known and c not in (name, "fsm_agent")}
    return out


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PKG.rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, name, known) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in stack:
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in done:
                visit(nxt, [*stack, nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_engine_stays_small() -> None:
    lines = (PKG / "_core" / "_engine.py").read_text().count("\n")
    assert lines < 400, f"_core/_engine.py has {lines} lines; the design keeps it under 400"


def test_no_module_is_over_800_lines() -> None:
    # A module that long does several jobs: split it along its sections (docs/modules.md).
    long = {str(p.relative_to(PKG.parent)): n for p in sorted(PKG.rglob("*.py"))
            if (n := p.read_text().count("\n")) > 800}
    assert not long, long


# -- the layers of docs/modules.md -----------------------------------------------------------

MAP = PKG.parent / "docs" / "modules.md"


def _module_map() -> tuple[list[tuple[str, list[str]]], dict[str, list[str]]]:
    """docs/modules.md as (core layer, modules) in order, and outer package -> modules."""
    core: list[tuple[str, list[str]]] = []
    outer: dict[str, list[str]] = {}
    part = section = None
    for line in MAP.read_text().splitlines():
        if line.startswith("## "):
            part = line[3:]
        elif line.startswith("### "):
            section = line[4:].split(". ", 1)[-1]
            (core.append((section, [])) if part == "Layers of the core"
             else outer.setdefault(section, []))
        elif line.startswith("| `fsm_agent/") and section is not None:
            path = line.split("`")[1]
            name = _module_name(PKG.parent / path)
            (core[-1][1] if part == "Layers of the core" else outer[section]).append(name)
    return core, outer


def test_the_module_map_lists_every_module_once() -> None:
    core, outer = _module_map()
    listed = [m for _, mods in core for m in mods] + [m for mods in outer.values() for m in mods]
    actual = {_module_name(p) for p in PKG.rglob("*.py")}
    assert len(core) >= 6 and set(outer) == set(OUTER), (core, outer)
    assert sorted(m for m in set(listed) if listed.count(m) > 1) == [], "listed twice"
    assert sorted(actual - set(listed)) == [], "modules missing from docs/modules.md"
    assert sorted(set(listed) - actual) == [], "docs/modules.md lists modules that do not exist"


def _layer_violations(graph: dict[str, set[str]], core: list[tuple[str, list[str]]],
                      outer: dict[str, list[str]]) -> list[str]:
    level = {m: i for i, (_, mods) in enumerate(core) for m in mods}
    owner = {m: pkg for pkg, mods in outer.items() for m in mods}
    names = [name for name, _ in core]
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if mod in level:
                ok = dep in level and level[dep] <= level[mod]
            else:
                pkg = owner.get(mod)
                ok = dep in level or owner.get(dep) == pkg or owner.get(dep) in OUTER.get(
                    pkg or "", set())
            if not ok:
                where = (names[level[dep]] if dep in level else owner.get(dep, "?"))
                bad.append(f"{mod} imports {dep} ({where})")
    return bad


def test_each_module_imports_only_from_its_layer_or_the_layers_below() -> None:
    core, outer = _module_map()
    assert _layer_violations(_graph(), core, outer) == []


def test_the_layer_rule_finds_an_upward_import() -> None:
    core = [("base", ["a"]), ("engine", ["b"])]
    outer = {"torch": ["t"], "cli": ["c"], "testing": ["k"]}
    graph = {"a": {"b"}, "b": {"a"}, "t": {"c", "a"}, "k": {"t"}, "c": {"t", "k", "b"}}
    assert _layer_violations(graph, core, outer) == [
        "a imports b (engine)", "k imports t (torch)", "t imports c (cli)"]


# -- the packages: the layers as folders ---------------------------------------------------

#: Each package of fsm_agent and the packages it may import ("": the top-level modules, the
#: public ``fsm_agent`` namespace). Everything else it imports is its own.
PACKAGES = {
    "_core": set(),
    "trace": {"_core"},
    "diagram": {"_core", "trace"},
    "_readers": {"_core", "trace"},
    "": {"_core"},
    "testing": {"_core", "trace", "diagram", "_readers"},
    "torch": {"_core", "trace", "_readers"},
    "cli": {"_core", "trace", "diagram", "_readers", "testing", "torch", ""},
}
#: What each outer package may import besides the core: the other outer packages it builds on.
OUTER = {name: PACKAGES[name] & {"testing", "torch", "cli"} for name in ("testing", "torch", "cli")}
#: The package each layer of docs/modules.md lives in (None: the public namespaces, which are
#: the top-level ``__init__.py`` and those of the public packages).
LAYER_PACKAGE = {"base": "_core", "values": "_core", "vocabulary": "_core",
                 "spec language": "_core", "engine": "_core", "trace": "trace",
                 "diagram": "diagram", "readers": "_readers", "public": None}


def _package(module: str) -> str:
    if module == "fsm_agent.__main__":  # ``python -m fsm_agent``: the command line's
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else ""


def _package_violations(graph: dict[str, set[str]]) -> list[str]:
    return [f"{mod} imports {dep}" for mod, deps in sorted(graph.items()) for dep in sorted(deps)
            if _package(dep) != _package(mod) and _package(dep) not in PACKAGES[_package(mod)]]


def test_each_package_imports_only_the_packages_it_builds_on() -> None:
    graph = _graph()
    assert {_package(m) for m in graph} == set(PACKAGES)
    assert _package_violations(graph) == []


def test_the_package_rule_finds_an_import_the_wrong_way() -> None:
    graph = {"fsm_agent._core._spec": {"fsm_agent.trace._writer"},
             "fsm_agent.trace._writer": {"fsm_agent._core._spec", "fsm_agent._readers._report"},
             "fsm_agent._readers._report": {"fsm_agent.trace._writer", "fsm_agent._core._spec"},
             "fsm_agent.torch._agent": {"fsm_agent.cli.run"}}
    assert _package_violations(graph) == [
        "fsm_agent._core._spec imports fsm_agent.trace._writer",
        "fsm_agent.torch._agent imports fsm_agent.cli.run",
        "fsm_agent.trace._writer imports fsm_agent._readers._report"]


def test_each_layer_lives_in_its_package() -> None:
    core, _ = _module_map()
    assert [name for name, _ in core] == list(LAYER_PACKAGE)
    misplaced = []
    for layer, mods in core:
        want = LAYER_PACKAGE[layer]
        for mod in mods:
            public = mod == "fsm_agent" or (_package(mod) in PACKAGES and
                                           mod == f"fsm_agent.{_package(mod)}")
            if (want is None and not public) or (want is not None and _package(mod) != want):
                misplaced.append(f"{mod} ({layer})")
    assert misplaced == []


def test_tests_readme_names_every_test_directory() -> None:
    tests = PKG.parent / "tests"
    text = (tests / "README.md").read_text()
    dirs = sorted(f"`tests/{d.name}/`" for d in tests.iterdir()
                  if d.is_dir() and not d.name.startswith((".", "_")))
    assert [d for d in dirs if f"| {d} |" not in text] == []


# -- no references a reader of the repository cannot follow ----------------------------------

ROOT = PKG.parent
#: A project's public tracker may be named: "pytorch issue 135712", "owner/repo issue 7".
_UPSTREAM = {"pytorch", "torch", "kubeflow", "jobset", "nvrx", "nvidia-resiliency-ext"}
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def _private_issue_references(text: str) -> list[str]:
    found = []
    for m in _ISSUE.finditer(text):
        before = re.search(r"([\w./-]+)[ \t]+$", text[max(0, m.start() - 60):m.start()])
        word = before.group(1).lower() if before else ""
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", word) and word not in _UPSTREAM:
            found.append(" ".join(m.group().split()))
    return found


def test_no_references_to_the_projects_own_issue_tracker() -> None:
    files = [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"),
             *(p for d in ("specs", "examples") for p in (ROOT / d).rglob("*") if p.is_file()),
             ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    bad = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        refs = _private_issue_references(path.read_text(errors="replace"))
        if refs:
            bad[rel] = refs
    assert bad == {}, "name the doc section or test instead of the issue: " + repr(bad)


def test_the_issue_reference_check_keeps_public_trackers() -> None:
    # numbers filled in, so that this file passes the check it tests
    a, b, c = 19, 28, 6
    text = (f"(issue {a}, item 4) and Issue\n  {b} and issues {c} and 7, `bench/x.py` (issue {c});"
            " pytorch issue 135712, kubeflow/trainer issue 12 and pytorch/pytorch#1 are public")
    assert _private_issue_references(text) == [f"issue {a}", f"Issue {b}", f"issues {c}",
                                               f"issue {c}"]
