"""The command output quoted in README.md and docs/ is what the command prints today.

Every ```console block (or plain ``` block starting with ``$ ``) whose command is deterministic
and needs nothing but the repository (check, demo, replay of a committed trace, diff of two
specs) is run from the repository root,
and its output compared with the quoted lines (paths shown relative to the root). A block that
runs a job or writes files is not run: the tests of that command check what it prints. A quoted
line may end with ``...`` to stand for the rest of the line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# a ```console block, or a plain ``` one that starts with a command (docs/conformance.md's)
BLOCK = re.compile(r"^```(?:console)?\n\$ (.*?)\n(.*?)^```\n", re.S | re.M)
RUN = re.compile(r"^fsm-agent (check|demo|diff |replay tests/)")


def excerpts() -> list[tuple[str, str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            command, shown = m.group(1), m.group(2)
            # a spec file the reader writes first (my_policy.yaml) is not in the repository
            files = [w for w in shlex.split(command, comments=True)
                     if w.endswith(".yaml") and "*" not in w]
            if RUN.match(command) and "\n$ " not in "\n" + shown \
                    and all((ROOT / f).is_file() for f in files):
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{doc.relative_to(ROOT)}:{line}", command, shown))
    return found


EXCERPTS = excerpts()


def test_the_docs_quote_commands_that_are_checked() -> None:
    assert len(EXCERPTS) >= 4, EXCERPTS


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "command", "shown"), EXCERPTS,
                         ids=[where for where, _, _ in EXCERPTS])
def test_quoted_output_is_current(where: str, command: str, shown: str) -> None:
    words = shlex.split(command, comments=True)
    argv = [w2 for w in words[1:] for w2 in (sorted(str(p.relative_to(ROOT)) for p in
            ROOT.glob(w)) if "*" in w else [w])]
    res = subprocess.run([sys.executable, "-m", "fsm_agent", *argv], cwd=ROOT,
                         capture_output=True, text=True, timeout=100)
    # paths as from the repository root, where the quoted commands run
    got = (res.stdout + res.stderr).replace(f"{ROOT}/", "").rstrip("\n").splitlines()
    want = shown.rstrip("\n").splitlines()
    assert len(got) == len(want), (where, "\n".join(got))
    for g, w in zip(got, want, strict=True):
        if w.endswith("..."):
            assert g.startswith(w[:-3]), (where, g, w)
        else:
            assert g == w, (where, "\n".join(got))


def test_the_readme_diagram_is_the_committed_one() -> None:
    """The README draws the default preset inline; ``diagrams/torchelastic.mmd`` is generated from
    the spec (and checked for staleness by tests/diag), the README's copy must be that file."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^```mermaid\n(.*?)^```\n", text, re.S | re.M)
    assert m, "no Mermaid diagram in README.md"
    assert m.group(1) == (ROOT / "diagrams" / "torchelastic.mmd").read_text()
