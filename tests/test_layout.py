"""The package's layout: no import cycles among its modules, and the engine readable in a sitting.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a cycle that
only type checking sees still means two modules cannot be understood apart.
"""

from __future__ import annotations

import ast
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
    lines = (PKG / "_engine.py").read_text().count("\n")
    assert lines < 400, f"fsm_agent/_engine.py has {lines} lines; the design keeps it under 400"
