"""Timeouts checked across layers: the spec's against the collective's, c10d's and the scheduler's.

A job's timeouts live in four places that nobody reads together: the collectives (gloo's and
NCCL's ``timeout``), the rendezvous (c10d's ``join_timeout``), the agent (the spec's parameters,
torch's stop timeout) and the scheduler (Slurm's ``KillWait`` and ``--signal`` lead, Kubernetes'
``terminationGracePeriodSeconds``). Ordered wrongly, the wrong one fires first: a hang becomes a
collective error without stacks, a drain is cut short by the scheduler's ``SIGKILL``, a node in
its backoff makes its peers' rendezvous time out. ``fsm-agent check --bounds`` checks each rule
below for the spec's parameter values (``--spec-param``) and the surrounding timeouts given as
flags (:class:`Layers`); each finding names the spec's line of the parameter it is about.

A rule whose parameters a spec does not declare does not apply to it (the torch presets have
no drain, backoff or hang detection); one that needs a flag not given (``--signal-lead``) is
reported as not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._spec import HANG_TIMEOUT_PARAM, HUNG_TRIGGER, Spec
from ._units import format_seconds

__all__ = ["KILL_MARGIN", "RULES", "Finding", "Layers", "check_timeouts", "format_findings"]

#: What the agent needs after a drain's deadline to kill what is left and exit (measured: under
#: 0.5 s on the test machine; tests/reliability/test_preemption.py), with room to spare.
KILL_MARGIN = 2.0


@attrs.frozen
class Layers:
    """The timeouts around the agent (seconds), with the defaults of torch, c10d and Slurm."""

    #: The collectives' timeout: torch's default process-group timeout (gloo: 30 min; NCCL's
    #: default is 10 min).
    collective_timeout: float = 1800.0
    #: c10d's join_timeout: how long a rendezvous waits for the nodes it needs.
    rendezvous_timeout: float = 600.0
    #: torch's stop of the workers after a signal: SIGTERM, then SIGKILL after this.
    stop_timeout: float = 30.0
    #: The scheduler's grace period between its SIGTERM and its SIGKILL (Slurm's KillWait,
    #: Kubernetes' terminationGracePeriodSeconds; both 30 s by default).
    grace: float = 30.0
    #: Slurm's ``--signal=SIG@LEAD``: how long before the time limit the warning comes (None:
    #: not given).
    signal_lead: float | None = None


@attrs.frozen
class Finding:
    """One rule's verdict for one spec: ``ok`` (None: not checked), where, and why."""

    rule: str
    ok: bool | None
    message: str
    path: str
    line: int | None = None
    element: str = ""

    def location(self) -> str:
        """``file:line: params.name`` (as the spec check prints its problems)."""
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.element}" if self.element else where

    def as_dict(self) -> dict[str, Any]:
        """For ``--format json``."""
        return {"rule": self.rule, "ok": self.ok, "message": self.message, "path": self.path,
                "line": self.line, "element": self.element}


_Verdict = tuple[str, "bool | None", str]
_Rule = Callable[[Spec, Mapping[str, Any], Layers, Callable[[], bool]], "_Verdict | None"]


def _s(seconds: float) -> str:
    return format_seconds(float(seconds))


