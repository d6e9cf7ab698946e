"""fsm_agent inside torch elastic: a spec-driven agent and the ``fsm-agent run`` launcher.

- :class:`LifecycleAgentMixin`: mix into any ``SimpleElasticAgent`` subclass to replace its run
  loop with a ``fsm_agent.Lifecycle``.
- :class:`FSMElasticAgent`: the mixin on torch's ``LocalElasticAgent`` (what torchrun runs).
- :class:`TorchDriver`: the ``fsm_agent.Driver`` that calls a torch agent's own hooks.

Importing this package imports torch.
"""

from __future__ import annotations

from fsm_agent.torch._agent import FSMElasticAgent, LifecycleAgentMixin
from fsm_agent.torch._driver import TorchDriver

__all__ = ["FSMElasticAgent", "LifecycleAgentMixin", "TorchDriver"]
