"""Replay checks of what a spec's policy decided: the rule that matched and the timers set.

A trace records on every step the failure-policy rule whose transition was taken (``rule``) and
the timer set on entering the destination (``timer``); the header records the parameters in
force. ``PolicyCheck`` checks them against the spec, one lifecycle at a time:

- the rule recorded is the rule of the transition the spec takes (None for a plain transition);
- a timer is recorded exactly when the step enters a state that has a timeout;
- a fixed timeout equals its value in force; a backoff lies within the jitter of a term of its
  sequence, the term that follows the previous entry's (or the first again, after a reset);
- ``timeout`` only fires in a state that has a timer.

Traces written before rules and timers were recorded (no ``rule``/``timer`` fields) are not
checked for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._core._errors import SpecError
from .._core._params import Ref, format_value
from .._core._spec import TIMEOUT_TRIGGER, BackoffSpec, Spec, TimeoutSpec
from .._core._spec import TransitionSpec as Transition
from .._core._units import format_plain_seconds
from ._reader import Trace, TraceRecord
from ._writer import param_text

__all__ = ["PolicyCheck"]

# Backoff terms followed exactly; a sequence still growing after this many (a factor a hair
# above 1) is checked against the range of its terms only.
_MAX_TERMS = 10_000
_REL = 1e-9


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=_REL, abs_tol=1e-12)


class _Backoff:
    """One backoff state's terms, and which of them the next entry may draw."""

    def __init__(self, b: BackoffSpec, values: Mapping[str, Any]) -> None:
        self.initial, self.factor, self.cap, self.jitter, self.reset_after = (
            float(r.resolve(values)) for r in (b.initial, b.factor, b.max, b.jitter,
                                               b.reset_after))
        self.on_progress = bool(b.reset_on_progress.resolve(values))
        self.terms: list[float] = []
        self.last: int | None = None  # index from which every term is the same
        for n in range(_MAX_TERMS + 1):
            self.terms.append(self._term(n))
            if n and self.terms[n] == self.terms[n - 1] and self._term(n + 1) == self.terms[n]:
                self.last = n - 1
                break
        # The next entry's possible term numbers; None: unknown (a trace continued from a
        # rotated file, or a sequence too long to follow).
        self.next: set[int] | None = {0} if self.last is not None else None

    def _term(self, n: int) -> float:
        try:
            return min(self.cap, self.initial * self.factor**n)
        except OverflowError:
            return self.cap

    def _range(self, n: int) -> tuple[float, float]:
        t = self.terms[n]
        if math.isinf(t):
            return t, t
        return max(0.0, t * (1 - self.jitter)), t * (1 + self.jitter)

    def _fits(self, value: float, n: int) -> bool:
        lo, hi = self._range(n)
        if math.isinf(hi):
            return math.isinf(value)
        return (lo <= value or _close(lo, value)) and (value <= hi or _close(hi, value))

    def _shown(self, n: int) -> str:
        lo, hi = self._range(n)
        if lo == hi:
            return format_plain_seconds(lo)
        return f"{format_plain_seconds(lo)[:-2]} to {format_plain_seconds(hi)}"

    def enter(self, value: float) -> str | None:
        """Take one entry's delay; a message saying what was allowed if it does not fit."""
        resets = not math.isinf(self.reset_after) or self.on_progress
        if self.next is None:
            candidates = set(range(len(self.terms)))
        else:
            candidates = set(self.next) | ({0} if resets else set())
        matching = {n for n in candidates if self._fits(value, n)}
        if not matching:
            if self.next is None:
                lo = min(self._range(n)[0] for n in candidates)
                hi = max(self._range(n)[1] for n in candidates)
                return (f"the backoff lies between {format_plain_seconds(lo)} and "
                        f"{format_plain_seconds(hi)}")
            allowed = [f"{self._shown(n)} ({_ordinal(n + 1)} backoff in a row)"
                       for n in sorted(self.next)]
            if resets and 0 not in self.next:
                why = (f"a healthy attempt of {format_plain_seconds(self.reset_after)} or more"
                       if not math.isinf(self.reset_after) else "an attempt that made progress")
                allowed.append(f"{self._shown(0)} (after {why} resets it)")
            return "the backoff allows " + " or ".join(allowed)
        if self.last is not None:
            self.next = {min(n + 1, self.last) for n in matching}
        return None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class PolicyCheck:
    """The rule, timer and budget checks of one lifecycle's replay (see the module docstring).

    ``problem`` is set when the trace's header records parameters the spec cannot take.
    """

    def __init__(self, spec: Spec, trace: Trace, params: Mapping[str, Any] | None = None
                 ) -> None:
        self.spec = spec
        self.problem: str | None = None
        self.values: dict[str, Any] = dict(spec.defaults)
        recorded: Mapping[str, Any] | None = trace.params if params is None else params
        if recorded:
            # Parameters the spec does not declare belong to the spec the trace was recorded
            # with (replayed here against another); only the spec's own are bound.
            known = {p.name for p in spec.params}
            try:
                self.values = spec.bind({k: v for k, v in recorded.items() if k in known})
            except SpecError as e:
                whose = "the trace header's" if params is None else "the given"
                self.problem = (f"{whose} parameters do not fit spec {spec.name!r}: "
                                + "; ".join(p.message for p in e.problems))
        first = trace.records[0] if trace.records else None
        if first is not None and "continues" not in trace.header and first.trigger == "start":
            # Before any restart the budget is whole: the agent's --max-restarts.
            self.values["max_restarts"] = (int(first.data["remaining_restarts"])
                                           + int(first.data["restart_count"]))
        self.window = self._resolve(spec.budget.window)
        self._backoffs: dict[str, _Backoff] = {}
        continued = "continues" in trace.header
        for s in spec.states:
            if s.timeout is not None and s.timeout.backoff is not None:
                try:
                    b = _Backoff(s.timeout.backoff, self.values)
                except (KeyError, TypeError, ValueError):
                    continue
                if continued:
                    b.next = None
                self._backoffs[s.name] = b

    @property
    def params(self) -> dict[str, str]:
        """The spec's parameters in force, in the spec's syntax."""
        return {p.name: param_text(p.type, self.values[p.name]) for p in self.spec.params
                if p.name in self.values}

    @property
    def max_restarts(self) -> int | None:
        value = self.values.get("max_restarts")
        return value if isinstance(value, int) else None

    def _resolve(self, ref: Ref) -> float | None:
        try:
            return float(ref.resolve(self.values))
        except (KeyError, TypeError, ValueError):
            return None  # a value the trace does not record (exit_barrier_timeout)

    def _ref_text(self, ref: Ref, value: float) -> str:
        if ref.name is None:
            return format_plain_seconds(value)
        return f"{ref.name} = {format_plain_seconds(value)}"

    def check_timeout(self, rec: TraceRecord, where: str) -> str | None:
        """``timeout`` fires only in a state that has a timer."""
        if rec.trigger != TIMEOUT_TRIGGER:
            return None
        try:
            state = self.spec.state(rec.source)
        except KeyError:
            return None  # the step check names the unknown state
        if state.timeout is None:
            return (f"{where}: 'timeout' fired in {rec.source}, which has no timer (spec "
                    f"{self.spec.name!r} declares no timeout on it)")
        return None

    def check(self, rec: TraceRecord, chosen: Transition, where: str) -> str | None:
        """The rule and the timer of a step that took ``chosen``."""
        if "rule" in rec.data and rec.rule != chosen.rule:
            vals = ", ".join(f"{k}={v}" for k, v in rec.guards) or "no guards"
            if chosen.rule is None:
                return (f"{where}: the trace says rule {rec.rule!r} decided, but with {vals} the "
                        f"spec takes a plain transition (line {chosen.line}), no failure-policy "
                        "rule")
            if rec.rule is None:
                return (f"{where}: the trace names no rule, but with {vals} the spec's rule "
                        f"{chosen.rule!r} (line {chosen.line}) decides")
            return (f"{where}: the trace says rule {rec.rule!r} decided, but with {vals} the "
                    f"spec's rule {chosen.rule!r} (line {chosen.line}) decides")
        if "timer" not in rec.data or rec.dest != chosen.dest:
            return None
        return self._check_timer(rec, where)

    def _check_timer(self, rec: TraceRecord, where: str) -> str | None:
        dest = rec.dest or rec.source
        timeout: TimeoutSpec | None = self.spec.state(dest).timeout
        entered = dest != rec.source and rec.error is None
        recorded = rec.timer
        if timeout is None or not entered:
            if recorded is None:
                return None
            why = (f"stays in {dest}, which keeps its timer running" if timeout is not None
                   and dest == rec.source else f"{dest} has no timeout" if timeout is None
                   else "the step ended in an error")
            return (f"{where}: the trace recorded a timer of {format_plain_seconds(recorded)} "
                    f"entering {dest}, but {why}")
        if recorded is None:
            return (f"{where}: entering {dest} sets its timer ({timeout}), but the trace "
                    "recorded none")
        if timeout.backoff is None:
            assert timeout.after is not None
            want = self._resolve(timeout.after)
            if want is not None and not _close(recorded, want):
                return (f"{where}: entering {dest} set a timer of "
                        f"{format_plain_seconds(recorded)}, but its timeout is "
                        f"{self._ref_text(timeout.after, want)} (the value in force)")
            return None
        backoff = self._backoffs.get(dest)
        if backoff is None:
            return None
        allowed = backoff.enter(recorded)
        if allowed is None:
            return None
        b = timeout.backoff
        terms = ", ".join(f"{k} {r.name + ' = ' if r.name else ''}{shown(v)}"
                          for k, r, v, shown in (("initial", b.initial, backoff.initial,
                                                  format_plain_seconds),
                                                 ("factor", b.factor, backoff.factor,
                                                  format_value),
                                                 ("max", b.max, backoff.cap,
                                                  format_plain_seconds),
                                                 ("jitter", b.jitter, backoff.jitter,
                                                  format_value)))
        return (f"{where}: entering {dest} set a backoff of {format_plain_seconds(recorded)}, "
                f"but {allowed} ({terms})")
