"""``fsm-agent run``: torchrun, with the agent's run loop driven by a lifecycle spec.

Every torchrun flag and positional argument is accepted: the parser *is* torch's
(``torch.distributed.run.get_args_parser``), with three options added, and the launch
configuration comes from torch's ``config_from_args``. :func:`launch` then does what torch's
``launch_agent`` does, with ``FSMElasticAgent`` in place of ``LocalElasticAgent``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["build_parser", "launch", "main"]

logger = logging.getLogger("fsm_agent.torch")

PROG = "fsm-agent run"
USAGE_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser plus ``--spec``, ``--exit-barrier-timeout`` and ``--trace``."""
    from torch.distributed.run import get_args_parser

    parser: argparse.ArgumentParser = get_args_parser()
    parser.prog = PROG
    parser.description = (
        "Launch a job as torchrun does; the agent's lifecycle follows a spec. "
        + (parser.description or "")
    )
    group = parser.add_argument_group("fsm-agent")
    group.add_argument(
        "--spec",
        dest="lifecycle_spec",
        default="torchelastic",
        metavar="NAME|PATH",
        help="Lifecycle spec: a preset name (torchelastic, torchrun) or a YAML file. "
        "Default: torchelastic (exit barrier also on failure, then a failure summary); "
        "torchrun reproduces torch 2.x.",
    )
    group.add_argument(
        "--exit-barrier-timeout",
        "--exit_barrier_timeout",
        dest="exit_barrier_timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="How long an agent whose workers finished waits for the other agents (default 300).",
    )
    group.add_argument(
        "--trace",
        dest="trace",
        default=None,
        metavar="FILE",
        help="Write every lifecycle transition to FILE (JSON lines; see fsm-agent replay).",
    )
    return parser


def _prepare(args: argparse.Namespace) -> None:
    # torch.distributed.run.run()'s own defaulting, done before config_from_args.
    if args.standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
        logger.info(
            "Rendezvous info: --rdzv-backend=%s --rdzv-endpoint=%s --rdzv-id=%s",
            args.rdzv_backend,
            args.rdzv_endpoint,
            args.rdzv_id,
        )
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        from torch.distributed.run import parse_min_max_nnodes

        _, max_nodes = parse_min_max_nnodes(args.nnodes)
        if max_nodes == 1:
            args.rdzv_backend = "c10d"
            args.rdzv_endpoint = "localhost:0"
            args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    if args.rdzv_endpoint == "localhost:0" and args.local_addr is None:
        # a single-node job's stores listen on loopback only (fsm_agent.torch._loopback);
        # the workers must be told to reach them there, not at this host's name.
        args.local_addr = "127.0.0.1"


class _AgentRef:
    """The agent, once ``launch`` has built it (the trace's ``group_rank`` is read from it)."""

    agent: Any = None

    def fields(self) -> dict[str, Any]:
        group = getattr(self.agent, "_worker_group", None)
        return {} if group is None else {"group_rank": group.group_rank}


def _trace_listener(
    path: str, spec: Any, run_id: str | None, ref: _AgentRef
) -> tuple[Callable[..., Any], Callable[[], None]]:
    """The trace writer of ``fsm_agent._trace`` as a listener, and how to close it."""
    if importlib.util.find_spec("fsm_agent._trace") is None:
        raise _UsageError("--trace: not available in this installation (no fsm_agent._trace)")
    trace = importlib.import_module("fsm_agent._trace")
    factory = getattr(trace, "TraceWriter", None)
    if factory is None:
        raise _UsageError("--trace: fsm_agent._trace has no TraceWriter")
    try:
        writer = factory(path, spec=spec, dynamic=ref.fields, node=socket.gethostname(),
                         pid=os.getpid(), run_id=run_id)
    except OSError as e:
        raise _UsageError(f"--trace {path}: {e.strerror or e}") from e
    close = getattr(writer, "close", None)
    return writer, (close if callable(close) else (lambda: None))


class _UsageError(Exception):
    pass


