"""Loading a spec: by preset name or path, from a bounded read, through every check.

Loading is three steps, each in a module of its own: ``_yaml`` reads the text safely into plain
data with the line of every element, ``_shape`` checks that data key by key into a ``Spec`` (and
``_policy`` compiles its failure-policy table into ordinary transitions), and ``_static`` checks
what the spec means (reachability, determinism, bounded restart cycles, timers, rules). Every
problem names the file, the line and the element, and all are reported at once.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._errors import SpecError
from ._files import read_bounded
from ._shape import UnknownNames, build_spec
from ._spec import MAX_SPEC_BYTES, Spec
from ._static import check_spec
from ._vocabulary import Vocabulary
from ._yaml import YamlReader

__all__ = ["PRESETS_DIR_ENV", "load_spec", "parse_spec", "preset_names", "resolve_spec_path"]

PRESETS_DIR_ENV = "FSM_AGENT_SPECS"


def _spec_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent.parent  # the fsm_agent package
    dirs = []
    if os.environ.get(PRESETS_DIR_ENV):
        dirs.append(Path(os.environ[PRESETS_DIR_ENV]))
    # An installed wheel carries the presets inside the package; a source checkout (and an
    # editable install) reads the repository's top-level specs/ directory.
    dirs += [here / "specs", here.parent / "specs"]
    return [d for d in dirs if d.is_dir()]


def preset_names() -> list[str]:
    """Names of the built-in specs (``torchelastic``, ``torchrun``, ``resilient``)."""
    names: set[str] = set()
    for d in _spec_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def resolve_spec_path(name_or_path: str | os.PathLike[str]) -> Path:
    """The file a preset name or path refers to; ``SpecError`` for an unknown preset."""
    text = os.fspath(name_or_path)
    path = Path(text)
    looks_like_path = (
        isinstance(name_or_path, os.PathLike)
        or os.sep in text
        or "/" in text
        or path.suffix in (".yaml", ".yml")
    )
    if looks_like_path or path.is_file():
        return path
    for d in _spec_dirs():
        candidate = d / f"{text}.yaml"
        if candidate.is_file():
            return candidate
    raise SpecError.single(
        text,
        None,
        "",
        f"no such spec file or preset (presets: {', '.join(preset_names()) or 'none found'})",
    )


_LOAD_CACHE: dict[tuple[str, int, int, int], Spec] = {}


def load_spec(
    name_or_path: str | os.PathLike[str] | Spec, *, vocabulary: Vocabulary | None = None
) -> Spec:
    """Load and check a spec by preset name (``"torchelastic"``) or file path.

    Raises ``SpecError`` naming the file, line and element of every problem found.
    ``vocabulary`` adds the embedding program's own guards, actions and kinds.
    """
    if isinstance(name_or_path, Spec):
        return name_or_path
    vocab = vocabulary or Vocabulary.builtin()
    path = resolve_spec_path(name_or_path)
    shown = str(path)
    try:
        st = path.stat()
        if st.st_size > MAX_SPEC_BYTES:
            raise SpecError.single(
                shown,
                None,
                "",
                f"file is {st.st_size} bytes; a spec may be at most {MAX_SPEC_BYTES}",
            )
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size, id(vocab))
        if key in _LOAD_CACHE:
            return _LOAD_CACHE[key]
        # Bounded and never blocking: a FIFO or /dev/zero is refused, not read for ever.
        data = read_bounded(path, MAX_SPEC_BYTES, "spec")
    except OSError as e:
        raise SpecError.single(shown, None, "", f"cannot read spec: {e.strerror or e}") from None
    spec = parse_spec(data, path=shown, vocabulary=vocab)
    _LOAD_CACHE[key] = spec
    return spec


def parse_spec(
    source: str | bytes, *, path: str = "<string>", vocabulary: Vocabulary | None = None
) -> Spec:
    """Parse and check a spec from YAML text. Raises ``SpecError``."""
    vocab = vocabulary or Vocabulary.builtin()
    if isinstance(source, bytes):
        if len(source) > MAX_SPEC_BYTES:
            raise SpecError.single(
                path, None, "", f"spec is {len(source)} bytes; at most {MAX_SPEC_BYTES} allowed"
            )
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as e:
            line = source[: e.start].count(b"\n") + 1
            raise SpecError.single(
                path, line, "", f"not valid UTF-8 (byte {source[e.start]:#04x} at offset {e.start})"
            ) from None
    else:
        text = source
    reader = YamlReader(path)
    raw = reader.read(text)
    try:
        spec = build_spec(raw, path=path, vocabulary=vocab, lines=reader.lines)
    except UnknownNames as e:
        # An unregistered name hides nothing else: the machine's own problems come with it.
        try:
            check_spec(e.spec, lines=reader.lines)
        except SpecError as more:
            raise SpecError([*e.problems, *more.problems]) from None
        except Exception:
            # the whole-spec checks assume known names; should one trip over an unknown name,
            # the names found are still the answer
            pass
        raise SpecError(e.problems) from None
    check_spec(spec, lines=reader.lines)
    return spec
