"""``fsm-agent run``: torchrun, with the agent's run loop driven by a lifecycle spec.

Every torchrun flag and positional argument is accepted: the parser *is* torch's
(``torch.distributed.run.get_args_parser``), with the ``fsm-agent`` group added (the spec and
trace flags, and the agent's options from the flags ``AgentOptions`` declares on its fields),
and the launch configuration comes from torch's ``config_from_args``. The launch itself is
library code: :func:`fsm_agent.torch.launch` (``fsm_agent/torch/_launch.py``) does what torch's
``launch_agent`` does, with ``FSMElasticAgent`` in place of ``LocalElasticAgent``. Argument
checks live beside this module, in ``_runargs.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs

from .._core._drain import Preempted
from .._core._errors import SpecError
from .._core._health import LeftJob
from .._core._load import preset_names
from .._readers._summary import RunRecorder, format_text
from ..torch._job import JobFailed
from ..torch._launch import launch
from ..torch._options import AgentOptions
from ..trace._writer import TraceWriter
from ._common import (
    FAILED,
    OK,
    USAGE,
    UsageError,
    add_spec_option,
    finish_parser,
    load_spec_arg,
    spec_params,
)

__all__ = ["build_parser", "main"]

logger = logging.getLogger("fsm_agent.torch")

PROG = "fsm-agent run"
EXAMPLES = (
    "fsm-agent run --standalone --nproc-per-node 2 train.py       # one node, as torchrun",
    "fsm-agent run --nnodes 1:4 --rdzv-backend c10d --rdzv-endpoint HOST:29400 "
    "--max-restarts 3 train.py",
    "fsm-agent run --spec resilient --spec-param backoff_initial=5s --trace run.jsonl "
    "--standalone train.py; fsm-agent replay run.jsonl",
)


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser plus ``--spec``, ``--exit-barrier-timeout`` and ``--trace``."""
    from torch.distributed.run import get_args_parser

    parser: argparse.ArgumentParser = get_args_parser()
    parser.prog = PROG
    parser.description = (
        f"{parser.description or 'torchrun'}, with the agent's lifecycle driven by a spec.\n"
        "Takes every torchrun flag. Exit 0 when the job succeeds, 1 when it fails, 2 on bad\n"
        "arguments, 128+N on signal N."
    )
    group = parser.add_argument_group("fsm-agent")
    add_spec_option(
        group,
        "--spec",
        dest="lifecycle_spec",
        metavar="NAME|PATH",
        help=f"Lifecycle spec: a preset name ({', '.join(preset_names())}) or a YAML file. "
        "Default: torchelastic (exit barrier also on failure, then a failure summary); "
        "torchrun reproduces torch 2.x; resilient adds policies (backoff, exit codes not to "
        "retry, health checks, ...), each a parameter set with --spec-param "
        "(fsm-agent check --bounds resilient lists them with their values).",
    )
    _add_option_flags(group)
    group.add_argument(
        "--trace",
        dest="trace",
        default=None,
        metavar="FILE",
        help="Write every lifecycle transition to FILE (JSON lines; see fsm-agent replay and "
        "fsm-agent report). Monitor ticks that change nothing are folded into one record.",
    )
    group.add_argument(
        "--trace-max-size",
        dest="trace_max_size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="Rotate the trace before it grows past SIZE (bytes, or with KB, MB, GB: 10MB): FILE "
        "moves to FILE.1 and a new FILE continues it. The newest records are always in FILE.",
    )
    group.add_argument(
        "--trace-backups",
        dest="trace_backups",
        type=int,
        default=1,
        metavar="N",
        help="With --trace-max-size: rotated files kept (FILE.1 ... FILE.N; default 1). 0 caps "
        "FILE at SIZE: it starts again when full.",
    )
    finish_parser(parser, EXAMPLES)
    return parser


