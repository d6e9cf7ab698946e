"""``fsm-agent demo``: run a lifecycle against a simulated worker group (no processes) and print
each transition.

No torch import.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .._core._engine import Lifecycle
from .._core._errors import WorkerGroupFailureException
from .._core._spec import STATE_NAMES
from .._core._step import Step
from ..testing import RecordingDriver
from ._common import (
    FAILED,
    OK,
    add_spec_option,
    load_spec_arg,
    make_parser,
    run_command,
    spec_params,
)

__all__ = ["build_parser", "main"]

PROG = "fsm-agent demo"


def _simulated_group(script: Sequence[str], waiting: Sequence[int]) -> RecordingDriver:
    """A worker group that plays ``script`` and prints the metrics it is given: no processes."""

    class SimulatedGroup(RecordingDriver):
        def put_metric(self, name: str, value: int) -> None:
            super().put_metric(name, value)
            print(f"    metric {name}={value}")

    return SimulatedGroup(script, nodes_waiting=waiting)


def _print_step(step: Step) -> None:
    guards = ", ".join(f"{g}={'true' if v else 'false'}" for g, v in step.guards)
    actions = ", ".join(a.name for a in step.actions)
    line = f"  {step.source:>9} --{step.trigger}--> {step.dest}"
    if guards:
        line += f"  [{guards}]"
    if actions:
        line += f"  / {actions}"
    print(line)


EXAMPLES = (
    "fsm-agent demo                   # a failure, a restart, a node joining, success",
    "fsm-agent demo --spec torchrun --max-restarts 0 --script HEALTHY,FAILED",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent demo`` command line."""
    parser = make_parser(
        PROG, "Run a lifecycle against a simulated worker group (no processes) and print each "
        "transition. Exit 0 when the lifecycle succeeds, 1 when it gives up.", EXAMPLES)
    add_spec_option(parser)
    parser.add_argument("--max-restarts", type=int, default=1, metavar="N",
                        help="restarts allowed after a failure (default: 1)")
    parser.add_argument(
        "--script",
        default="HEALTHY,FAILED,HEALTHY,HEALTHY,SUCCEEDED",
        help="comma-separated monitor results, one per tick",
    )
    parser.add_argument(
        "--nodes-waiting",
        default="0,1,0",
        help="comma-separated answers of num_nodes_waiting() on HEALTHY ticks",
    )
    return parser


def _demo(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    spec = load_spec_arg(args)
    script = [s.strip().upper() for s in args.script.split(",") if s.strip()]
    for s in script:
        if s not in STATE_NAMES:
            parser.error(f"--script: unknown state {s!r} (states: {', '.join(STATE_NAMES)})")
    try:
        waiting = [int(x) for x in args.nodes_waiting.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--nodes-waiting: expected integers, got {args.nodes_waiting!r}")
    group = _simulated_group(script, waiting)
    lc = Lifecycle(
        spec,
        group,
        max_restarts=args.max_restarts,
        exit_barrier_timeout=1.0,
        listeners=[_print_step],
        params=spec_params(args, spec, max_restarts=args.max_restarts, exit_barrier_timeout=1.0),
    )
    print(f"spec {spec.name} ({spec.path}), max_restarts={args.max_restarts}")
    try:
        result = lc.run(0.0)
    except WorkerGroupFailureException as e:
        print(f"raised WorkerGroupFailureException: {e}")
        return FAILED
    assert result is not None
    print(f"result: {result.state.name}, restarts used {lc.restart_count}/{args.max_restarts}")
    return OK if result.state.name == "SUCCEEDED" else FAILED


def main(argv: Sequence[str]) -> int:
    """Run a spec against a simulated worker group and print each transition."""
    return run_command(PROG, _demo, argv)
