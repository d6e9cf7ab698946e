"""``fsm-agent diagram``: draw a spec (or the path a trace took) as a state diagram.

No torch import: it reads specs and traces only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core._load import preset_names
from .._core._spec import DEFAULT_SPEC
from ._common import (
    FAILED,
    OK,
    UsageError,
    add_spec_option,
    load_spec_arg,
    make_parser,
    read_trace_arg,
    run_command,
    spec_for_trace,
    spec_params,
)

if TYPE_CHECKING:
    from ..diagram._render import Highlight

__all__ = ["DIAGRAMS_DIR", "REGENERATE_COMMAND", "build_parser", "main"]

PROG = "fsm-agent diagram"
DIAGRAMS_DIR = "diagrams"
REGENERATE_COMMAND = "fsm-agent diagram --all -o diagrams"


EXAMPLES = (
    "fsm-agent diagram torchrun                          # Mermaid text on stdout",
    "fsm-agent diagram torchelastic -o torchelastic.svg  # format from the extension",
    "fsm-agent diagram --trace run.jsonl -o path.svg     # the path a recorded run took",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent diagram`` command line."""
    from ..diagram._render import FORMATS

    parser = make_parser(
        PROG, "Draw a spec as a state diagram: every edge 'trigger [guards] / actions', entry "
        "and exit actions on the states, initial and final states marked.", EXAMPLES)
    add_spec_option(parser, "spec", nargs="?",
                    help=f"spec file or preset name (default: {DEFAULT_SPEC}, or the spec "
                    "a --trace names)")
    parser.add_argument("--format", "-f", choices=FORMATS,
                        help="output format (default: from -o's extension, else mermaid); svg "
                        "and png need the pygraphviz wheel: pip install 'fsm-agent[diagrams]'")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write here instead of standard output (with --all: a directory)")
    parser.add_argument("--trace", metavar="TRACE",
                        help="highlight the path a recorded trace took (edge counts, final state)")
    parser.add_argument("--all", action="store_true",
                        help=f"write NAME.mmd and NAME.svg of every built-in spec into -o "
                        f"(default {DIAGRAMS_DIR}/)")
    parser.add_argument("--check", action="store_true",
                        help="with --all: write nothing, exit 1 if any file is missing or stale")
    return parser


def _diagram(argv: list[str]) -> int:
    from ..diagram._render import EXTENSIONS, DiagramEngineMissing, regenerate, render

    args = build_parser().parse_args(argv)

    if args.check and not args.all:
        raise UsageError("--check goes with --all")
    if args.all:
        if args.spec or args.trace or args.format or args.spec_params:
            raise UsageError("--all draws every built-in spec as .mmd and .svg; it takes no "
                             "SPEC, --trace, --format or --spec-param")
        outdir = args.output or DIAGRAMS_DIR
        specs = [load_spec_arg(args, name) for name in preset_names()]
        try:
            files = regenerate(specs, outdir, check=args.check)
        except DiagramEngineMissing as e:
            raise UsageError(str(e)) from None
        if args.check:
            if files:
                print("stale or missing diagrams: " + ", ".join(files), file=sys.stderr)
                print(f"regenerate them with: {REGENERATE_COMMAND}", file=sys.stderr)
                return FAILED
            print(f"{outdir}: {2 * len(specs)} diagrams up to date")
            return OK
        for path in files:
            print(f"wrote {path}")
        if not files:
            print(f"{outdir}: {2 * len(specs)} diagrams already up to date")
        return OK

    fmt = args.format
    if args.output:
        ext = os.path.splitext(args.output)[1].lower()
        implied = EXTENSIONS.get(ext)
        if fmt is None:
            if implied is None:
                raise UsageError(f"-o {args.output}: cannot tell the format from {ext or 'no'} "
                                 f"extension (known: {', '.join(sorted(EXTENSIONS))}); pass "
                                 "--format")
            fmt = implied
        elif implied is not None and implied != fmt:
            raise UsageError(f"--format {fmt} does not match -o {args.output} (a {ext} file "
                             f"holds {implied}); change one of them")
    fmt = fmt or "mermaid"

    highlight = None
    if args.trace:
        from .._core._files import printable
        from ..diagram._render import highlight_from_replay
        from ..trace._replay import replay

        traces = read_trace_arg(args.trace)
        spec = spec_for_trace(args, args.trace, traces, args.spec, "SPEC")
        results = [replay(spec, t) for t in traces]
        highlight = _merge([highlight_from_replay(r) for r in results])
        for r in results:
            if not r.ok:
                print(f"{PROG}: warning: {args.trace}: {printable(r.divergence, 1000)}",
                      file=sys.stderr)
            if r.trace.incomplete:
                print(f"{PROG}: warning: {args.trace}: incomplete trace: "
                      f"{r.trace.incomplete}", file=sys.stderr)
    else:
        spec = load_spec_arg(args, args.spec or DEFAULT_SPEC, flag="SPEC")
    values = spec_params(args, spec)

    try:
        # --spec-param: draw these values as in force (over a trace's own, if any).
        out = render(spec, fmt, highlight, values if args.spec_params else None)
    except DiagramEngineMissing as e:
        raise UsageError(str(e)) from None
    data = out.encode("utf-8") if isinstance(out, str) else out
    if args.output:
        try:
            with open(args.output, "wb") as f:
                f.write(data)
        except OSError as e:
            raise UsageError(f"-o {args.output}: {e.strerror or e}") from None
        return OK
    if fmt == "png" and sys.stdout.isatty():
        raise UsageError("refusing to write PNG to a terminal; pass -o FILE.png")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return OK


def _merge(hs: Sequence[Highlight]) -> Highlight:
    """Several lifecycles of one trace file drawn as one path: counts add up."""
    from ..diagram._render import Highlight

    if len(hs) == 1:
        return hs[0]
    counts: dict[tuple[int, str], int] = {}
    extra: dict[tuple[str, str, str], tuple[int, str]] = {}
    visited: set[str] = set()
    for h in hs:
        for k, n in h.counts.items():
            counts[k] = counts.get(k, 0) + n
        for move, (n, why) in h.extra.items():
            extra[move] = (extra.get(move, (0, why))[0] + n, why)
        visited |= h.visited
    notes = "; ".join(h.note for h in hs if h.note)
    # The parameters of the last lifecycle: the one whose final state is drawn.
    return Highlight(counts, extra, frozenset(visited), hs[-1].final,
                     f"{len(hs)} lifecycles" + (f"; {notes}" if notes else ""), hs[-1].params)


def main(argv: Sequence[str]) -> int:
    """``fsm-agent diagram [SPEC] [--format F] [-o FILE] [--trace TRACE] | --all [--check]``."""
    return run_command(PROG, _diagram, argv)
