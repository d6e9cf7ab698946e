"""``fsm-agent diff``: what differs between two specs (exit 1 when they differ, as diff(1)).

No torch import: it reads specs only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._core._errors import SpecError
from .._core._spec import Spec
from ._common import (
    FAILED,
    OK,
    UsageError,
    add_format_option,
    add_spec_option,
    load_spec_arg,
    make_parser,
    print_json,
    run_command,
    shown,
)

__all__ = ["build_parser", "main"]

PROG = "fsm-agent diff"
EXAMPLES = (
    "fsm-agent diff torchelastic torchrun        # exit 1: they differ in giving up",
    "fsm-agent diff torchrun my_lifecycle.yaml --format json",
    "fsm-agent diff resilient my_policy.yaml     # rules, timers, parameters, budget",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent diff`` command line."""
    parser = make_parser(
        PROG, "List what behaves differently from SPEC_A to SPEC_B: transitions, failure-policy "
        "rules (added, removed, renamed, reordered, changed), states (actions, outcome, timer, "
        "reported WorkerState), parameters, the spec's own guards and actions, the restart "
        "budget, triggers and metrics (descriptions are not compared). Exit 0 when they behave "
        "the same, 1 when they differ, 2 on bad input.", EXAMPLES)
    add_spec_option(parser, "spec_a", metavar="SPEC_A", help="spec file or preset name",
                    params=False)
    add_spec_option(parser, "spec_b", metavar="SPEC_B", help="spec file or preset name")
    add_format_option(parser)
    return parser


def _load(args: argparse.Namespace, value: str, flag: str) -> Spec:
    try:
        return load_spec_arg(args, value, flag=flag)
    except SpecError as e:
        raise UsageError(f"{flag}: {e}") from None


def _diff(argv: list[str]) -> int:
    from .._readers._diff import diff_specs, format_diff

    args = build_parser().parse_args(argv)
    a = _load(args, args.spec_a, "SPEC_A")
    b = _load(args, args.spec_b, "SPEC_B")
    d = diff_specs(a, b)
    if args.format == "json":
        print_json("diff", {
            "same": d.same,
            "a": {"name": a.name, "path": a.path},
            "b": {"name": b.name, "path": b.path},
            "changes": [{"kind": c.kind, "element": c.element, "name": c.name,
                         "details": list(c.details), "line_a": c.line_a, "line_b": c.line_b}
                        for c in d.changes],
        })
    else:
        sys.stdout.write(format_diff(d, paths=(shown(a.path), shown(b.path))))
    return OK if d.same else FAILED


def main(argv: Sequence[str]) -> int:
    """``fsm-agent diff SPEC_A SPEC_B``: exit 0 when they behave the same, 1 when they differ."""
    return run_command(PROG, _diff, argv)
