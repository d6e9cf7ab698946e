"""The model a lifecycle's machine drives, and the shapes of what acts on it.

``Context`` is what guards read and actions change; ``Kind`` is a parameterised guard or action
that a spec instantiates with arguments. Both are here, apart from the vocabulary that names
them, so that the built-in kinds (``_matchers``) and the vocabulary (``_vocabulary``) depend on
this module and not on each other.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from ._clock import Clock, SystemClock
from ._driver import HAS_JOB, JobDriver

if TYPE_CHECKING:
    from ._driver import Driver
    from ._step import Step

__all__ = ["MAX_ATTEMPTS_KEPT", "Action", "ActionDef", "Context", "Guard", "Kind", "KindExample",
           "frozen_mapping"]

_ADD_JOB_RESTART = JobDriver.add_job_restart.__name__

#: Failed attempts and restart times remembered (for the consecutive-failure and window guards).
MAX_ATTEMPTS_KEPT = 1000


def frozen_mapping(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy of ``mapping``."""
    return MappingProxyType(dict(mapping))


@attrs.define(slots=True, eq=False)
class Context:
    """The model the machine drives: what guards read and actions change.

    ``state`` is the machine's current state name (the spec's name; ``Lifecycle.state`` maps it
    to the ``WorkerState`` it reports); ``observed`` is the last monitor result (torch's
    ``RunResult``), ``None`` before the first tick. Times are on ``clock``'s scale.
    """

    driver: Driver
    role: str = "default"
    max_restarts: int = 3
    remaining_restarts: int = 3
    restart_count: int = 0
    exit_barrier_timeout: float = 300.0
    observed: Any = None
    state: str = "INIT"
    fatal_exceptions: tuple[type[BaseException], ...] = ()
    #: The spec's parameters in force (defaults merged with what the program set).
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    clock: Clock = attrs.field(factory=SystemClock, repr=False)
    rng: random.Random = attrs.field(factory=random.Random, repr=False)
    #: The budget's sliding window in seconds (inf: the whole job, as torch counts).
    window: float = math.inf
    #: Who counts failure restarts: "agent" (each agent, as torch) or "job" (the driver's
    #: job-wide ledger, when the driver has one: see ``fsm_agent._core._driver.JobDriver``).
    budget_scope: str = "agent"
    #: When each failure restart was consumed (for windows), most recent last.
    restart_times: list[float] = attrs.field(factory=list, repr=False)
    #: The spec's named budgets (``fsm_agent._core._budgets``): name -> (max, window seconds), and
    #: when each of their restarts was consumed / how many were (counted by this lifecycle;
    #: a job budget's counts are the driver's).
    budget_limits: Mapping[str, tuple[float, float]] = attrs.field(factory=dict, repr=False)
    budget_times: dict[str, list[float]] = attrs.field(factory=dict, repr=False)
    budget_counts: dict[str, int] = attrs.field(factory=dict, repr=False)
    #: When the workers were last started; None before the first start.
    attempt_started: float | None = None
    #: How long each attempt that ended in a failure had run, most recent last.
    failed_attempts: list[float] = attrs.field(factory=list, repr=False)
    #: Entries into each backoff state since its last reset.
    backoff: dict[str, int] = attrs.field(factory=dict, repr=False)
    #: When the current state's timer fires (clock time), None if it has none.
    deadline: float | None = None
    #: Set by :meth:`withdraw_restarts`: no restart is left, whatever a window gives back.
    restarts_withdrawn: bool = False
    #: The exit code the job should end with if it fails (``set_exit_code``); None: the default.
    exit_code: int | None = None
    #: Starts of the workers so far, where training stood at the last one (a
    #: ``fsm_agent._core._progress.Mark``, None without a progress source), and the restarts in a
    #: row whose attempt failed without progress.
    attempts: int = 0
    progress_start: Any = attrs.field(default=None, repr=False)
    stalled_restarts: int = 0
    #: The failures of this node's own workers so far (``count_own_failure``), each in a few
    #: words, oldest first: what quarantine counts (``fsm_agent._core._quarantine``).
    own_failures: list[str] = attrs.field(factory=list, repr=False)
    #: Whether the attempt that failed last made progress (None: unknown, or none failed yet).
    progressed: bool | None = None
    #: The lifecycle's guards by name, bound to its parameters (combinators evaluate through it).
    guard_fns: Mapping[str, Guard] = attrs.field(factory=dict, repr=False)
    # Guard values of the current step: a guard is evaluated at most once per step, because some
    # guards ask the driver (num_nodes_waiting) and torch asks once per tick.
    memo: dict[str, bool] = attrs.field(factory=dict, repr=False)
    # The step being recorded for listeners; None when nobody listens, so untraced runs pay nothing.
    step: Step | None = attrs.field(default=None, repr=False)

    def check(self, name: str) -> bool:
        """The value of guard ``name`` in this step (evaluated once, then remembered)."""
        memo = self.memo
        if name in memo:
            return memo[name]
        value = memo[name] = bool(self.guard_fns[name](self))
        return value

    def job_driver(self) -> Any:
        """The driver, if the budget is the job's and the driver keeps a job-wide count."""
        if self.budget_scope != "job":
            return None
        driver = self.driver
        # every tick comes through here (refresh_budget): a getattr, not a call of capability()
        if not callable(getattr(driver, _ADD_JOB_RESTART, None)):
            return None
        return driver if getattr(driver, HAS_JOB, True) else None

    def refresh_budget(self) -> None:
        """Recount ``remaining_restarts`` for a sliding window or a job-wide budget (a no-op for
        an agent's budget over the whole job)."""
        if self.window == math.inf and self.budget_scope != "job":
            return  # torch's count: nothing to recount (every tick comes through here)
        if self.restarts_withdrawn:
            self.remaining_restarts = 0
            return
        job = self.job_driver()
        if job is not None:
            used = int(job.job_restart_count(self.window))
            self.remaining_restarts = max(0, self.max_restarts - used)
            return
        if self.window == math.inf:
            return
        horizon = self.clock.now() - self.window
        inside = sum(1 for t in self.restart_times if t > horizon)
        self.remaining_restarts = max(0, self.max_restarts - inside)

    def withdraw_restarts(self) -> None:
        """No restart is left for this agent from now on (torch's agent does this when a worker
        is stuck in uninterruptible sleep: a fresh worker would conflict with it), even where
        a sliding window or the job's ledger would give restarts back."""
        self.restarts_withdrawn = True
        self.remaining_restarts = 0

    def note_failure(self) -> None:
        """Remember how long the attempt that just failed had run."""
        if self.attempt_started is not None:
            self.failed_attempts.append(self.clock.now() - self.attempt_started)
            del self.failed_attempts[:-MAX_ATTEMPTS_KEPT]


