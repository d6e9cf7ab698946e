"""The pieces of progress across attempts (``fsm_agent/_core/_progress.py``) on their own: marks,
the worker's helper, the checkpoint glob's bounds. The decisions, with real jobs, are
``tests/resilient/test_progress.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent._core._progress import PROGRESS_DIR_ENV, Mark, newest_mtime, read_steps


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


class _MarkedDriver:
    """A recording driver whose progress mark is a step the test sets (``step``)."""

    def __init__(self) -> None:
        from fsm_agent.testing import RecordingDriver

        self.inner = RecordingDriver([])
        self.step: int | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def progress_mark(self) -> Mark:
        return Mark(step=self.step)


@pytest.mark.parametrize(("on_progress", "steps", "long", "expected"), [
    # attempts that advance: reset by progress however short (without it: a growing loop)
    (True, [10, 20, 30, 40], False, [1.0, 1.0, 1.0, 1.0]),
    (False, [10, 20, 30, 40], False, [1.0, 2.0, 4.0, 8.0]),
    # long attempts stuck at one step: no reset by progress (without it: reset by time)
    (True, [10, 10, 10, 10], True, [1.0, 2.0, 4.0, 8.0]),
    (False, [10, 10, 10, 10], True, [1.0, 1.0, 1.0, 1.0]),
    # no source of progress: backoff_reset's healthy time decides either way
    (True, [None] * 4, True, [1.0, 1.0, 1.0, 1.0]),
])
def test_backoff_reset_on_progress_resets_on_progress_instead_of_healthy_time(
        on_progress: bool, steps: list[int | None], long: bool, expected: list[float]) -> None:
    from fsm_agent import Lifecycle, VirtualClock
    from fsm_agent.testing import make_result

    clock, driver = VirtualClock(), _MarkedDriver()
    lc = Lifecycle("resilient", driver, max_restarts=10, clock=clock,  # type: ignore[arg-type]
                   params={"backoff_jitter": 0, "backoff_reset": "60s",
                           "no_progress_restarts": 0,
                           "backoff_reset_on_progress": on_progress})
    lc.start()
    waits = []
    for step in steps:
        clock.sleep(120.0 if long else 1.0)  # the attempt's length, against backoff_reset
        driver.step = step
        lc.observe(make_result("FAILED"))
        assert lc.state_name == "BACKOFF"
        waits.append(lc.deadline - clock.now())  # type: ignore[operator]
        clock.sleep(waits[-1])
        assert lc.poll_timer()
    assert waits == expected
