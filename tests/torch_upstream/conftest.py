"""Fixtures for the torch-derived agent tests; helpers live in ``upstream_helpers`` (a unique
module name: several test directories have a ``conftest`` module)."""

from upstream_helpers import procs

__all__ = ["procs"]
