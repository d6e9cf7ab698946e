"""``fsm-agent check``: check spec files and report every problem (exit 1 if any); with
``--bounds``, how long a crash loop takes to give up and how many restarts it makes.

No torch import: it reads specs, and ``--bounds`` runs them in virtual time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from .._core._errors import SpecError
from .._core._load import preset_names
from ._common import (
    FAILED,
    OK,
    UsageError,
    add_format_option,
    add_spec_option,
    check_spec_exists,
    load_spec_arg,
    make_parser,
    print_json,
    run_command,
    seconds_arg,
    shown,
    spec_params,
)

__all__ = ["build_parser", "main"]

PROG = "fsm-agent check"
EXAMPLES = (
    "fsm-agent check                         # every built-in preset",
    "fsm-agent check my_lifecycle.yaml -q    # print problems only; exit 1 if any",
    "fsm-agent check --bounds resilient --max-restarts 3 --spec-param backoff_max=5m",
)

# torchrun's own defaults (fsm-agent run's): --max-restarts 0, --monitor-interval 0.1, c10d's
# join_timeout 600 s, the 30 s within which torch stops workers on a restart, exit barrier 300 s.
_LIMIT_DEFAULTS = {"max_restarts": 0, "monitor_interval": 0.1, "rendezvous_timeout": 600.0,
                   "stop_timeout": 30.0, "exit_barrier_timeout": 300.0}


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent check`` command line."""
    parser = make_parser(
        PROG, "Check lifecycle specs (files or preset names) and report every problem, each "
        "with its file and line. Exit 0 when all are valid, 1 when any has a problem, 2 when a "
        "file is missing or an option is bad.", EXAMPLES)
    add_spec_option(
        parser,
        "specs",
        nargs="*",
        help=f"spec file or preset name (default: all presets: {', '.join(preset_names())})",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    add_format_option(parser)
    b = parser.add_argument_group(
        "bounds", "With --bounds, each valid spec's engine runs a crash loop (every attempt fails "
        "as soon as it starts) in virtual time: the fastest (every call instant) and the slowest "
        "(every call as slow as the limits below allow). It prints how long the job takes to "
        "give up and how many restarts it makes. Durations: seconds or with a unit (90, 500ms, "
        "5s, 10m).")
    b.add_argument("--bounds", action="store_true",
                   help="print the crash-loop bounds of each spec")
    b.add_argument("--max-restarts", "--max_restarts", type=_count, default=None, metavar="N",
                   help="the agent's --max-restarts (default 0, as torchrun)")
    b.add_argument("--monitor-interval", "--monitor_interval", type=seconds_arg(True), default=None,
                   metavar="SECONDS", help="the agent's --monitor-interval (default 0.1)")
    b.add_argument("--rdzv-timeout", type=seconds_arg(True), default=None, metavar="SECONDS",
                   help="the longest rendezvous: c10d's join_timeout (--rdzv-conf "
                   "join_timeout=...; default 600)")
    b.add_argument("--stop-timeout", "--shutdown-timeout", dest="stop_timeout",
                   type=seconds_arg(False), default=None, metavar="SECONDS",
                   help="the longest stop of the workers (torch stops them on a restart, and "
                   "closes a failed group, within 30 s: the default)")
    b.add_argument("--exit-barrier-timeout", "--exit_barrier_timeout",
                   type=seconds_arg(False), default=None, metavar="SECONDS",
                   help="the agent's --exit-barrier-timeout (default 300)")
    b.add_argument("--collective-timeout", type=seconds_arg(True), default=None,
                   metavar="SECONDS", help="the collectives' timeout (init_process_group's "
                   "timeout; default 30m, gloo's; NCCL's is 10m)")
    b.add_argument("--grace", type=seconds_arg(False), default=None, metavar="SECONDS",
                   help="the scheduler's grace between its SIGTERM and its SIGKILL (Slurm's "
                   "KillWait, Kubernetes' terminationGracePeriodSeconds; default 30)")
    b.add_argument("--signal-lead", type=seconds_arg(False), default=None, metavar="SECONDS",
                   help="Slurm's --signal=SIG@LEAD: how long before the time limit the "
                   "warning comes (default: not checked)")
    return parser


def _limits(args: argparse.Namespace) -> Any:
    """The ``Limits`` of ``--bounds`` (None without it; its flags alone are a usage error)."""
    given = {"max_restarts": args.max_restarts, "monitor_interval": args.monitor_interval,
             "rendezvous_timeout": args.rdzv_timeout, "stop_timeout": args.stop_timeout,
             "exit_barrier_timeout": args.exit_barrier_timeout}
    if not args.bounds:
        flags = {"max_restarts": "--max-restarts", "monitor_interval": "--monitor-interval",
                 "rendezvous_timeout": "--rdzv-timeout", "stop_timeout": "--stop-timeout",
                 "exit_barrier_timeout": "--exit-barrier-timeout"}
        used = [flags[k] for k, v in given.items() if v is not None]
        used += [f for f, v in (("--collective-timeout", args.collective_timeout),
                                ("--grace", args.grace), ("--signal-lead", args.signal_lead))
                 if v is not None]
        if used:
            raise UsageError(f"{used[0]} goes with --bounds")
        return None
    from .._core._bounds import Limits

    values: dict[str, Any] = {k: _LIMIT_DEFAULTS[k] if v is None else v for k, v in given.items()}
    return Limits(**values)


def _layers(args: argparse.Namespace, limits: Any) -> Any:
    """The timeouts around the agent, for the rules of ``fsm_agent._core._timeouts``."""
    from .._core._timeouts import Layers

    default = Layers()
    return Layers(
        collective_timeout=default.collective_timeout if args.collective_timeout is None
        else args.collective_timeout,
        rendezvous_timeout=limits.rendezvous_timeout, stop_timeout=limits.stop_timeout,
        grace=default.grace if args.grace is None else args.grace,
        signal_lead=args.signal_lead)


def _check(argv: list[str]) -> int:
    from .._core._params import format_param

    args = build_parser().parse_args(argv)
    limits = _limits(args)
    names = args.specs or preset_names()
    for name in names:  # a missing file is bad input: say so before checking anything
        check_spec_exists(name)
    results: list[dict[str, Any]] = []
    failed: list[SpecError | None] = []
    tables: list[str | None] = []
    for name in names:
        entry: dict[str, Any] = {"spec": name, "ok": True, "name": None, "path": None,
                                 "states": None, "transitions": None, "problems": [],
                                 "params": None}
        results.append(entry)
        tables.append(None)
        try:
            spec = load_spec_arg(args, name, flag="SPEC")
        except SpecError as e:
            entry["ok"] = False
            entry["problems"] = [{"path": p.path, "line": p.line, "element": p.element,
                                  "message": p.message} for p in e.problems]
            failed.append(e)
            continue
        failed.append(None)
        # --spec-param against every spec given: a bad value is bad input (exit 2), reported
        # before any output.
        settings = _LIMIT_DEFAULTS if limits is None else {
            "max_restarts": limits.max_restarts,
            "exit_barrier_timeout": limits.exit_barrier_timeout}
        values = spec_params(args, spec, max_restarts=int(settings["max_restarts"]),
                             exit_barrier_timeout=float(settings["exit_barrier_timeout"]))
        entry.update(name=spec.name, path=spec.path, states=len(spec.states),
                     transitions=sum(1 for _ in spec.edges()),
                     params={p.name: format_param(p.type, values[p.name])
                             for p in sorted(spec.params, key=lambda p: p.name)})
        if limits is not None:
            from .._core._bounds import bounds, bounds_json, format_bounds
            from .._core._timeouts import check_timeouts, format_findings

            found = bounds(spec, values, limits)
            entry["bounds"] = bounds_json(spec, found, limits, values)
            layers = _layers(args, limits)
            findings = check_timeouts(spec, values, layers,
                                      gives_up=all(b.restarts is not None for b in found))
            entry["timeouts"] = [f.as_dict() for f in findings]
            if any(f.ok is False for f in findings):
                entry["ok"] = False
            tables[-1] = (format_bounds(spec, found, limits, values) + "\n\n"
                          + format_findings(findings, layers, shown))
    ok = all(r["ok"] for r in results)
    if args.format == "json":
        print_json("check", {"ok": ok, "specs": results})
        return OK if ok else FAILED
    given = {p.partition("=")[0].strip() for p in args.spec_params}
    for entry, error, table in zip(results, failed, tables, strict=True):
        if error is not None:
            print(error, file=sys.stderr)
            continue
        if not args.quiet:
            extra = "".join(f"; {k}={entry['params'][k]}" for k in sorted(given))
            print(f"{shown(entry['path'])}: ok ({entry['name']}: {entry['states']} states, "
                  f"{entry['transitions']} transitions{extra})")
        if table is not None:
            print(f"\n{table}\n")
    return OK if ok else FAILED


def main(argv: Sequence[str]) -> int:
    """Check every spec given; print each problem with its file and line. Exit 1 if any."""
    return run_command(PROG, _check, argv)
