"""How a trace is judged: against the reference's, and by the invariants of every lifecycle."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import attrs

from ._reference import (
    ConformanceTrace,
    Event,
    Raised,
    Returned,
)
from ._strategies import (
    RunConfig,
)


@attrs.frozen
class IntendedDivergence:
    """A difference from torch 2.13's agent that fsm_agent makes on purpose, and why."""

    name: str
    where: str
    reason: str


DIVERGENCES: tuple[IntendedDivergence, ...] = (
    IntendedDivergence(
        "give-up-reports-failed",
        "torchrun preset, giving up after an UNHEALTHY observation",
        "torch 2.13 returns the raw UNHEALTHY RunResult, which torchrun's launcher reports as a "
        "success; fsm_agent returns the same result with state FAILED. The kit accepts either.",
    ),
    IntendedDivergence(
        "action-errors-wrapped",
        "a hook (driver call) raises inside a transition's action or guard",
        "torch lets the raw exception out of _invoke_run; fsm_agent raises ActionError naming "
        "the action and the transition, with the original as __cause__. The kit compares the "
        "cause's type and message.",
    ),
    IntendedDivergence(
        "unknown-after-action-error",
        "the group state after a hook raised inside a transition",
        "torch leaves whatever state it had reached (e.g. STOPPED when the rendezvous of a "
        "restart fails); fsm_agent moves to UNKNOWN, its error state, so that a failed action "
        "never leaves the machine in a state it did not enter cleanly. The kit accepts either.",
    ),
    IntendedDivergence(
        "torchelastic-returns-runresult",
        "torchelastic preset, on success",
        "the seed's _invoke_run returns the bare ret_vals dict (its old API); fsm_agent returns "
        "torch's RunResult. The kit compares return values when a bare dict comes back.",
    ),
)


def _outcome_mismatch(expected: Any, actual: Any) -> str | None:
    if isinstance(expected, Returned) and isinstance(actual, Returned):
        if actual.state is None:  # a bare dict of return values (the seed's API)
            ok = expected.state == "SUCCEEDED" and actual.return_values == expected.return_values
        else:
            states = {expected.state, expected.gave_up_after} - {None}
            ok = (actual.state in states and actual.return_values == expected.return_values
                  and actual.failures == expected.failures)
        return None if ok else "outcome"
    if isinstance(expected, Raised) and isinstance(actual, Raised):
        same = ((expected.type_name, expected.message, expected.exit_code)
                == (actual.type_name, actual.message, actual.exit_code))
        return None if same else "outcome"
    return None if type(expected) is type(actual) else "outcome"


def _same_call(a: Event, b: Event) -> bool:
    """Equal calls; two waits are the same to within float rounding (a supervisor may compute
    the rest of a backoff as deadline - now)."""
    if a == b:
        return True
    return (a[0] == b[0] == "sleep" and len(a) == len(b) == 2
            and isinstance(a[1], (int, float)) and isinstance(b[1], (int, float))
            and math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-9))


def same_calls(expected: Sequence[Event], actual: Sequence[Event]) -> bool:
    """Whether two runs made the same calls (waits compared to within float rounding)."""
    return len(expected) == len(actual) and all(
        _same_call(a, b) for a, b in zip(expected, actual, strict=True))


def compare_traces(expected: ConformanceTrace, actual: ConformanceTrace) -> list[str]:
    """What differs between a reference trace and a supervisor's, after intended divergences."""
    problems = []
    if expected.events != actual.events and not same_calls(expected.events, actual.events):
        problems.append("calls")
    if _outcome_mismatch(expected.outcome, actual.outcome):
        problems.append("outcome")
    if actual.state is not None and expected.state is not None and actual.state != expected.state:
        # unknown-after-action-error: after a hook raised, torch's agent stays wherever it got
        # to and the engine moves to UNKNOWN; either side may be the reference (a spec file's
        # reference is the engine).
        errored = isinstance(expected.outcome, Raised) and expected.outcome.scripted
        if not (errored and "UNKNOWN" in (actual.state, expected.state)):
            problems.append("final state")
    if (actual.remaining_restarts is not None and expected.remaining_restarts is not None
            and actual.remaining_restarts != expected.remaining_restarts):
        problems.append("remaining restarts")
    if actual.exit_code != expected.exit_code:
        problems.append("exit code")
    return problems


def trace_invariants(trace: ConformanceTrace, config: RunConfig, *,
                     windowed: bool = False) -> list[str]:
    """Invariants of the model tests that hold for every lifecycle, checked on one trace.

    ``windowed``: restarts are counted within a sliding window, so the ``remaining_restarts``
    metric may go up again as old restarts leave it.
    """
    ev = trace.events
    out = []
    started = stopped = False
    for i, e in enumerate(ev):
        if e[0] == "monitor" and (i == 0 or ev[i - 1] != ("sleep", config.monitor_interval)):
            out.append(f"call {i + 1}: monitor() not right after "
                       f"sleep({config.monitor_interval:g})")
        if e[0] == "monitor" and stopped:
            out.append(f"call {i + 1}: monitor() while the workers are stopped")
        if e[0] == "rendezvous" and i + 1 < len(ev) and ev[i + 1] != ("start_workers",):
            out.append(f"call {i + 1}: rendezvous() not followed by start_workers()")
        if e[0] == "rendezvous" and started and not stopped:
            # a backoff may wait between the stop and the restart; nothing else may
            out.append(f"call {i + 1}: restart without stop_workers() first")
        if e[0] == "stop_workers":
            stopped = True
        elif e[0] == "start_workers":
            started, stopped = True, False
        elif e[0] not in ("sleep", "rendezvous"):
            stopped = False
    barriers = [i for i, e in enumerate(ev) if e[0] == "exit_barrier"]
    if len(barriers) > 1:
        out.append(f"exit barrier entered {len(barriers)} times")
    if barriers and any(e[0] in ("monitor", "start_workers") for e in ev[barriers[0]:]):
        out.append("workers monitored or started after the exit barrier")
    suffix = ".remaining_restarts"
    left = [e[2] for e in ev if e[0] == "put_metric" and str(e[1]).endswith(suffix)]
    if any(not 0 <= n <= config.max_restarts for n in left):
        out.append(f"remaining_restarts metric outside 0..{config.max_restarts}: {left}")
    if not windowed and any(b > a for a, b in itertools.pairwise(left)):
        out.append(f"remaining_restarts went up: {left}")
    return out

