"""Regenerate docs/spec-format.md's tables of guard and action kinds from each ``Kind``.

    python tools/kind_tables.py           # rewrite the tables in place
    python tools/kind_tables.py --check   # exit 1 if they are stale (tests/test_kinds.py fails too)

The tables come from ``fsm_agent._kind_table``; the text around them is the page's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fsm_agent._kind_table import with_tables

DOC = Path(__file__).resolve().parent.parent / "docs" / "spec-format.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the tables are stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    fresh = with_tables(text)
    if fresh == text:
        return 0
    if args.check:
        print(f"{DOC}: the tables of kinds are stale; run python tools/kind_tables.py",
              file=sys.stderr)
        return 1
    DOC.write_text(fresh)
    print(f"rewrote the tables of kinds in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
