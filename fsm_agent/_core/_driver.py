"""The driver interface: everything the lifecycle does to the outside world goes through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult

__all__ = [
    "HAS_JOB",
    "DrainDriver",
    "Driver",
    "HealthDriver",
    "JobDriver",
    "JobMembership",
    "PeerDriver",
    "ProgressDriver",
    "QuarantineDriver",
    "StackDriver",
    "capability",
    "members",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@runtime_checkable
class Driver(Protocol):
    """What a lifecycle needs from the supervisor that embeds it.

    The torch agent's driver calls ``SimpleElasticAgent``'s own hooks; ``fsm_agent.testing
    .RecordingDriver`` scripts results and records calls. ``monitor()`` returns torch's
    ``RunResult``.
    """

    def rendezvous(self) -> None:
        """Join the next rendezvous round (assigns ranks and world size)."""

    def start_workers(self) -> None:
        """Start the local worker group."""

    def stop_workers(self) -> None:
        """Stop every local worker, whatever its state."""

    def monitor(self) -> RunResult:
        """Check on the workers; the result's ``state`` is the observed ``WorkerState``."""
        ...

    def num_nodes_waiting(self) -> int:
        """How many nodes wait to join the next rendezvous round."""
        ...

    def exit_barrier(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every agent of the group to finish."""

    def put_metric(self, name: str, value: int) -> None:
        """Publish one metric (torch's ``put_metric`` in the torch driver)."""


@runtime_checkable
class JobDriver(Protocol):
    """Optional driver methods for a job of several agents (``fsm_agent.torch``'s driver has them).

    With them, a spec whose budget is ``job`` counts failure restarts once for the whole job
    (``has_restarts_left``, ``consume_restart`` and ``remaining_restarts`` read the job's count),
    and ``announce_failure`` tells every other agent that this one gives up. A driver without
    them is a job of one agent: the budget is counted by the lifecycle, the announcement is
    skipped. ``window`` is the budget's sliding window in seconds (``inf``: the whole job);
    ``budget`` names a spec's named budget (``fsm_agent._core._budgets``; "" the default one). It is
    passed only for a named budget, so a driver for specs without them may leave it out.
    ``has_job`` (optional, default True: :class:`JobMembership`) says whether the driver is in a
    job of several agents right now; when False the lifecycle counts by itself. Quarantine
    (``fsm_agent._core._quarantine``) reads it the other way: only a driver that says True is in a
    job where another node could take this one's slot; and it counts a failure as the node's own
    only when the driver's optional ``failed_first()`` (default True: :class:`QuarantineDriver`)
    says this node's failure of the round reached the job first (the torch driver: a
    ``compare_set`` on the job's store). The lifecycle asks for ``add_job_restart`` (a job
    driver) and ``announce_failure`` one at a time, as for the capabilities below.
    """

    def job_restart_count(self, window: float, budget: str = "") -> int:
        """Failure restarts the job has counted against ``budget`` (within ``window``)."""
        ...

    def job_restarts_left(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Restarts of ``budget`` left for a failure of the current round (at least 1 when
        another agent has already counted that round's failure)."""
        ...

    def add_job_restart(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Count the current round's failure restart once for the job, against ``budget``;
        that budget's count after it. Raises ``TriggerInterrupt`` (``job_failed``) when the
        budget was spent meanwhile."""
        ...

    def announce_failure(self, exit_code: int, reason: str) -> None:
        """Tell every agent of the job that it failed (the first announcement wins)."""


# -- optional capabilities ------------------------------------------------------------------------
#
# Each Protocol below groups the optional methods of one feature. The lifecycle asks for them one
# method at a time, with ``capability(driver, PeerDriver.lost_peers)``: a driver may have any of a
# group's methods and not the others (a test sets one on a RecordingDriver instance), and one it
# lacks keeps the lifecycle's default for that method alone, as the docstrings say. Their values
# are typed Any where the type lives in a higher layer (``Preemption``, ``CheckResult``, ``Mark``:
# this module is the base the feature modules build on); the lifecycle checks what it gets.


@runtime_checkable
class PeerDriver(Protocol):
    """Node loss (``fsm_agent._core._peers``, the built-in guard ``peer_lost``). Without it the
    driver never reports a loss and ``peer_lost`` is always false."""

    def lost_peers(self) -> tuple[str, ...]:
        """The nodes of the current round known to be lost (empty: none is)."""
        ...


@runtime_checkable
class HealthDriver(Protocol):
    """Node health checks (``fsm_agent._core._health``). Without ``check_health`` a check runs here,
    without the rendezvous store's address; without ``health_reason`` ``leave_job`` says "a node
    health check failed"."""

    def check_health(self, check: Any) -> Any:
        """Run ``check`` (a ``fsm_agent._core._health.HealthCheck``) and return its ``CheckResult``
        (the torch driver fills in the rendezvous store's address and the slate hook)."""
        ...

    def health_reason(self) -> str | None:
        """Why the last health check that failed did (None: none failed)."""
        ...


@runtime_checkable
class JobMembership(Protocol):
    """``has_job``: whether the driver is in a job of several agents right now (read as
    ``getattr(driver, HAS_JOB, default)``). The job-wide budget assumes True when it is missing
    (any ``JobDriver`` is a job), quarantine assumes False (an agent alone has nobody to take
    its slot)."""

    has_job: bool


#: :class:`JobMembership`'s attribute (an attribute, not a method: ``capability`` cannot name it).
HAS_JOB = "has_job"


@runtime_checkable
class QuarantineDriver(Protocol):
    """Quarantine (``fsm_agent._core._quarantine``). Without ``failed_first`` every failure is this
    node's own; without ``quarantine`` the node leaves without a mark."""

    def failed_first(self) -> bool:
        """Whether this node's failure is the first of its round in the job."""
        ...

    def quarantine(self, reason: str) -> None:
        """Mark this node quarantined, so that later rounds of the job refuse it."""


@runtime_checkable
class StackDriver(Protocol):
    """The ``capture_stacks`` action. Without it the action logs a warning and does nothing."""

    def capture_stacks(self) -> None:
        """Dump every worker's Python stacks (before they are stopped)."""


@runtime_checkable
class DrainDriver(Protocol):
    """Preemption and drains (``fsm_agent._core._drain``). Without ``preemption`` the reason is
    "preempted" and the signal unknown; without ``announce_preemption`` this agent's exit code
    stands; without ``drain_workers`` the action logs a warning (the workers are stopped when the
    drain's time is up); without ``kill_workers`` ``stop_workers`` ends them."""

    def preemption(self) -> Any:
        """The preemption under way, a ``fsm_agent.Preemption`` (anything else: none known)."""
        ...

    def announce_preemption(self, exit_code: int, reason: str) -> int | None:
        """Tell every agent of the job; the exit code that won (None: ``exit_code``)."""
        ...

    def drain_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker: the drain begins."""

    def kill_workers(self) -> None:
        """Kill what is left of the workers at once."""


@runtime_checkable
class ProgressDriver(Protocol):
    """Progress between restarts (``fsm_agent._core._progress``). Without ``progress_mark`` no
    attempt is judged; without ``note_progress`` the verdict is not reported."""

    def progress_mark(self) -> Any:
        """Where training stands now, a ``fsm_agent._core._progress.Mark`` (anything else: no
        source)."""
        ...

    def note_progress(self, verdict: dict[str, Any]) -> None:
        """The verdict on the attempt that just failed (for the trace)."""


def capability(driver: object,
               method: Callable[Concatenate[Any, _P], _R]) -> Callable[_P, _R] | None:
    """The driver's ``method`` (a method of one of the capability Protocols, named through it:
    ``capability(driver, PeerDriver.lost_peers)``), or None when the driver has none. The torch
    agent's optional hooks are asked for the same way (``fsm_agent.torch._hooks``).

    Found as ``getattr`` finds it, at every call: a method set on the instance counts, and one
    set to None is missing. (An ``isinstance`` check against the Protocol would look at every
    member of it, and would refuse a driver that has only some of a feature's methods.) The
    lookups of every monitor tick (``lost_peers``, ``add_job_restart``) cannot pay for this
    call: they ``getattr`` the name taken once from the Protocol (``PeerDriver.lost_peers
    .__name__``).
    """
    found: Callable[_P, _R] | None = getattr(driver, method.__name__, None)
    return found


def members(protocol: type) -> tuple[str, ...]:
    """The members a Protocol declares in its own body (annotated attributes, then methods, in
    the order written; not the dunders ``typing`` adds)."""
    names = [*vars(protocol).get("__annotations__", {}),
             *(n for n, v in vars(protocol).items() if callable(v))]
    return tuple(dict.fromkeys(n for n in names if not n.startswith("__")))