Guard = Callable[[Context], bool]
Action = Callable[[Context], None]


@attrs.frozen
class ActionDef:
    """An action and whether it is *terminal*: its exception is the spec's outcome, not a fault."""

    fn: Action
    terminal: bool = False


def _name_set(names: Iterable[str]) -> frozenset[str]:
    return frozenset(names)


def _frozen_records(records: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(frozen_mapping(r) for r in records)


@attrs.frozen
class KindExample:
    """One case of a guard kind, as data: the spec's argument, what the guard sees, its answer.

    ``args`` is what a spec writes after the kind (``[3]``, ``{codes: [3], ranks: any}``,
    ``"30s"``); an argument in the kind's ``user_only`` is given through a spec parameter, as a
    user would. What the guard sees: ``failures``, the observed failed ranks (the attributes of
    torch's ``ProcessFailure``: ``exitcode``, and ``message`` for the error file's text; none: a
    healthy observation); ``context``, fields of the ``Context`` (``attempt_started``,
    ``restart_times``, ...); ``now``, the clock's time; ``guards``, the values of other guards the
    argument names (for combinators); ``driver``, attributes of the driver (``has_job``);
    ``spec``, sections the spec needs besides the guard (a ``budgets`` block).
    ``expect`` is the guard's value. ``tests/test_kinds.py`` runs every example of every
    built-in kind through a spec and a lifecycle.
    """

    args: Any
    expect: bool
    failures: tuple[Mapping[str, Any], ...] = attrs.field(default=(), converter=_frozen_records)
    context: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    now: float = 0.0
    guards: Mapping[str, bool] = attrs.field(factory=dict, converter=frozen_mapping)
    driver: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    spec: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)


def _examples(examples: Iterable[KindExample]) -> tuple[KindExample, ...]:
    return tuple(examples)


@attrs.frozen
class Kind:
    """A parameterised guard or action: typed arguments, and a factory that builds it from them.

    ``args`` maps each argument to its type (a parameter type such as ``duration`` or
    ``int_list``, or ``guard``/``guard_list`` for combinators); ``positional`` is the argument
    a bare value fills (``{exit_code_in: [3]}``); ``factory(**args)`` returns the guard or
    action, and may raise ``ValueError`` for a value it cannot use (the spec check reports it).
    ``implies(mine, earlier)``: whether a guard of this kind with the arguments ``mine`` holding
    means one with ``earlier`` holds too, so that a failure-policy rule after the earlier one can
    never match (``fsm-agent check`` reports it); None when that is never known.
    ``user_only`` names the arguments a spec file may not set: a command to run, a host to probe.
    A spec is data someone may hand you, so there it can only name a parameter whose default is
    empty; the value comes from the user who runs the job (``--spec-param``) or from Python code
    the user registers (a vocabulary).
    ``description`` is the kind's row in docs/spec-format.md (for a guard: when it holds), and
    ``examples`` are cases it must get right (``KindExample``); a built-in guard kind has them,
    or says in ``untested`` why its inputs cannot be written down as data.
    """

    factory: Callable[..., Callable[[Context], Any]]
    args: Mapping[str, str] = attrs.field(converter=frozen_mapping)
    positional: str | None = None
    defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    choices: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=frozen_mapping)
    terminal: bool = False
    description: str = ""
    user_only: frozenset[str] = attrs.field(default=frozenset(), converter=_name_set)
    implies: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None
    examples: tuple[KindExample, ...] = attrs.field(default=(), converter=_examples)
    untested: str = ""

    def instantiate(self, args: Mapping[str, Any], values: Mapping[str, Any]) -> Callable[..., Any]:
        """The guard or action for ``args`` (values, or ``Ref``s resolved against ``values``)."""
        resolved = dict(self.defaults)
        for name, arg in args.items():
            resolve = getattr(arg, "resolve", None)
            resolved[name] = resolve(values) if resolve is not None else arg
        return self.factory(**resolved)
