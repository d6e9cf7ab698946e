"""Fixtures for the resilient-preset tests; the helpers live in ``resilient_helpers`` (a unique
module name: several test directories have a ``conftest`` module)."""

from resilient_helpers import jobs

__all__ = ["jobs"]
