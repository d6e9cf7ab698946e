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


def _main_job() -> tuple[list[str], list[str]]:
    """The README's main job (the first line's ``fsm-agent run ...``) and its sample output
    (the first plain fence after it)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```\n", (ROOT / "README.md").read_text(),
                        re.S | re.M)
    assert [lang for lang, _ in blocks[:2]] == ["sh", ""], blocks[:2]
    command = blocks[0][1].splitlines()[0].split("&& .venv/bin/fsm-agent run ", 1)[1]
    return command.split(), blocks[1][1].splitlines()


def _line_pattern(line: str) -> re.Pattern[str]:
    # The sample abridges what changes from run to run: a log line's time and pid (``E...``),
    # a pid, the interpreter's path and fsm_agent's own line numbers. Everything else, torch's
    # source lines included, must be what a run prints.
    pattern = re.escape(line)
    pattern = re.sub(r"^([EWI])\\\.\\\.\\\.", r"\1\\d{4} [\\d:.]+ \\d+", pattern)
    pattern = pattern.replace(r"\.\.\./python3", r"\S*python3")
    # fsm_agent's own source lines move with every change; torch's are pinned with torch
    pattern = re.sub(r"(fsm_agent/\S*\\\.py):\d+", r"\1:\\d+", pattern)
    pattern = re.sub(r"pid:\\ \d+", r"pid:\\ \\d+", pattern)
    return re.compile(pattern)


@pytest.mark.timeout(240)
def test_the_readme_sample_output_is_what_the_main_job_prints(tmp_path: Path) -> None:
    args, sample = _main_job()
    at = args.index("--checkpoint-dir")
    assert args[at + 1:at + 3] == ['"$(mktemp', '-d)"'], args
    args[at + 1:at + 3] = [str(tmp_path / "ckpt")]
    assert len(sample) > 5 and sum(s[:1] in "EW" for s in sample) >= 2, sample
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    # the console script, as the README runs it (``python -m`` would put the checkout first on
    # sys.path, and torch's log lines would name its files from there)
    fsm_agent = Path(sys.executable).with_name("fsm-agent")
    proc = subprocess.run([str(fsm_agent), "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    # Each sample line appears in a run's output, each rank's lines in the order shown (the
    # two streams and the two ranks interleave as they like).
    for prefix in ("[rank 0]", "[rank 1]", ("E", "W")):
        wanted = [s for s in sample if s.startswith(prefix)]
        got = iter(lines)
        for s in wanted:
            pat = _line_pattern(s)
            assert any(pat.search(line) for line in got), \
                f"README sample line not printed (in this order): {s!r}\n" + "\n".join(lines)
