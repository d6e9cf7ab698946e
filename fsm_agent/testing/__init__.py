"""Public helpers for testing lifecycles and the supervisors that embed them.

``RecordingDriver`` scripts monitor results and records every driver call; the conformance kit
checks a supervisor against a spec's reference behaviour with hypothesis.
"""

from ._conformance import (
    DIVERGENCES,
    ConformanceFailure,
    Divergence,
    ScriptedDriver,
    SupervisorConformance,
    check_script,
    conformance_machine,
    default_settings,
    run_conformance,
    run_script,
)
from ._recording import Call, RecordingDriver, ScriptExhausted, make_result
from ._reference import Trace, reference_trace
from ._strategies import RunConfig, Tick, run_configs, scripts, ticks

__all__ = [
    "DIVERGENCES",
    "Call",
    "ConformanceFailure",
    "Divergence",
    "RecordingDriver",
    "RunConfig",
    "ScriptExhausted",
    "ScriptedDriver",
    "SupervisorConformance",
    "Tick",
    "Trace",
    "check_script",
    "conformance_machine",
    "default_settings",
    "make_result",
    "reference_trace",
    "run_configs",
    "run_conformance",
    "run_script",
    "scripts",
    "ticks",
]
