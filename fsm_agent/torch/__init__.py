"""fsm_agent inside torch elastic: a spec-driven agent and its launcher.

- :class:`LifecycleAgentMixin`: mix into any ``SimpleElasticAgent`` subclass to replace its run
  loop with a ``fsm_agent.Lifecycle``.
- :class:`FSMElasticAgent`: the mixin on torch's ``LocalElasticAgent`` (what torchrun runs).
- :class:`TorchDriver`: the ``fsm_agent.Driver`` that calls a torch agent's own hooks.
- :func:`launch`: torch's ``launch_agent`` with an ``FSMElasticAgent`` (what ``fsm-agent run``
  calls), and :class:`AgentOptions`, what fsm_agent adds to torch's ``LaunchConfig``.

Importing this package imports torch.
"""

from __future__ import annotations

from fsm_agent.torch._agent import FSMElasticAgent, LifecycleAgentMixin
from fsm_agent.torch._driver import TorchDriver
from fsm_agent.torch._launch import launch
from fsm_agent.torch._options import AgentOptions

__all__ = ["AgentOptions", "FSMElasticAgent", "LifecycleAgentMixin", "TorchDriver", "launch"]
