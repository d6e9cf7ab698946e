"""What every ``fsm-agent`` subcommand shares: exit codes, one-line errors, the spec argument.

Exit codes (the same for every subcommand):

- ``OK`` (0): success.
- ``FAILED`` (1): the checked thing failed: a spec has problems (``check``), a trace diverges
  (``replay``), two specs differ (``diff``), a counterexample was found (``conformance``), the job
  failed (``run``), diagrams are stale (``diagram --all --check``).
- ``USAGE`` (2): bad input: a flag, a missing or unreadable file, an unknown preset, a spec that
  cannot be used by a command that is not checking it.

Nothing here imports torch: ``check``, ``diagram``, ``diff`` and ``replay`` must start fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .._core._errors import SpecError
from .._core._load import load_spec, preset_names
from .._core._spec import DEFAULT_SPEC, Spec
from .._core._vocabulary import Vocabulary

if TYPE_CHECKING:
    from ..trace._reader import Trace

__all__ = [
    "FAILED",
    "OK",
    "USAGE",
    "ArgumentParser",
    "UsageError",
    "add_format_option",
    "add_spec_option",
    "check_spec_exists",
    "finish_parser",
    "import_ref",
    "load_spec_arg",
    "make_parser",
    "print_json",
    "run_command",
    "seconds_arg",
    "shown",
    "spec_loading_kwargs",
    "spec_params",
]

OK, FAILED, USAGE = 0, 1, 2
# Bumped when a --format json shape changes incompatibly (a new key is not a change).
JSON_FORMAT_VERSION = 1


class UsageError(Exception):
    """One line for stderr and an exit code (``USAGE`` unless told): no traceback."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a parse error raises :class:`UsageError` (one line, exit 2) instead of
    printing the usage block and calling ``sys.exit``. ``--help`` still prints and exits 0."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def finish_parser(parser: argparse.ArgumentParser, examples: Sequence[str]) -> None:
    """Add ``--version`` and end the help with ``examples`` (two or three command lines, each
    optionally followed by ``  # comment``)."""
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"fsm-agent {__version__}",
                        help="print fsm-agent's version and exit")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)


def make_parser(prog: str, description: str, examples: Sequence[str],
                **kwargs: Any) -> ArgumentParser:
    """The parser of one subcommand: one-line errors, ``--version``, examples at the end."""
    parser = ArgumentParser(prog=prog, description=description, **kwargs)
    finish_parser(parser, examples)
    return parser


def add_format_option(parser: argparse.ArgumentParser) -> None:
    """``--format text|json``: JSON is one object on stdout (shapes in docs/cli.md)."""
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text); json prints one JSON object "
                        "whose shape is documented in docs/cli.md")


def print_json(command: str, body: dict[str, Any]) -> None:
    """Print a ``--format json`` result: ``{"command", "format_version", ...body}``."""
    out = {"command": command, "format_version": JSON_FORMAT_VERSION, **body}
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


def run_command(prog: str, body: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run one subcommand's ``body(argv)``; turn its errors into a line on stderr and a code."""
    from .._core._files import printable_lines

    try:
        return int(body(list(argv)))
    except UsageError as e:
        # Messages quote paths and trace fields: no terminal escapes, no endless lines.
        print(f"{prog}: error: {printable_lines(e)}", file=sys.stderr)
        return e.code
    except SpecError as e:
        print(f"{prog}: error: {printable_lines(e)}", file=sys.stderr)
        return USAGE


def seconds_arg(positive: bool) -> Callable[[str], float]:
    """An argparse ``type``: a finite duration (``1.5``, ``500ms``, ``5s``, ``10m``), more
    than 0 if ``positive``."""
    def parse(text: str) -> float:
        from .._core._units import BadValue, parse_duration

        try:
            value = parse_duration(text)
        except BadValue as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not math.isfinite(value) or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"must be {'more than 0' if positive else 'at least 0'} seconds and finite, "
                f"got {text!r}")
        return value

    parse.__name__ = "duration"
    return parse


def shown(path: str) -> str:
    """A path relative to the working directory when it is below it."""
    if path.startswith("<"):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# --------------------------------------------------------------------------------------------
# The spec argument
#
# Every subcommand that takes a spec declares it with add_spec_option and loads it with
# load_spec_arg. Options that change *how* a spec loads (for example spec parameters or an extra
# vocabulary) belong in _add_loading_options and spec_loading_kwargs: every subcommand then gets
# them.

_LOADING_MARK = "_fsm_agent_spec_loading"
_VOCABULARY_CACHE = "_fsm_agent_vocabulary"


