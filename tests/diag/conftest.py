"""Fixtures for the diagnosis tests; the helpers live in ``diag_helpers`` (a unique module name:
several test directories have a ``conftest`` module)."""

from diag_helpers import jobs

__all__ = ["jobs"]
