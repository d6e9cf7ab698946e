"""The tables of guard and action kinds in docs/spec-format.md, made from each ``Kind``.

A kind's declaration (its arguments, their types, defaults and choices, and its description) is
the one place it is described: the tables are generated from it, between marker comments
(``<!-- generated: NAME ... -->`` and ``<!-- end: NAME -->``). ``python tools/generated_docs.py``
rewrites them; ``tests/test_kinds.py`` fails while they are stale.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._context import Kind
from ._params import format_param
from ._vocabulary import Vocabulary

__all__ = ["kind_table", "spec_format_tables", "with_tables"]

#: How an argument type reads in the table (the parameter types read as their own names).
_TYPE_WORDS = {"guard": "a guard name", "guard_list": "guard names"}


def _argument(kind: Kind, name: str, type_name: str) -> str:
    choices = kind.choices.get(name)
    text = f"`{name}`: " + ("|".join(f"`{c}`" for c in choices) if choices
                            else _TYPE_WORDS.get(type_name, type_name))
    if name == kind.positional:
        text += ", the bare value"
    if name in kind.defaults:
        default = format_param(type_name, kind.defaults[name])
        text += f", default `{default}`" if default else ", default empty"
    if name in kind.user_only:
        text += ", the user's (a parameter)"
    return text


def _arguments(kind: Kind) -> str:
    if not kind.args:
        return "none (`{}`)"
    return "; ".join(_argument(kind, name, t) for name, t in kind.args.items())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")  # a pipe, even inside backticks


def kind_table(kinds: Mapping[str, Kind], *, heading: str = "true when") -> str:
    """The Markdown table of ``kinds``: name, arguments, description (under ``heading``)."""
    rows = [f"| kind | arguments | {heading} |", "|---|---|---|"]
    for name, kind in kinds.items():
        label = f"`{name}`" + (" (terminal)" if kind.terminal else "")
        rows.append(f"| {label} | {_cell(_arguments(kind))} | {_cell(kind.description)} |")
    return "\n".join(rows)


def spec_format_tables(vocabulary: Vocabulary | None = None) -> dict[str, str]:
    """The generated blocks of docs/spec-format.md, by marker name."""
    vocab = vocabulary or Vocabulary.builtin()
    return {"guard-kinds": kind_table(vocab.guard_kinds),
            "action-kinds": kind_table(vocab.action_kinds, heading="what it does")}


def with_tables(text: str, tables: Mapping[str, str] | None = None) -> str:
    """``text`` (docs/spec-format.md) with each marked block replaced by its table. Raises
    ``ValueError`` if a block's markers are missing."""
    for name, table in (tables or spec_format_tables()).items():
        block = re.compile(rf"(<!-- generated: {name}\b[^\n]*-->\n).*?(<!-- end: {name} -->)",
                           re.S)
        m = block.search(text)
        if m is None:
            raise ValueError(f"no block <!-- generated: {name} --> ... <!-- end: {name} -->")
        text = text[:m.end(1)] + table + "\n" + text[m.start(2):]
    return text
