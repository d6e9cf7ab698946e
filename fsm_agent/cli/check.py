"""``fsm-agent check``: check spec files and report every problem (exit 1 if any).

No torch import: it reads specs only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .._errors import SpecError
from .._spec import preset_names
from ._common import FAILED, OK, ArgumentParser, add_spec_option, load_spec_arg, run_command

__all__ = ["main"]

PROG = "fsm-agent check"


def _check(argv: list[str]) -> int:
    parser = ArgumentParser(
        prog=PROG,
        description="Check lifecycle specs (files or preset names) and report every problem.",
    )
    add_spec_option(
        parser,
        "specs",
        nargs="*",
        help=f"spec file or preset name (default: all presets: {', '.join(preset_names())})",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    args = parser.parse_args(argv)
    bad = 0
    for name in args.specs or preset_names():
        try:
            spec = load_spec_arg(args, name, flag="SPEC")
        except SpecError as e:
            bad += 1
            print(e, file=sys.stderr)
            continue
        if not args.quiet:
            print(
                f"{spec.path}: ok ({spec.name}: {len(spec.states)} states, "
                f"{sum(1 for _ in spec.edges())} transitions)"
            )
    return FAILED if bad else OK


def main(argv: Sequence[str]) -> int:
    """Check every spec given; print each problem with its file and line. Exit 1 if any."""
    return run_command(PROG, _check, argv)
