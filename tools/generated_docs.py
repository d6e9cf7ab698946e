"""Regenerate every table of the docs that is made from the code, in one command.

    python tools/generated_docs.py           # rewrite what is stale
    python tools/generated_docs.py --check   # exit 1 if any table is stale (the tests fail too)

Each table has its own generator, run here in turn:

- docs/spec-format.md's guard and action kinds, from each ``Kind`` (``tools/kind_tables.py``);
- docs/diagrams.md's trace record fields, from ``fsm_agent/_trace_schema.py``
  (``tests/tools/trace_tables.py``);
- docs/cli.md's ``fsm-agent run`` flags, from the parser and ``AgentOptions``
  (``fsm_agent.cli.run.write_flags_table``).

The diagrams are made by ``fsm-agent diagram --all -o diagrams`` (CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FLAGS = ("import sys; from fsm_agent.cli.run import own_flags_table, write_flags_table\n"
          "check = sys.argv[1:] == ['--check']\n"
          "text = open('docs/cli.md', encoding='utf-8').read()\n"
          "stale = own_flags_table() not in text\n"
          "if check and stale: print('docs/cli.md: the flag table is stale', file=sys.stderr)\n"
          "elif stale: write_flags_table(); print('rewrote the flag table in docs/cli.md')\n"
          "sys.exit(1 if check and stale else 0)\n")
GENERATORS = (
    ("kinds", [sys.executable, "tools/kind_tables.py"]),
    ("trace fields", [sys.executable, "tests/tools/trace_tables.py"]),
    ("run flags", [sys.executable, "-c", _FLAGS]),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any table is stale")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    stale = [name for name, cmd in GENERATORS
             if subprocess.run([*cmd, *(["--check"] if args.check else [])], cwd=ROOT,
                               env=env, check=False).returncode != 0]
    if stale:
        print(f"stale: {', '.join(stale)}; run python tools/generated_docs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
