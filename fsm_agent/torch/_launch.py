"""``launch``: torch's ``launch_agent`` with an ``FSMElasticAgent`` in place of torch's agent.

The ``fsm-agent run`` command line (``fsm_agent/cli/run.py``) parses torchrun's arguments and
calls :func:`launch`; programs call it directly with a torch ``LaunchConfig`` (public as
``fsm_agent.torch.launch``).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.torch._options import AgentOptions

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.health_check_server import HealthCheckServer
    from torch.distributed.launcher.api import LaunchConfig

    from fsm_agent.torch._agent import FSMElasticAgent

__all__ = ["launch"]

# torch's launch_agent logs this at INFO (the same text in torch 2.13 and 2.14)
_LAUNCH_CONFIG = (
    "Starting elastic_operator with launch configs:\n"
    "  entrypoint               : %(entrypoint)s\n"
    "  min_nodes                : %(min_nodes)s\n"
    "  max_nodes                : %(max_nodes)s\n"
    "  nproc_per_node           : %(nproc_per_node)s\n"
    "  run_id                   : %(run_id)s\n"
    "  rdzv_backend             : %(rdzv_backend)s\n"
    "  rdzv_endpoint            : %(rdzv_endpoint)s\n"
    "  rdzv_configs             : %(rdzv_configs)s\n"
    "  max_restarts             : %(max_restarts)s\n"
    "  monitor_interval         : %(monitor_interval)s\n"
    "  log_dir                  : %(log_dir)s\n"
    "  metrics_cfg              : %(metrics_cfg)s\n"
    "  event_log_handler        : %(event_log_handler)s\n"
    "  numa_options             : %(numa_options)s\n"
    "  signals_to_handle        : %(signals_to_handle)s\n"
    "  duplicate_stdout_filters : %(duplicate_stdout_filters)s\n"
    "  duplicate_stderr_filters : %(duplicate_stderr_filters)s\n"
)
_CONFIG_FIELDS = (
    "min_nodes", "max_nodes", "nproc_per_node", "run_id", "rdzv_backend", "rdzv_endpoint",
    "rdzv_configs", "max_restarts", "monitor_interval", "metrics_cfg", "event_log_handler",
    "numa_options", "signals_to_handle", "duplicate_stdout_filters", "duplicate_stderr_filters",
)


def _log_launch_config(config: Any, entrypoint_name: str) -> None:
    values = {name: getattr(config, name, None) for name in _CONFIG_FIELDS}
    values["entrypoint"] = entrypoint_name
    values["log_dir"] = getattr(getattr(config, "logs_specs", None), "root_log_dir", None)
    logger.info(_LAUNCH_CONFIG, values)

logger = logging.getLogger("fsm_agent.torch")


def job_failure(agent: Any, result: Any = None) -> Exception | None:
    """``JobFailed`` when the agent ends with an outcome another agent announced (or with the
    rendezvous store lost), None when its own outcome stands (it announced, or nobody did).

    A store lost after this agent's workers succeeded (``result``) changes nothing: it can only
    have been seen at the exit barrier, where torch logs it and the outcome stands. The store's
    host leaving as a finished job ends must not fail the agents still at the barrier; an agent
    that dies mid-run is a failure its own node reports."""
    from fsm_agent.torch._job import JobFailed

    job = getattr(agent, "job", None)
    if job is None or job.outcome is None or job.announced_here:
        return None
    if job.only_store_lost and result is not None and not result.is_failed():
        return None
    return JobFailed(job.outcome, store_lost=job.lost is not None)


def launch(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str | None,
    args: Sequence[Any],
    *,
    options: AgentOptions | None = None,
    on_agent: Callable[[FSMElasticAgent], None] | None = None,
    health_check_server: HealthCheckServer | None = None,
    **option_fields: Any,
) -> dict[int, Any]:
    """torch's ``launch_agent`` with an ``FSMElasticAgent``; returns the workers' return values.

    ``config``, ``entrypoint`` and ``args`` are what torch's ``elastic_launch`` takes: a
    ``LaunchConfig``, then a script or executable path (``args``: its arguments) or a function
    (``args``: its positional arguments), the return values keyed by global rank.
    ``options``: what fsm_agent adds to torch's agent (:class:`AgentOptions`: the spec, its
    parameters, listeners, the exit barrier's timeout, ...); each of its fields may also be
    given as a keyword (``lifecycle_spec="resilient"``), which replaces the one in ``options``.
    ``on_agent`` is called with the agent once it is built, before it runs.
    ``health_check_server``: as torch's ``launch_agent``, a
    server the caller started (before a long rendezvous, say) that the agent then answers
    through; without one the agent starts its own when ``TORCHELASTIC_HEALTH_CHECK_PORT`` is set.

    Raises ``ChildFailedError`` when the workers failed (both presets: the ``torchelastic``
    preset's ``WorkerGroupFailureException`` is turned into one, so the root-cause summary and
    error-file handling of ``@record`` apply), ``SignalException`` on a termination signal,
    ``fsm_agent._core._health.LeftJob`` when the spec had this node leave the job (a failed health
    check: the rendezvous is left open for the other nodes), ``fsm_agent._core._drain.Preempted``
    after a drain (its ``exit_code`` is the one every agent of the job ends with).
    The exit code the spec asked for on failure (``set_exit_code``: the ``resilient`` preset's
    ``no_requeue_exit_code``) is ``agent.lifecycle.exit_code`` (``on_agent`` gives the agent).
    """
    unknown = sorted(set(option_fields) - AgentOptions.names())
    if unknown:
        raise TypeError(f"launch() got unexpected keyword argument(s) {', '.join(unknown)} "
                        f"(the options are {', '.join(sorted(AgentOptions.names()))})")
    options = attrs.evolve(options or AgentOptions(), **option_fields)
    from torch.distributed.elastic import events, metrics
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry
    from torch.distributed.launcher.api import _get_addr_and_port, _get_entrypoint_name

    from fsm_agent import LifecycleError, WorkerGroupFailureException
    from fsm_agent._core._drain import Preempted
    from fsm_agent._core._health import LeftJob
    from fsm_agent.torch._agent import FSMElasticAgent, rendezvous_over
    from fsm_agent.torch._job import JobFailed
    from fsm_agent.torch._loopback import loopback_rendezvous_handler

    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
        logger.warning("config has no run_id, generated a random run_id: %s", config.run_id)
    entrypoint_name = _get_entrypoint_name(entrypoint, list(args))
    _log_launch_config(config, entrypoint_name)
    rdzv_parameters = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    master_addr, master_port = _get_addr_and_port(rdzv_parameters)
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(args),
        # loopback-only stores for a local self-hosted rendezvous (--standalone).
        rdzv_handler=loopback_rendezvous_handler(rdzv_parameters)
        or rdzv_registry.get_rendezvous_handler(rdzv_parameters),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
    )
    agent = FSMElasticAgent(
        spec=spec,
        logs_specs=config.logs_specs,
        start_method=config.start_method,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=config.shutdown_timeout,
        **options.agent_kwargs(),
        **({} if health_check_server is None else {"health_check_server": health_check_server}),
    )
    # As torch: a server started before the agent existed answered with the current time until
    # now; from here on it reports the agent's own progress.
    delegate = getattr(getattr(health_check_server, "alive_callback", None), "set_delegate", None)
    if callable(delegate):
        delegate(agent._get_alive_time)
    if on_agent is not None:
        on_agent(agent)
    shutdown_rdzv = True
    try:
        metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
        try:
            result = agent.run()
        except (WorkerGroupFailureException, LifecycleError) as e:
            # Another agent gave up first (or the store is gone): end with the job's outcome.
            failed = job_failure(agent)
            if failed is not None:
                raise failed from e
            if not isinstance(e, WorkerGroupFailureException) or not e.failures:
                raise
            # The workers failed, the agent did not: the one launcher event torch records for
            # a failed result (and the torchrun preset, which returns it), under every preset.
            events.record(agent.get_event_succeeded(), config.event_log_handler)
            raise ChildFailedError(name=entrypoint_name, failures=e.failures) from e
        if result is None:
            # torch's run() returns nothing for a node left waiting when the job closed its
            # rendezvous (a spare it never needed); torch's launch_agent then fails on it.
            logger.warning("[%s] the job ended without needing this node (it waited as a "
                           "spare); nothing to run", config.role)
            return {}
        failed = job_failure(agent, result)
        if failed is not None:
            raise failed
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        if result.is_failed():
            raise ChildFailedError(name=entrypoint_name, failures=result.failures)
        return dict(result.return_values)
    except ChildFailedError:
        raise
    except (LeftJob, Preempted):
        # A node that failed its health checks leaves; the rendezvous stays open for the others
        # (shutting it down would close it for every agent of the job). A preempted job leaves
        # it open too, as torch leaves it on a signal: the requeued job may join it again.
        shutdown_rdzv = False
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except JobFailed:
        # The agent that announced the outcome closes the rendezvous; the store's host may
        # already be gone, and this agent's shutdown would only warn about it.
        shutdown_rdzv = False
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except SignalException:
        # As torch: a signalled agent leaves the rendezvous open, so it can be re-joined.
        shutdown_rdzv = False
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except Exception as e:
        events.record(agent.get_event_failed(), config.event_log_handler)
        if rendezvous_over(e):
            # a late agent: the job ended (or was closed) before it came; it is not closed again
            shutdown_rdzv = False
            raise LeftJob(f"the rendezvous of job {config.run_id!r} is closed: the job has "
                          "ended, there is nothing to join", 1) from e
        raise
    finally:
        if shutdown_rdzv:
            _shutdown_rendezvous(spec.rdzv_handler, failing=sys.exc_info()[1])


def _shutdown_rendezvous(handler: Any, failing: BaseException | None) -> None:
    """Close the rendezvous; when the launch already failed, a failing shutdown (the store's
    host gone, say) is logged instead of replacing the failure (torch's newer test_api.py)."""
    if failing is None:
        handler.shutdown()
        return
    try:
        handler.shutdown()
    except Exception:
        logger.warning("rendezvous shutdown failed after %s; the launch's error is kept",
                       type(failing).__name__, exc_info=True)
