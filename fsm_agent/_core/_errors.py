"""Exceptions raised by fsm_agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "ActionError",
    "LifecycleError",
    "Problem",
    "SpecError",
    "TriggerInterrupt",
    "WorkerGroupFailureException",
]


@attrs.frozen
class Problem:
    """One thing wrong with a spec: where it is and what is wrong."""

    path: str
    line: int | None
    element: str
    message: str

    def __str__(self) -> str:
        path, element, message = (_printable(x) for x in (self.path, self.element, self.message))
        where = path if self.line is None else f"{path}:{self.line}"
        element = f" {element}:" if element else ""
        return f"{where}:{element} {message}"


def _printable(text: str) -> str:
    # A key or file name from hostile input may hold control or invisible characters (a BOM,
    # a newline): escaped, so that a problem stays one readable line.
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SpecError(ValueError):
    """A lifecycle spec is invalid. ``problems`` lists every finding, each with file and line."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, path: str, line: int | None, element: str, message: str) -> SpecError:
        """Build an error with one problem."""
        return cls([Problem(path, line, element, message)])


class LifecycleError(RuntimeError):
    """The lifecycle was used in a way its spec does not allow (e.g. observed after finishing)."""


class ActionError(LifecycleError):
    """An action or guard raised; the machine moved to UNKNOWN. The original is ``__cause__``."""

    def __init__(self, message: str, *, action: str, trigger: str, source: str, dest: str) -> None:
        super().__init__(message)
        self.action = action
        self.trigger = trigger
        self.source = source
        self.dest = dest


class TriggerInterrupt(Exception):
    """Raised by a driver method that waits (a rendezvous) to end its action early.

    The engine does not treat it as an action fault: the transition in progress is abandoned
    where it stands (its remaining actions do not run) and the machine takes ``trigger`` (one of
    the spec's own triggers) from its current state instead. A state without a transition on
    ``trigger`` makes it an ordinary action fault (UNKNOWN). Raise it only from actions that run
    before the state change (a transition's ``actions``), where the machine is still in the
    source state: an entry action of a final state cannot be redirected.
    """

    def __init__(self, trigger: str, reason: str = "") -> None:
        super().__init__(f"{trigger}: {reason}" if reason else trigger)
        self.trigger = trigger
        self.reason = reason


class WorkerGroupFailureException(Exception):
    """The worker group failed and no restarts are left (the ``torchelastic`` preset raises it).

    ``failures`` maps a worker's global rank to its failure (torch's ``ProcessFailure``), as the
    seed's ``WorkerGroupFailureException(msg, monitor_result.exceptions)`` kept them.
    """

    def __init__(self, msg: str, failures: Mapping[int, Any] | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.failures: dict[int, Any] = dict(failures or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.msg, self.failures))
