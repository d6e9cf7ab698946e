"""Public helpers for testing lifecycles and the supervisors that embed them.

``RecordingDriver`` scripts monitor results and records every driver call; the conformance kit
checks a supervisor against a spec's reference behaviour with hypothesis (``TargetAPI`` declares
what an agent asks for beyond torch's API); ``check_protocol`` model-checks a spec's part in the
job-wide protocol with TLC, and ``check_model`` any model of ``specs/model``
(docs/job-protocol.md).
"""

from typing import Any

from ._model_check import ModelError, TLCResult, check_model, check_protocol, lifecycle_module
from ._recording import Call, RecordingDriver, ScriptedRandom, ScriptExhausted, make_result
from ._target_api import TARGET_APIS, TargetAPI, load_target_api

# The conformance kit needs hypothesis (the `testing` extra); RecordingDriver does not, so the
# kit's names load on first use.
_KIT = {
    "DIVERGENCES": "_conformance", "ConformanceFailure": "_conformance",
    "IntendedDivergence": "_conformance", "HarnessError": "_conformance",
    "ScriptedDriver": "_conformance",
    "SupervisorConformance": "_conformance", "check_script": "_conformance",
    "conformance_machine": "_conformance", "default_settings": "_conformance",
    "run_conformance": "_conformance", "run_script": "_conformance",
    "ReferenceRun": "_reference", "ConformanceTrace": "_reference",
    "reference_trace": "_reference",
    "RunConfig": "_strategies", "Tick": "_strategies", "run_configs": "_strategies",
    "scripts": "_strategies", "ticks": "_strategies",
}

# The kit's old class names, still importable but warning: they collided with fsm_agent.trace's
# `Trace` (a JSONL trace) and `Divergence` (where a trace departs from its spec). Never cached in
# globals(), so every use warns.
_DEPRECATED = {"Trace": "ConformanceTrace", "Divergence": "IntendedDivergence"}


def __getattr__(name: str) -> Any:
    new = _DEPRECATED.get(name)
    if new is not None:
        import warnings

        warnings.warn(f"fsm_agent.testing.{name} is deprecated; use {new}",
                      DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    module = _KIT.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm_agent.testing' has no attribute {name!r}")
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ImportError(f"fsm_agent.testing.{name} needs hypothesis: "
                          "pip install 'fsm-agent[testing]'") from None
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DIVERGENCES",
    "TARGET_APIS",
    "Call",
    "ConformanceFailure",
    "ConformanceTrace",
    "HarnessError",
    "IntendedDivergence",
    "ModelError",
    "RecordingDriver",
    "ReferenceRun",
    "RunConfig",
    "ScriptExhausted",
    "ScriptedDriver",
    "ScriptedRandom",
    "SupervisorConformance",
    "TLCResult",
    "TargetAPI",
    "Tick",
    "check_model",
    "check_protocol",
    "check_script",
    "conformance_machine",
    "default_settings",
    "lifecycle_module",
    "load_target_api",
    "make_result",
    "reference_trace",
    "run_configs",
    "run_conformance",
    "run_script",
    "scripts",
    "ticks",
]
