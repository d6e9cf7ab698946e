"""``fsm-agent check``: check spec files and report every problem (exit 1 if any).

No torch import: it reads specs only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from .._errors import SpecError
from .._load import preset_names
from ._common import (
    FAILED,
    OK,
    add_format_option,
    add_spec_option,
    check_spec_exists,
    load_spec_arg,
    make_parser,
    print_json,
    run_command,
)

__all__ = ["build_parser", "main"]

PROG = "fsm-agent check"
EXAMPLES = (
    "fsm-agent check                         # every built-in preset",
    "fsm-agent check my_lifecycle.yaml -q    # print problems only; exit 1 if any",
    "fsm-agent check specs/*.yaml --format json",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent check`` command line."""
    parser = make_parser(
        PROG, "Check lifecycle specs (files or preset names) and report every problem, each "
        "with its file and line. Exit 0 when all are valid, 1 when any has a problem, 2 when a "
        "file is missing.", EXAMPLES)
    add_spec_option(
        parser,
        "specs",
        nargs="*",
        help=f"spec file or preset name (default: all presets: {', '.join(preset_names())})",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    add_format_option(parser)
    return parser


def _check(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    names = args.specs or preset_names()
    for name in names:  # a missing file is bad input: say so before checking anything
        check_spec_exists(name)
    results: list[dict[str, Any]] = []
    for name in names:
        entry: dict[str, Any] = {"spec": name, "ok": True, "name": None, "path": None,
                                 "states": None, "transitions": None, "problems": []}
        try:
            spec = load_spec_arg(args, name, flag="SPEC")
        except SpecError as e:
            entry["ok"] = False
            entry["problems"] = [{"path": p.path, "line": p.line, "element": p.element,
                                  "message": p.message} for p in e.problems]
            if args.format == "text":
                print(e, file=sys.stderr)
        else:
            entry.update(name=spec.name, path=spec.path, states=len(spec.states),
                         transitions=sum(1 for _ in spec.edges()))
            if args.format == "text" and not args.quiet:
                print(f"{spec.path}: ok ({spec.name}: {entry['states']} states, "
                      f"{entry['transitions']} transitions)")
        results.append(entry)
    ok = all(r["ok"] for r in results)
    if args.format == "json":
        print_json("check", {"ok": ok, "specs": results})
    return OK if ok else FAILED


def main(argv: Sequence[str]) -> int:
    """Check every spec given; print each problem with its file and line. Exit 1 if any."""
    return run_command(PROG, _check, argv)
