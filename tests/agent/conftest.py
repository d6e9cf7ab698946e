"""Fixtures for the fsm_agent.torch tests; the helpers live in ``fsm_torch_helpers`` (a unique
module name: several test directories have a ``conftest`` module)."""

from fsm_torch_helpers import jobs

__all__ = ["jobs"]
