"""What fsm_agent adds to torch's agent, as one object: :class:`AgentOptions`.

``fsm-agent run`` builds one from its flags, ``launch`` passes it on, and ``FSMElasticAgent``
(its mixin) takes its fields as keyword arguments. A new option is a field here and the code
that reads it in the agent; ``launch`` forwards every field unchanged, so it is not touched.

A field that ``fsm-agent run`` sets from its command line declares its flag here, on the field
(:func:`flag`: names, help, metavar, how its text is parsed and checked). ``fsm_agent.cli.run``
adds every declared flag to its parser, checks the values before anything starts and builds
the options from them, and docs/cli.md's flag table is made from that parser: a new flag is
written once, here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent._core._spec import DEFAULT_SPEC
from fsm_agent._core._units import check_seconds
from fsm_agent.torch._preload import check_module_names

if TYPE_CHECKING:
    from fsm_agent import Listener, Spec

__all__ = ["AgentOptions", "Flag", "flag"]

#: The key of a field's ``metadata`` that holds its :class:`Flag`.
FLAG = "fsm_agent.flag"


@attrs.frozen
class Flag:
    """An ``fsm-agent run`` flag that sets one field of :class:`AgentOptions`.

    ``names``: the option strings (the first is the one help and errors show); ``help``: the
    flag's ``--help`` text, also its row in docs/cli.md; ``metavar``: the value's name in help.
    ``parse``: text to value for a flag that takes one; its ``ValueError`` says what is wrong
    (shown as argparse shows a bad value: ``argument --flag: ...``; a type such as ``float``
    keeps argparse's ``invalid float value: 'x'``). Without ``parse`` the flag takes no value:
    given, it sets the field to the opposite of its default. ``check``: the parsed value,
    checked before anything starts with torchrun's flags; its ``ValueError`` says what is wrong,
    shown after the flag's name (``--flag must be ...``).
    """

    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    check: Callable[[Any], object] | None = None


def flag(*names: str, help: str, metavar: str | None = None,
         parse: Callable[[str], Any] | None = None,
         check: Callable[[Any], object] | None = None) -> dict[str, Flag]:
    """A field's ``metadata`` declaring its ``fsm-agent run`` flag (:class:`Flag`)."""
    return {FLAG: Flag(names, help, metavar, parse, check)}


def _module_names(text: str) -> list[str]:
    return check_module_names(text.split(","))


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

    # --spec and --spec-param, with the spec loaded and its parameters checked (fsm_agent.cli)
    lifecycle_spec: Spec | str | os.PathLike[str] = DEFAULT_SPEC
    lifecycle_params: Mapping[str, Any] | None = None
    exit_barrier_timeout: float = attrs.field(default=300.0, metadata=flag(
        "--exit-barrier-timeout", "--exit_barrier_timeout", metavar="SECONDS", parse=float,
        # 0 as torch takes it: the exit barrier waits for nobody.
        check=partial(check_seconds, allow_zero=True),
        help="How long an agent whose workers finished waits for the other agents "
             "(default 300)."))
    listeners: Sequence[Listener] = ()
    isolate_worker_store: bool = attrs.field(default=True, metadata=flag(
        "--shared-worker-store",
        help="Restarted workers use the agent's store, as torchrun's (with --rdzv-backend "
             "static: the --master-port store on every attempt). Default: every restart gets a "
             "fresh store, because the previous attempt's keys in it break gloo's connect "
             "(docs/runner.md); the first attempt uses --master-port either way."))
    preload: Sequence[str] = attrs.field(default=(), metadata=flag(
        "--preload", metavar="MODULE[,MODULE...]", parse=_module_names,
        help="Import these modules once, in a template process that forks the Python script "
             "workers (at the first start and at every restart), instead of each worker "
             "importing them: a restarted worker reaches its first line after 'import torch' "
             "in a fraction of the time. Each worker still gets what torchrun gives it "
             "(environment, arguments, output files, session, signals, exit code). A module "
             "that cannot be preloaded is one line at start, then the workers start cold. Off "
             "by default."))

    def agent_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``FSMElasticAgent`` (and ``LifecycleAgentMixin``)."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(AgentOptions)}

    @classmethod
    def names(cls) -> frozenset[str]:
        """The options' names (``launch`` takes each one as a keyword too)."""
        return frozenset(f.name for f in attrs.fields(cls))

    @classmethod
    def flags(cls) -> dict[str, Flag]:
        """The options that are ``fsm-agent run`` flags: field name to :class:`Flag`, in the
        fields' order."""
        return {f.name: f.metadata[FLAG] for f in attrs.fields(cls) if FLAG in f.metadata}

    @classmethod
    def default(cls, name: str) -> Any:
        """The default value of the option ``name``."""
        return attrs.fields_dict(cls)[name].default