def _add_loading_options(parser: Any, params: bool) -> None:
    """Options shared by every spec a command loads; added once per parser.

    ``--spec-param NAME=VALUE`` (repeatable; only for commands that run or show a spec with
    parameter values, ``params``) sets a spec parameter, checked against each spec by
    :func:`spec_params`; ``--vocabulary MODULE:ATTR`` names the ``fsm_agent.Vocabulary`` the
    spec's guard and action names resolve against (:func:`spec_loading_kwargs`). The user names
    the module: a spec file itself never causes an import.
    """
    if params:
        parser.add_argument(
            "--spec-param", action="append", dest="spec_params", default=[],
            metavar="NAME=VALUE",
            help="set a spec parameter (repeatable): a duration as seconds or with a unit "
            "(90, 500ms, 5s, 10m), a list as [3,4] or 3,4")
    parser.add_argument(
        "--vocabulary", dest="vocabulary", default=None, metavar="MODULE:ATTR",
        help="import MODULE and use its fsm_agent.Vocabulary ATTR for the spec's guard and "
        "action names (a spec with guards or actions of its own program)")


def import_ref(ref: str, flag: str, example: str = "mypkg.module:NAME") -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted); a problem is a one-line :class:`UsageError`
    starting with ``flag``."""
    import importlib

    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{flag} must be MODULE:ATTR (e.g. {example}), got {ref!r}")
    # As `python -m` does: the current directory's modules are importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module itself failing on import
        raise UsageError(f"{flag} {ref}: cannot import module {module_name!r}: "
                         f"{type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{flag} {ref}: module {module_name!r} has no attribute "
                             f"{attr!r}") from None
    return obj


def _vocabulary(args: argparse.Namespace) -> Vocabulary | None:
    ref = getattr(args, "vocabulary", None)
    if not ref:
        return None
    cached = getattr(args, _VOCABULARY_CACHE, None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    vocab = import_ref(ref, "--vocabulary", "mypkg.lifecycle:VOCABULARY")
    if not isinstance(vocab, Vocabulary):
        raise UsageError(f"--vocabulary {ref}: expected a fsm_agent.Vocabulary (for example "
                         f"fsm_agent.Vocabulary.builtin().extend(guards={{...}})), got "
                         f"{type(vocab).__name__}")
    setattr(args, _VOCABULARY_CACHE, vocab)
    return vocab


def spec_loading_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``load_spec`` keyword arguments from the options of :func:`_add_loading_options`."""
    vocab = _vocabulary(args)
    return {} if vocab is None else {"vocabulary": vocab}


def _param_overrides(args: argparse.Namespace) -> dict[str, str]:
    """``--spec-param`` as ``{name: text}``; a malformed or repeated one is a UsageError."""
    out: dict[str, str] = {}
    for item in getattr(args, "spec_params", None) or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--spec-param {item}: expected NAME=VALUE "
                             "(for example backoff_max=90s)")
        if name in out:
            raise UsageError(f"--spec-param {name}: given twice ({out[name]!r} and {value!r})")
        out[name] = value
    return out


def spec_params(args: argparse.Namespace, spec: Spec, *, max_restarts: int = 3,
                exit_barrier_timeout: float = 300.0) -> dict[str, Any]:
    """The values of ``spec``'s parameters in force: defaults and ``--spec-param`` overrides.

    An unknown name, an ill-typed or out-of-range value, or a value a guard or action of the
    spec cannot use, is a one-line :class:`UsageError` naming the flag, the parameter and the
    spec. ``max_restarts`` and ``exit_barrier_timeout`` are the agent's settings (specs may refer
    to them).
    """
    overrides = _param_overrides(args)
    for name, text in overrides.items():
        try:
            spec.bind({name: text})
        except SpecError as e:
            why = e.problems[0].message if e.problems else str(e)
            raise UsageError(f"--spec-param {name}={text}: spec {spec.name!r}: {why}") from None
    values = spec.bind(overrides)
    if overrides:
        _check_instances(spec, overrides, {**values, "max_restarts": max_restarts,
                                           "exit_barrier_timeout": float(exit_barrier_timeout)})
    return values


def _check_instances(spec: Spec, overrides: dict[str, str], values: dict[str, Any]) -> None:
    """The spec's guard and action instances built with ``values``: a value a kind refuses
    (an exit code of 300, say) is refused here, not when the lifecycle is first built."""
    vocab = spec.vocabulary
    for inst in (*spec.guard_defs, *spec.action_defs):
        kinds = vocab.guard_kinds if inst.role == "guard" else vocab.action_kinds
        kind = kinds.get(inst.kind)
        if kind is None:
            continue
        try:
            kind.instantiate(inst.args, values)
        except (ValueError, TypeError) as e:
            used = [n for n in overrides if any(getattr(a, "name", None) == n
                                                for a in inst.args.values())]
            given = ", ".join(f"{n}={overrides[n]}" for n in used or overrides)
            raise UsageError(f"--spec-param {given}: spec {spec.name!r}: {inst.role} "
                             f"{inst.name!r} ({inst.kind}) cannot use it: {e}") from None


