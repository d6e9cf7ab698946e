"""``fsm-agent``: one command, several tools. Each subcommand lives in its own module and is
imported only when used, so ``fsm-agent check`` never pays for importing torch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("fsm_agent.torch._run", "main", "launch a job, as torchrun does, driven by a spec"),
    "check": ("fsm_agent._cli_check", "main", "check spec files and report every problem"),
    "demo": (
        "fsm_agent._cli_check",
        "demo_main",
        "run a lifecycle against a simulated worker group and print each transition",
    ),
    "diagram": (
        "fsm_agent._cli_tools",
        "diagram_main",
        "draw a spec (or a trace's path) as a diagram",
    ),
    "replay": ("fsm_agent._cli_tools", "replay_main", "check a recorded trace against a spec"),
    "diff": ("fsm_agent._cli_tools", "diff_main", "list what differs between two specs"),
    "conformance": (
        "fsm_agent.testing._cli",
        "main",
        "check a supervisor against a spec with property-based tests",
    ),
}

USAGE_EXIT = 2


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: fsm-agent COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "fsm-agent COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fsm-agent`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else USAGE_EXIT
    if args[0] == "--version":
        from . import __version__

        print(f"fsm-agent {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"fsm-agent: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return USAGE_EXIT
    module, func, _ = COMMANDS[name]
    try:
        entry = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        print(f"fsm-agent {name}: not available in this installation ({e})", file=sys.stderr)
        return 1
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
