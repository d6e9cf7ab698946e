"""Deliberately wrong supervisors of the ``resilient`` behaviour: the kit must reject each one.

Each is ``fsm_agent.Lifecycle`` with one thing wrong, the way a team writing its own restart
policy (or its own spec) gets it wrong: a copy of ``specs/resilient.yaml`` with one edit (the
engine then runs the wrong policy faithfully), or a factory that hands the lifecycle one wrong
value. The unmutated copy and ``good_resilient`` are accepted (tests/conformance/test_kit.py),
so what the kit catches is the edit.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fsm_agent import Lifecycle, load_spec

SPECS = Path(__file__).resolve().parents[2] / "specs"

def _without_backoff_state(text: str) -> str:
    """The BACKOFF state and every transition out of it removed."""
    state = re.compile(r"^  BACKOFF:\n(?:    .*\n)+", re.M)
    out_of_it = re.compile(r"^  - trigger: \w+\n    source: BACKOFF\n(?:    .*\n)*\n?", re.M)
    assert len(state.findall(text)) == 1 and out_of_it.findall(text), "resilient.yaml changed"
    text = re.sub(r"^(    source: \[.*), BACKOFF\]$", r"\1]", text, flags=re.M)  # job_failed's
    return out_of_it.sub("", state.sub("", text))


#: name -> (what the edit does, then each edit) of specs/resilient.yaml: (text replaced,
#: replacement), or a function of the text.
SPEC_EDITS: dict[str, tuple[Any, ...]] = {
    "NoBackoff": (
        "restarts a failed group at once, as torchrun (no backoff state)",
        lambda text: text.replace("      then: restart_after_backoff\n", "      then: restart\n"),
        _without_backoff_state,
    ),
    "BackoffNotCapped": (
        "the backoff grows without backoff_max",
        ("        max: backoff_max\n", "        max: inf\n"),
    ),
    "RetriesNoRetryCodes": (
        "no rule for no_retry_exit_codes: every failure is retried",
        ("    - name: no_retry\n      when: no_retry_exit\n      then: give_up_no_requeue\n"
         "      description: Retrying cannot help; tell the scheduler not to requeue.\n",
         ""),
    ),
    "CountsMembershipRestarts": (
        "a restart for nodes waiting to join counts against max_restarts",
        ("    guards: [nodes_waiting]\n    unless: [peer_lost]\n    actions: [stop_workers]\n",
         "    guards: [nodes_waiting]\n    unless: [peer_lost]\n"
         "    actions: [consume_restart, stop_workers]\n"),
    ),
    "IgnoresLostNodeWhileHealthy": (
        "a node lost while the workers run is not acted on until they fail",
        ("    dest: STOPPED\n    guards: [peer_lost, has_node_replacements_restarts_left]\n"
         "    actions: [consume_node_replacements_restart, stop_workers]\n",
         "    dest: HEALTHY\n    guards: [peer_lost, has_node_replacements_restarts_left]\n"),
    ),
    "BackoffNeverReset": (
        "the backoff never goes back to backoff_initial after a long healthy run",
        ("        reset_after: backoff_reset\n", ""),
    ),
    "ForgetsTheNoRequeueCode": (
        "gives up on a no-retry code, but with the plain exit code",
        ("      when: no_retry_exit\n      then: give_up_no_requeue\n",
         "      when: no_retry_exit\n      then: give_up\n"),
    ),
    "InfraSpendsUserBudget": (
        "an infrastructure failure spends the user's max_restarts (no budget of its own)",
        ("      budget: infra\n", ""),
    ),
    "BarrierOnGivingUp": (
        "waits at the exit barrier before giving up, as the seed does",
        ("  FAILED:\n    final: true\n",
         "  FAILED:\n    final: true\n    enter: [exit_barrier]\n"),
    ),
}


def edited_spec(tmp_dir: Path, name: str) -> Path:
    """specs/resilient.yaml with the edit ``name`` (a spec the engine loads and runs)."""
    text = (SPECS / "resilient.yaml").read_text()
    for edit in SPEC_EDITS[name][1:]:
        if callable(edit):
            text = edit(text)
            continue
        old, new = edit
        assert text.count(old) == 1, f"resilient.yaml changed shape; update the mutant {name}"
        text = text.replace(old, new)
    out = tmp_dir / f"resilient_{name}.yaml"
    out.write_text(text)
    load_spec(out)  # the mutant is a valid spec: the kit, not the checker, must find it
    return out


def spec_factory(path: Path) -> Callable[..., Lifecycle]:
    """A supervisor factory running the spec at ``path``."""
    spec = load_spec(path)

    def factory(driver: Any, **settings: Any) -> Lifecycle:
        return Lifecycle(spec, driver, **settings)

    factory.__name__ = factory.__qualname__ = path.stem
    return factory


def good_resilient(driver: Any, **settings: Any) -> Lifecycle:
    """What a correct embedding looks like: the preset, the driver, everything the kit passes."""
    return Lifecycle("resilient", driver, **settings)


# A restart exactly restart_window ago is outside the window. Times in the kit's scripts are
# exact binary fractions far coarser than this, so adding it moves only that edge.
_EDGE = 2.0**-20


def window_off_by_one(driver: Any, *, params: Mapping[str, Any] | None = None,
                      **settings: Any) -> Lifecycle:
    """Counts a restart made exactly restart_window ago as still inside the window (<= for <)."""
    values = dict(params or {})
    window = float(values.get("restart_window", math.inf))
    if window < math.inf:
        values["restart_window"] = window + _EDGE
    return Lifecycle("resilient", driver, params=values, **settings)


def reset_off_by_one(driver: Any, *, params: Mapping[str, Any] | None = None,
                     **settings: Any) -> Lifecycle:
    """Resets the backoff only after an attempt longer than backoff_reset (> for >=)."""
    values = dict(params or {})
    values["backoff_reset"] = float(values.get("backoff_reset", 600.0)) + _EDGE
    return Lifecycle("resilient", driver, params=values, **settings)


class _Doubled(random.Random):
    """Draws twice as far from the middle as the source it wraps."""

    def __init__(self, inner: random.Random) -> None:
        super().__init__(0)
        self._inner = inner

    def random(self) -> float:
        return 2.0 * self._inner.random() - 0.5


def jitter_outside_its_fraction(driver: Any, *, rng: random.Random | None = None,
                                **settings: Any) -> Lifecycle:
    """Jitters each backoff by up to twice backoff_jitter."""
    return Lifecycle("resilient", driver, rng=_Doubled(rng or random.Random()), **settings)


def ignores_no_retry_codes(driver: Any, *, params: Mapping[str, Any] | None = None,
                           **settings: Any) -> Lifecycle:
    """Does not pass no_retry_exit_codes on (the setting is lost on the way)."""
    values = {k: v for k, v in (params or {}).items() if k != "no_retry_exit_codes"}
    return Lifecycle("resilient", driver, params=values, **settings)


WRAPPER_MUTANTS: tuple[Callable[..., Lifecycle], ...] = (
    window_off_by_one,
    reset_off_by_one,
    jitter_outside_its_fraction,
    ignores_no_retry_codes,
)
