"""Every ```python snippet in README.md runs as shown.

Each snippet runs on its own, as a script (``python snippet.py``: a snippet that starts worker
processes needs a real ``__main__``), in a fresh directory that sees the repository's top-level
folders, so relative paths work as from the repository root and files a snippet writes stay out
of the checkout. A snippet may be excluded by putting, on the line right before its opening fence,

    <!-- readme-test: skip REASON -->

Keep those rare: today there are none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
SKIP = re.compile(r"<!-- readme-test: skip (.+?) -->\n$")


def snippets() -> list[tuple[int, str, str | None]]:
    text = (ROOT / "README.md").read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        skip = SKIP.search(text, 0, m.start())
        reason = skip.group(1) if skip and skip.end() == m.start() else None
        found.append((line, m.group(1), reason))
    return found


SNIPPETS = snippets()


def test_the_readme_has_snippets() -> None:
    assert len(SNIPPETS) >= 5


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("line", "code", "skip"), SNIPPETS,
                         ids=[f"README.md:{line}" for line, _, _ in SNIPPETS])
def test_snippet_runs(line: int, code: str, skip: str | None, tmp_path: Path) -> None:
    if skip:
        pytest.skip(skip)
    for entry in ("specs", "tests", "examples"):
        (tmp_path / entry).symlink_to(ROOT / entry)
    script = tmp_path / f"readme_line_{line}.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=150, env=env)
    assert proc.returncode == 0, f"README.md:{line} failed:\n{proc.stdout}\n{proc.stderr}"
    # what the snippets' comments promise: `print(...)  # OUTPUT (explanation)`
    for comment in re.findall(r"print\(.*\)\s+# (.+)$", code, re.M):
        promise = comment.split(" (")[0].strip()
        assert promise in proc.stdout, (promise, proc.stdout)
