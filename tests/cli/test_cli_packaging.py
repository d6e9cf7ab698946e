"""The wheel and the sdist carry the licence and the specs; an installed wheel works outside the
repository; the metadata's URLs and version agree with the repository."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import fsm_agent

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    code = ("import sys\nfrom hatchling.build import build_sdist, build_wheel\n"
            "print(build_wheel(sys.argv[1]))\nprint(build_sdist(sys.argv[1]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    wheel, sdist = proc.stdout.split()
    return out / wheel, out / sdist


def test_wheel_carries_licence_specs_and_metadata(dists: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(dists[0]) as whl:
        names = set(whl.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        assert whl.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        meta = email.message_from_bytes(whl.read(f"{info}/METADATA"))
    assert {"fsm_agent/py.typed", "fsm_agent/specs/torchelastic.yaml",
            "fsm_agent/specs/torchrun.yaml", "fsm_agent/cli/__init__.py"} <= names
    assert not any(n.startswith("tests/") for n in names)
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta["Version"] == fsm_agent.__version__
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == PYPROJECT["project"]["urls"]


def test_sdist_carries_licence_and_changelog(dists: tuple[Path, Path]) -> None:
    with tarfile.open(dists[1]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        licence = sdist.extractfile(f"{top}/LICENSE")
        assert licence is not None and licence.read() == (ROOT / "LICENSE").read_bytes()
        assert f"{top}/CHANGELOG.md" in sdist.getnames()


def test_installed_wheel_works_outside_the_repository(dists: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(target), str(dists[0])], check=True, timeout=120,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = tmp_path / "elsewhere"
    where.mkdir()

    def fsm(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fsm_agent", *argv], cwd=where, env=env,
                              capture_output=True, text=True, timeout=60)

    probe = subprocess.run([sys.executable, "-c", "import fsm_agent; print(fsm_agent.__file__)"],
                           cwd=where, env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.startswith(str(target)), probe.stdout  # not the editable checkout
    check = fsm("check")
    assert check.returncode == 0, check.stderr
    assert str(target / "fsm_agent" / "specs" / "torchelastic.yaml") in check.stdout
    assert fsm("--version").stdout.strip() == f"fsm-agent {fsm_agent.__version__}"


def test_changelog_and_urls() -> None:
    urls = PYPROJECT["project"]["urls"]
    assert {"Homepage", "Documentation", "Issues", "Changelog"} <= set(urls)
    # the documentation and changelog links point into this repository's tree
    for key in ("Documentation", "Changelog"):
        rel = urls[key].split("/main/", 1)[1]
        assert (ROOT / rel).exists(), urls[key]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert f"## [{fsm_agent.__version__}]" in changelog
