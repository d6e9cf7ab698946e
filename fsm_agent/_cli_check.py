"""``fsm-agent check`` and ``fsm-agent demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._engine import Lifecycle, Step
from ._errors import SpecError, WorkerGroupFailureException
from ._spec import load_spec, preset_names
from .testing import RecordingDriver

__all__ = ["demo_main", "main"]


def main(argv: Sequence[str]) -> int:
    """Check every spec given; print each problem with its file and line. Exit 1 if any."""
    parser = argparse.ArgumentParser(
        prog="fsm-agent check",
        description="Check lifecycle specs (files or preset names) and report every problem.",
    )
    parser.add_argument(
        "specs",
        nargs="*",
        metavar="SPEC",
        help=f"spec file or preset name (default: all presets: {', '.join(preset_names())})",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    args = parser.parse_args(list(argv))
    bad = 0
    for name in args.specs or preset_names():
        try:
            spec = load_spec(name)
        except SpecError as e:
            bad += 1
            print(e, file=sys.stderr)
            continue
        if not args.quiet:
            print(
                f"{spec.path}: ok ({spec.name}: {len(spec.states)} states, "
                f"{sum(1 for _ in spec.edges())} transitions)"
            )
    return 1 if bad else 0


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


def demo_main(argv: Sequence[str]) -> int:
    """Run a spec against a simulated worker group and print each transition."""
    parser = argparse.ArgumentParser(
        prog="fsm-agent demo",
        description="Run a lifecycle against a simulated worker group (no processes).",
    )
    parser.add_argument("--spec", default="torchelastic", help="spec file or preset name")
    parser.add_argument("--max-restarts", type=int, default=1)
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
    args = parser.parse_args(list(argv))
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    from ._spec import STATE_NAMES

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
        max_restarts=args.max_restarts,  # type: ignore[arg-type]
        exit_barrier_timeout=1.0,
        listeners=[_print_step],
    )
    print(f"spec {spec.name} ({spec.path}), max_restarts={args.max_restarts}")
    try:
        result = lc.run(0.0)
    except WorkerGroupFailureException as e:
        print(f"raised WorkerGroupFailureException: {e}")
        return 1
    assert result is not None
    print(f"result: {result.state.name}, restarts used {lc.restart_count}/{args.max_restarts}")
    return 0 if result.state.name == "SUCCEEDED" else 1