def add_spec_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *names: str,
    help: str | None = None,
    params: bool = True,
    **kwargs: Any,
) -> argparse.Action:
    """Declare a spec argument: ``--spec`` (default) or a positional name given in ``names``.

    Keyword arguments go to ``add_argument`` (``default``, ``nargs``, ``dest``, ``metavar``); an
    option's default is :data:`DEFAULT_SPEC` unless given. The options shared by all spec loads
    are added to ``parser`` the first time: ``--vocabulary``, and ``--spec-param`` unless
    ``params`` is false (a command that never uses parameter values).
    """
    names = names or ("--spec",)
    if names[0].startswith("-"):
        kwargs.setdefault("default", DEFAULT_SPEC)
    kwargs.setdefault("metavar", "SPEC")
    default = kwargs.get("default")
    text = help or "spec file or preset name ({})".format(", ".join(preset_names()))
    if default is not None and help is None:
        text += f" (default: {default})"
    action = parser.add_argument(*names, help=text, **kwargs)
    if not getattr(parser, _LOADING_MARK, False):
        _add_loading_options(parser, params)
        setattr(parser, _LOADING_MARK, True)
    return action


def check_spec_exists(value: str, flag: str = "SPEC") -> None:
    """Raise :class:`UsageError` when ``value`` is neither a preset name nor a readable file.

    A missing file is a usage error (exit 2) for every command, including ``check``, for which a
    spec that exists but has problems is the checked thing failing (exit 1).
    """
    if value in preset_names():
        return
    if os.path.isfile(value):
        if not os.access(value, os.R_OK):
            raise UsageError(f"{flag} {value}: permission denied")
        return
    if os.path.exists(value):
        raise UsageError(f"{flag} {value}: not a file")
    presets = ", ".join(preset_names()) or "none found"
    raise UsageError(f"{flag} {value}: no such spec file or preset (presets: {presets})")


def load_spec_arg(args: argparse.Namespace, value: str | None = None, *,
                  flag: str = "--spec") -> Spec:
    """Load the spec a command line names: ``value`` (default ``args.spec``).

    A missing file or unknown preset raises :class:`UsageError` naming ``flag``; a spec with
    problems raises ``SpecError`` (every problem, each with file and line).
    """
    name = args.spec if value is None else value
    check_spec_exists(name, flag)
    return load_spec(name, **spec_loading_kwargs(args))


# --------------------------------------------------------------------------------------------
# Traces (diagram --trace, replay)


def read_trace_arg(path: str) -> list[Trace]:
    """The lifecycles of a trace file; a missing or malformed file is a :class:`UsageError`."""
    from ..trace._reader import read_trace
    from ..trace._schema import TraceError

    try:
        return read_trace(path)
    except TraceError as e:
        raise UsageError(str(e)) from None


def spec_for_trace(args: argparse.Namespace, trace_path: str, traces: Sequence[Trace],
                   given: str | None, flag: str = "--spec") -> Spec:
    """The spec given on the command line, else the built-in preset the trace's header names.

    A trace is untrusted input: no file it names is ever opened (``_replay.trace_spec``).
    """
    from .._core._files import printable
    from ..trace._replay import UntrustedSpec, trace_spec

    # The vocabulary the run used (--vocabulary): named in the header, never imported from it.
    vocab = traces[0].header.get("vocabulary") if traces else None
    also = (f" and --vocabulary {printable(vocab)}" if isinstance(vocab, str) and vocab
            and not getattr(args, "vocabulary", None) else "")
    if given:
        try:
            return load_spec_arg(args, given, flag=flag)
        except SpecError as e:
            hint = (f" (the trace was recorded with --vocabulary {printable(vocab)}: pass it "
                    "too, if you trust that module)" if also else "")
            raise UsageError(f"{flag}: {e}{hint}") from None
    try:
        return trace_spec(traces[0])
    except UntrustedSpec as e:
        where = printable(trace_path)
        option = flag.startswith("-")
        if e.path:
            how = f"{flag} {e.path}{also}" if option else f"{e.path} as {flag}{also}"
            trusted = "that file and module" if also else "that file"
            raise UsageError(f"{where}: {e}; pass {how} if you trust {trusted}") from None
        how = f"{flag} SPEC" if option else f"it as {flag}"
        raise UsageError(f"{where}: {e}; pass {how}{also}") from None
