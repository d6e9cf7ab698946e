"""The built-in parameterised guards and actions: failure matchers, budgets, combinators.

Failure matchers read the observed ``RunResult.failures`` (global rank -> torch's
``ProcessFailure``: ``exitcode``, negative for a signal, and the error file's ``message``), so a
spec can decide on *why* a group failed. Each factory takes its arguments already resolved (the
values of parameters in force) and returns a plain ``guard(ctx) -> bool``; a bad argument raises
``ValueError``, which the spec check reports at the argument's line.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._context import Context, Guard, Kind
from ._context import KindExample as E

__all__ = ["ACTION_KINDS", "GUARD_KINDS", "error_type", "exit_code", "signal_name",
           "stopped_by_torch"]

_RANKS = ("all", "any")
_TYPE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?::|$)")


def exit_code(failure: Any) -> int | None:
    """A failure's exit code (negative: killed by that signal), None if it has none."""
    code = getattr(failure, "exitcode", None)
    return code if isinstance(code, int) else None


def signal_name(failure: Any) -> str | None:
    """``SIGKILL`` for a failure killed by signal 9, None if no signal killed it."""
    code = exit_code(failure)
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"SIG{-code}"


def error_type(failure: Any) -> str | None:
    """The exception type recorded in the worker's error file (``"ValueError: ..."``)."""
    message = getattr(failure, "message", None)
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str):
        return None
    m = _TYPE.match(message)
    return m.group(1) if m else None


def stopped_by_torch(failure: Any) -> bool:
    """Whether the rank ended by SIGTERM: what torch sends the other ranks once one failed, and
    then lists among the failures too."""
    return exit_code(failure) == -signal.SIGTERM


def _failures(ctx: Context) -> list[Any]:
    """The ranks that failed. When one rank fails, torch stops the others with SIGTERM and
    lists them among the failures too (exit code -15): those are left out unless every listed
    rank ended by SIGTERM (then something else sent it, and they are the failure)."""
    failures = getattr(ctx.observed, "failures", None)
    if not failures:
        return []
    listed = list(failures.values())
    own = [f for f in listed if not stopped_by_torch(f)]
    return own or listed


def _matcher(values: Iterable[Any], ranks: str, key: Callable[[Any], Any]) -> Guard:
    wanted = frozenset(values)
    pick = all if ranks == "all" else any

    def guard(ctx: Context) -> bool:
        failures = _failures(ctx)
        return bool(failures) and pick(key(f) in wanted for f in failures)

    return guard


def _exit_code_in(codes: Sequence[int], ranks: str = "all") -> Guard:
    return _matcher(codes, ranks, exit_code)


def _exit_code_not_in(codes: Sequence[int], ranks: str = "all") -> Guard:
    listed = frozenset(codes)

    def guard(ctx: Context) -> bool:
        failures = _failures(ctx)
        pick = all if ranks == "all" else any
        return bool(failures) and pick(exit_code(f) not in listed for f in failures)

    return guard


def _signal_in(signals: Sequence[str], ranks: str = "all") -> Guard:
    names = []
    for s in signals:
        name = s.upper() if s.upper().startswith("SIG") else "SIG" + s.upper()
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {s!r}")
        names.append(name)
    return _matcher(names, ranks, signal_name)


def _error_type_in(types: Sequence[str], ranks: str = "all") -> Guard:
    short = frozenset(t.rsplit(".", 1)[-1] for t in types)

    def key(f: Any) -> str | None:
        name = error_type(f)
        return None if name is None else name.rsplit(".", 1)[-1]

    return _matcher(short, ranks, key)


def _failed_ranks_at_least(count: int) -> Guard:
    return lambda ctx: len(_failures(ctx)) >= count


def _attempt_shorter_than(duration: float) -> Guard:
    def guard(ctx: Context) -> bool:
        started = ctx.attempt_started
        return started is not None and ctx.clock.now() - started < duration

    return guard


def _restarts_in_window_at_least(count: int, window: float) -> Guard:
    def guard(ctx: Context) -> bool:
        horizon = ctx.clock.now() - window
        return sum(1 for t in ctx.restart_times if t > horizon) >= count

    return guard


