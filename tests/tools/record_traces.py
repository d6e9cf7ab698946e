"""Record the trace fixtures of tests/tools/data/ from real ``fsm-agent run --trace`` jobs.

    python tests/tools/record_traces.py

Each job starts real worker processes under the c10d rendezvous on loopback (two workers, fast
monitor interval), so it takes a few seconds. The traces are committed; tests only read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

JOBS = {
    # name: (spec, max_restarts, script)
    "fail_once_recover": ("torchelastic", 2, "fail_once.py"),
    "give_up_torchrun": ("torchrun", 1, "always_fail.py"),
}


def record(name: str, spec: str, max_restarts: int, script: str) -> Path:
    out = DATA / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "fsm_agent.cli", "run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", "--spec", spec,
        "--exit-barrier-timeout", "10", "--trace", str(out), str(DATA / script),
    ]
    proc = subprocess.run(cmd, cwd=DATA, timeout=180, capture_output=True, text=True,
                          env={**os.environ, "LOGLEVEL": "WARNING"})
    # The header's spec_path is this checkout's absolute path: on another machine (or in CI's
    # clone) it names nothing or a different tree, so the committed fixture keeps the preset
    # name only. Everything else is as the runner wrote it.
    lines = out.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header.pop("spec_path", None)
    out.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    print(f"{name}: exit {proc.returncode}, {len(lines)} lines -> {out}")
    return out


if __name__ == "__main__":
    for job, (spec, restarts, script) in JOBS.items():
        record(job, spec, restarts, script)
