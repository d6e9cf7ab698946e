"""``LifecycleAgentMixin`` and ``FSMElasticAgent``: torch's elastic agent, run by a spec."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    SimpleElasticAgent,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from fsm_agent import Lifecycle, Listener, Spec, Step, WorkerGroupFailureException, load_spec
from fsm_agent._core._budgets import DEFAULT_BUDGET, budget_used
from fsm_agent._core._drain import PREEMPTED_TRIGGER
from fsm_agent._core._job import LINGER_TIMEOUT
from fsm_agent._core._params import bind_params
from fsm_agent._core._peers import PEER_LOST_GUARD
from fsm_agent._core._policy import rule_budgets
from fsm_agent._core._progress import PROGRESS_DIR_ENV, Mark, newest_mtime, read_steps
from fsm_agent._core._spec import DEFAULT_SPEC, HANG_TIMEOUT_PARAM, HUNG_TRIGGER
from fsm_agent.torch._compat import require_core
from fsm_agent.torch._drain import DrainMixin
from fsm_agent.torch._driver import TorchDriver
from fsm_agent.torch._etcd import etcd_rendezvous_poll
from fsm_agent.torch._fastpath import (
    cheap_rendezvous_events,
    fast_rendezvous,
    notify_background_syncs,
)
from fsm_agent.torch._file_timer import HangWatchdogMixin
from fsm_agent.torch._job import STORE_ERRORS, AgentJob
from fsm_agent.torch._monitor import FATAL_EXCEPTIONS, MonitorWaitMixin
from fsm_agent.torch._peers import PeerWatch, RoundLost, abortable_bootstrap, install_peer_watch
from fsm_agent.torch._preload import WarmStartMixin
from fsm_agent.torch._progress import HangDetector
from fsm_agent.torch._reaper import ProcessGroupReaperMixin, record_interruption
from fsm_agent.torch._sentinel import SentinelMixin
from fsm_agent.torch._slate import CleanSlateMixin
from fsm_agent.torch._slots import STABLE_SLOTS_PARAM, install_stable_slots
from fsm_agent.torch._stacks import find_py_spy, main_thread_frames
from fsm_agent.torch._tick import QuietTicks
from fsm_agent.torch._wakeup import WorkerExitWaker

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerGroup

    from fsm_agent.torch._hooks import (
        AgentHooks,
        DiagnosticHooks,
        PeerHooks,
        PreemptionHooks,
        SlateHooks,
        TimerHooks,
    )

__all__ = ["FSMElasticAgent", "LifecycleAgentMixin"]

logger = logging.getLogger("fsm_agent.torch")

#: How many rounds in a row a rendezvous leaves because their rank 0 was lost before it
#: published the workers' store (fsm_agent.torch._peers.RoundLost) before it gives up.
MAX_LOST_ROUNDS = 10


def rendezvous_over(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the job's rendezvous is closed: the job has
    ended, and an agent that was not in it has nothing to join and nothing to announce."""
    from torch.distributed.elastic.rendezvous import RendezvousClosedError

    seen: BaseException | None = error
    for _ in range(20):  # a cause chain is short; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, (RendezvousClosedError, RendezvousGracefulExitError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class LifecycleAgentMixin(MonitorWaitMixin):
    """Makes any ``SimpleElasticAgent`` subclass spec-driven: list it first among the bases.

    ::

        class MyAgent(LifecycleAgentMixin, SomeVendorElasticAgent): ...
        agent = MyAgent(worker_spec, ..., lifecycle_spec="torchrun", listeners=[print])

    The mixin replaces ``_invoke_run`` (torch's hard-coded ``while True`` loop) with a
    ``fsm_agent.Lifecycle`` whose driver (:class:`TorchDriver`) calls the agent's own
    ``_rendezvous``, ``_start_workers``, ``_stop_workers``, ``_monitor_workers``, the rendezvous
    handler's ``num_nodes_waiting`` and torch's store barrier. ``run()`` is torch's, so its
    signal handling, shutdown, ``_record_metrics`` and ``_record_worker_events`` are unchanged.

    Keyword arguments taken by the mixin (everything else goes to the agent's constructor):

    - ``lifecycle_spec``: preset name, path or ``Spec`` (default ``"torchelastic"``). Not
      ``spec``: torch's agents already use that name for the ``WorkerSpec``.
    - ``listeners``: callables receiving a ``fsm_agent.Step`` per transition (a trace writer).
    - ``isolate_worker_store``: give every rendezvous round's workers a fresh store (default
      True; the restart fix, see ``docs/runner.md``).
    - ``lifecycle_params``: values for the spec's ``params`` (checked at construction: an
      unknown name or a bad value is a ``SpecError``).

    The monitor and restart paths are separate methods so that they can be changed alone:
    :meth:`_lifecycle_loop` (start, then the monitor loop), :meth:`_monitor_wait` (what happens
    between two looks at the workers) and :meth:`_on_workers_started` (called by the driver after
    every start of the workers).
    """

    _worker_group: WorkerGroup
    _remaining_restarts: int
    _exit_barrier_timeout: float
    _fsm_restarts_seen: int = 0  # restart_count of the last step: tells counted restarts apart
    _fsm_step_counted: bool = False  # the last step counted a restart (for its log line)
    _fsm_exit_waker: WorkerExitWaker | None = None  # created on first wait
    _fsm_rendezvoused: bool = False  # the first rendezvous keeps torch's start-up skew
    _fsm_waker_failed: bool = False  # the waker raised once: plain ticks from then on
    _fsm_hangs: HangDetector | None = None  # the spec's hang_timeout, while workers run
    _fsm_hung_trigger: bool = False  # the spec handles `hung`: timer hangs come that way too
    _fsm_diagnostics: dict[str, Any] | None = None  # for the trace's next record
    _fsm_job: AgentJob | None = None  # the job of several nodes this agent is part of
    _fsm_restart_pending: bool = False  # the rendezvous under way is a restart's
    _fsm_progress_dir: str | None = None  # where the workers' fsm_agent.progress(step) writes
    _fsm_best_step: int | None = None  # the best step they reported in this run

    def __init__(
        self,
        *args: Any,
        lifecycle_spec: str | os.PathLike[str] | Spec = DEFAULT_SPEC,
        listeners: Iterable[Listener] = (),
        isolate_worker_store: bool = True,
        lifecycle_params: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # torch's internals this adapter needs, checked once per process (_compat.py): a torch
        # without them is one clear error here; a missing optional one turns its feature off.
        require_core()
        # Load (and check) the spec and its parameters before the agent allocates anything: a
        # bad spec or value is a clear SpecError at construction, not after the first rendezvous.
        self._lifecycle_spec: Spec = load_spec(lifecycle_spec)
        spec = self._lifecycle_spec
        self._lifecycle_params = bind_params(spec.params, lifecycle_params, path=spec.path)
        self._fsm_reported = {s.name: s.reported for s in spec.states}
        super().__init__(*args, **kwargs)
        if not isinstance(self, SimpleElasticAgent):
            raise TypeError(
                f"{type(self).__name__}: LifecycleAgentMixin needs a SimpleElasticAgent subclass "
                "after it among the bases"
            )
        # The spec's stable_slots (resilient): survivors keep their group rank (_slots.py).
        # A spec without the parameter (the torch presets) keeps torch's numbering.
        if self._lifecycle_params.get(STABLE_SLOTS_PARAM) is True:
            install_stable_slots(self._worker_group.spec.rdzv_handler)
        # A policy that asks peer_lost (resilient) gets its answer from torch's keep-alive
        # (_peers.py); the torch presets never ask, and their handler stays untouched.
        self._fsm_peer_watch: PeerWatch | None = None
        #: Whether the spec asks ``peer_lost``: the exit barrier then stops waiting for a peer
        #: known to be lost.
        self._fsm_asks_peers = any(PEER_LOST_GUARD in t.guards or PEER_LOST_GUARD in t.unless
                                   for t in spec.transitions)
        if self._fsm_asks_peers:
            self._fsm_peer_watch = install_peer_watch(self._worker_group.spec.rdzv_handler)
        # The lifecycle is built at run(); refuse what it would refuse now, at construction.
        timeout = self._exit_barrier_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"exit_barrier_timeout must be >= 0 seconds, got {timeout!r}")
        self._lifecycle_listeners: tuple[Listener, ...] = tuple(listeners)
        # The agent owns its driver and lifecycle; they refer back to it weakly, so a finished
        # agent is freed by reference counting alone. A cycle would keep the rendezvous
        # handler's TCPStores (and their threads) alive until a garbage collection, which may
        # then run in a forked child, where ~TCPStore aborts or hangs.
        self._fsm_driver = TorchDriver(
            weakref.proxy(self),  # type: ignore[arg-type]
            isolate_worker_store=isolate_worker_store,
            on_started=_weak_method(self._on_workers_started),
        )
        self._lifecycle: Lifecycle | None = None
        # Ticks after which nothing can have changed need no look, and no tick at all when
        # nobody else sees them (fsm_agent/torch/_tick.py).
        self._fsm_quiet = QuietTicks(self, _weak_method(self._fsm_ticks_seen))
        self._fsm_driver.quiet = self._fsm_quiet

    # -- the lifecycle -------------------------------------------------------------------------

    @property
    def lifecycle(self) -> Lifecycle | None:
        """The lifecycle of the current (or last) ``run()``, ``None`` before the first."""
        return self._lifecycle

    @property
    def driver(self) -> TorchDriver:
        """The driver the lifecycle acts through."""
        return self._fsm_driver

    @property
    def job(self) -> AgentJob | None:
        """This agent's part in a job of several nodes (``fsm_agent.torch._job``), if any."""
        return self._fsm_job

    def _make_lifecycle(self) -> Lifecycle:
        spec = self._worker_group.spec
        lifecycle = Lifecycle(
            self._lifecycle_spec,
            self._fsm_driver,
            role=spec.role,
            max_restarts=spec.max_restarts,
            exit_barrier_timeout=self._exit_barrier_timeout,
            fatal_exceptions=FATAL_EXCEPTIONS,
            params=self._lifecycle_params,
            # Ours first: the group state is in step before any other listener looks at it.
            # The step's log line last: a trace read when the line says so holds the step.
            listeners=(_own(self._follow_step), *self._lifecycle_listeners,
                       _own(self._fsm_log_step)),
        )
        self._fsm_driver.bind(lifecycle)
        self._fsm_restarts_seen = 0
        self._fsm_setup_hangs(lifecycle)
        return lifecycle

    def _fsm_setup_hangs(self, lifecycle: Lifecycle) -> None:
        # The spec opts in: its own trigger `hung`, and the parameter hang_timeout.
        self._fsm_hung_trigger = HUNG_TRIGGER in lifecycle.spec.triggers
        self._fsm_hangs = None
        timeout = lifecycle.context.params.get(HANG_TIMEOUT_PARAM)
        if not self._fsm_hung_trigger or not isinstance(timeout, (int, float)):
            return
        if math.isfinite(timeout) and timeout > 0:
            py_spy = find_py_spy()
            self._fsm_hangs = HangDetector(
                float(timeout),
                stacker=None if py_spy is None else functools.partial(main_thread_frames,
                                                                      py_spy=py_spy),
                steps=_weak_method(self._fsm_reported_steps))
            logger.info("[%s] hang detection: a group whose workers all make no progress for "
                        "%g s is hung (sampled every %g s%s)", lifecycle.context.role, timeout,
                        self._fsm_hangs.period, "" if py_spy else "; without py-spy a rank "
                        "that spins is not told from one that works")

    def _follow_step(self, step: Step) -> None:
        # torch's loop sets worker_group.state at the same points the machine changes state
        # (observed state, STOPPED during a restart, HEALTHY after a start, FAILED on giving up);
        # a spec's own states show the WorkerState they report (BACKOFF: STOPPED).
        if step.dest is not None:
            self._worker_group.state = WorkerState[self._fsm_reported[step.dest]]
        self._fsm_step_counted = step.restart_count > self._fsm_restarts_seen
        self._fsm_restarts_seen = step.restart_count
        self._remaining_restarts = step.remaining_restarts

    def _fsm_log_step(self, step: Step) -> None:
        counted = self._fsm_step_counted
        if step.error is not None or step.dest is None:
            return
        role = self._worker_group.spec.role
        if counted:
            wait = f"; restarting in {step.timer:.3g} s" if step.timer is not None else ""
            rule = f" (rule {step.rule!r})" if step.rule else ""
            allowed = self._worker_group.spec.max_restarts
            window = self._lifecycle.context.window if self._lifecycle is not None else math.inf
            of = (f"of {allowed}" if math.isinf(window) else
                  f"({step.remaining_restarts} of {allowed} left within {window:g} s)")
            spent = self._fsm_budget_spent(step)
            number = step.restart_count
            if spent is not None:
                of = spent
            elif self._lifecycle is not None and self._lifecycle.spec.budgets \
                    and math.isinf(window):
                # restart_count counts every budget's restarts: say the default budget's own
                number = allowed - step.remaining_restarts
            logger.warning("[%s] worker group %s; restart %d %s%s%s", role, step.observed,
                           number, of, rule, wait)
        elif step.trigger == "healthy" and self._fsm_reported[step.dest] == "STOPPED":
            failed = self._fsm_failed_peer()
            if failed is not None:
                # another node's workers failed and it counted the restart for the job: this
                # node restarts with it, without counting it again
                logger.warning("[%s] %s's workers failed; restarting the worker group with it "
                               "(counted once for the job: %d of %s used%s)", role, failed[0],
                               failed[1], failed[2], f" of budget {failed[3]}" if failed[3]
                               else "")
            else:
                logger.warning("[%s] nodes waiting to join; restarting the worker group "
                               "(membership change, not counted against max_restarts)", role)

    def _fsm_budget_spent(self, step: Step) -> str | None:
        """For a restart that spent a budget of its own (its rule's, or a plain transition's
        ``consume_<name>_restart``): ``(budget infra: 1 of 2 used)`` (None for the default
        budget, whose line says ``of max_restarts``)."""
        lifecycle = self._lifecycle
        if lifecycle is None:
            return None
        ctx = lifecycle.context
        if step.rule is not None:
            name = rule_budgets(lifecycle.spec).get(step.rule, DEFAULT_BUDGET)
        else:
            name = next((n for n in ctx.budget_limits
                         if any(a.name == f"consume_{n}_restart" for a in step.actions)),
                        DEFAULT_BUDGET)
        if name == DEFAULT_BUDGET:
            return None
        most, window = ctx.budget_limits[name]
        try:
            used = budget_used(ctx, name)
        except STORE_ERRORS:
            return f"(budget {name})"
        within = "" if math.isinf(window) else f" within {window:g} s"
        return f"(budget {name}: {used} of {most} used{within}; not counted against max_restarts)"

    def _fsm_failed_peer(self) -> tuple[str, int, float, str] | None:
        """The node whose failure of the current round the job counted (if not this one), the
        job's failure restarts so far of the budget it spent, that budget's maximum and its
        name ("" the default)."""
        job, lifecycle = self._fsm_job, self._lifecycle
        if job is None or job.round_id is None or lifecycle is None:
            return None
        ctx = lifecycle.context
        try:
            node = job.channel.claimer(job.round_id)
            if node is None or node == job.channel.node:
                return None
            job.channel.entries()
            name = job.channel.budget_of(job.round_id) or ""
            most, window = ctx.budget_limits.get(name, (ctx.max_restarts, ctx.window))
            return node, job.channel.restart_count(window, cached=True, budget=name), most, name
        except STORE_ERRORS:
            return None

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        spec = self._worker_group.spec
        # torch's line, word for word; then which spec runs the loop
        logger.info("[%s] starting workers for entrypoint: %s", spec.role,
                    spec.get_entrypoint_name())
        logger.info("[%s] lifecycle spec: %s", spec.role, self._lifecycle_spec.name)
        lifecycle = self._make_lifecycle()
        self._lifecycle = lifecycle
        try:
            return self._lifecycle_loop(lifecycle)
        except WorkerGroupFailureException:
            # torch's run() records run metrics and worker events only for a returned result;
            # the torchelastic preset raises on giving up, so record them here.
            result = lifecycle.result
            self._fsm_driver.sync_counters()
            if result is not None:
                self._record_metrics(result)  # type: ignore[attr-defined]
                self._record_worker_events(result)  # type: ignore[attr-defined]
            raise
        except BaseException as e:
            # a signal between two transitions still gives the trace a final record.
            record_interruption(lifecycle, self._lifecycle_listeners, e)
            self._fsm_job_end(lifecycle, e)
            raise
        finally:
            self._fsm_driver.sync_counters()

    def _fsm_job_end(self, lifecycle: Lifecycle, error: BaseException) -> None:
        # The lifecycle ended by an exception: tell the other agents of the job. An action that
        # failed (UNKNOWN) fails the job; a signal leaves the rendezvous open for a new agent
        # (as torch), but with a job-wide budget the failure it causes is counted here, so that
        # a fast rejoin cannot restart the job for free (pytorch/pytorch#147064).
        job = self._fsm_job
        if job is None or job.outcome is not None or rendezvous_over(error):
            return
        if isinstance(error, SignalException):
            if (self._lifecycle_spec.budget.scope == "job"
                    and lifecycle.state_name in ("HEALTHY", "UNHEALTHY")):
                try:
                    job.claim_restart(lifecycle.context.max_restarts, lifecycle.context.window)
                except Exception as e:  # JobOver: the budget is spent and the failure announced
                    logger.warning("[%s] leaving on %s: %s", lifecycle.context.role,
                                   type(error).__name__, e)
            return
        if isinstance(error, Exception) and lifecycle.state_name == "UNKNOWN":
            job.announce(1, f"[{lifecycle.context.role}] {type(error).__name__}: {error}")

    # -- the monitor and restart path ---------------------------------------------------------

    def _lifecycle_loop(self, lifecycle: Lifecycle) -> RunResult:
        """Start the group, then run the lifecycle until it is done (torch's while loop).

        Restarts happen inside the lifecycle: the spec's transitions call the driver's
        ``stop_workers``, ``rendezvous`` and ``start_workers``; timers (a backoff) wait in
        :meth:`_monitor_wait` too, so signals and worker exits end them at once.
        """
        lifecycle.start()
        result = lifecycle.run(self._worker_group.spec.monitor_interval,
                               sleep=self._monitor_wait)
        if result is None:  # pragma: no cover - the engine sets it on every final state
            raise RuntimeError(f"[{lifecycle.context.role}] lifecycle ended without a result")
        return result

    def _stop_workers(self, worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> None:
        # Stopped workers make no progress: the detector watches the next start's.
        if self._fsm_hangs is not None:
            self._fsm_hangs.clear()
        super()._stop_workers(worker_group, *args, **kwargs)  # type: ignore[misc]

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        # torch's rendezvous without its needless sleeps (fsm_agent.torch._fastpath).
        first = not self._fsm_rendezvoused
        self._fsm_rendezvoused = True
        job = self._fsm_job
        if job is not None:
            # A job already over is never joined; while waiting for the others, an announcement
            # (or a node that finished, on a restart) ends the rendezvous: fsm_agent.torch._job.
            job.check(force=True)
            job.rendezvous_poll(restart=not first)
        self._fsm_restart_pending = not first
        self._fsm_rendezvous_poll()
        watch = self._fsm_peer_watch
        for _ in range(MAX_LOST_ROUNDS):
            try:
                handler = worker_group.spec.rdzv_handler
                with fast_rendezvous(handler, first=first, poll=self._fsm_rendezvous_poll), (
                        abortable_bootstrap(watch, self._fsm_rendezvous_poll)
                        if watch is not None else contextlib.nullcontext()), \
                        etcd_rendezvous_poll(handler, self._fsm_rendezvous_poll):
                    super()._rendezvous(worker_group)  # type: ignore[misc]
                break
            except RoundLost as e:
                # torch's next join starts with its exit op: this agent leaves the dead round,
                # and the next one opens once the keep-alive has dropped the lost node
                logger.warning("[%s] %s; joining the next round", worker_group.spec.role, e)
                first = False
        else:
            raise RuntimeError(f"{MAX_LOST_ROUNDS} rendezvous rounds in a row lost their "
                               "rank 0 before it published the workers' store address")
        if watch is not None:
            watch.round_started()

    def _fsm_lost_peers(self) -> tuple[str, ...]:
        """The peers of this round torch's keep-alive says are lost (the guard ``peer_lost``;
        a subclass may add what its scheduler knows).

        After a failure it waits until every peer is accounted for (the failure may follow a
        loss the keep-alive has not expired yet); at the exit barrier it answers at once from
        what torch's keep-alive thread last read; on a healthy tick from the state the tick's
        membership check reads (``PeerWatch.lost_at_tick``)."""
        watch = self._fsm_peer_watch
        if watch is None:
            return ()
        lifecycle = self._lifecycle
        observed = lifecycle.context.observed if lifecycle is not None else None
        failed = observed is not None and observed.state.name in ("FAILED", "UNHEALTHY")
        if failed or getattr(self, "_in_exit_barrier", False):
            return watch.lost(wait=failed)
        return watch.lost_at_tick(self._fsm_driver.num_nodes_waiting)

    def _fsm_rendezvous_poll(self) -> None:
        """Between two looks at the rendezvous state (torch's join loop): what it raises ends
        the rendezvous; here, the job's announcement (``JobOver``)."""
        job = self._fsm_job
        if job is not None:
            job.rendezvous_poll(restart=self._fsm_restart_pending)

    # -- progress across attempts (fsm_agent._core._progress) --------------------------------------

    def _fsm_reported_steps(self) -> dict[int, int]:
        """The step each local rank last reported (``fsm_agent.progress``)."""
        directory = self._fsm_progress_dir
        steps = read_steps(directory) if directory else {}
        return {int(name[4:]): step for name, step in steps.items() if name[4:].isdigit()}

    def _fsm_progress_mark(self) -> Mark:
        """The best step the workers reported through ``fsm_agent.progress`` and the newest file
        under the spec's ``checkpoint_path``."""
        directory = self._fsm_progress_dir
        steps = read_steps(directory) if directory else {}
        best = max(steps.values()) if steps else None
        if best is not None:
            prev = self._fsm_best_step
            self._fsm_best_step = best if prev is None else max(best, prev)
        lifecycle = self._lifecycle
        pattern = lifecycle.context.params.get("checkpoint_path") if lifecycle else None
        newest = newest_mtime(pattern) if isinstance(pattern, str) and pattern else None
        return Mark(self._fsm_best_step, newest)

    # -- run ---------------------------------------------------------------------------------

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """torch's ``run()``; afterwards the per-round worker store is released."""
        # A node waiting to join is counted as soon as another thread refreshes the state.
        handler = self._worker_group.spec.rdzv_handler
        unhook = notify_background_syncs(handler, _weak_method(self._fsm_wake))
        self._fsm_job = AgentJob.for_handler(handler, role=self._worker_group.spec.role)
        if self._fsm_job is not None:
            # the outcome reaches this agent by a watch that ends its wait (no polling)
            self._fsm_job.start_watch(on_fire=_weak_method(self._fsm_wake))
            self._fsm_job.on_announced = self._fsm_driver.release_exit_barrier
            if PREEMPTED_TRIGGER in self._lifecycle_spec.triggers:
                self._fsm_job.preempted_trigger = PREEMPTED_TRIGGER
        self._fsm_driver.job = self._fsm_job
        # fsm_agent.progress(step) in the workers writes here (their environment is ours)
        self._fsm_progress_dir = tempfile.mkdtemp(prefix="fsm-agent-progress-")
        self._fsm_best_step = None
        saved_dir = os.environ.get(PROGRESS_DIR_ENV)
        os.environ[PROGRESS_DIR_ENV] = self._fsm_progress_dir
        try:
            with cheap_rendezvous_events():  # torch's events without inspect.stack()
                return super().run(role)  # type: ignore[misc, no-any-return]
        except BaseException as e:
            _clear_library_frames(e)
            raise
        finally:
            if saved_dir is None:
                os.environ.pop(PROGRESS_DIR_ENV, None)
            else:
                os.environ[PROGRESS_DIR_ENV] = saved_dir
            shutil.rmtree(self._fsm_progress_dir, ignore_errors=True)
            job = self._fsm_job
            if job is not None:
                # the workers are stopped (torch's run() did): wait until the others have read
                # the job's outcome, so that this agent does not take the store down too early.
                job.linger(max(1, self._worker_group.group_world_size or 1),
                           min(LINGER_TIMEOUT, self._exit_barrier_timeout))
                job.close()
            unhook()
            self._fsm_driver.close()
            self._fsm_driver.bind(None)  # the lifecycle (kept for inspection) refers to the driver
            waker = self._fsm_exit_waker
            if waker is not None:
                waker.close()
                self._fsm_exit_waker = None


_LIBRARY_MODULES = ("transitions.", "fsm_agent.")


def _clear_library_frames(error: BaseException) -> None:
    """Free the locals of the ``transitions`` and ``fsm_agent`` frames an exception passed through.

    ``transitions`` keeps the exception in ``EventData.error``, and that ``EventData`` is a local
    of frames in the exception's own traceback (transitions' and the engine's action wrappers):
    a cycle that keeps every frame of the traceback, and so the agent and its rendezvous stores,
    alive until a garbage collection. The locals of these library frames are internals; the
    traceback itself (files, lines, names) is unchanged, and the frames of torch and of the
    user's code keep theirs.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if str(frame.f_globals.get("__name__", "")).startswith(_LIBRARY_MODULES):
                with contextlib.suppress(RuntimeError):  # a frame still running stays as it is
                    frame.clear()
            tb = tb.tb_next
        todo += [exc.__cause__, exc.__context__]


def _weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without a strong reference to its object (a no-op once the object is gone)."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]

    def call(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)

    return call


def _own(method: Callable[..., Any]) -> Callable[..., Any]:
    """The agent's own listener: weak, and needing no tick that changes nothing."""
    call = _weak_method(method)
    call.every_tick = False  # type: ignore[attr-defined]
    return call


# the sentinel, drains, a clean slate per start, hang watchdog, process-group reaping and warm
# starts (fsm_agent.torch._sentinel, _drain, _slate, _file_timer, _reaper, _preload)
class FSMElasticAgent(  # type: ignore[misc]
    SentinelMixin,
    DrainMixin,
    LifecycleAgentMixin,
    CleanSlateMixin,
    HangWatchdogMixin,
    ProcessGroupReaperMixin,
    WarmStartMixin,
    LocalElasticAgent,  # type: ignore[misc]
):
    """torch's ``LocalElasticAgent`` whose run loop is a ``fsm_agent`` lifecycle.

    Takes ``LocalElasticAgent``'s arguments (``spec`` is the ``WorkerSpec``, ``logs_specs``,
    ``start_method``, ``exit_barrier_timeout``, ``log_line_prefix_template``,
    ``shutdown_timeout``, ...) plus the mixin's ``lifecycle_spec``, ``listeners`` and
    ``isolate_worker_store``, ``preload`` (module names: script workers are forked from a
    process that imported them once, ``fsm_agent.torch._preload``; default none) and
    ``sentinel`` (default True: a process that ends the workers and their descendants when the
    agent dies, SIGKILL included, ``fsm_agent.torch._sentinel``). Without ``logs_specs``, torch's
    ``DefaultLogsSpecs(log_dir)`` (``log_dir`` None: a fresh temporary directory, as torchrun
    without ``--log-dir``).
    """

    def __init__(self, spec: Any, logs_specs: Any = None, *args: Any,
                 log_dir: str | None = None, **kwargs: Any) -> None:
        # Defaults make the agent buildable from a worker spec alone, as the conformance kit
        # (which passes a scratch log_dir) and a quick script build it; torch's
        # LocalElasticAgent requires logs_specs.
        if logs_specs is None:
            from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

            logs_specs = DefaultLogsSpecs(log_dir=log_dir)
        elif log_dir is not None:
            raise ValueError("FSMElasticAgent: give logs_specs or log_dir, not both")
        super().__init__(spec, logs_specs, *args, **kwargs)


if TYPE_CHECKING:
    # mypy checks that the agent has every hook its driver calls, with the driver's types.
    # FSMElasticAgent's torch base is Any to mypy, which would let any hook pass: the check is
    # on its bases of this package, composed in the same order.
    class _Composed(SentinelMixin, DrainMixin, LifecycleAgentMixin, CleanSlateMixin,
                    HangWatchdogMixin, ProcessGroupReaperMixin, WarmStartMixin):
        pass

    def _agent_hooks(agent: _Composed) -> tuple[AgentHooks, DiagnosticHooks, PeerHooks,
                                                PreemptionHooks, SlateHooks, TimerHooks]:
        return agent, agent, agent, agent, agent, agent
