"""``fsm-agent conformance MODULE:ATTR``: run the conformance kit from the command line.

Exit status: 0 when the target conforms, 1 on a counterexample (printed as a table) and on
nothing else, 2 on a usage error (bad target, unknown spec, bad flag) and on a target the kit
cannot script (a hook, type or constructor argument it cannot find or supply: one line naming
it). No torch import here; the kit imports torch only for a target that needs it.
"""

from __future__ import annotations

import argparse
import random
import shlex
from collections.abc import Sequence
from typing import Any

from ._common import (
    FAILED,
    OK,
    UsageError,
    _param_overrides,
    add_spec_option,
    import_ref,
    load_spec_arg,
    make_parser,
    run_command,
    spec_loading_kwargs,
    spec_params,
)

__all__ = ["build_parser", "load_target", "main"]

PROG = "fsm-agent conformance"

_DESCRIPTION = """\
Check a supervisor against a lifecycle spec with generated monitor scripts (all seven worker
states, failures with exit codes, signals and error types, nodes waiting, exit barrier
ok/error/timeout, hooks raising, max_restarts 0..5; for a spec with parameters or timers, such
as resilient, also time passing in virtual time, jitter draws and the parameters' values, which
--spec-param fixes instead).

TARGET is MODULE:ATTR, where ATTR names either a class with the SimpleElasticAgent shape, from
torch or any other package (torchelastic, a vendored copy): the kit subclasses it with scripted
hooks and runs its own _invoke_run; an abstract subclass that only overrides _invoke_run is fine.
Or a callable factory(driver, **settings) returning an object with run(monitor_interval,
sleep=...), as fsm_agent.Lifecycle has. --driver MODULE:ATTR names make_driver(world) -> Driver:
your own driver, which the factory (or Lifecycle) gets instead of the kit's; world is the kit's
scripted driver, which yours must call as its outside world. --target-api declares what an
agent class asks for beyond torch's API (nvrx: NVIDIA's ft_launcher agent, any release).

Exit status: 0 conforms; 1 a counterexample (and nothing else); 2 a usage error, or a target the
kit cannot script (one line naming what it cannot find or supply)."""


EXAMPLES = (
    "fsm-agent conformance mypkg.agent:MyElasticAgent --spec torchrun --examples 500",
    "fsm-agent conformance mypkg.sup:make_supervisor --spec resilient "
    "--spec-param no_retry_exit_codes=3,4",
    "fsm-agent conformance fsm_agent:Lifecycle --driver mypkg.sup:make_driver --seed 1234",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent conformance`` command line."""
    p = make_parser(PROG, _DESCRIPTION, EXAMPLES)
    p.add_argument("target", metavar="MODULE:ATTR",
                   help="the supervisor to check, e.g. mypkg.agent:MyAgent")
    p.add_argument("--driver", metavar="MODULE:ATTR", default=None,
                   help="your driver, make_driver(world) -> Driver, checked between the target "
                        "(a factory or fsm_agent:Lifecycle) and the kit's scripted world")
    p.add_argument("--target-api", metavar="NAME|FILE", default=None,
                   help="what an agent class needs beyond torch's agent API (constructor "
                        "arguments, rendezvous handler methods), answered from the script: "
                        "nvrx (NVIDIA's ft_launcher) or a YAML file (docs/conformance.md)")
    # --spec-param fixes a parameter for every run; the others are drawn per run.
    add_spec_option(p)
    p.add_argument("--examples", type=int, default=200, metavar="N",
                   help="generated scripts to run (default: 200)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="random seed, to reproduce a run (default: a fresh one, printed)")
    p.add_argument("--stateful", action="store_true",
                   help="use the RuleBasedStateMachine (several runs per example; slower)")
    return p


def load_target(ref: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted); raise ``UsageError`` with a clear message."""
    return import_ref(ref, "TARGET", "mypkg.agent:MyAgent")


def _reproduction(args: argparse.Namespace, seed: int) -> str:
    """The command line that runs the same search again: every option that changes which
    scripts are drawn, how they run or how the spec loads, quoted for a POSIX shell."""
    argv = [args.target, "--spec", args.spec]
    for param in args.spec_params or ():
        argv += ["--spec-param", param]
    for option in ("driver", "vocabulary", "target_api"):
        value = getattr(args, option, None)
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", value]
    argv += ["--examples", str(args.examples), "--seed", str(seed)]
    if args.stateful:
        argv.append("--stateful")
    return " ".join([PROG, *map(shlex.quote, argv)])


def _conformance(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        from hypothesis import settings
        from hypothesis.errors import HypothesisException
    except ImportError:
        raise UsageError("the conformance kit needs hypothesis: "
                         "pip install 'fsm-agent[testing]'") from None

    from ..testing._conformance import (
        ConformanceFailure,
        HarnessError,
        default_settings,
        run_conformance,
    )
    from ..testing._oracle import _profile
    from ..testing._strategies import RunConfig
    from ..testing._targets import resolve_target

    if args.examples < 1:
        raise UsageError(f"--examples must be at least 1, got {args.examples}")
    target = load_target(args.target)
    driver = (import_ref(args.driver, "--driver", "mypkg.sup:make_driver")
              if args.driver is not None else None)
    loaded = load_spec_arg(args)  # a bad spec is a usage error, reported before any run
    # The kit's oracle for a preset *name* is its reference table of torch's behaviour; for a
    # loaded spec it is the engine. Keep the table unless an option changed how the spec loads.
    spec = loaded if spec_loading_kwargs(args) else args.spec
    values = spec_params(args, loaded)  # a bad --spec-param is a usage error
    fixed = {name: values[name] for name in _param_overrides(args)}
    try:
        target_ok = resolve_target(target, spec, driver, args.target_api)
    except TypeError as e:  # HarnessError included
        raise UsageError(str(e)) from None
    if fixed and "params" not in target_ok.accepts:
        raise UsageError(f"--spec-param: {args.target} takes no params=, so the kit cannot set "
                         f"{', '.join(fixed)} (a factory(driver, params=..., **settings) can)")
    try:
        _profile(spec, RunConfig(params=fixed).params)
    except ValueError as e:  # a parameter the preset's reference does not model
        raise UsageError(f"--spec-param: {e}") from None
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    how = f"{args.examples} scripts, seed {seed}"
    try:
        run_conformance(target, spec=spec,
                        settings=settings(default_settings(args.examples), database=None),
                        seed=seed, stateful=args.stateful, params=fixed, driver=driver,
                        target_api=args.target_api)
    except ConformanceFailure as e:
        print(f"\nCOUNTEREXAMPLE ({how}):\n{e}\n")
        print(f"reproduce with: {_reproduction(args, seed)}")
        return FAILED
    except (HarnessError, HypothesisException) as e:
        # A target the kit cannot script (HarnessError: a hook, type or constructor argument it
        # cannot find or supply) is bad input, not a finding. What the supervisor itself raises
        # is part of its behaviour and never escapes here.
        raise UsageError(str(e)) from None
    print(f"OK: {args.target} conforms to spec {args.spec!r} ({how})")
    return OK


def main(argv: Sequence[str]) -> int:
    """Entry point of ``fsm-agent conformance``; returns the exit status."""
    return run_command(PROG, _conformance, argv)
