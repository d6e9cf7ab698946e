"""``fsm-agent report TRACE... [-o report.html | --format text]``: what happened in a job.

Reads the traces of every agent of a job (``fsm-agent run --trace`` on each node) and writes one
self-contained HTML page (``fsm_agent._readers._report``) or prints the summary (``--format
text``). No torch import. Exit 0 when the report was written (whatever the job's outcome), 2 on bad
input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._common import (
    OK,
    UsageError,
    add_spec_option,
    make_parser,
    read_trace_arg,
    run_command,
)
from ._common import spec_for_trace as _spec_for_trace

if TYPE_CHECKING:
    from .._core._spec import Spec
    from ..trace._reader import Trace

__all__ = ["build_parser", "main"]

PROG = "fsm-agent report"
EXAMPLES = (
    "fsm-agent report node0.jsonl node1.jsonl -o report.html  # one page for the whole job",
    "fsm-agent report run.jsonl --format text                 # the summary in the terminal",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent report`` command line."""
    parser = make_parser(
        PROG, "Merge the traces of a job's agents into one self-contained HTML page: the root "
        "cause, a timeline per agent, the rule that decided each restart, time lost per cause, "
        "the spec's diagram with the path taken, the stacks of hung workers. Exit 0 when the "
        "report was written (whatever the job's outcome), 2 on bad input.", EXAMPLES)
    parser.add_argument("traces", nargs="+", metavar="TRACE",
                        help="JSON Lines traces (fsm-agent run --trace), one or more per agent")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the HTML report here (default: report.html; - for stdout)")
    parser.add_argument("--format", choices=("html", "text"), default=None,
                        help="html (default with -o) or text (the summary, on stdout)")
    add_spec_option(parser, "--spec", default=None, params=False,
                    help="spec file or preset name (default: the one each trace names)")
    parser.add_argument("--log-dir", action="append", default=[], metavar="DIR",
                        help="the run's log directory (fsm-agent run --log-dir; repeat for "
                        "several nodes): embed the hung workers' stacks saved under it. A trace "
                        "is untrusted input: without this, no file it names is opened")
    return parser


def _report(argv: list[str]) -> int:
    from .._readers._analysis import analyse
    from .._readers._summary import format_text

    parser = build_parser()
    args = parser.parse_args(argv)
    fmt = args.format or "html"
    if fmt == "text" and args.output:
        raise UsageError("--format text prints to stdout; it takes no -o")
    for d in args.log_dir:
        if not os.path.isdir(d):
            raise UsageError(f"--log-dir {d}: not a directory")
    traces: list[Trace] = []
    specs: dict[int, Spec] = {}
    for path in args.traces:
        lifecycles = read_trace_arg(path)
        spec = _spec_for_trace(args, path, lifecycles, args.spec)
        for t in lifecycles:
            specs[len(traces)] = spec
            traces.append(t)
    analysis = analyse(traces, specs)
    if fmt == "text":
        from .._readers._report import root_stderr_text

        sys.stdout.write(format_text(analysis)
                         + "".join(f"{line}\n" for line in root_stderr_text(analysis,
                                                                            args.log_dir)))
        return OK
    page = _html(analysis, traces, specs, args.traces, args.log_dir)
    out = args.output or "report.html"
    if out == "-":
        sys.stdout.write(page)
        return OK
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise UsageError(f"-o {out}: {e.strerror or e}") from None
    print(f"wrote {out} ({analysis.outcome}; {len(analysis.lanes)} agent(s), "
          f"{len(analysis.incidents)} incident(s))")
    return OK


def _html(analysis: object, traces: Sequence[Trace], specs: dict[int, Spec],
          sources: Sequence[str], log_dirs: Sequence[str] = ()) -> str:
    from .._readers._analysis import JobAnalysis
    from .._readers._report import render_html
    from ..diagram._render import DiagramEngineMissing, Highlight, highlight_from_replay, render
    from ..trace._replay import replay
    from .diagram import _merge

    assert isinstance(analysis, JobAnalysis)
    # The diagram of the first trace's spec, with the path of every trace that runs it.
    spec = specs[0]
    results = [replay(spec, t) for i, t in enumerate(traces) if specs[i].name == spec.name]
    highlight: Highlight = _merge([highlight_from_replay(r) for r in results])
    for r in results:
        if not r.ok:
            print(f"{PROG}: warning: {r.trace.path}: {r.divergence}", file=sys.stderr)
    taken = []
    for (index, source), n in sorted(highlight.counts.items()):
        t = spec.transitions[index]
        taken.append((f"{source} --{'|'.join(t.triggers)}--> {t.dest} (line {t.line})", n))
    svg: bytes | str | None
    try:
        svg = render(spec, "svg", highlight)
    except DiagramEngineMissing:
        svg = None
    return render_html(analysis, diagram_svg=svg, taken=taken,
                       sources=[os.path.abspath(s) for s in sources], log_dirs=log_dirs)


def main(argv: Sequence[str]) -> int:
    """``fsm-agent report TRACE... [-o FILE] [--format html|text] [--spec SPEC]``."""
    return run_command(PROG, _report, argv)
