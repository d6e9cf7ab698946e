"""Public helpers for testing lifecycles and the supervisors that embed them.

``RecordingDriver`` scripts monitor results and records every driver call; the conformance kit
checks a supervisor against a spec's reference behaviour with hypothesis.
"""

from ._recording import Call, RecordingDriver, ScriptExhausted, make_result

__all__ = ["Call", "RecordingDriver", "ScriptExhausted", "make_result"]
