"""``fsm-agent run --preload``: launch the template before the agent imports torch.

The agent's own ``import torch`` (about 1.3 s of CPU) and the template's would otherwise run one
after the other: the template starts when the agent runs, and the first workers wait for it. Here
the command line is read without torch's parser (which needs torch): the ``--preload`` modules,
and the training script as torch will start it (``PYTHON_EXEC`` or this interpreter, ``-u``,
the script). The guess may be wrong (an option value that looks like a script): the agent takes
the template over only when its own would be the same command, modules and environment
(``_template.take_prestarted``); otherwise it is ended and the agent starts its own, so a wrong
guess costs CPU, never a difference. The one change torch's launcher makes to the agent's
environment before the template would start, ``OMP_NUM_THREADS=1`` for several workers per node
(``torch.distributed.run.config_from_args``), is made for the early template too; and it
carries the token the agent's sentinel will use (``FSM_AGENT_SENTINEL``), reserved here, so
that the sentinel finds it and its workers (a forked worker's ``/proc/PID/environ`` is the
template's) if the agent is killed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .._core._templatefile import load, reserve_sentinel_token

TOKEN_VAR = "FSM_AGENT_SENTINEL"  # fsm_agent.torch._sentinel's (that module imports torch)

__all__ = ["prestart_template"]

# options after which the script is not started as ``python -u SCRIPT``: no template guess
_OTHER_START = ("-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                "-h", "--help")


def _value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value given to option ``names`` (``--opt V`` or ``--opt=V``)."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1:]
    return found


def _script(argv: Sequence[str]) -> str | None:
    """The training script: the first argument that is an existing ``.py`` file."""
    for arg in argv:
        if arg in _OTHER_START:
            return None
        if not arg.startswith("-") and arg.endswith(".py") and os.path.isfile(arg):
            return arg
    return None


def prestart_template(argv: Sequence[str]) -> None:
    """Launch the template ``fsm-agent run ARGV`` will ask for, if it is one (see the module)."""
    preload = _value(argv, ("--preload",))
    script = _script(argv)
    if not preload or script is None or not sys.platform.startswith("linux"):
        return
    modules = [m.strip() for m in preload.split(",")]
    if not all(m and all(p.isidentifier() for p in m.split(".")) for m in modules):
        return  # the real parser reports it
    env = dict(os.environ)
    env[TOKEN_VAR] = reserve_sentinel_token()
    nproc = _value(argv, ("--nproc-per-node", "--nproc_per_node")) or "1"
    if "OMP_NUM_THREADS" not in env and nproc.isdigit() and int(nproc) > 1:
        env["OMP_NUM_THREADS"] = "1"
    interpreter = os.environ.get("PYTHON_EXEC", sys.executable)
    load().prestart(interpreter, ("-u",), modules, (script,), env)
