"""Hang detection from torch's file timers: a worker whose deadline passes makes the group
UNHEALTHY.

The mechanism is torch's own watchdog, unchanged on the worker side: the agent runs a
``FileTimerServer`` on a named pipe when ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` (optionally at
``TORCHELASTIC_TIMER_FILE``), passes the pipe to the workers as ``TORCHELASTIC_TIMER_FILE``, and a
worker arms a deadline around each unit of work::

    from torch.distributed.elastic.timer import FileTimerClient, configure, expires
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with expires(after=60):      # this step must finish within 60 s
        train_step()

What torch's ``LocalElasticAgent`` does when a deadline passes: its watchdog thread SIGKILLs the
worker *and then the agent itself* (``FileTimerServer._run_watchdog``: "Terminating the server
process because of expired timers"). The agent dies without stopping the other workers (they are
left running, orphaned), without a failure summary and without the restarts it had left.

What :class:`HangWatchdogMixin` does instead: the watchdog thread only records the expired
deadline (:class:`HangWatchdog`). At the next monitor tick the agent sends the hung worker the
signal its timer asked for (SIGKILL unless the client chose another; a timer with signal 0 is
only logged, as in torch) and reports the group ``UNHEALTHY``, with a failure for each hung rank
naming the timer (scope) that expired. The spec decides what follows -- both presets restart the
group while restarts are left (``UNHEALTHY --always [has_restarts_left]--> STOPPED``), then give
up with the hung rank as the root cause.

Without ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` nothing runs and nothing changes: a worker that
hangs is a live process, the group is HEALTHY, as under torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import attrs
from torch.distributed.elastic.timer import FileTimerRequest, FileTimerServer

from fsm_agent._core._driver import capability
from fsm_agent.torch._compat import enabled
from fsm_agent.torch._hooks import AgentHooks

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup

__all__ = ["ENABLE_VAR", "FILE_VAR", "ExpiredTimer", "HangWatchdog", "HangWatchdogMixin"]

logger = logging.getLogger("fsm_agent.torch")

#: torch's switch and pipe path variables (``torch.distributed.elastic.agent.server
#: .local_elastic_agent``); the same names, so a job written for torch's watchdog works as is.
ENABLE_VAR = "TORCHELASTIC_ENABLE_FILE_TIMER"
FILE_VAR = "TORCHELASTIC_TIMER_FILE"


@attrs.frozen
class ExpiredTimer:
    """A worker whose deadline passed: its pid, the timer's scope, when it expired, the signal."""

    pid: int
    scope_id: str
    expiration_time: float
    signal: int

    def describe(self) -> str:
        """One line for logs and the failure summary."""
        late = max(0.0, time.time() - self.expiration_time)
        return (
            f"worker hung: timer {self.scope_id!r} expired {late:.1f} s ago without progress "
            f"(fsm-agent watchdog, {ENABLE_VAR}=1)"
        )


