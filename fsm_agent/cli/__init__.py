"""The ``fsm-agent`` command: one module per subcommand, this one dispatches.

``fsm_agent/cli/NAME.py`` is ``fsm-agent NAME`` (``main(argv) -> int``); ``_common.py`` holds what
they share (exit codes, one-line errors, the spec argument); ``_runargs.py`` checks ``run``'s
arguments. A subcommand's module is imported only when it runs, so ``fsm-agent check`` never pays
for importing torch. Library code the commands call lives outside this package (``launch`` in
``fsm_agent.torch``, traces in ``fsm_agent.trace``, ...).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from ._common import OK, USAGE

__all__ = ["COMMANDS", "main"]

# name -> one-line help; the module is fsm_agent.cli.<name>, its entry point main(argv).
COMMANDS: dict[str, str] = {
    "run": "launch a job, as torchrun does, driven by a spec",
    "check": "check spec files and report every problem",
    "demo": "run a lifecycle against a simulated worker group and print each transition",
    "diagram": "draw a spec (or a trace's path) as a diagram",
    "replay": "check a recorded trace against a spec",
    "diff": "list what differs between two specs",
    "report": "merge a job's traces into an HTML report or a text summary",
    "conformance": "check a supervisor against a spec with property-based tests",
    "store": "serve a rendezvous store outside the training nodes",
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: fsm-agent COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, help_ in COMMANDS.items()]
    lines += ["", "fsm-agent COMMAND --help shows a command's options.",
              "fsm-agent --version prints the version."]
    return "\n".join(lines)


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return OK if args else USAGE
    if args[0] == "--version":
        from .. import __version__

        print(f"fsm-agent {__version__}")
        return OK
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"fsm-agent: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return USAGE
    if name == "run":
        from ._prestart import prestart_template

        prestart_template(rest)  # --preload: the template imports while this imports torch
    module = importlib.import_module(f"{__name__}.{name}")
    return int(module.main(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fsm-agent`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:
        # The process ends when this returns: its final garbage collection would walk every
        # object torch allocated, about 2 s after `fsm-agent run` on this machine, for nothing
        # (what holds resources is closed explicitly). Only for the process's own entry.
        atexit.register(gc.freeze)
    try:
        code = _dispatch(args)
        # Flush here, not at interpreter exit, so that a closed pipe is caught below.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # `fsm-agent ... | head`: the reader left; nothing to report. Point stdout at /dev/null
        # so that the interpreter's own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return OK
