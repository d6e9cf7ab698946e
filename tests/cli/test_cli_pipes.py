"""Output into a pipe whose reader has left (``fsm-agent ... | head``): no traceback, exit 0.

Each command writes into a real pipe whose read end is already closed, so its first write fails
with EPIPE whatever the output size (with ``| head -1`` a small output can fit the pipe buffer
before head exits, and nothing would be tested).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "tests" / "tools" / "data" / "fail_once_recover.jsonl")

COMMANDS = {
    "check": ["check"],
    "check-json": ["check", "--format", "json"],
    "demo": ["demo"],
    "diagram": ["diagram", "torchelastic"],
    "diagram-dot": ["diagram", "torchrun", "--format", "dot"],
    "replay": ["replay", TRACE],
    "diff": ["diff", "torchelastic", "torchrun"],
    "top-level-help": ["--help"],
    "conformance-help": ["conformance", "--help"],
    "run-help": ["run", "--help"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_traceback_when_the_reader_leaves(name: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "fsm_agent", *COMMANDS[name]],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=100,
                              cwd=ROOT)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


def test_head_in_a_shell() -> None:
    fsm = f"{sys.executable} -m fsm_agent"
    proc = subprocess.run(f"{fsm} diagram torchelastic --format dot | head -n 1",
                          shell=True, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.startswith("digraph"), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
