"""Trace validation: the membership a real multi-node test's agents went through, read off their
logs, is checked by TLC to be a behaviour of specs/model/Membership.tla (MembershipTrace.tla;
docs/job-protocol.md, "Membership", "Trace validation").

What is read, from every ``fsm-agent run`` agent of one :class:`fsm_test_procs.Jobs`:

- each completed round of torch's rendezvous, 0, 1, ...: the slot map the node that marked it
  complete logged (``rendezvous round K: stable slots DESC=SLOT, ...``, torch/_slots.py);
- the nodes quarantined (exit 75, ``left the job: quarantined``), and when (before which round);
- the nodes lost: the agents the test SIGKILLed (exit -9: call this before the fixture's cleanup);
- whether the job succeeded: every agent of the last round exited 0.

A node is torch's node descriptor ``ADDR_PID_LOCALID`` (the agent's pid); nodes are numbered
1..k in torch's order of descriptors (``_NodeDesc``: addr, then pid, then local id), the order
assign_slots fills free slots in. Agents that never took part in a round nor were lost or
quarantined (a refused rejoin, a spare never needed) are left out.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from fsm_agent.testing._model_check import ModelError, TLCResult, check_model, find_tla2tools

#: Seconds TLC may take on one trace (it takes a second or two).
TLC_TIMEOUT = 60.0

_STAMP = r"[IWE]\d{4} (?P<time>\d\d:\d\d:\d\d\.\d+) (?P<pid>\d+) "
_SLOTS = re.compile(_STAMP + r"fsm_agent/torch/_slots\.py:\d+\] rendezvous round (?P<round>\d+): "
                    r"stable slots (?P<map>.*)$", re.M)
_LOST = re.compile(_STAMP + r".*lost node\(s\) of the job: (?P<nodes>.*?) \(their agent's", re.M)
_QUARANTINED = re.compile(_STAMP + r"fsm_agent/_quarantine\.py:\d+\] \[\w+\] quarantined: ", re.M)
_DESC = re.compile(r"(?P<addr>[\w.\-:\[\]]+?)_(?P<pid>\d+)_(?P<local>\d+)\b")


def _seconds(stamp: str) -> float:
    t = datetime.strptime(stamp, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def _sort_key(desc: str) -> tuple[str, int, int]:
    m = _DESC.fullmatch(desc)
    assert m, desc
    return m["addr"], int(m["pid"]), int(m["local"])


@dataclass
class Round:
    """One completed round: its slot map(s) (descriptor -> slot), the nodes quarantined before
    it, and the lost nodes a survivor noticed before it."""

    maps: list[dict[str, int]]
    quarantined: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)


@dataclass
class Run:
    """What the agents of one test went through, as the model's constants."""

    nodes: list[str]  # torch's order: node i + 1 of the model is nodes[i]
    n: int
    quarantine_after: int
    rounds: list[Round]
    lost: set[str]
    quarantined: set[str]
    succeeded: bool

    def module(self) -> str:
        """The trace as a TLA+ module extending MembershipTrace."""
        index = {d: i + 1 for i, d in enumerate(self.nodes)}

        def nodeset(ds: set[str]) -> str:
            return "{" + ", ".join(str(index[d]) for d in sorted(ds, key=_sort_key)) + "}"

        def tup(m: dict[str, int]) -> str:
            return "<<" + ", ".join(str(m.get(d, -1)) for d in self.nodes) + ">>"

        rounds = ",\n    ".join(
            f"[maps |-> {{{', '.join(tup(m) for m in r.maps)}}}, "
            f"quarantined |-> {nodeset(r.quarantined)}, lost |-> {nodeset(r.lost)}]"
            for r in self.rounds)
        legend = "\n".join(f"\\* node {i + 1}: {d}" for i, d in enumerate(self.nodes))
        return (f"---- MODULE MembershipTraceRun ----\nEXTENDS MembershipTrace\n{legend}\n"
                f"RunTrace == <<\n    {rounds}>>\n"
                f"RunLost == {nodeset(self.lost)}\n"
                f"RunQuarantined == {nodeset(self.quarantined)}\n====\n")

    def config(self) -> str:
        after = self.quarantine_after or len(self.rounds) + 1  # 0: never
        nodes = ", ".join(str(i + 1) for i in range(len(self.nodes)))
        return (f"CONSTANTS\n    Nodes = {{{nodes}}}\n"
                f"    N = {self.n}\n    QuarantineAfter = {after}\n"
                f"    MaxLosses = {len(self.lost)}\n"
                # an own failure needs an intact round and breaks it: one per round at most
                f"    MaxFailures = {len(self.rounds)}\n"
                f"    WrongVariant = \"none\"\n    Trace <- RunTrace\n"
                f"    LostNodes <- RunLost\n    QuarantinedNodes <- RunQuarantined\n"
                f"    Succeeded = {'TRUE' if self.succeeded else 'FALSE'}\n"
                "SPECIFICATION TraceSpec\nINVARIANT TraceNotMatched\n")

    def describe(self) -> str:
        lines = [f"nodes (torch's order): {', '.join(self.nodes)}; N = {self.n}"]
        for k, r in enumerate(self.rounds):
            maps = " | ".join(", ".join(f"{d}={s}" for d, s in sorted(m.items(),
                                                                     key=lambda i: i[1]))
                              for m in r.maps)
            before = "".join(f" ({what} before: {sorted(ds)})" for what, ds in
                             (("quarantined", r.quarantined), ("lost", r.lost)) if ds)
            lines.append(f"round {k}: {maps}{before}")
        lines.append(f"lost: {sorted(self.lost)}; quarantined: {sorted(self.quarantined)}; "
                     f"succeeded: {self.succeeded}")
        return "\n".join(lines)


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _params(args: list[str]) -> dict[str, str]:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--spec-param")


