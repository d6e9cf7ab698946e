"""The agent's diagnostics: a hang made the group's failure, the stacks taken, and the notes
(``diagnostics``) that the trace's next record carries."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

from fsm_agent._core._progress import note_attempt_end
from fsm_agent._core._spec import HUNG_TRIGGER
from fsm_agent.torch._hang import (
    HungRank,
    encode_suspects,
    find_suspects,
    hang_failures,
    merge_suspects,
    take_stacks,
)
from fsm_agent.trace._schema import DIAGNOSTICS

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerGroup

    from fsm_agent import Lifecycle
    from fsm_agent.torch._job import AgentJob
    from fsm_agent.torch._progress import HangDetector

__all__ = ["DiagnosticsMixin"]

logger = logging.getLogger("fsm_agent.torch")

#: How long a node of several waits for the other nodes' parts of the suspects: three sample
#: periods, within these bounds (seconds). The others find the hang up to about a sample period
#: and a monitor interval later, then take their ranks' stacks (a py-spy dump each) before they
#: share theirs; a floor of 2 s was once too short for that on a quiet 2-core machine, and the
#: node that waits out the bound named no suspect.
SUSPECTS_WAIT = (5.0, 15.0)


class DiagnosticsMixin:
    """The diagnostics part of ``LifecycleAgentMixin`` (one of its bases): hang reports, stack
    captures and the trace's ``diagnostics`` records."""

    # set by LifecycleAgentMixin
    _worker_group: WorkerGroup
    _lifecycle: Lifecycle | None
    _fsm_hangs: HangDetector | None
    _fsm_diagnostics: dict[str, Any] | None
    _fsm_job: AgentJob | None

    def _fsm_report_hang(self, hung: list[HungRank], *, source: str) -> str | None:
        """Make the observation UNHEALTHY with the hung ranks' failures and return ``hung``."""
        lifecycle = self._lifecycle
        if lifecycle is None or not lifecycle.spec.outgoing(lifecycle.state_name, HUNG_TRIGGER):
            return None
        if self._fsm_hangs is not None:
            self._fsm_hangs.clear()  # once per attempt: the spec decides what follows
        role = self._worker_group.spec.role
        error_files = dict(getattr(getattr(self, "_pcontext", None), "error_files", {}) or {})
        lifecycle.context.observed = RunResult(state=WorkerState.UNHEALTHY,
                                               failures=hang_failures(hung, error_files))
        note_attempt_end(lifecycle.context)  # a hung attempt may have made no progress either
        detector = self._fsm_hangs
        self._fsm_note("hang", {
            "source": source,
            "timeout_s": detector.timeout if detector is not None else None,
            "sample_period_s": detector.period if detector is not None else None,
            "workers": [h.as_dict() for h in hung],
        })
        logger.warning("[%s] worker group hung: rank(s) %s (%s)", role,
                       sorted(h.global_rank for h in hung), hung[0].description)
        return HUNG_TRIGGER

    def _fsm_note(self, key: str, value: Any) -> None:
        if key not in DIAGNOSTICS:  # the readers know only the declared records
            raise ValueError(f"undeclared diagnostics record {key!r} (fsm_agent.trace._schema)")
        if self._fsm_diagnostics is None:
            self._fsm_diagnostics = {}
        self._fsm_diagnostics[key] = value

    def _fsm_note_health(self, result: Any) -> None:
        checks = (self._fsm_diagnostics or {}).get("health", {}).get("checks", [])
        checks = [*checks, result.as_dict()]
        failed = [c for c in checks if not c["ok"]]
        self._fsm_note("health", {"ok": not failed, "checks": checks,
                                  "reason": f"{failed[0]['name']}: {failed[0]['reason']}"
                                  if failed else None})

    def trace_fields(self) -> dict[str, Any]:
        """Fields for the trace's next record (a ``JsonlTraceWriter``'s ``dynamic``): the group
        rank, and ``diagnostics`` (a hang, the stacks taken, health checks) once, on the record
        of the step they belong to."""
        out: dict[str, Any] = {}
        group = getattr(self, "_worker_group", None)
        if group is not None:
            out["group_rank"] = group.group_rank
        if self._fsm_diagnostics:
            out["diagnostics"], self._fsm_diagnostics = self._fsm_diagnostics, None
        return out

    def _fsm_capture_stacks(self) -> None:
        """Dump every running worker's stacks (the ``capture_stacks`` action)."""
        pcontext = getattr(self, "_pcontext", None)
        group = self._worker_group
        role = group.spec.role
        if pcontext is None:
            logger.warning("[%s] capture_stacks: no workers to take stacks of", role)
            return
        pids = pcontext.pids()
        workers = {w.local_rank: (w.global_rank, pids[w.local_rank]) for w in group.workers
                   if w.local_rank in pids}
        lifecycle = self._lifecycle
        observed = lifecycle.context.observed if lifecycle is not None else None
        failures = dict(getattr(observed, "failures", None) or {})
        hung = "hang" in (self._fsm_diagnostics or {})
        reason = "the group hung" if hung else f"observed {getattr(observed, 'state', '?')}"
        dumps = take_stacks(workers, dict(pcontext.error_files or {}), role=role, reason=reason)
        found = find_suspects(dumps) if hung else None
        job = self._fsm_job
        nodes = group.group_world_size or 1
        if found is not None and job is not None and nodes > 1:
            # the other nodes found their hang within about a sample of this one: the job's
            # suspects are in every node's part
            period = self._fsm_hangs.period if self._fsm_hangs is not None else 1.0
            low, high = SUSPECTS_WAIT
            found = merge_suspects(job.pool_notes("suspects", encode_suspects(found), nodes,
                                                  min(high, max(low, 3 * period))))
        for rank, dump in dumps:
            failure = failures.get(rank)
            if failure is not None and isinstance(getattr(failure, "message", None), str):
                where = found.about(rank) if found is not None else ""
                failure.message = f"{failure.message}{where}; {dump.describe()}"
        self._fsm_note("stacks", [
            {"rank": rank, "pid": d.pid, "path": d.path, "method": d.method, "error": d.error}
            for rank, d in dumps])
        if found is not None and found.summary:
            logger.warning("[%s] %s", role, found.summary)
            self._fsm_note("suspects", found.as_dict())
            if observed is not None and found.suspects and failures:
                # the suspects first: the root cause of a hang is the rank the others wait for
                first = [r for r in failures if r in found.suspects]
                observed.failures = {r: failures[r] for r in
                                     [*first, *(r for r in failures if r not in first)]}
