"""Start-up cost of ``import fsm_agent`` and the pure-spec commands, against importing torch.

    python bench/startup.py [--smoke] [--json OUT]

Each command runs in a fresh interpreter (what a user waits for); the figure is the median wall
time over several runs, with the median CPU time (user + system) beside it, since wall time on a
shared machine also counts other processes' load. ``python -c pass`` is the interpreter's own
floor; ``import torch`` and ``import torch.distributed.elastic.agent.server.api`` show what
importing torch eagerly would cost.
For each command, whether torch ended up in ``sys.modules`` is checked too.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-m", "fsm_agent.cli"]

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [PY, "-c", "pass"],
    "import fsm_agent": [PY, "-c", "import fsm_agent"],
    "fsm-agent check": [*CLI, "check", "-q"],
    "fsm-agent diagram": [*CLI, "diagram", "torchrun"],
    "fsm-agent diff": [*CLI, "diff", "torchelastic", "torchrun"],
    "import torch": [PY, "-c", "import torch"],
    "import torch elastic agent": [PY, "-c", "import torch.distributed.elastic.agent.server.api"],
}
# `fsm-agent diff` exits 1 when the specs differ, as diff(1) does; these two do differ.
NEEDS_NO_TORCH = ("import fsm_agent", "fsm-agent check", "fsm-agent diagram", "fsm-agent diff")

def _imports_torch(name: str, argv: list[str]) -> bool:
    """Run the command in-process under a probe and report whether it imported torch."""
    if argv[1] == "-c":
        code = f"{argv[2]}\nimport sys; print('torch' in sys.modules)"
    else:  # -m fsm_agent.cli ARGS
        code = (
            "import sys, contextlib, io\n"
            "from fsm_agent.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv[3:]!r})\n"
            "print('torch' in sys.modules)\n"
        )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    return out.stdout.strip().endswith("True")


def measure(smoke: bool) -> dict[str, Any]:
    repeat = 3 if smoke else 5
    figures: dict[str, Any] = {}
    names = [n for n in COMMANDS if not (smoke and n == "import torch elastic agent")]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(repeat):
        for name in names:  # interleaved, so that load from elsewhere hits every command alike
            if name.startswith("import torch") and len(times[name]) >= (1 if smoke else 2):
                continue  # a reference only, and 2-5 s a run
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            done = subprocess.run(COMMANDS[name], capture_output=True, cwd=ROOT, check=False)
            times[name].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            if done.returncode not in ((0, 1) if name == "fsm-agent diff" else (0,)):
                raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    for name in names:
        figures[name] = {
            "median_s": statistics.median(times[name]),
            "cpu_median_s": statistics.median(cpu[name]),
            "runs": times[name],
        }
    for name in NEEDS_NO_TORCH:
        figures[name]["imports_torch"] = _imports_torch(name, COMMANDS[name])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = measure(args.smoke)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    for name, f in figures.items():
        extra = "" if "imports_torch" not in f else f"  imports torch: {f['imports_torch']}"
        wall, cpu = f["median_s"] * 1e3, f["cpu_median_s"] * 1e3
        print(f"{name:28s} {wall:8.1f} ms wall {cpu:8.1f} ms cpu{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
