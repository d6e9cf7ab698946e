"""Single-line mutants of the preset specs, and a differential search that tells them apart.

Every mutant changes exactly one line of a copy of ``specs/<preset>.yaml``: deletes it, flips a
flag, swaps ``guards``/``unless``, drops or reorders one list item, or replaces one state,
trigger, guard, action or metric token with another of its kind. Descriptions and comments are
left alone (they do not change behaviour).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fsm_agent import Lifecycle
from fsm_agent.testing._conformance import run_script
from fsm_agent.testing._targets import resolve_target

from ._support import draw_script, ours_from_torch

SPECS = Path(__file__).resolve().parents[2] / "specs"

STATES = ["INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED", "UNKNOWN"]
TRIGGERS = ["start", "healthy", "unhealthy", "failed", "succeeded", "unknown", "init", "stopped",
            "always"]
GUARDS = ["has_restarts_left", "nodes_waiting"]
ACTIONS = ["rendezvous", "start_workers", "stop_workers", "consume_restart", "exit_barrier",
           "raise_failure", "raise_invalid_state", "restart_workers"]
METRIC_VALUES = ["remaining_restarts", "restart_count", "max_restarts"]
KINDS = [STATES, TRIGGERS, GUARDS, ACTIONS, METRIC_VALUES]


def _behavioural(line: str) -> bool:
    text = line.strip()
    return bool(text) and not text.startswith(("#", "description:", "name:")) and ":" in text


def line_mutants(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, what changed, mutated text) for every single-line mutant of ``text``."""
    lines = text.splitlines(keepends=True)
    in_description, desc_indent = False, 0
    for no, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if in_description and (not line.strip() or indent > desc_indent):
            continue
        in_description = False
        if line.strip().startswith("description:"):
            in_description, desc_indent = True, indent
            continue
        if not _behavioural(line):
            continue
        variants: list[tuple[str, str]] = [("delete line", "")]
        for a, b in (("true", "false"), ("guards:", "unless:"), ("unless:", "guards:")):
            if a in line:
                variants.append((f"{a} -> {b}", line.replace(a, b, 1)))
        flow = re.search(r"\[([^\]]*)\]", line)
        if flow and flow.group(1).strip():
            items = [i.strip() for i in flow.group(1).split(",")]
            for k in range(len(items)):
                rest = items[:k] + items[k + 1:]
                variants.append((f"drop {items[k]}", line.replace(flow.group(0),
                                                                  f"[{', '.join(rest)}]")))
            if len(items) > 1:
                variants.append(("reverse list", line.replace(
                    flow.group(0), f"[{', '.join(reversed(items))}]")))
        for m in re.finditer(r"[A-Za-z_]+", line):
            word = m.group(0)
            for kind in KINDS:
                if word in kind:
                    other = kind[(kind.index(word) + 1) % len(kind)]
                    variants.append((f"{word} -> {other}",
                                     line[:m.start()] + other + line[m.end():]))
        if "value: 1" in line:
            variants.append(("value 1 -> 2", line.replace("value: 1", "value: 2")))
        if "{observed}" in line:
            variants.append(("{observed} -> {role}", line.replace("{observed}", "{role}")))
        for what, new in variants:
            if new != line:
                yield no + 1, what, "".join([*lines[:no], new, *lines[no + 1:]])


class _AllTold(Exception):
    pass


def undetected(mutants: dict[str, Any], agent: type, preset: str, max_examples: int) -> list[str]:
    """The mutants (label -> spec) that no generated script tells apart from ``agent``.

    One search serves every mutant: each generated script runs ``agent`` once and every mutant
    not yet told apart, so generation is paid once, not once per mutant. The search is
    derandomized: a mutant that only a rare script tells apart (an action order seen only when
    ``stop_workers`` raises) must be found on every run, not on most.
    """
    alive = {label: resolve_target(Lifecycle, spec) for label, spec in mutants.items()}

    @settings(max_examples=max_examples, database=None, deadline=None, phases=[Phase.generate],
              derandomize=True,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(st.data())
    def search(data: st.DataObject) -> None:
        config, script = draw_script(data, preset)
        want = ours_from_torch(run_script(agent, config, script))
        for label in [k for k, t in alive.items() if run_script(t, config, script) != want]:
            del alive[label]
        if not alive:
            raise _AllTold

    with contextlib.suppress(_AllTold):
        search()
    return sorted(alive)
