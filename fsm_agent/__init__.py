"""fsm_agent: torch elastic's worker-group lifecycle as an explicit, checked state machine.

A spec (YAML, see ``specs/``) declares states, triggers, guards and actions; ``Lifecycle`` runs
it on a ``transitions`` machine whose actions go through a ``Driver``.

Public modules: ``fsm_agent`` (specs, the engine, the driver interface), ``fsm_agent.trace``
(write, read and replay traces), ``fsm_agent.diagram`` (render a spec), ``fsm_agent.testing``
(recording driver, conformance kit), ``fsm_agent.torch`` (the torch agent, the mixin and
``launch``; imports torch). The ``fsm-agent`` command is ``fsm_agent.cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._core._clock import Clock, SystemClock, VirtualClock
from ._core._drain import Preempted, Preemption
from ._core._driver import (
    DrainDriver,
    Driver,
    HealthDriver,
    JobDriver,
    JobMembership,
    PeerDriver,
    ProgressDriver,
    QuarantineDriver,
    StackDriver,
)
from ._core._engine import Lifecycle
from ._core._errors import (
    ActionError,
    LifecycleError,
    Problem,
    SpecError,
    TriggerInterrupt,
    WorkerGroupFailureException,
)
from ._core._load import load_spec, parse_spec, preset_names
from ._core._params import ParamSpec
from ._core._progress import progress
from ._core._spec import MetricSpec, Spec, StateSpec, TransitionSpec
from ._core._step import ActionRecord, Listener, Step
from ._core._vocabulary import Context, Kind, KindExample, Vocabulary

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

__version__ = "0.1.0"

__all__ = [
    "ActionError",
    "ActionRecord",
    "Clock",
    "Context",
    "DrainDriver",
    "Driver",
    "HealthDriver",
    "JobDriver",
    "JobMembership",
    "Kind",
    "KindExample",
    "Lifecycle",
    "LifecycleError",
    "Listener",
    "MetricSpec",
    "ParamSpec",
    "PeerDriver",
    "Preempted",
    "Preemption",
    "Problem",
    "ProgressDriver",
    "QuarantineDriver",
    "RunResult",
    "Spec",
    "SpecError",
    "StackDriver",
    "StateSpec",
    "Step",
    "SystemClock",
    "TransitionSpec",
    "TriggerInterrupt",
    "VirtualClock",
    "Vocabulary",
    "WorkerGroupFailureException",
    "WorkerState",
    "__version__",
    "load_spec",
    "parse_spec",
    "preset_names",
    "progress",
]


def __getattr__(name: str) -> Any:
    # torch's own WorkerState and RunResult, re-exported lazily: importing fsm_agent to check or
    # draw a spec must not pay for importing torch.
    if name in ("WorkerState", "RunResult"):
        from torch.distributed.elastic.agent.server import api

        return getattr(api, name)
    raise AttributeError(f"module 'fsm_agent' has no attribute {name!r}")
