"""Deliberately wrong supervisors of the ``resilient`` preset's drain and no-progress rule
(docs/spec-format.md, "Preemption" and "Progress"): the kit must reject each one.

As in ``resilient_mutants.py``: copies of ``specs/resilient.yaml`` with one edit (the engine runs
the wrong policy faithfully), and factories that wrap ``fsm_agent.Lifecycle`` the way an
embedding program gets it wrong. Each changes what the supervisor does on some script; the
unwrapped preset is accepted (tests/conformance/test_resilient.py), so what the kit catches is
the change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fsm_agent import Lifecycle, Preempted, load_spec

from .resilient_mutants import SPECS, spec_factory

#: name -> (what the edit does, then each (text replaced, replacement)) of specs/resilient.yaml.
SPEC_EDITS: dict[str, tuple[Any, ...]] = {
    "DrainedIsSuccess": (
        "a drain whose workers all exited ends SUCCEEDED (the exit barrier, exit 0), not "
        "PREEMPTED",
        ("  - trigger: drained\n    source: DRAINING\n    dest: PREEMPTED\n",
         "  - trigger: drained\n    source: DRAINING\n    dest: SUCCEEDED\n"),
    ),
    "PreemptionSpendsUserBudget": (
        "a preemption spends one of the user's max_restarts (the scheduler requeues the job: it "
        "was no failure)",
        ("  - trigger: preempted\n    source: [INIT, HEALTHY, STOPPED, BACKOFF]\n"
         "    dest: DRAINING\n",
         "  - trigger: preempted\n    source: [INIT, HEALTHY, STOPPED, BACKOFF]\n"
         "    dest: DRAINING\n    actions: [consume_restart]\n"),
    ),
    "IgnoresProgress": (
        "no rule for restarts without progress: a crash loop spends the whole budget",
        ("    - name: no_progress\n      when: stalled\n      then: give_up_no_requeue\n"
         "      description: Restarts make no progress; stop spending the budget and tell the "
         "scheduler not to requeue.\n", ""),
    ),
}


def edited_spec(tmp_dir: Path, name: str) -> Path:
    """specs/resilient.yaml with the edit ``name`` (a spec the engine loads and runs)."""
    text = (SPECS / "resilient.yaml").read_text()
    for old, new in SPEC_EDITS[name][1:]:
        assert text.count(old) == 1, f"resilient.yaml changed shape; update the mutant {name}"
        text = text.replace(old, new)
    out = tmp_dir / f"resilient_{name}.yaml"
    out.write_text(text)
    load_spec(out)  # the mutant is a valid spec: the kit, not the checker, must find it
    return out


def spec_mutant(tmp_dir: Path, name: str) -> Callable[..., Lifecycle]:
    """A factory running the edited spec ``name``."""
    return spec_factory(edited_spec(tmp_dir, name))


class _Embedding:
    """A program that embeds a ``Lifecycle`` and runs it through its own wait."""

    def __init__(self, lifecycle: Lifecycle, driver: Any) -> None:
        self.lifecycle = lifecycle
        self.driver = driver
        self.exit_code: int | None = None

    @property
    def state(self) -> Any:
        return self.lifecycle.state

    @property
    def remaining_restarts(self) -> int:
        return self.lifecycle.remaining_restarts

    def run(self, monitor_interval: float, sleep: Any = None) -> Any:
        self.exit_code = None
        try:
            return self.lifecycle.run(monitor_interval, sleep=sleep)
        finally:
            if self.exit_code is None:
                self.exit_code = self.lifecycle.exit_code


class _WorkersDone(Exception):
    def __init__(self, result: Any) -> None:
        super().__init__("every worker exited 0")
        self.result = result


class _JudgesTheDrain(_Embedding):
    """When the drain ends, looks at how the workers ended, as torchrun's monitor would: all
    exited 0, so the job is done."""

    def run(self, monitor_interval: float, sleep: Any = None) -> Any:
        def wait(seconds: float) -> Any:
            event = sleep(seconds)
            if event == "drained":
                result = self.driver.monitor()
                if result.state.name == "SUCCEEDED":
                    raise _WorkersDone(result)
            return event

        try:
            return super().run(monitor_interval, sleep=wait)
        except _WorkersDone as done:
            self.exit_code = 0
            return done.result


def drain_exit0_is_success(driver: Any, **settings: Any) -> _Embedding:
    """Counts a drain whose workers all exited 0 as the job's success (returns their SUCCEEDED
    result, exit 0) instead of a preemption."""
    return _JudgesTheDrain(Lifecycle("resilient", driver, **settings), driver)


class _SwallowsPreemption(_Embedding):
    def run(self, monitor_interval: float, sleep: Any = None) -> Any:
        try:
            return super().run(monitor_interval, sleep=sleep)
        except Preempted:
            self.exit_code = 0  # "the workers checkpointed and left": a clean exit
            return self.lifecycle.result


def preemption_exits_zero(driver: Any, **settings: Any) -> _Embedding:
    """Ends a drained run with its result and exit code 0, not ``Preempted`` with
    ``preempted_exit_code``."""
    return _SwallowsPreemption(Lifecycle("resilient", driver, **settings), driver)


def ignores_preempted_exit_code(driver: Any, *, params: Mapping[str, Any] | None = None,
                                **settings: Any) -> Lifecycle:
    """Does not pass ``preempted_exit_code`` on: every preemption exits 128 + the signal."""
    values = {k: v for k, v in (params or {}).items() if k != "preempted_exit_code"}
    return Lifecycle("resilient", driver, params=values, **settings)


def _no_progress_restarts(params: Mapping[str, Any] | None) -> tuple[dict[str, Any], int]:
    values = dict(params or {})
    return values, int(values.get("no_progress_restarts", 3))


def no_progress_one_early(driver: Any, *, params: Mapping[str, Any] | None = None,
                          **settings: Any) -> Lifecycle:
    """Gives up after no_progress_restarts - 1 restarts without progress (counts the first
    attempt as a restart); a count of 1 is left alone (0 would turn the rule off)."""
    values, count = _no_progress_restarts(params)
    if count > 1:
        values["no_progress_restarts"] = count - 1
    return Lifecycle("resilient", driver, params=values, **settings)


def no_progress_one_late(driver: Any, *, params: Mapping[str, Any] | None = None,
                         **settings: Any) -> Lifecycle:
    """Gives up only after no_progress_restarts + 1 restarts without progress (> for >=)."""
    values, count = _no_progress_restarts(params)
    if count > 0:
        values["no_progress_restarts"] = count + 1
    return Lifecycle("resilient", driver, params=values, **settings)


#: The drain's wrong supervisors (among them "a drain that counts as success").
DRAIN_MUTANTS: tuple[str, ...] = ("DrainedIsSuccess", "drain_exit0_is_success",
                                  "preemption_exits_zero", "ignores_preempted_exit_code",
                                  "PreemptionSpendsUserBudget")
#: The no-progress rule's ("a no-progress count off by one").
PROGRESS_MUTANTS: tuple[str, ...] = ("no_progress_one_early", "no_progress_one_late",
                                     "IgnoresProgress")


def mutant(name: str, tmp_dir: Path) -> Callable[..., Any]:
    """The wrong supervisor ``name`` (a spec edit is written under ``tmp_dir``)."""
    if name in SPEC_EDITS:
        return spec_mutant(tmp_dir, name)
    factory: Callable[..., Any] = globals()[name]
    return factory