def launch(
    config: Any,
    entrypoint: Callable[..., Any] | str | None,
    args: Sequence[Any],
    *,
    lifecycle_spec: Any = "torchelastic",
    exit_barrier_timeout: float = 300.0,
    listeners: Sequence[Callable[..., Any]] = (),
    on_agent: Callable[[Any], None] | None = None,
) -> dict[int, Any]:
    """torch's ``launch_agent`` with an ``FSMElasticAgent``; returns the workers' return values.

    Raises ``ChildFailedError`` when the workers failed (both presets: the ``torchelastic``
    preset's ``WorkerGroupFailureException`` is turned into one, so the root-cause summary and
    error-file handling of ``@record`` apply), ``SignalException`` on a termination signal.
    """
    from torch.distributed.elastic import events, metrics
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry
    from torch.distributed.launcher.api import _get_addr_and_port, _get_entrypoint_name

    from fsm_agent import WorkerGroupFailureException
    from fsm_agent.torch._agent import FSMElasticAgent
    from fsm_agent.torch._loopback import loopback_rendezvous_handler

    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
        logger.warning("config has no run_id, generated a random run_id: %s", config.run_id)
    entrypoint_name = _get_entrypoint_name(entrypoint, list(args))
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
        exit_barrier_timeout=exit_barrier_timeout,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=config.shutdown_timeout,
        lifecycle_spec=lifecycle_spec,
        listeners=listeners,
    )
    if on_agent is not None:
        on_agent(agent)
    shutdown_rdzv = True
    try:
        metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
        try:
            result = agent.run()
        except WorkerGroupFailureException as e:
            if not e.failures:
                raise
            raise ChildFailedError(name=entrypoint_name, failures=e.failures) from e
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        if result.is_failed():
            raise ChildFailedError(name=entrypoint_name, failures=result.failures)
        return dict(result.return_values)
    except ChildFailedError:
        raise
    except SignalException:
        # As torch: a signalled agent leaves the rendezvous open, so it can be re-joined.
        shutdown_rdzv = False
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except Exception:
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    finally:
        if shutdown_rdzv:
            spec.rdzv_handler.shutdown()


def _configure_logging() -> None:
    # torch's elastic loggers honour LOGLEVEL (default WARNING); ours follow the same switch.
    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    log = logging.getLogger("fsm_agent")
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname).1s %(asctime)s %(name)s] %(message)s"))
        log.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """``fsm-agent run ARGS``: 0 on success, 1 when workers failed, 128+N on signal N, 2 on bad
    arguments."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import config_from_args

    from fsm_agent import SpecError, load_spec
    from fsm_agent.torch._argcheck import ArgError, parse_args

    parser = build_parser()
    try:
        # argparse errors and unusable values as one line, before anything starts.
        args = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    except ArgError as e:
        print(f"{PROG}: error: {e} (see {PROG} --help)", file=sys.stderr)
        return USAGE_EXIT
    _configure_logging()
    closers: list[Callable[[], None]] = []
    try:
        try:
            lifecycle_spec = load_spec(args.lifecycle_spec)
        except SpecError as e:
            # the first problem, on one line; `fsm-agent check` lists every one.
            raise _UsageError(f"--spec: {e.problems[0] if e.problems else e}") from e
        except OSError as e:
            raise _UsageError(f"--spec {args.lifecycle_spec}: {e.strerror or e}") from e
        _prepare(args)
        try:
            config, cmd, cmd_args = config_from_args(args)
        except (AssertionError, ValueError, RuntimeError) as e:
            raise _UsageError(str(e)) from e
        ref = _AgentRef()
        listeners = []
        if args.trace:
            writer, close = _trace_listener(args.trace, lifecycle_spec, config.run_id, ref)
            listeners.append(writer)
            closers.append(close)

        def _launch() -> None:
            launch(
                config,
                cmd,
                cmd_args,
                lifecycle_spec=lifecycle_spec,
                exit_barrier_timeout=args.exit_barrier_timeout,
                listeners=listeners,
                on_agent=lambda agent: setattr(ref, "agent", agent),
            )

        # torchrun's main is @record: the root cause's error file is copied to the launcher's
        # own TORCHELASTIC_ERROR_FILE, any other error is recorded there.
        record(_launch)()
        return 0
    except _UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        return 1
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"{PROG}: received {name}; workers stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (SIGINT); workers stopped", file=sys.stderr)
        return 128 + int(signal.SIGINT)
    except Exception as e:  # one clear line instead of a traceback; details at LOGLEVEL=DEBUG
        logger.debug("launch failed", exc_info=True)
        print(f"{PROG}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        for close in closers:
            close()