def observe(jobs: object) -> Run | None:
    """The run of ``jobs`` (a ``Jobs``), or None where the model does not speak of it (not the
    resilient spec with stable slots, or not min = max nodes)."""
    agents = [j for j in jobs.jobs  # type: ignore[attr-defined]
              if "fsm_agent" in j.proc.args and "run" in j.proc.args]
    if not agents:
        return None
    args = [str(a) for a in agents[0].proc.args]
    params = _params(args)
    nnodes = (_option(args, "--nnodes") or "1").split(":")
    if _option(args, "--spec") != "resilient" or params.get("stable_slots", "true") != "true" \
            or nnodes[0] != nnodes[-1]:
        return None
    text = "\n".join(j.output for j in agents)
    rounds: dict[int, tuple[float, list[dict[str, int]]]] = {}
    desc_of: dict[int, str] = {}  # agent pid -> its node descriptor
    for m in _SLOTS.finditer(text):
        slots = {d: int(s) for d, s in (x.rsplit("=", 1) for x in m["map"].split(", "))}
        desc_of.update((_sort_key(d)[1], d) for d in slots)
        t, maps = rounds.setdefault(int(m["round"]), (_seconds(m["time"]), []))
        rounds[int(m["round"])] = (min(t, _seconds(m["time"])), maps)
        if slots not in maps:
            maps.append(slots)
    assert sorted(rounds) == list(range(len(rounds))), \
        f"rounds logged: {sorted(rounds)} (a completed round not logged?)"
    if not rounds:
        assert "Rendezvous complete for workers" not in text, "rounds completed, none logged"
        return None
    timeline = [rounds[k] for k in sorted(rounds)]
    quarantined: dict[str, float] = {}
    lost: set[str] = set()
    for j in agents:
        rc = j.poll()
        q = _QUARANTINED.search(j.output)
        if rc == 75 and q and "left the job: quarantined:" in j.output:
            quarantined[desc_of[j.pid]] = _seconds(q["time"])
        elif rc == -9 and j.pid in desc_of:
            lost.add(desc_of[j.pid])
    # a survivor's notice of a loss comes after it (one machine, one clock); a quarantined node's
    # leave reads as a loss too, and is the quarantine's
    noticed: dict[str, float] = {}
    for m in _LOST.finditer(text):
        for d in m["nodes"].split(", "):
            if d in lost:
                noticed[d] = min(noticed.get(d, float("inf")), _seconds(m["time"]))
    nodes = {d for _, maps in timeline for m in maps for d in m} | lost | set(quarantined)
    last = timeline[-1][1][0]
    succeeded = all(j.poll() == 0 for j in agents if desc_of.get(j.pid) in last)
    return Run(nodes=sorted(nodes, key=_sort_key), n=int(nnodes[-1]),
               quarantine_after=int(params.get("quarantine_after", "3")),
               rounds=[Round(maps, {q for q, tq in quarantined.items() if tq < t},
                             {d for d, td in noticed.items() if td < t})
                       for t, maps in timeline],
               lost=lost, quarantined=set(quarantined), succeeded=succeeded)


def tlc_missing() -> str | None:
    """Why TLC cannot run here, or None."""
    if shutil.which("java") is None:
        return "TLC needs Java 11 or newer on PATH"
    try:
        find_tla2tools()
    except ModelError as e:
        return str(e)
    return None


def check_run(run: Run, workdir: Path) -> TLCResult:
    """TLC on ``run``: violated() is "TraceNotMatched" when the run is a behaviour of the model."""
    workdir.mkdir(parents=True, exist_ok=True)
    module = workdir / "MembershipTraceRun.tla"
    module.write_text(run.module())
    (workdir / "MembershipTraceRun.cfg").write_text(run.config())
    return check_model(module, options=["-deadlock"], timeout=TLC_TIMEOUT)


def matches_model(run: Run, workdir: Path) -> tuple[bool, TLCResult]:
    """Whether ``run`` is a behaviour of the model, and TLC's result; an error of TLC itself
    (a module that does not parse) raises."""
    result = check_run(run, workdir)
    if result.violated() == "TraceNotMatched":
        return True, result
    if not result.ok:
        raise ModelError(f"TLC failed on the trace:\n{run.module()}\n{result.output[-3000:]}")
    return False, result


def assert_membership_trace(jobs: object) -> None:
    """Assert that the membership the agents of ``jobs`` went through is a behaviour of the
    model. Call it at the end of a test, before the ``jobs`` fixture's cleanup; where TLC cannot
    run (no Java, no tla2tools.jar) it checks nothing (tests/job/test_membership_model.py skips
    there too)."""
    if tlc_missing() is not None:
        return
    run = observe(jobs)
    if run is None:
        return
    ok, result = matches_model(run, jobs.tmp_path / "membership-trace")  # type: ignore[attr-defined]
    assert ok, ("the agents' membership is not a behaviour of specs/model/Membership.tla "
                f"(TLC: {result.verdict}, {result.distinct_states} states):\n{run.describe()}")