def _add_option_flags(group: Any) -> None:
    """An argument for every ``AgentOptions`` field that declares a flag (the field's
    ``Flag``, ``fsm_agent/torch/_options.py``): its value goes, by the field's name, into the
    options the agent gets (:func:`_agent_options`), checked first by ``_runargs``."""
    for name, flag in AgentOptions.flags().items():
        default = AgentOptions.default(name)
        if flag.parse is None:
            group.add_argument(*flag.names, dest=name, default=default, help=flag.help,
                               action="store_false" if default else "store_true")
        else:
            group.add_argument(*flag.names, dest=name, default=default, metavar=flag.metavar,
                               type=_argparse_type(flag.parse), help=flag.help)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: its ``ValueError`` is argparse's one line saying what
    is wrong; a type's (``float``, ``int``) stays argparse's own ``invalid float value: 'x'``."""
    if isinstance(parse, type):
        return parse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _size(text: str) -> int:
    from .._core._units import parse_size

    try:
        size = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size < 4096:
        raise argparse.ArgumentTypeError(f"must be at least 4096 bytes (a few records), got {text}")
    return size


def _prepare(args: argparse.Namespace) -> None:
    # torch.distributed.run.run()'s own defaulting, done before config_from_args.
    from ._runargs import rdzv_backend_in_effect

    if args.standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
        # torchrun's banner (torch.distributed.run.run), word for word
        logger.info(
            "\n**************************************\n"
            "Rendezvous info:\n"
            "--rdzv-backend=%s "
            "--rdzv-endpoint=%s "
            "--rdzv-id=%s\n"
            "**************************************\n",
            args.rdzv_backend,
            args.rdzv_endpoint,
            args.rdzv_id,
        )
    elif rdzv_backend_in_effect(args) != args.rdzv_backend:
        # one node on the default static backend
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    if args.local_addr is None and args.rdzv_backend == "c10d" and _loopback_endpoint(
        args.rdzv_endpoint
    ):
        # a rendezvous on loopback keeps its stores there (fsm_agent.torch._loopback); the
        # workers must be told to reach them there, not at this host's name.
        args.local_addr = "127.0.0.1"


def _loopback_endpoint(endpoint: str | None) -> bool:
    from ..torch._loopback import is_loopback

    host, _, port = (endpoint or "").rpartition(":")
    return bool(host) and port.isdigit() and is_loopback(host)


class _AgentRef:
    """The agent, once ``launch`` has built it: the trace's ``group_rank`` and ``diagnostics``
    are read from it, once per step (:meth:`__call__`: it is the first listener), for every record
    of that step (the trace file's and the end-of-run summary's)."""

    agent: Any = None
    current: dict[str, Any] = {}  # noqa: RUF012 - replaced, never mutated
    #: A listener that only reads fields: the agent need not tick for it.
    every_tick: ClassVar[bool] = False

    def fields(self) -> dict[str, Any]:
        fields = getattr(self.agent, "trace_fields", None)
        if fields is not None:
            return dict(fields())  # group_rank, and diagnostics (hangs, stacks, health checks)
        group = getattr(self.agent, "_worker_group", None)
        return {} if group is None else {"group_rank": group.group_rank}

    def __call__(self, step: Any) -> None:
        self.current = self.fields()

    def step_fields(self) -> dict[str, Any]:
        return self.current


def _trace_listener(
    path: str, spec: Any, run_id: str | None, ref: _AgentRef, args: argparse.Namespace, *,
    params: dict[str, Any] | None = None,
) -> TraceWriter:
    """A trace writer for ``--trace FILE``: the engine calls it after every transition. Its
    header records ``params``, the spec's parameters the agent runs with."""
    try:
        return TraceWriter(path, spec=spec, dynamic=ref.step_fields, node=socket.gethostname(),
                           pid=os.getpid(), run_id=run_id, max_bytes=args.trace_max_size,
                           backups=args.trace_backups, params=params,
                           vocabulary=getattr(args, "vocabulary", None))
    except OSError as e:
        raise UsageError(f"--trace {path}: {e.strerror or e}") from e


def own_flags_table() -> str:
    """The Markdown table of the flags ``fsm-agent run`` adds to torchrun's, from its parser:
    docs/cli.md shows it (``tests/cli/test_cli_help.py`` keeps the two equal)."""
    parser = build_parser()
    group = next(g for g in parser._action_groups if g.title == "fsm-agent")
    rows = ["| flag | what it does |", "|---|---|"]
    for action in group._group_actions:
        flag = action.option_strings[0] + (f" {action.metavar}" if action.metavar else "")
        text = " ".join((action.help or "").split())
        rows.append(f"| `{_cell(flag)}` | {_cell(text)} |")
    return "\n".join(rows)


