"""Fixtures for the job-protocol tests; the helpers live in ``job_helpers``."""

from job_helpers import jobs

__all__ = ["jobs"]
