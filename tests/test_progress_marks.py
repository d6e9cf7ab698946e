"""The pieces of progress across attempts (``fsm_agent/_progress.py``) on their own: marks,
the worker's helper, the checkpoint glob's bounds. The decisions, with real jobs, are
``tests/resilient/test_progress.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent._progress import PROGRESS_DIR_ENV, Mark, newest_mtime, read_steps


@pytest.mark.parametrize(("before", "after", "moved"), [
    (Mark(), Mark(), None),                      # no source: unknown, never a stall
    (Mark(), Mark(step=1), True),
    (Mark(step=5), Mark(step=5), False),
    (Mark(step=5), Mark(step=4), False),         # resumed from an older checkpoint
    (Mark(checkpoint=10.0), Mark(checkpoint=10.0), False),
    (Mark(step=5, checkpoint=10.0), Mark(step=5, checkpoint=11.0), True),
])
def test_a_mark_is_beyond_another_when_either_source_advanced(
        before: Mark, after: Mark, moved: bool | None) -> None:
    assert after.beyond(before) is moved


def test_the_workers_helper_writes_one_file_per_local_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_DIR_ENV, raising=False)
    fsm_agent.progress(7)  # outside an agent: nothing, no error
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(PROGRESS_DIR_ENV, str(tmp_path))
    for rank, step in (("0", 12), ("1", 9), ("0", 13)):
        monkeypatch.setenv("LOCAL_RANK", rank)
        fsm_agent.progress(step)
    (tmp_path / "rank2").write_text("not a number")
    assert read_steps(str(tmp_path)) == {"rank0": 13, "rank1": 9}


def test_the_newest_checkpoint_is_found_through_a_glob_and_below_directories(
        tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "model.pt").write_text("a")
    os.utime(tmp_path / "step_1" / "model.pt", (100, 100))
    (tmp_path / "step_2.pt").write_text("b")
    os.utime(tmp_path / "step_2.pt", (200, 200))
    assert newest_mtime(str(tmp_path / "step_*")) == 200
    assert newest_mtime(str(tmp_path / "step_1")) == 100
    assert newest_mtime(str(tmp_path / "nothing_*")) is None
    assert newest_mtime("") is None
    # a huge tree is searched only so far
    for i in range(30):
        (tmp_path / f"f{i}").write_text("c")
    assert newest_mtime(str(tmp_path / "f*"), max_files=5) is not None
