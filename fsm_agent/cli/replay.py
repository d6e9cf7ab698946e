"""``fsm-agent replay``: check a recorded trace against a spec (exit 1 at a divergence).

No torch import: it reads specs and traces only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import (
    FAILED,
    OK,
    ArgumentParser,
    add_spec_option,
    read_trace_arg,
    run_command,
    shown,
    spec_for_trace,
)

__all__ = ["main"]

PROG = "fsm-agent replay"


def _replay(argv: list[str]) -> int:
    from .._replay import replay, summary

    parser = ArgumentParser(
        prog=PROG,
        description="Check a recorded trace against its spec: every step must be a transition "
        "the spec allows, with guards consistent with the recorded values.",
    )
    parser.add_argument("trace", metavar="TRACE", help="a JSON Lines trace (fsm-agent run --trace)")
    add_spec_option(parser, "--spec", default=None,
                    help="spec file or preset name (default: the one the trace names)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print divergences only")
    args = parser.parse_args(argv)
    traces = read_trace_arg(args.trace)
    spec = spec_for_trace(args, args.trace, traces, args.spec)
    bad = 0
    for i, trace in enumerate(traces, start=1):
        res = replay(spec, trace)
        label = shown(args.trace) + (f" lifecycle {i}/{len(traces)}" if len(traces) > 1 else "")
        if res.ok:
            if not args.quiet:
                print(f"{label}: follows spec {spec.name!r} ({shown(spec.path)})")
                print("  " + summary(res).replace("\n", "\n  "))
        else:
            bad += 1
            print(f"{label}: diverges from spec {spec.name!r} ({shown(spec.path)})")
            print(f"  {res.divergence}")
            if res.checked > 1 and not args.quiet:
                print("  path until then: " + summary(res, steps=res.checked - 1)
                      .split("\n")[0])
    return FAILED if bad else OK


def main(argv: Sequence[str]) -> int:
    """``fsm-agent replay TRACE [--spec SPEC]``: exit 1 at the first divergence."""
    return run_command(PROG, _replay, argv)