def with_flags_table(text: str) -> str:
    """``text`` (docs/cli.md) with its flag table (the lines from its ``| flag | ...`` header to
    the first that is not a table row) replaced by :func:`own_flags_table`. Raises
    ``ValueError`` if the page has no such table."""
    lines = text.split("\n")
    if "| flag | what it does |" not in lines:
        raise ValueError("no flag table (a '| flag | what it does |' line)")
    start = lines.index("| flag | what it does |")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join([*lines[:start], own_flags_table(), *lines[end:]])


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a table cell's pipe, even inside backticks


def _agent_options(args: argparse.Namespace, spec: Any, params: dict[str, Any] | None,
                   listeners: Sequence[Any]) -> AgentOptions:
    """The agent's options from the run's flags: every declared flag by its field's name, and
    the options no flag sets as such (the loaded spec, its checked parameters, the listeners)."""
    flagged = {name: getattr(args, name) for name in AgentOptions.flags()}
    return AgentOptions(lifecycle_spec=spec, lifecycle_params=params, listeners=listeners,
                        **flagged)


def _failure_exit_code(ref: _AgentRef) -> int:
    """1 as torchrun, or the code the spec asked for on giving up (``set_exit_code``: the
    ``resilient`` preset's ``no_requeue_exit_code``, which tells a scheduler not to requeue)."""
    lifecycle = getattr(ref.agent, "lifecycle", None)
    code = getattr(lifecycle, "exit_code", None)
    if lifecycle is not None and isinstance(code, int) and 0 < code < 256:
        print(f"{PROG}: exit code {code}, as spec {lifecycle.spec.name!r} asked on giving up",
              file=sys.stderr)
        return code
    return FAILED


def _check_health_budget(spec: Any, config: Any, params: dict[str, Any] | None) -> None:
    """The spec's health checks must fit the rendezvous join timeout: the other nodes wait for
    this one in the rendezvous while it runs them."""
    from .._core._health import health_budget

    budget = health_budget(spec, params)
    if not budget:
        return
    join = float(config.rdzv_configs.get("join_timeout", 600))
    total = sum(budget.values())
    if total >= join:
        parts = " + ".join(f"{name} {seconds:g} s" for name, seconds in budget.items())
        raise UsageError(f"--spec {spec.name}: the health checks may take {total:g} s ({parts}), "
                         f"not less than the rendezvous join timeout ({join:g} s); the other "
                         "nodes would give up waiting for this one: shorten their timeouts or "
                         "raise --rdzv-conf join_timeout")


def _print_summary(recorder: RunRecorder | None, spec: Any,
                   job_failed: JobFailed | None = None) -> None:
    """The end-of-run summary (root cause first, the rule that gave up, restarts used, time
    lost, where the stacks and error files are), after torch's failure block.

    ``job_failed``: the job's outcome when this agent ends with it (another agent gave up, or
    the store is gone). This agent's own steps may have ended SUCCEEDED (its workers finished
    and it learnt the outcome at the exit barrier) and may show no failure of their own."""
    if recorder is None:
        return
    try:
        analysis = recorder.analysis(spec)
        if job_failed is not None and analysis.outcome != "FAILED":
            analysis = attrs.evolve(analysis, outcome="FAILED")
        text = format_text(analysis)
        if job_failed is not None and analysis.root_cause is None:
            head, _, rest = text.partition("\n")
            text = f"{head}\nroot cause: {job_failed}\n{rest}"
    except Exception:  # a summary must never hide the job's own error
        logger.debug("no end-of-run summary", exc_info=True)
        return
    print("\n" + text, end="", file=sys.stderr)


class TorchStyleFormatter(logging.Formatter):
    """The layout of torch's log lines (``torch._logging``), so that ``fsm-agent run``'s output
    reads like torchrun's: ``I1203 03:13:59.104000 9021 fsm_agent/torch/_launch.py:88] text``,
    the prefix repeated on every line of a multi-line message."""

    _LEVELS: ClassVar[dict[str, str]] = {
        "DEBUG": "V", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "C"}
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}" if text else record.exc_text
        path = record.pathname
        if path.startswith(self._ROOT + os.sep):
            path = os.path.relpath(path, self._ROOT)
        prefix = (f"{self._LEVELS.get(record.levelname, record.levelname)}"
                  f"{self.formatTime(record, '%m%d %H:%M:%S')}.{int(record.msecs * 1000):06d} "
                  f"{record.process} {path}:{record.lineno}]")
        return "\n".join(f"{prefix} {line}" for line in text.split("\n"))


