"""Regenerate every table of the docs that is made from the code, in one command.

    python tools/generated_docs.py           # rewrite what is stale
    python tools/generated_docs.py --check   # exit 1 if any table is stale (the tests fail too)

Each page's tables come from one function of the package, ``text -> text``, that replaces its
marked tables and leaves the page's own prose as it is:

- docs/spec-format.md's guard and action kinds, from each ``Kind``
  (``fsm_agent._core._kind_table.with_tables``);
- docs/diagrams.md's trace record fields, from ``fsm_agent/trace/_schema.py`` and
  ``fsm_agent/_core/_step.py`` (``fsm_agent.trace._schema.with_trace_tables``);
- docs/cli.md's ``fsm-agent run`` flags, from the parser and ``AgentOptions``
  (``fsm_agent.cli.run.with_flags_table``).

The diagrams are made by ``fsm-agent diagram --all -o diagrams`` (CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generators() -> list[tuple[str, str, Callable[[str], str]]]:
    """(what, page, how its tables are made) for every generated table of the docs."""
    sys.path.insert(0, str(ROOT))  # this checkout's package, installed or not
    from fsm_agent._core._kind_table import with_tables
    from fsm_agent.cli.run import with_flags_table
    from fsm_agent.trace._schema import with_trace_tables

    return [("kinds", "docs/spec-format.md", with_tables),
            ("trace fields", "docs/diagrams.md", with_trace_tables),
            ("run flags", "docs/cli.md", with_flags_table)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any table is stale")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose docs/ to read (default: this one)")
    args = parser.parse_args(argv)
    stale = []
    for what, page, make in generators():
        path = args.root / page
        try:
            text = path.read_text(encoding="utf-8")
            fresh = make(text)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 1
        if fresh == text:
            continue
        if args.check:
            stale.append(what)
            print(f"{path}: the {what} table is stale", file=sys.stderr)
        else:
            path.write_text(fresh, encoding="utf-8")
            print(f"{path}: rewrote the {what} table")
    if stale:
        print(f"stale: {', '.join(stale)}; run python tools/generated_docs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
