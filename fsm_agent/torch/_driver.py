"""``TorchDriver``: the lifecycle's driver calls, implemented by a torch ``SimpleElasticAgent``."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from torch.distributed.elastic.metrics.api import NullMetricHandler as _NullMetricHandler
from torch.distributed.elastic.metrics.api import getStream as _get_stream

from fsm_agent._core._drain import PREEMPTED_OUTCOME, Preemption
from fsm_agent._core._driver import capability
from fsm_agent._core._health import CheckResult, HealthCheck
from fsm_agent._core._job import ANY
from fsm_agent._core._peers import describe_lost
from fsm_agent._core._progress import Mark
from fsm_agent.torch._compat import enabled
from fsm_agent.torch._errorfiles import tolerant_error_files
from fsm_agent.torch._fastpath import cached_nodes_waiting
from fsm_agent.torch._hooks import (
    AgentHooks,
    DiagnosticHooks,
    PeerHooks,
    PreemptionHooks,
    SlateHooks,
    asks_peers,
)
from fsm_agent.torch._isolation import WorkerStoreIsolation

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import (
        RunResult,
        SimpleElasticAgent,
        WorkerGroup,
    )

    from fsm_agent.torch._job import AgentJob
    from fsm_agent.torch._tick import QuietTicks

__all__ = ["TorchDriver"]

logger = logging.getLogger("fsm_agent.torch")

_LOST_PEERS = PeerHooks._fsm_lost_peers.__name__


class _Counters(Protocol):
    """What the driver reads from the lifecycle it serves (``fsm_agent.Lifecycle`` has both)."""

    @property
    def remaining_restarts(self) -> int: ...

    @property
    def restart_count(self) -> int: ...


class TorchDriver:
    """Drives a torch ``SimpleElasticAgent``'s own hooks on behalf of a lifecycle.

    Every call mirrors what ``SimpleElasticAgent._invoke_run`` does at the same point, so the
    agent's ``worker_group``, ``_remaining_restarts``, events and metrics look to torch (and to
    subclasses such as DeepSpeed's or NVIDIA's agents) exactly as if torch's loop were running:

    - ``rendezvous``: ``agent._rendezvous(group)``, then a fresh worker store for the round
      (see ``fsm_agent.torch._isolation``; ``isolate_worker_store=False`` keeps torch's
      behaviour).
    - ``start_workers``: ``agent._start_workers(group)``, worker ids and START events as in
      ``_initialize_workers``; group state HEALTHY.
    - ``stop_workers``: ``agent._stop_workers(group)``.
    - ``monitor``: ``agent._monitor_workers(group)``; group state := observed state.
    - ``num_nodes_waiting``: the rendezvous handler's.
    - ``exit_barrier``: torch's store barrier (same keys, same key prefix, so torch agents and
      ours can meet at one barrier), waiting so that a signal interrupts it
      (``fsm_agent.torch._barrier``). Errors
      propagate; the lifecycle decides what they mean.
    - ``put_metric``: ``torch.distributed.elastic.metrics.put_metric``.

    Before each call into the agent the lifecycle's remaining restarts are copied into
    ``agent._remaining_restarts``; around ``_rendezvous`` and ``_start_workers`` (which derive
    the restart count from it: the rendezvous log, ``TORCHELASTIC_RESTART_COUNT``, START events)
    it holds ``max_restarts`` minus the lifecycle's restart count, which differs only under a
    budget window. :meth:`bind` gives the driver the lifecycle to read.
    """

    def __init__(
        self,
        agent: SimpleElasticAgent,
        *,
        isolate_worker_store: bool = True,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        self.agent = agent
        #: The same agent, as the hooks the driver calls on it without asking (the optional ones
        #: it asks for: ``fsm_agent.torch._hooks``).
        self.hooks: AgentHooks = agent
        self._on_started = on_started
        self.isolation: WorkerStoreIsolation | None = (
            WorkerStoreIsolation() if isolate_worker_store else None
        )
        self._counters: _Counters | None = None
        #: Set by the agent: stands in for ``_monitor_workers`` when the last look must still
        #: stand (``fsm_agent.torch._tick``); ``None``: every tick looks, as torch's loop.
        self.quiet: QuietTicks | None = None
        self._group_world_size: int | None = None  # of the last rendezvous round
        self._health: list[CheckResult] = []
        #: Set by the agent for a job of several nodes (``fsm_agent.torch._job``): the job-wide
        #: budget and the announcement; ``None``: a single agent, counting by itself.
        self.job: AgentJob | None = None

    @property
    def worker_group(self) -> WorkerGroup:
        """The agent's (single) worker group."""
        return self.agent._worker_group

    def bind(self, counters: _Counters | None) -> None:
        """Read restart counters from ``counters`` (the lifecycle) from now on; ``None`` unbinds
        (the lifecycle refers to its driver: unbinding breaks that cycle once a run is over)."""
        self._counters = counters

    def sync_counters(self) -> None:
        """Copy the lifecycle's remaining restarts into the agent (torch reads it there)."""
        if self._counters is not None:
            self.agent._remaining_restarts = self._counters.remaining_restarts

    @contextlib.contextmanager
    def _counting_restarts(self) -> Iterator[int]:
        """Around the calls in which torch derives the restart count from ``max_restarts -
        _remaining_restarts`` (``TORCHELASTIC_RESTART_COUNT``, the rendezvous log, START
        events): the agent holds ``max_restarts`` minus the failure restarts so far, so the
        workers of attempt N see N. Without a budget window that is the remaining restarts
        anyway; with one, the remaining restarts are the window's (restarts that left the
        window are given back) and the count would repeat. Yields the restart count."""
        counters = self._counters
        if counters is None:
            spec_max = self.worker_group.spec.max_restarts
            yield spec_max - self.agent._remaining_restarts
            return
        budget = counters.remaining_restarts
        count = counters.restart_count
        context = getattr(counters, "context", None)
        if self.job is not None and getattr(context, "budget_scope", None) == "job":
            # a job-wide budget: every node's workers see the job's count (a node that did not
            # fail, or joined late, too)
            count = max(count, self.job.restart_count(math.inf, ANY))
        self.agent._remaining_restarts = self.worker_group.spec.max_restarts - count
        try:
            yield count
        finally:
            self.agent._remaining_restarts = budget

    # -- Driver protocol -------------------------------------------------------------------

    def rendezvous(self) -> None:
        """Join the next round; give the round's workers their own store."""
        self.sync_counters()
        group = self.worker_group
        logger.info("[%s] Rendezvous'ing worker group", group.spec.role)
        if self.isolation is not None:
            self.isolation.before_rendezvous(group)
        with self._counting_restarts() as restart_count:
            self.agent._rendezvous(group)
        self._group_world_size = group.group_world_size
        if self.job is not None:
            from fsm_agent.torch._job import round_of

            self.job.round_id = round_of(group.spec.rdzv_handler,
                                          getattr(self.agent, "_store", None))
        if self.isolation is not None:
            self.isolation.apply(group, restart_count)

    def start_workers(self) -> None:
        """Start the local workers and record their START events, as ``_initialize_workers``."""
        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.events import EventSource, record

        self.sync_counters()
        group = self.worker_group
        logger.info("[%s] Starting worker group", group.spec.role)
        with self._counting_restarts():
            worker_ids = self.agent._start_workers(group)
            for local_rank, worker_id in worker_ids.items():
                worker = group.workers[local_rank]
                worker.id = worker_id
                record(
                    self.agent._construct_event("START", EventSource.WORKER, worker),
                    group.spec.event_log_handler,
                )
        group.state = WorkerState.HEALTHY
        if self._on_started is not None:
            self._on_started()

    def stop_workers(self) -> None:
        """Stop every local worker."""
        self.sync_counters()
        group = self.worker_group
        logger.info("[%s] Stopping worker group", group.spec.role)
        self.agent._stop_workers(group)

    def monitor(self) -> RunResult:
        """One look at the workers; the group's state follows the observation, as in torch.

        With ``quiet`` set, a tick after which nothing can have changed gets the last look's
        HEALTHY result instead (``fsm_agent.torch._tick``: same answer, no look).
        """
        quiet = self.quiet
        if quiet is not None:
            standing = quiet.stand_in()
            if standing is not None:
                return standing  # type: ignore[no-any-return]
        self.sync_counters()
        group = self.worker_group
        before = self.agent._remaining_restarts
        with tolerant_error_files():
            result = self.agent._monitor_workers(group)
        group.state = result.state
        if result.state.name == "FAILED" and self.job is not None:
            # Claimed as soon as the failure is seen, before any policy runs (and waits): the
            # culprit's agent sees its workers fail before the others' workers notice the
            # broken collective, and the earliest claim is what quarantine counts.
            self.job.failed_first()
        if result.state.name == "SUCCEEDED":  # torch's line before its exit barrier
            timeout = self.agent._exit_barrier_timeout
            logger.info(
                "[%s] worker group successfully finished. Waiting %s seconds for other agents "
                "to finish.",
                group.spec.role, int(timeout) if float(timeout).is_integer() else timeout,
            )
        if self.agent._remaining_restarts < before and self._counters is not None:
            # LocalElasticAgent zeroes _remaining_restarts when a worker is stuck in D-state
            # ("a fresh worker would conflict"); the lifecycle owns the counter, so pass it on.
            _set_remaining_restarts(self._counters, self.agent._remaining_restarts)
        if quiet is not None:
            quiet.looked(result)
        return result

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join the next round (a membership change).

        torch's c10d handler reads the rendezvous state from the store at most once per cache
        period (1 s) and serves its cached copy in between; the cached answer is read here
        without the call (``fsm_agent.torch._fastpath.cached_nodes_waiting``), the store read
        happens when torch's would.
        """
        handler = self.worker_group.spec.rdzv_handler
        waiting = cached_nodes_waiting(handler)
        if waiting is not None:
            return waiting
        try:
            return int(handler.num_nodes_waiting())
        except Exception:
            # the store did not answer (fsm_agent.torch._bounded): none waiting, and the job
            # protocol's next look ends the job with the store lost, naming it
            job = self.job
            if job is not None and job.check(force=True) is not None:
                return 0
            raise

    def exit_barrier(self, timeout: float) -> None:
        """Wait for every agent of the group on the rendezvous store, like torch's agent."""
        from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID

        from fsm_agent.torch._barrier import BarrierAborted, interruptible_barrier
        from fsm_agent.torch._job import RendezvousStoreLost

        self.sync_counters()
        group = self.worker_group
        # the last round's size: some agents' _stop_workers clear the group's rendezvous info
        # (torch's api_test agent does), and the torchelastic preset meets at the barrier after
        # stopping the workers
        world_size = group.group_world_size or self._group_world_size
        if not world_size:
            raise RuntimeError("exit barrier: the worker group never completed a rendezvous")
        job = self.job
        if job is not None and job.check(force=True) is not None:
            assert job.outcome is not None
            if job.only_store_lost:
                # Only the store is lost: a barrier error, as when torch's own barrier finds
                # the store gone (logged, the outcome stands; fsm_agent.torch._launch).
                raise RendezvousStoreLost(job.outcome.reason)
            # The job's outcome is known: nobody needs to wait for anybody (the agent that
            # announced released this round's barrier for those already waiting).
            logger.warning("[%s] exit barrier: %s; not waiting for the other agents",
                           group.spec.role, job.outcome.describe())
            return
        # LocalElasticAgent's health check reports "alive" while this flag is set.
        self.agent._in_exit_barrier = True
        try:
            if job is not None and group.state.name == "SUCCEEDED":
                job.mark_finishing()  # a peer's restart could never complete now
            if enabled("barrier"):
                # torch's store barrier blocks signals for the whole timeout; same keys.
                try:
                    interruptible_barrier(
                        store=self.agent._store,
                        world_size=world_size,
                        key_prefix=_TERMINAL_STATE_SYNC_ID,
                        timeout=timeout,
                        abort=self._lost_at_barrier if asks_peers(self.agent) else None,
                    )
                except BarrierAborted as e:
                    # A lost peer never arrives: this node's outcome stands, now rather than
                    # after the barrier's timeout.
                    logger.warning("[%s] exit barrier: %s; not waiting for it",
                                   group.spec.role, e.reason)
                    return
            else:
                from torch.distributed.elastic.utils.store import barrier

                barrier(store=self.agent._store, world_size=world_size,
                        key_prefix=_TERMINAL_STATE_SYNC_ID, barrier_timeout=timeout)
            if job is not None and job.check(force=True) is not None:
                assert job.outcome is not None
                logger.warning("[%s] exit barrier released: %s", group.spec.role,
                               job.outcome.describe())
        finally:
            self.agent._in_exit_barrier = False

    def _lost_at_barrier(self) -> str | None:
        """Why the exit barrier can never be released: a peer of the round lost (None: none)."""
        lost = self.lost_peers()
        return describe_lost(lost) if lost else None

    def release_exit_barrier(self) -> None:
        """Release the current round's exit barrier for every agent waiting at it: the job's
        outcome is announced, so there is nothing left to wait for (torch's own barrier keys:
        the waiters wait for ``last_member``)."""
        from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID

        from fsm_agent.torch._job import STORE_ERRORS

        store = getattr(self.agent, "_store", None)
        if store is None:
            return
        try:
            store.set(f"{_TERMINAL_STATE_SYNC_ID}/last_member", "<val_ignored>")
        except STORE_ERRORS:  # the store is gone: so are the waiters' barriers
            logger.debug("could not release the exit barrier", exc_info=True)

    def capture_stacks(self) -> None:
        """Dump every worker's Python stacks before they are stopped (``capture_stacks``)."""
        capture = capability(self.agent, DiagnosticHooks._fsm_capture_stacks)
        if capture is None:
            logger.warning("capture_stacks: agent %s cannot take its workers' stacks",
                           type(self.agent).__name__)
            return
        capture()

    def drain_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker process (``drain_workers``): the drain begins."""
        self.hooks._fsm_drain_workers(signum)

    def kill_workers(self) -> None:
        """Kill what is left of the workers at once (``kill_workers``: the drain's time is up)."""
        self.hooks._fsm_kill_workers()

    def preemption(self) -> Preemption | None:
        """The preemption under way (the signal received, or another agent's announcement)."""
        current = capability(self.agent, PreemptionHooks._fsm_current_preemption)
        return current() if current is not None else None

    def announce_preemption(self, exit_code: int, reason: str) -> int:
        """Tell every agent of the job that it is preempted; the exit code that won (one job,
        one outcome: the first announcement's)."""
        if self.job is None:
            return exit_code
        return self.job.announce(exit_code, reason, outcome=PREEMPTED_OUTCOME).exit_code

    def progress_mark(self) -> Mark:
        """Where training stands (``fsm_agent._core._progress``): the best step the workers
        reported, the newest file under the spec's ``checkpoint_path``."""
        return self.hooks._fsm_progress_mark()

    def lost_peers(self) -> tuple[str, ...]:
        """The nodes of the current round known to be lost (``fsm_agent._core._peers``): what the
        agent's ``_fsm_lost_peers()`` says (the mixin's reads torch's rendezvous keep-alive,
        ``fsm_agent.torch._peers``; a supervisor that learns of a lost machine from its scheduler
        overrides it); none when the agent has no such hook."""
        # asked on every healthy tick of a spec that asks peer_lost: a getattr, not capability()
        ask: Callable[[], Iterable[str]] | None = getattr(self.agent, _LOST_PEERS, None)
        return tuple(ask()) if ask is not None else ()

    def note_progress(self, verdict: dict[str, Any]) -> None:
        """Record whether the attempt that just failed made progress (for the trace)."""
        self.hooks._fsm_note("progress", verdict)

    def check_health(self, check: HealthCheck) -> CheckResult:
        """Run a node health check (a spec guard); the result goes to the trace's diagnostics and,
        if it failed, is the reason ``leave_job`` gives."""
        job = self.job
        result = check.run(store=_rendezvous_store(self.worker_group.spec.rdzv_handler),
                           slate=capability(self.agent, SlateHooks._fsm_slate_reason),
                           quarantined=job.quarantine_mark if job is not None else None)
        self._health.append(result)
        note = capability(self.agent, DiagnosticHooks._fsm_note_health)
        if note is not None:
            note(result)
        return result

    def quarantine(self, reason: str) -> None:
        """Mark this node quarantined on the job's store (``fsm_agent._core._quarantine``); a node
        without a job of several agents has nowhere to mark it, and simply leaves."""
        if self.job is not None:
            self.job.quarantine(reason)

    def failed_first(self) -> bool:
        """Whether this node's failure is the first of its round in the job (quarantine counts
        only those: ``fsm_agent._core._quarantine``); alone, every failure is."""
        return True if self.job is None else self.job.failed_first()

    def health_reason(self) -> str | None:
        """``check: reason`` of the last health check that failed, if any."""
        failed = [r for r in self._health if not r.ok]
        return f"{failed[-1].name}: {failed[-1].reason}" if failed else None

    # -- JobDriver (fsm_agent._core._driver): a job of several agents ---------------------------

    @property
    def has_job(self) -> bool:
        """Whether this agent shares its job with others (a job-wide budget then counts)."""
        return self.job is not None

    def job_restart_count(self, window: float, budget: str = "") -> int:
        """Failure restarts the job has counted against ``budget`` ("": the default)."""
        return 0 if self.job is None else self.job.restart_count(window, budget)

    def job_restarts_left(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Restarts of ``budget`` left for a failure of the current round."""
        return 0 if self.job is None else self.job.restarts_left(max_restarts, window, budget)

    def add_job_restart(self, max_restarts: int, window: float, budget: str = "") -> int:
        """Count the current round's failure restart once for the job, against ``budget``."""
        if self.job is None:
            raise RuntimeError("add_job_restart without a job")
        return self.job.claim_restart(max_restarts, window, budget)

    def announce_failure(self, exit_code: int, reason: str) -> None:
        """Tell every other agent of the job that it failed, and release the exit barrier of
        the agents already waiting at it."""
        if self.job is not None:
            self.job.announce(exit_code, reason)

    def put_metric(self, name: str, value: int) -> None:
        """Publish through torch's metrics API (group ``torchelastic``, as torch's agent).

        What ``put_metric`` does, skipped when the group's handler is torch's
        ``NullMetricHandler`` (the default), which drops every value.
        """
        stream = _get_stream("torchelastic")
        if type(stream.handler) is not _NullMetricHandler:
            stream.add_value(name, value)

    # -- resources -------------------------------------------------------------------------

    def close(self) -> None:
        """Release what the driver holds beyond the agent (the per-round worker store)."""
        if self.isolation is not None:
            self.isolation.close()


def _rendezvous_store(handler: Any) -> tuple[str, int] | None:
    """(host, port) of a c10d rendezvous handler's TCP store, None if it has none we can see."""
    holder = getattr(handler, "_state_holder", None)
    for found in (getattr(getattr(holder, "_backend", None), "_store", None),
                  getattr(handler, "_store", None)):
        store = found
        for _ in range(3):  # through PrefixStores
            host, port = getattr(store, "host", None), getattr(store, "port", None)
            if isinstance(host, str) and isinstance(port, int) and port > 0:
                return host, port
            store = getattr(store, "underlying_store", None)
    return None


def _set_remaining_restarts(counters: Any, value: int) -> None:
    # fsm_agent.Lifecycle exposes its attrs Context, whose counters guards and actions read.
    target = getattr(counters, "context", counters)
    withdraw = getattr(target, "withdraw_restarts", None)
    if value == 0 and callable(withdraw):
        withdraw()  # sticky: a restart window must not give them back
        return
    try:
        target.remaining_restarts = value
    except AttributeError:  # a read-only stand-in: nothing to pass the change on to
        logger.warning("cannot lower the lifecycle's remaining restarts to %s", value)