def _consecutive_failures_at_least(count: int, min_uptime: float) -> Guard:
    def guard(ctx: Context) -> bool:
        recent = ctx.failed_attempts[-count:] if count > 0 else []
        return len(recent) >= count and all(d < min_uptime for d in recent)

    return guard


def _all_of(guards: Sequence[str]) -> Guard:
    return lambda ctx: all(ctx.check(g) for g in guards)


def _any_of(guards: Sequence[str]) -> Guard:
    return lambda ctx: any(ctx.check(g) for g in guards)


def _not(guard: str) -> Guard:
    return lambda ctx: not ctx.check(guard)


def _set_exit_code(code: int) -> Callable[[Context], None]:
    if not 0 < code < 256:
        raise ValueError(f"an exit code is between 1 and 255, got {code}")

    def action(ctx: Context) -> None:
        ctx.exit_code = code

    return action


_RANKS_ARG = {"ranks": _RANKS}


def _listed(key: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool]:
    """``implies`` of a matcher on a list: its values a subset of the earlier one's, over the
    same or fewer ranks."""
    def implies(mine: Mapping[str, Any], earlier: Mapping[str, Any]) -> bool:
        ranks_ok = not (mine.get("ranks") == "any" and earlier.get("ranks", "all") == "all")
        # An empty list matches no failure: the rule is off until its parameter is set, not
        # shadowed (two such rules are independent switches).
        values = set(mine[key])
        return ranks_ok and bool(values) and values <= set(earlier[key])
    return implies


def _at_least(*keys: str, at_most: tuple[str, ...] = ()) -> Callable[
        [Mapping[str, Any], Mapping[str, Any]], bool]:
    """``implies`` of a threshold: each of ``keys`` at least the earlier one's, each of
    ``at_most`` at most."""
    def implies(mine: Mapping[str, Any], earlier: Mapping[str, Any]) -> bool:
        return (all(mine[k] >= earlier[k] for k in keys)
                and all(mine[k] <= earlier[k] for k in at_most))
    return implies

# Examples' failed ranks: what torch lists when rank 0 exited 3 and it stopped rank 1 (SIGTERM).
_CODE_3 = ({"exitcode": 3},)
_CODE_3_STOPPED = ({"exitcode": 3}, {"exitcode": -15})
_CODES_3_1 = ({"exitcode": 3}, {"exitcode": 1})
_KILLED = ({"exitcode": -9},)
_OOM = ({"exitcode": 1, "message": "torch.OutOfMemoryError: CUDA out of memory"},)
_CHOICES = {"g": True, "h": False}

