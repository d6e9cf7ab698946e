"""``tools/generated_docs.py``: the one command that regenerates the docs' tables made from code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_docs_are_what_every_generator_makes() -> None:
    done = subprocess.run([sys.executable, "tools/generated_docs.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stale" not in done.stderr, done.stderr
