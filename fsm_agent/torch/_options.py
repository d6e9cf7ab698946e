"""What fsm_agent adds to torch's agent, as one object: :class:`AgentOptions`.

``fsm-agent run`` builds one from its flags, ``launch`` passes it on, and ``FSMElasticAgent``
(its mixin) takes its fields as keyword arguments. A new option is a field here and the code
that reads it in the agent; ``launch`` forwards every field unchanged, so it is not touched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from fsm_agent import Listener, Spec

__all__ = ["AgentOptions"]


@attrs.frozen(kw_only=True)
class AgentOptions:
    """The agent's options beyond torch's ``LaunchConfig``.

    ``lifecycle_spec``: a preset name, a spec file or a loaded ``Spec``; ``lifecycle_params``:
    values for its ``params`` (a bad one is a ``SpecError`` before anything starts);
    ``exit_barrier_timeout``: how long an agent whose workers finished waits for the others;
    ``listeners``: receive every transition (a trace writer, ``fsm_agent.trace.open_trace``);
    ``isolate_worker_store=False``: restarted workers share the agent's store, as under
    torchrun (docs/runner.md says why the default gives them a fresh one); ``preload``: modules
    imported once in a template process that forks the script workers
    (``fsm_agent.torch._preload``).
    """

    lifecycle_spec: Spec | str | os.PathLike[str] = "torchelastic"
    lifecycle_params: Mapping[str, Any] | None = None
    exit_barrier_timeout: float = 300.0
    listeners: Sequence[Listener] = ()
    isolate_worker_store: bool = True
    preload: Sequence[str] = ()

    def agent_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``FSMElasticAgent`` (and ``LifecycleAgentMixin``)."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(AgentOptions)}

    @classmethod
    def names(cls) -> frozenset[str]:
        """The options' names (``launch`` takes each one as a keyword too)."""
        return frozenset(f.name for f in attrs.fields(cls))
