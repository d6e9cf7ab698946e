"""What the CLI shows about specs and runs, from a spec or a job's traces, running no lifecycle:
the differences between two specs, a job's analysis, its summary and its report.

It imports ``_core`` and ``trace`` only. docs/modules.md lists its modules.
"""
