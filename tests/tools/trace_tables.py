"""Write the trace format's tables into docs/diagrams.md from ``fsm_agent/_trace_schema.py``.

    python tests/tools/trace_tables.py           # rewrite the tables in place
    python tests/tools/trace_tables.py --check   # exit 1 if any is stale

Each table follows a ``<!-- trace-schema: NAME -->`` line (``step``, ``fold``, ``diagnostics``,
``header``) and ends at the first line that is not a table row; everything else on the page is
left as it is. ``tests/tools/test_trace.py`` fails while the page differs from the schema.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagrams.md"
MARK = "<!-- trace-schema: {} -->"


def tables() -> dict[str, str]:
    """Each table of the page by its marker's name, as the schema makes it."""
    from fsm_agent._trace_schema import (
        FOLD_FIELDS,
        HEADER_FIELDS,
        STEP_FIELDS,
        diagnostics_table,
        field_table,
    )

    return {"step": field_table(STEP_FIELDS), "fold": field_table(FOLD_FIELDS),
            "diagnostics": diagnostics_table(), "header": field_table(HEADER_FIELDS)}


def synced(text: str) -> str:
    """``text`` with the table after each marker replaced by the schema's; a marker missing from
    ``text`` is an error (a table the page has lost)."""
    lines = text.split("\n")
    for name, table in tables().items():
        mark = MARK.format(name)
        if mark not in lines:
            raise ValueError(f"docs/diagrams.md has no {mark!r} line before its {name} table")
        start = lines.index(mark) + 1
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = table.split("\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(DOC.parents[1]))
    text = DOC.read_text()
    new = synced(text)
    if new == text:
        return 0
    if args.check:
        print(f"{DOC}: the trace tables are stale (python tests/tools/trace_tables.py)")
        return 1
    DOC.write_text(new)
    print(f"{DOC}: trace tables rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
