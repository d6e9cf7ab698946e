"""``fsm-agent diagram``, ``fsm-agent replay`` and ``fsm-agent diff``.

None of them imports torch: they read specs and traces only, so each starts in well under 0.3 s.
Exit codes: 0 success (``diff``: no differences), 1 a finding (a divergent trace, differing
specs, stale diagrams), 2 bad input (a flag, a spec, a trace file), as ``diff(1)`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from ._errors import SpecError
from ._spec import Spec, load_spec, preset_names

if TYPE_CHECKING:
    from ._diagram import Highlight
    from ._trace import Trace

__all__ = ["diagram_main", "diff_main", "replay_main"]

DEFAULT_SPEC = "torchelastic"
DIAGRAMS_DIR = "diagrams"
REGENERATE_COMMAND = "fsm-agent diagram --all -o diagrams"
OK, FINDING, BAD_INPUT = 0, 1, 2


class _Fail(Exception):
    """One line for stderr and an exit code: bad input never ends in a traceback."""

    def __init__(self, message: str, code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _Fail(message)


def _run(prog: str, body: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    try:
        return int(body(list(argv)))
    except _Fail as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.code
    except SpecError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return BAD_INPUT
    except BrokenPipeError:
        # `fsm-agent diagram | head`: the reader left; nothing to report.
        return OK


def _load(name: str, flag: str = "SPEC") -> Spec:
    try:
        return load_spec(name)
    except SpecError as e:
        raise _Fail(f"{flag}: {e}") from None


def _shown(path: str) -> str:
    """A path relative to the working directory when it is below it."""
    if path.startswith("<"):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _traces(path: str) -> list[Trace]:
    from ._trace import TraceError, read_trace

    try:
        return read_trace(path)
    except TraceError as e:
        raise _Fail(str(e)) from None


def _spec_for_trace(
    trace_path: str, traces: Sequence[Trace], given: str | None, how: str = "--spec SPEC"
) -> Spec:
    if given:
        return _load(given, how.split(maxsplit=1)[0])
    first = traces[0]
    spec_path = first.header.get("spec_path")
    if isinstance(spec_path, str) and os.path.isfile(spec_path):
        return _load(spec_path, f"{trace_path}: header spec_path")
    if first.spec_name:
        return _load(first.spec_name, f"{trace_path}: header spec")
    raise _Fail(f"{trace_path}: the trace does not name its spec (it was recorded without "
                f"one); pass {how}")


# --------------------------------------------------------------------------------------------
# diagram


def _diagram(argv: list[str]) -> int:
    from ._diagram import EXTENSIONS, FORMATS, DiagramEngineMissing, regenerate, render

    parser = _Parser(
        prog="fsm-agent diagram",
        description="Draw a spec as a state diagram: every edge 'trigger [guards] / actions', "
        "entry and exit actions on the states, initial and final states marked.",
    )
    parser.add_argument("spec", nargs="?", metavar="SPEC",
                        help=f"spec file or preset name (default: {DEFAULT_SPEC}, or the spec "
                        "a --trace names)")
    parser.add_argument("--format", "-f", choices=FORMATS,
                        help="output format (default: from -o's extension, else mermaid); svg "
                        "and png need the pygraphviz wheel: pip install 'fsm-agent[diagrams]'")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write here instead of standard output (with --all: a directory)")
    parser.add_argument("--trace", metavar="TRACE",
                        help="highlight the path a recorded trace took (edge counts, final state)")
    parser.add_argument("--all", action="store_true",
                        help=f"write NAME.mmd and NAME.svg of every built-in spec into -o "
                        f"(default {DIAGRAMS_DIR}/)")
    parser.add_argument("--check", action="store_true",
                        help="with --all: write nothing, exit 1 if any file is missing or stale")
    args = parser.parse_args(argv)

    if args.check and not args.all:
        raise _Fail("--check goes with --all")
    if args.all:
        if args.spec or args.trace or args.format:
            raise _Fail("--all draws every built-in spec as .mmd and .svg; it takes no SPEC, "
                        "--trace or --format")
        outdir = args.output or DIAGRAMS_DIR
        specs = [_load(name) for name in preset_names()]
        try:
            files = regenerate(specs, outdir, check=args.check)
        except DiagramEngineMissing as e:
            raise _Fail(str(e)) from None
        if args.check:
            if files:
                print("stale or missing diagrams: " + ", ".join(files), file=sys.stderr)
                print(f"regenerate them with: {REGENERATE_COMMAND}", file=sys.stderr)
                return FINDING
            print(f"{outdir}: {2 * len(specs)} diagrams up to date")
            return OK
        for path in files:
            print(f"wrote {path}")
        if not files:
            print(f"{outdir}: {2 * len(specs)} diagrams already up to date")
        return OK

    fmt = args.format
    if args.output:
        ext = os.path.splitext(args.output)[1].lower()
        implied = EXTENSIONS.get(ext)
        if fmt is None:
            if implied is None:
                raise _Fail(f"-o {args.output}: cannot tell the format from {ext or 'no'} "
                            f"extension (known: {', '.join(sorted(EXTENSIONS))}); pass --format")
            fmt = implied
        elif implied is not None and implied != fmt:
            raise _Fail(f"--format {fmt} does not match -o {args.output} (a {ext} file holds "
                        f"{implied}); change one of them")
    fmt = fmt or "mermaid"

    highlight = None
    if args.trace:
        from ._diagram import highlight_from_replay
        from ._replay import replay

        traces = _traces(args.trace)
        spec = _spec_for_trace(args.trace, traces, args.spec, "SPEC")
        results = [replay(spec, t) for t in traces]
        highlight = _merge([highlight_from_replay(r) for r in results])
        for r in results:
            if not r.ok:
                print(f"fsm-agent diagram: warning: {args.trace}: {r.divergence}",
                      file=sys.stderr)
    else:
        spec = _load(args.spec or DEFAULT_SPEC)

    try:
        out = render(spec, fmt, highlight)
    except DiagramEngineMissing as e:
        raise _Fail(str(e)) from None
    data = out.encode("utf-8") if isinstance(out, str) else out
    if args.output:
        try:
            with open(args.output, "wb") as f:
                f.write(data)
        except OSError as e:
            raise _Fail(f"-o {args.output}: {e.strerror or e}") from None
        return OK
    if fmt == "png" and sys.stdout.isatty():
        raise _Fail("refusing to write PNG to a terminal; pass -o FILE.png")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return OK


def _merge(hs: Sequence[Highlight]) -> Highlight:
    """Several lifecycles of one trace file drawn as one path: counts add up."""
    from ._diagram import Highlight

    if len(hs) == 1:
        return hs[0]
    counts: dict[tuple[int, str], int] = {}
    extra: dict[tuple[str, str, str], tuple[int, str]] = {}
    visited: set[str] = set()
    for h in hs:
        for k, n in h.counts.items():
            counts[k] = counts.get(k, 0) + n
        for move, (n, why) in h.extra.items():
            extra[move] = (extra.get(move, (0, why))[0] + n, why)
        visited |= h.visited
    notes = "; ".join(h.note for h in hs if h.note)
    return Highlight(counts, extra, frozenset(visited), hs[-1].final,
                     f"{len(hs)} lifecycles" + (f"; {notes}" if notes else ""))


def diagram_main(argv: Sequence[str]) -> int:
    """``fsm-agent diagram [SPEC] [--format F] [-o FILE] [--trace TRACE] | --all [--check]``."""
    return _run("fsm-agent diagram", _diagram, argv)


# --------------------------------------------------------------------------------------------
# replay


def _replay(argv: list[str]) -> int:
    from ._replay import replay, summary

    parser = _Parser(
        prog="fsm-agent replay",
        description="Check a recorded trace against its spec: every step must be a transition "
        "the spec allows, with guards consistent with the recorded values.",
    )
    parser.add_argument("trace", metavar="TRACE", help="a JSON Lines trace (fsm-agent run --trace)")
    parser.add_argument("--spec", metavar="SPEC",
                        help="spec file or preset name (default: the one the trace names)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print divergences only")
    args = parser.parse_args(argv)
    traces = _traces(args.trace)
    spec = _spec_for_trace(args.trace, traces, args.spec)
    bad = 0
    for i, trace in enumerate(traces, start=1):
        res = replay(spec, trace)
        label = f"{_shown(args.trace)}" + (f" lifecycle {i}/{len(traces)}"
                                          if len(traces) > 1 else "")
        if res.ok:
            if not args.quiet:
                print(f"{label}: follows spec {spec.name!r} ({_shown(spec.path)})")
                print("  " + summary(res).replace("\n", "\n  "))
        else:
            bad += 1
            print(f"{label}: diverges from spec {spec.name!r} ({_shown(spec.path)})")
            print(f"  {res.divergence}")
            if res.checked > 1 and not args.quiet:
                print("  path until then: " + summary(res, steps=res.checked - 1)
                      .split("\n")[0])
    return FINDING if bad else OK


def replay_main(argv: Sequence[str]) -> int:
    """``fsm-agent replay TRACE [--spec SPEC]``: exit 1 at the first divergence."""
    return _run("fsm-agent replay", _replay, argv)


# --------------------------------------------------------------------------------------------
# diff


def _diff(argv: list[str]) -> int:
    from ._diff import diff_specs, format_diff

    parser = _Parser(
        prog="fsm-agent diff",
        description="List the transitions, state actions, outcomes and metrics that differ "
        "from SPEC_A to SPEC_B (descriptions are not compared).",
    )
    parser.add_argument("spec_a", metavar="SPEC_A", help="spec file or preset name")
    parser.add_argument("spec_b", metavar="SPEC_B", help="spec file or preset name")
    args = parser.parse_args(argv)
    a = _load(args.spec_a, "SPEC_A")
    b = _load(args.spec_b, "SPEC_B")
    d = diff_specs(a, b)
    sys.stdout.write(format_diff(d, paths=(_shown(a.path), _shown(b.path))))
    return OK if d.same else FINDING


def diff_main(argv: Sequence[str]) -> int:
    """``fsm-agent diff SPEC_A SPEC_B``: exit 0 when they behave the same, 1 when they differ."""
    return _run("fsm-agent diff", _diff, argv)
