"""YAML text to plain data, safely, remembering the line of every element.

The text is composed into nodes with PyYAML's safe composer and only plain mappings, sequences
and scalars with the core tags are built, by this module: no tag can construct an object, no
anchor can multiply the document beyond a fixed number of elements, no nesting can exhaust the
stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from ._errors import SpecError

__all__ = ["MAX_DEPTH", "MAX_NODES", "YamlReader", "element_name"]

MAX_NODES = 20_000
MAX_DEPTH = 64
_CORE_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "bool", "null", "float", "map", "seq")
}
# libyaml's composer when PyYAML has it (ten times faster); both build the same inert nodes.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def element_name(where: Sequence[Any]) -> str:
    """``("transitions", 3, "guards")`` as ``transitions[3].guards``."""
    out = ""
    for part in where:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class YamlReader:
    """Reads one document; ``lines`` maps every element's path to its line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: dict[tuple[Any, ...], int] = {}
        self._count = 0
        self._last_line = 1
        # Only ever given scalar nodes with core tags (checked first), so it builds str/int/bool.
        self._constructor = yaml.constructor.SafeConstructor()  # type: ignore[no-untyped-call]

    def _error(self, line: int | None, where: Sequence[Any], message: str) -> SpecError:
        if line is not None:
            # PyYAML may place the end of the stream one line past the text's last line.
            line = max(1, min(line, self._last_line))
        return SpecError.single(self.path, line, element_name(where), message)

    def read(self, text: str) -> Any:
        """The document as dicts, lists and scalars; raises ``SpecError`` with the line."""
        self._last_line = text.count("\n") + (0 if text.endswith("\n") else 1)
        try:
            # compose() builds nodes only; constructing them ourselves is what keeps tags inert.
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark is not None else None
            msg = " ".join(str(x) for x in (e.context, e.problem) if x)
            if e.context_mark is not None and mark is not e.context_mark:
                msg += f" (the construct started on line {e.context_mark.line + 1})"
            raise self._error(line, (), f"YAML syntax error: {msg}") from None
        except yaml.reader.ReaderError as e:
            # Raised for characters YAML forbids; it knows the offset, not the line.
            line = text[: e.position].count("\n") + 1
            raise self._error(
                line, (), f"character {_codepoint(e.character)} is not allowed in YAML "
                f"({e.reason})"
            ) from None
        except yaml.YAMLError as e:
            raise self._error(None, (), f"YAML error: {e}") from None
        except RecursionError:
            raise self._error(None, (), f"nesting too deep (at most {MAX_DEPTH} levels)") from None
        if node is None:
            raise self._error(1, (), "empty spec")
        return self._build(node, ())

    def _build(self, node: yaml.Node, where: tuple[Any, ...]) -> Any:
        self._count += 1
        line = node.start_mark.line + 1
        if self._count > MAX_NODES:
            raise self._error(line, where, f"spec too large (more than {MAX_NODES} elements)")
        if len(where) > MAX_DEPTH:
            raise self._error(line, where, f"nesting too deep (at most {MAX_DEPTH} levels)")
        self.lines[where] = line
        if node.tag not in _CORE_TAGS:
            raise self._error(line, where, f"YAML tag {node.tag!r} is not allowed in a spec")
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for knode, vnode in node.value:
                kline = knode.start_mark.line + 1
                if not isinstance(knode, yaml.ScalarNode):
                    raise self._error(kline, where, "mapping keys must be plain scalars")
                key = self._build(knode, (*where, "<key>"))
                if isinstance(key, bool):
                    # YAML 1.1 reads on/off/yes/no as booleans: `on:` would silently be `True:`.
                    raise self._error(kline, where, f"key {knode.value!r} is read as a boolean "
                                      f"by YAML; write it quoted ('{knode.value}') or rename it")
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    raise self._error(kline, (*where, key), f"duplicate key {key!r}")
                self.lines[(*where, key)] = kline
                out[key] = self._build(vnode, (*where, key))
                self.lines[(*where, key)] = kline
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(item, (*where, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._constructor.construct_object(node)  # type: ignore[no-untyped-call]


def _codepoint(char: str | int) -> str:
    return f"U+{char if isinstance(char, int) else ord(char):04X}"