def _configure_logging() -> None:
    # torch's elastic loggers honour LOGLEVEL (default WARNING); ours follow the same switch,
    # in torch's layout.
    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    log = logging.getLogger("fsm_agent")
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TorchStyleFormatter())
        log.addHandler(handler)


def main(argv: Sequence[str]) -> int:
    """``fsm-agent run ARGS``: 0 on success, 1 when workers failed, 128+N on signal N, 2 on bad
    arguments."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import config_from_args

    from ._runargs import ArgError, parse_args

    parser = build_parser()
    try:
        # argparse errors and unusable values as one line, before anything starts.
        args = parse_args(parser, list(argv))
    except ArgError as e:
        print(f"{PROG}: error: {e} (see {PROG} --help)", file=sys.stderr)
        return USAGE
    _configure_logging()
    closers: list[Callable[[], None]] = []
    ref = _AgentRef()
    recorder: RunRecorder | None = None
    lifecycle_spec: Any = None
    try:
        try:
            lifecycle_spec = load_spec_arg(args, args.lifecycle_spec, flag="--spec")
        except SpecError as e:
            # the first problem, on one line; `fsm-agent check` lists every one.
            raise UsageError(f"--spec: {e.problems[0] if e.problems else e}") from e
        params = spec_params(args, lifecycle_spec, max_restarts=args.max_restarts,
                             exit_barrier_timeout=args.exit_barrier_timeout)
        _prepare(args)
        try:
            config, cmd, cmd_args = config_from_args(args)
        except (AssertionError, ValueError, RuntimeError, OSError) as e:
            # OSError: torch makes --log-dir here (a race with the check in _runargs).
            raise UsageError(str(e)) from e
        _check_health_budget(lifecycle_spec, config, params)
        # What the end-of-run summary reads: this agent's steps, kept in memory (folded).
        recorder = RunRecorder(fields=ref.step_fields, node=socket.gethostname(),
                               pid=os.getpid(), run_id=config.run_id)
        listeners: list[Callable[..., Any]] = [ref]
        if args.trace:
            writer = _trace_listener(args.trace, lifecycle_spec, config.run_id, ref, args,
                                     params=params)
            listeners.append(writer)
            closers.append(writer.close)
        listeners.append(recorder)

        def _launch() -> None:
            launch(config, cmd, cmd_args,
                   options=_agent_options(args, lifecycle_spec, params, listeners),
                   on_agent=lambda agent: setattr(ref, "agent", agent))

        # torchrun's main is @record: the root cause's error file is copied to the launcher's
        # own TORCHELASTIC_ERROR_FILE, any other error is recorded there.
        record(_launch)()
        return OK
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.code
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        code = _failure_exit_code(ref)
        _print_summary(recorder, lifecycle_spec)
        return code
    except LeftJob as e:
        # One line: the node is unfit; the scheduler replaces it, the job goes on without it.
        print(f"{PROG}: left the job: {e.reason} (exit {e.exit_code})", file=sys.stderr)
        return e.exit_code
    except Preempted as e:
        # Drained: every agent of the job ends with the same code, for the scheduler to requeue.
        # "workers drained", or which workers were killed instead (a scheduler's own signal,
        # the drain's deadline): the report says what became of each rank's checkpoint
        print(f"{PROG}: preempted ({e.reason}); {e.workers} (exit {e.exit_code})",
              file=sys.stderr)
        _print_summary(recorder, lifecycle_spec)
        return e.exit_code
    except JobFailed as e:
        # Another agent gave up (every agent ends with the code it announced), or the
        # rendezvous store's host is gone.
        print(f"{PROG}: {e}; workers stopped", file=sys.stderr)
        _print_summary(recorder, lifecycle_spec, e)
        return e.exit_code
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
        return FAILED
    finally:
        # The agent holds ref among its listeners: drop ref's hold, or the agent and its
        # rendezvous stores live on in a cycle when main is called in-process, until a garbage
        # collection that may run in a child forked later, where ~TCPStore aborts or hangs.
        ref.agent = None
        for close in closers:
            close()