GUARD_KINDS: dict[str, Kind] = {
    "exit_code_in": Kind(
        _exit_code_in, {"codes": "int_list", "ranks": "str"}, "codes", {"ranks": "all"},
        _RANKS_ARG, implies=_listed("codes"),
        description="there is a failure and every (any) failed rank exited with one of the codes",
        examples=(E([3, 4], True, _CODE_3), E([3], True, _CODE_3_STOPPED),
                  E([3], False, _CODES_3_1), E({"codes": [3], "ranks": "any"}, True, _CODES_3_1),
                  E([3], False), E([], False, _CODE_3))),
    "exit_code_not_in": Kind(
        _exit_code_not_in, {"codes": "int_list", "ranks": "str"}, "codes", {"ranks": "all"},
        _RANKS_ARG,
        description="there is a failure and every (any) failed rank exited with a code not "
        "listed",
        examples=(E([1], True, _CODE_3), E([1], False, _CODES_3_1),
                  E({"codes": [1], "ranks": "any"}, True, _CODES_3_1), E([1], False),
                  # every listed rank ended by SIGTERM: something else sent it, they failed
                  E([3], True, ({"exitcode": -15}, {"exitcode": -15})))),
    "signal_in": Kind(
        _signal_in, {"signals": "str_list", "ranks": "str"}, "signals", {"ranks": "all"},
        _RANKS_ARG, implies=_listed("signals"),
        description="every (any) failed rank was killed by one of the signals (`KILL` or "
        "`SIGKILL`)",
        examples=(E(["KILL", "SIGSEGV"], True, _KILLED), E(["SIGKILL"], False, _CODE_3),
                  E(["SIGKILL"], False, ({"exitcode": -9}, {"exitcode": 1})),
                  E({"signals": ["SIGKILL"], "ranks": "any"}, True,
                    ({"exitcode": -9}, {"exitcode": 1})),
                  # a rank torch stopped is not a failed one
                  E(["SIGTERM"], False, _CODE_3_STOPPED))),
    "error_type_in": Kind(
        _error_type_in, {"types": "str_list", "ranks": "str"}, "types", {"ranks": "all"},
        _RANKS_ARG, implies=_listed("types"),
        description="the exception type recorded in the error file (`\"ValueError: ...\"`) is "
        "listed (a name matches its last dotted part)",
        examples=(E(["torch.OutOfMemoryError"], True, _OOM), E(["OutOfMemoryError"], True, _OOM),
                  E(["ValueError"], False, _OOM), E(["ValueError"], False, _CODE_3))),
    "failed_ranks_at_least": Kind(
        _failed_ranks_at_least, {"count": "int"}, "count", implies=_at_least("count"),
        description="at least `count` ranks failed (ranks torch stopped are not counted)",
        examples=(E(2, True, _CODES_3_1), E(2, False, _CODE_3_STOPPED), E(1, True, _CODE_3),
                  E(1, False))),
    "attempt_shorter_than": Kind(
        _attempt_shorter_than, {"duration": "duration"}, "duration",
        implies=_at_least(at_most=("duration",)),
        description="the attempt (time since the workers were last started) is shorter: a "
        "crash at start-up",
        examples=(E("10s", True, _CODE_3, {"attempt_started": 100.0}, now=105.0),
                  E("10s", False, _CODE_3, {"attempt_started": 100.0}, now=111.0),
                  E("10s", False, _CODE_3, {"attempt_started": None}, now=105.0))),
    "restarts_in_window_at_least": Kind(
        _restarts_in_window_at_least, {"count": "int", "window": "duration"},
        implies=_at_least("count", at_most=("window",)),
        description="at least `count` failure restarts happened in the last `window` (MaxR "
        "in MaxT)",
        examples=(E({"count": 2, "window": "1m"}, True, context={"restart_times": [50.0, 90.0]},
                    now=100.0),
                  E({"count": 2, "window": "1m"}, False, context={"restart_times": [30.0, 90.0]},
                    now=100.0))),
    "consecutive_failures_at_least": Kind(
        _consecutive_failures_at_least, {"count": "int", "min_uptime": "duration"},
        implies=_at_least("count", at_most=("min_uptime",)),
        description="the last `count` attempts (this one included) each failed within "
        "`min_uptime` of starting",
        examples=(E({"count": 2, "min_uptime": "1m"}, True,
                    context={"failed_attempts": [600.0, 5.0, 20.0]}),
                  E({"count": 2, "min_uptime": "1m"}, False,
                    context={"failed_attempts": [5.0, 600.0, 20.0]}),
                  E({"count": 2, "min_uptime": "1m"}, False, context={"failed_attempts": [5.0]}))),
    "all_of": Kind(_all_of, {"guards": "guard_list"}, "guards",
                   description="every listed guard holds",
                   examples=(E(["g"], True, guards=_CHOICES),
                             E(["g", "h"], False, guards=_CHOICES))),
    "any_of": Kind(_any_of, {"guards": "guard_list"}, "guards",
                   description="at least one listed guard holds",
                   examples=(E(["g", "h"], True, guards=_CHOICES),
                             E(["h"], False, guards=_CHOICES))),
    "not": Kind(_not, {"guard": "guard"}, "guard", description="the guard does not hold",
                examples=(E("h", True, guards=_CHOICES), E("g", False, guards=_CHOICES))),
}

ACTION_KINDS: dict[str, Kind] = {
    "set_exit_code": Kind(_set_exit_code, {"code": "int"}, "code",
                          description="the exit code (1 to 255) the job ends with if it "
                          "fails: `fsm-agent run`'s, and `Lifecycle.exit_code`"),
}
