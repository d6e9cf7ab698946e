"""``tools/generated_docs.py``: the one command that regenerates the docs' tables made from code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("docs/spec-format.md", "docs/diagrams.md", "docs/cli.md")


def _generated_docs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "tools/generated_docs.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_committed_docs_are_what_every_generator_makes() -> None:
    done = _generated_docs("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stale" not in done.stderr, done.stderr


def test_it_rewrites_each_stale_table_and_nothing_else(tmp_path: Path) -> None:
    for page in PAGES:
        (tmp_path / page).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    edits = {"docs/spec-format.md": ("| `failed_ranks_at_least` |", "| `old_kind` |"),
             "docs/diagrams.md": ("| `rule` |", "| `old_rule` |"),
             "docs/cli.md": ("| `--trace FILE` |", "| `--old-flag` |")}
    for page, (old, new) in edits.items():
        text = (tmp_path / page).read_text()
        assert old in text, (page, old)
        (tmp_path / page).write_text(text.replace(old, new, 1))
    check = _generated_docs("--check", "--root", str(tmp_path))
    assert check.returncode == 1
    assert "stale: kinds, trace fields, run flags" in check.stderr, check.stderr
    done = _generated_docs("--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [(tmp_path / p).read_text() == (ROOT / p).read_text() for p in PAGES] == [True] * 3
    assert _generated_docs("--check", "--root", str(tmp_path)).returncode == 0


def test_a_page_that_lost_its_markers_is_an_error_naming_it(tmp_path: Path) -> None:
    for page in PAGES:
        (tmp_path / page).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    page = tmp_path / "docs/diagrams.md"
    page.write_text(page.read_text().replace("<!-- trace-schema: fold -->\n", ""))
    done = _generated_docs("--check", "--root", str(tmp_path))
    assert done.returncode == 1
    assert f"{page}: no '<!-- trace-schema: fold -->' line" in done.stderr, done.stderr
