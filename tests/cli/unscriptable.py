"""A conformance target the kit cannot build (its constructor wants an argument the kit lacks)."""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.agent.server.api import SimpleElasticAgent


class NeedsConfig(SimpleElasticAgent):  # type: ignore[misc]
    def __init__(self, spec: Any, config: dict[str, Any], exit_barrier_timeout: float = 300):
        super().__init__(spec, exit_barrier_timeout)
        self.config = config