def _drain_signals(values: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(values.get("drain_on", ()) or ())


def _drains(spec: Spec, values: Mapping[str, Any]) -> bool:
    return "preempted" in spec.triggers and bool(_drain_signals(values)) \
        and "drain_timeout" in values


def _drain_fits_grace(spec: Spec, v: Mapping[str, Any], layers: Layers,
                      gives_up: Callable[[], bool]) -> _Verdict | None:
    if not _drains(spec, v) or "SIGTERM" not in _drain_signals(v):
        return None
    need = float(v["drain_timeout"]) + KILL_MARGIN
    ok = need <= layers.grace
    return ("drain_timeout", ok,
            f"drain_timeout {_s(v['drain_timeout'])} + {_s(KILL_MARGIN)} to kill what is left "
            f"and exit {'fits in' if ok else 'exceeds'} the scheduler's grace period "
            f"{_s(layers.grace)} (--grace)" + ("" if ok else
            ": the scheduler's SIGKILL cuts the drain short; lower drain_timeout or raise "
            "KillWait / terminationGracePeriodSeconds"))


def _drain_fits_signal_lead(spec: Spec, v: Mapping[str, Any], layers: Layers,
                            gives_up: Callable[[], bool]) -> _Verdict | None:
    if not _drains(spec, v):
        return None
    if layers.signal_lead is None:
        return ("drain_timeout", None, "not checked: give Slurm's --signal lead time "
                "(--signal-lead) to check that a time limit's warning leaves room for the drain")
    need = float(v["drain_timeout"]) + KILL_MARGIN
    ok = need <= layers.signal_lead
    return ("drain_timeout", ok,
            f"drain_timeout {_s(v['drain_timeout'])} + {_s(KILL_MARGIN)} "
            f"{'fits in' if ok else 'exceeds'} the warning's lead {_s(layers.signal_lead)} "
            "(--signal-lead)" + ("" if ok else
            ": the time limit kills the job mid-drain; send the signal earlier"))


def _stop_fits_grace(spec: Spec, v: Mapping[str, Any], layers: Layers,
                     gives_up: Callable[[], bool]) -> _Verdict | None:
    if _drains(spec, v) and "SIGTERM" in _drain_signals(v):
        return None  # the scheduler's SIGTERM drains: drain-fits-grace applies instead
    ok = layers.stop_timeout <= layers.grace
    where = "drain_on" if "drain_on" in v else ""
    return (where, ok,
            f"on the scheduler's SIGTERM torch stops the workers within the stop timeout "
            f"{_s(layers.stop_timeout)} (--stop-timeout), which "
            f"{'fits in' if ok else 'exceeds'} the grace period {_s(layers.grace)} (--grace)"
            + ("" if ok else ": workers still saving are killed by the scheduler, not stopped"))


def _hang_below_collective(spec: Spec, v: Mapping[str, Any], layers: Layers,
                           gives_up: Callable[[], bool]) -> _Verdict | None:
    if HUNG_TRIGGER not in spec.triggers or HANG_TIMEOUT_PARAM not in v:
        return None
    timeout = float(v[HANG_TIMEOUT_PARAM])
    if not math.isfinite(timeout):
        return None
    # a hang is reported at most one sample period (a tenth, within 0.05-5 s) after the timeout
    reported = timeout + min(5.0, max(0.05, timeout / 10.0))
    ok = reported < layers.collective_timeout
    return (HANG_TIMEOUT_PARAM, ok,
            f"a hang is detected {_s(reported)} after it begins (hang_timeout "
            f"{_s(timeout)} + one sample), {'before' if ok else 'not before'} the collective "
            f"timeout {_s(layers.collective_timeout)} (--collective-timeout)"
            + ("" if ok else ": blocked ranks fail with a collective timeout first, without "
               "their stacks; lower hang_timeout"))


def _backoff_below_join(spec: Spec, v: Mapping[str, Any], layers: Layers,
                        gives_up: Callable[[], bool]) -> _Verdict | None:
    if "backoff_max" not in v:
        return None
    longest = float(v["backoff_max"]) * (1.0 + float(v.get("backoff_jitter", 0.0)))
    ok = longest < layers.rendezvous_timeout
    return ("backoff_max", ok,
            f"the longest backoff {_s(longest)} (backoff_max with its jitter) is "
            f"{'shorter' if ok else 'not shorter'} than the rendezvous timeout "
            f"{_s(layers.rendezvous_timeout)} (--rdzv-timeout)"
            + ("" if ok else ": the nodes that already joined time out waiting for one still "
               "in its backoff"))


def _health_below_join(spec: Spec, v: Mapping[str, Any], layers: Layers,
                       gives_up: Callable[[], bool]) -> _Verdict | None:
    from ._health import health_budget

    budget = health_budget(spec, v)
    if not budget:
        return None
    total = sum(budget.values())
    ok = total < layers.rendezvous_timeout
    where = next((f"{p}" for p in ("health_command_timeout",) if p in v), "")
    return (where, ok,
            f"the health checks before a (re)join may take {_s(total)} "
            f"({', '.join(f'{k} {_s(t)}' for k, t in sorted(budget.items()))}), "
            f"{'less' if ok else 'not less'} than the rendezvous timeout "
            f"{_s(layers.rendezvous_timeout)} (--rdzv-timeout)"
            + ("" if ok else ": the nodes that already joined time out waiting for this one"))


def _restarts_give_up(spec: Spec, v: Mapping[str, Any], layers: Layers,
                      gives_up: Callable[[], bool]) -> _Verdict | None:
    window = spec.budget.window.name
    if window is None or window not in v or not math.isfinite(float(v[window])):
        return None
    ok = gives_up()
    return (window, ok,
            f"with {window} {_s(v[window])}, the slowest crash loop "
            f"{'gives up' if ok else 'never gives up'} (each restart, with the rendezvous "
            "timeout and the stop timeout, is counted within the window)"
            + ("" if ok else ": restarts leave the window as fast as they are counted; "
               "lengthen it"))


def _exit_codes_distinct(spec: Spec, v: Mapping[str, Any], layers: Layers,
                         gives_up: Callable[[], bool]) -> _Verdict | None:
    import signal

    codes: dict[str, int] = {}
    for name in ("no_requeue_exit_code", "unhealthy_exit_code"):
        if isinstance(v.get(name), int):
            codes[name] = int(v[name])
    if _drains(spec, v):
        fixed = int(v.get("preempted_exit_code", 0) or 0)
        for sig in _drain_signals(v):
            code = fixed or 128 + int(signal.Signals[sig])
            codes[f"a drain on {sig}"] = code
    if len(codes) < 2:
        return None
    seen: dict[int, str] = {}
    clash = None
    for what, code in codes.items():
        if code in seen and not (what.startswith("a drain") and seen[code].startswith("a drain")):
            clash = (seen[code], what, code)
            break
        seen.setdefault(code, what)
    where = "preempted_exit_code" if "preempted_exit_code" in v else "no_requeue_exit_code"
    if clash is None:
        listed = ", ".join(f"{w} {c}" for w, c in codes.items())
        return (where, True, f"the exit codes a scheduler acts on are distinct ({listed})")
    return (where, False, f"{clash[0]} and {clash[1]} both exit {clash[2]}: the scheduler "
            "cannot tell a requeue from a failure or a lost node")


#: The rules, by name: each returns (the parameter it is about, ok, why), or None if it does not
#: apply to the spec.
RULES: dict[str, _Rule] = {
    "drain-fits-grace": _drain_fits_grace,
    "drain-fits-signal-lead": _drain_fits_signal_lead,
    "stop-fits-grace": _stop_fits_grace,
    "hang-below-collective": _hang_below_collective,
    "backoff-below-join": _backoff_below_join,
    "health-below-join": _health_below_join,
    "restarts-give-up": _restarts_give_up,
    "exit-codes-distinct": _exit_codes_distinct,
}


def check_timeouts(spec: Spec, values: Mapping[str, Any], layers: Layers,
                   gives_up: bool = True) -> list[Finding]:
    """Every rule that applies to ``spec`` with parameter ``values`` (all bound); ``gives_up``
    says whether the slowest crash loop gives up (``fsm_agent._core._bounds``)."""
    lines = {p.name: p.line for p in spec.params}
    out = []
    for name, rule in RULES.items():
        found = rule(spec, values, layers, lambda: gives_up)
        if found is None:
            continue
        param, ok, message = found
        out.append(Finding(name, ok, message, spec.path, lines.get(param) if param else None,
                           f"params.{param}" if param else ""))
    return out


def format_findings(findings: list[Finding], layers: Layers,
                    show: Callable[[str], str] = str) -> str:
    """The table under a spec's bounds: one line per rule, ``ok``, ``FAIL`` or ``--``
    (``show`` prints a spec's path)."""
    lines = [f"timeouts across layers: collective {_s(layers.collective_timeout)}, rendezvous "
             f"{_s(layers.rendezvous_timeout)}, stop {_s(layers.stop_timeout)}, grace "
             f"{_s(layers.grace)}, signal lead "
             f"{'not given' if layers.signal_lead is None else _s(layers.signal_lead)}"]
    if not findings:
        lines.append("  no rule applies to this spec")
    for f in findings:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[f.ok]
        where = f" {attrs.evolve(f, path=show(f.path)).location()}:" if f.ok is False else ""
        lines.append(f"  {mark} {f.rule}:{where} {f.message}")
    return "\n".join(lines)
