"""``fsm-agent replay``: check a recorded trace against a spec (exit 1 at a divergence).

No torch import: it reads specs and traces only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._common import (
    FAILED,
    OK,
    add_format_option,
    add_spec_option,
    make_parser,
    print_json,
    read_trace_arg,
    run_command,
    shown,
    spec_for_trace,
    spec_params,
)

if TYPE_CHECKING:
    from ..trace._replay import ReplayResult

__all__ = ["build_parser", "main"]

PROG = "fsm-agent replay"
EXAMPLES = (
    "fsm-agent replay run.jsonl                  # against the spec the trace names",
    "fsm-agent replay run.jsonl --spec torchrun  # would torchrun's lifecycle have done this?",
    "fsm-agent replay run.jsonl --format json",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent replay`` command line."""
    parser = make_parser(
        PROG, "Check a recorded trace against its spec: every step must be a transition the "
        "spec allows, with guards consistent with the recorded values. Exit 0 when every "
        "lifecycle in the trace follows the spec, 1 at a divergence, 2 on bad input.", EXAMPLES)
    parser.add_argument("trace", metavar="TRACE", help="a JSON Lines trace (fsm-agent run --trace)")
    add_spec_option(parser, "--spec", default=None,
                    help="spec file or preset name (default: the one the trace names)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print divergences only")
    add_format_option(parser)
    return parser


def _lifecycle_json(index: int, res: ReplayResult) -> dict[str, Any]:
    followed = res.checked if res.ok else max(res.checked - 1, 0)
    records = res.trace.records[:followed]
    path = [res.trace.records[0].source] if res.trace.records else []
    path += [r.dest or "?" for r in records]
    last = records[-1] if records else None
    d = res.divergence
    return {
        "lifecycle": index,
        "ok": res.ok,
        "steps_followed": followed,
        "path": path,
        "final_state": res.final_state,
        "restarts_used": None if last is None else last.data.get("restart_count"),
        "restarts_left": None if last is None else last.data.get("remaining_restarts"),
        "ended_with": None if last is None else last.error,
        "divergence": None if d is None else {"step": d.step, "line": d.line,
                                              "message": d.message},
        # Why the trace stops early (the writer could not write on), or null.
        "incomplete": res.trace.incomplete,
        # The spec's parameters in force (the header's, else the defaults), in spec syntax.
        "params": dict(res.params),
    }


def _replay(argv: list[str]) -> int:
    from .._core._files import printable_lines as safe  # trace fields: no escapes, no huge lines
    from .._readers._analysis import analyse
    from .._readers._summary import detail_lines
    from ..trace._replay import replay, summary

    args = build_parser().parse_args(argv)
    traces = read_trace_arg(args.trace)
    spec = spec_for_trace(args, args.trace, traces, args.spec)
    values = spec_params(args, spec)
    # --spec-param: the values the run used, in place of what the trace header says.
    given = values if args.spec_params else None
    results = [replay(spec, trace, params=given) for trace in traces]
    bad = sum(1 for r in results if not r.ok)
    if args.format == "json":
        print_json("replay", {
            "ok": not bad,
            "trace": args.trace,
            "spec": {"name": spec.name, "path": spec.path},
            "lifecycles": [_lifecycle_json(i, r) for i, r in enumerate(results, start=1)],
        })
        return FAILED if bad else OK
    for i, res in enumerate(results, start=1):
        label = shown(args.trace) + (f" lifecycle {i}/{len(traces)}" if len(traces) > 1 else "")
        if res.ok:
            if not args.quiet:
                print(f"{label}: follows spec {spec.name!r} ({shown(spec.path)})")
                seen = analyse([res.trace], res.spec)
                print("  " + safe(summary(
                    res, restarts_used=seen.restarts_used, budgets=seen.budget_restarts,
                    details=detail_lines(seen, restarts=False))).replace("\n", "\n  "))
        else:
            print(f"{label}: diverges from spec {spec.name!r} ({shown(spec.path)})")
            print(f"  {safe(res.divergence)}")
            if res.checked > 1 and not args.quiet:
                print("  path until then: " + safe(summary(res, steps=res.checked - 1)
                                                  .split("\n")[0]))
        if res.trace.incomplete:
            # Even with -q: what was replayed is not the whole lifecycle.
            print(f"  incomplete trace: {res.trace.incomplete}; only the steps before it were "
                  "checked")
    return FAILED if bad else OK


def main(argv: Sequence[str]) -> int:
    """``fsm-agent replay TRACE [--spec SPEC]``: exit 1 at the first divergence."""
    return run_command(PROG, _replay, argv)
