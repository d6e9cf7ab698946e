"""torch's ``local_elastic_agent_test.py`` scenarios on ``FSMElasticAgent`` (real processes)."""

from __future__ import annotations

import pytest
import upstream_workers as w
from upstream_helpers import Procs, endpoint

BACKENDS = ["c10d", "static"]


def _conf(procs: Procs, backend: str, entrypoint: object, n: int, **kw: object) -> w.AgentConf:
    if backend == "static":
        kw.setdefault("rank", 0)
    return procs.conf(entrypoint, n, backend=backend, endpoint=endpoint(), **kw)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_run_happy_function(procs: Procs, backend: str) -> None:
    """Mirrors ``test_run_happy_function_c10d``."""
    res, _ = procs.run_agent(_conf(procs, backend, w.happy_function, 2))
    assert not res.is_failed()
    assert res.return_values == {0: None, 1: None}