class HangWatchdog(FileTimerServer):  # type: ignore[misc]
    """torch's ``FileTimerServer`` that records expired deadlines instead of killing anyone."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._hung: dict[int, ExpiredTimer] = {}
        self._expired: dict[int, FileTimerRequest] = {}
        log_event: Any = getattr(self, "_log_event")  # noqa: B009 - set by torch's __init__

        def on_event(name: str, request: FileTimerRequest | None) -> None:
            # torch logs "timer expired" for each expired timer of a worker, in expiration
            # order, up to the first that carries a signal, and then calls _reap_worker for it.
            if name == "timer expired" and request is not None:
                self._expired[request.worker_pid] = request
            log_event(name, request)

        self._log_event = on_event

    def start(self) -> None:
        """Start the watchdog thread, with the pipe already open for reading.

        torch's server opens the pipe only once its thread runs; a worker that arms a timer
        before that gets ENXIO from its non-blocking open, retries briefly and then raises
        ``BrokenPipeError`` (seen with torchrun on a loaded machine). Holding a reader from the
        start lets the first requests wait in the pipe instead.
        """
        self._early_reader: int | None = os.open(self._file_path, os.O_RDONLY | os.O_NONBLOCK)
        super().start()

    def stop(self) -> None:
        """Stop the thread (torch's), then drop the early reader."""
        try:
            super().stop()
        finally:
            fd, self._early_reader = getattr(self, "_early_reader", None), None
            if fd is not None:
                os.close(fd)

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        if worker_pid == os.getpid():
            return True  # torch would kill the agent here; the lifecycle handles the hang
        request = self._expired.pop(worker_pid, None)
        hang = ExpiredTimer(
            worker_pid,
            request.scope_id if request is not None else "?",
            float(request.expiration_time) if request is not None else time.time(),
            int(signal),
        )
        with self._lock:
            self._hung.setdefault(worker_pid, hang)
        logger.warning("pid %s: %s", worker_pid, hang.describe())
        return True

    def hung(self) -> dict[int, ExpiredTimer]:
        """Workers whose deadline passed (pid -> :class:`ExpiredTimer`), since it started."""
        with self._lock:
            return dict(self._hung)


class HangWatchdogMixin:
    """For ``LocalElasticAgent`` subclasses: list it before ``LocalElasticAgent`` among the bases.

    Replaces torch's watchdog with :class:`HangWatchdog` (same switch, same pipe, same worker
    API) and makes ``_monitor_workers`` report UNHEALTHY for a group with a hung worker.
    """

    _worker_watchdog: FileTimerServer | None
    _pcontext: Any

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # LocalElasticAgent._setup_local_watchdog, with HangWatchdog for FileTimerServer.
        if not enabled("hang_watchdog"):
            super()._setup_local_watchdog(envs)  # type: ignore[misc]
            return
        path = os.getenv(FILE_VAR)
        if os.getenv(ENABLE_VAR) == "1":
            if path is None:
                path = os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")
            run_id = envs[0]["TORCHELASTIC_RUN_ID"] if envs else ""
            logger.info("starting the hang watchdog on %s", path)
            self._worker_watchdog = HangWatchdog(
                file_path=path,
                run_id=run_id,
                max_interval=0.1,
                daemon=True,
                log_event=self._log_watchdog_event,  # type: ignore[attr-defined]
            )
            self._worker_watchdog.start()
            logger.info("FileTimerServer started")  # torch's line
        else:
            logger.info("Environment variable '%s' not found. Do not start FileTimerServer.",
                        ENABLE_VAR)  # torch's line
        if path is not None:
            for worker_env in envs.values():
                worker_env[FILE_VAR] = path

    def _fsm_timer_hangs(self) -> list[Any]:
        """Workers whose timer expired, as ``fsm_agent.torch._hang.HungRank``s (for a spec that
        handles ``hung``: the agent delivers them as that trigger, stacks first)."""
        from fsm_agent.torch._hang import HungRank

        watchdog = self._worker_watchdog
        if not isinstance(watchdog, HangWatchdog) or self._pcontext is None:
            return []
        hung = watchdog.hung()
        if not hung:
            return []
        group = self._worker_group  # type: ignore[attr-defined]
        out = []
        for local_rank, pid in self._pcontext.pids().items():
            hang = hung.get(pid)
            if hang is None or hang.signal <= 0 or pid in self._fsm_timer_reported:
                continue
            self._fsm_timer_reported.add(pid)
            out.append(HungRank(local_rank, group.workers[local_rank].global_rank, pid, None,
                                hang.describe()))
        return out

    @property
    def _fsm_timer_reported(self) -> set[int]:
        seen: set[int] | None = self.__dict__.get("_fsm_timer_seen")
        if seen is None:
            seen = self.__dict__["_fsm_timer_seen"] = set()
        return seen

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        result: RunResult = super()._monitor_workers(worker_group)  # type: ignore[misc]
        watchdog = self._worker_watchdog
        if result.state != WorkerState.HEALTHY or not isinstance(watchdog, HangWatchdog):
            return result
        if getattr(self, "_fsm_hung_trigger", False):
            return result  # the spec's `hung` transition takes the stacks and stops the group
        hung = watchdog.hung()
        if not hung or self._pcontext is None:
            return result
        pids = self._pcontext.pids()
        hung_ranks = {r: p for r, p in pids.items()
                      if p in hung and hung[p].signal > 0 and p not in self._fsm_timer_reported}
        if not hung_ranks:
            return result
        # Stacks before the kill: every worker's, the hung one's and its peers'.
        stacks = _stacks_before_kill(self, pids, worker_group)
        failures = {}
        for local_rank, pid in hung_ranks.items():
            hang = hung[pid]
            self._fsm_timer_reported.add(pid)
            # What the worker's timer asked for; the spec's stop then finds it gone.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, hang.signal)
            failure = ProcessFailure(local_rank=local_rank, pid=pid, exitcode=-hang.signal,
                                     error_file="")
            global_rank = worker_group.workers[local_rank].global_rank
            failure.message = f"{hang.describe()}; sent {signal.Signals(hang.signal).name}" + (
                f"; {stacks[global_rank]}" if global_rank in stacks else "")
            failures[global_rank] = failure
        logger.warning(
            "[%s] worker group UNHEALTHY: rank(s) %s made no progress",
            worker_group.spec.role,
            sorted(failures),
        )
        return RunResult(state=WorkerState.UNHEALTHY, failures=failures)


def _stacks_before_kill(agent: Any, pids: dict[int, int], group: WorkerGroup) -> dict[int, str]:
    """Every worker's stacks, taken before a timer's kill (global rank -> where)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from fsm_agent.torch._hang import take_stacks

    try:
        workers = {w.local_rank: (w.global_rank, pids[w.local_rank]) for w in group.workers
                   if w.local_rank in pids}
        dumps = take_stacks(workers, dict(agent._pcontext.error_files or {}),
                            role=group.spec.role, reason="a worker's timer expired")
    except SignalException:
        raise  # a termination signal during the dumps (seconds of py-spy) is the agent's
    except Exception:  # diagnostics must never change what happens to the job
        logger.exception("[%s] could not take the workers' stacks", group.spec.role)
        return {}
    note = capability(agent, AgentHooks._fsm_note)
    if note is not None:
        note("stacks", [{"rank": r, "pid": d.pid, "path": d.path, "method": d.method,
                         "error": d.error} for r, d in dumps])
    return {r: d.describe() for r, d in dumps}
