"""Fixtures for the reliability tests; the helpers live in ``reliability_helpers`` (a unique
module name: several test directories have a ``conftest`` module)."""

from reliability_helpers import jobs

__all__ = ["jobs"]
