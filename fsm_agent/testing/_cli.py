"""``fsm-agent conformance MODULE:ATTR``: run the conformance kit from the command line.

Exit status: 0 when the target conforms, 1 on a counterexample (printed as a table), 2 on a
usage error (bad target, unknown spec, bad flag).
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

PROG = "fsm-agent conformance"
USAGE_EXIT = 2

_DESCRIPTION = """\
Check a supervisor against a lifecycle spec with generated monitor scripts (all seven worker
states, nodes waiting, exit barrier ok/error/timeout, hooks raising, max_restarts 0..5).

TARGET is MODULE:ATTR, where ATTR names either a SimpleElasticAgent subclass (the kit subclasses
it with scripted hooks and runs its own _invoke_run; an abstract subclass that only overrides
_invoke_run is fine) or a callable factory(driver, **settings) returning an object with
run(monitor_interval, sleep=...), as fsm_agent.Lifecycle has."""


class _Usage(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="MODULE:ATTR",
                   help="the supervisor to check, e.g. mypkg.agent:MyAgent")
    p.add_argument("--spec", default="torchrun", metavar="NAME|PATH",
                   help="preset name (torchrun, torchelastic) or spec file (default: torchrun)")
    p.add_argument("--examples", type=int, default=200, metavar="N",
                   help="generated scripts to run (default: 200)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="random seed, to reproduce a run (default: a fresh one, printed)")
    p.add_argument("--stateful", action="store_true",
                   help="use the RuleBasedStateMachine (several runs per example; slower)")
    return p


def load_target(ref: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted); raise ``_Usage`` with a clear message."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise _Usage(f"TARGET must be MODULE:ATTR (e.g. mypkg.agent:MyAgent), got {ref!r}")
    # As `python -m` does: the current directory's modules are importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module itself failing on import
        raise _Usage(f"cannot import module {module_name!r}: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _Usage(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fsm-agent conformance``; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse has printed its message
        return int(e.code or 0)
    try:
        from hypothesis import settings
        from hypothesis.errors import HypothesisException
    except ImportError:
        print(f"{PROG}: error: the conformance kit needs hypothesis: "
              "pip install 'fsm-agent[testing]'", file=sys.stderr)
        return USAGE_EXIT

    from fsm_agent import SpecError

    from ._conformance import ConformanceFailure, default_settings, resolve_target, run_conformance

    try:
        if args.examples < 1:
            raise _Usage(f"--examples must be at least 1, got {args.examples}")
        target = load_target(args.target)
        spec = args.spec
        resolve_target(target, spec)
    except (_Usage, TypeError, SpecError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    how = f"{args.examples} scripts, seed {seed}"
    try:
        run_conformance(target, spec=spec,
                        settings=settings(default_settings(args.examples), database=None),
                        seed=seed, stateful=args.stateful)
    except ConformanceFailure as e:
        print(f"\nCOUNTEREXAMPLE ({how}):\n{e}\n")
        again = f"{PROG} {args.target} --spec {spec} --examples {args.examples} --seed {seed}"
        print(f"reproduce with: {again}")
        return 1
    except (SpecError, HypothesisException) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    print(f"OK: {args.target} conforms to spec {spec!r} ({how})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
