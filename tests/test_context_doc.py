"""Every field of ``fsm_agent.Context`` a custom guard may read is in docs/spec-format.md's
table: a new field is documented there, or said here to be internal."""

from __future__ import annotations

from pathlib import Path

import attrs

from fsm_agent import Context

DOC = Path(__file__).resolve().parent.parent / "docs" / "spec-format.md"
# The machine's own bookkeeping: not for guards to read.
INTERNAL = {"fatal_exceptions", "rng", "budget_scope", "backoff", "restarts_withdrawn",
            "guard_fns", "memo", "step"}


def test_every_field_a_guard_may_read_is_documented() -> None:
    table = DOC.read_text().split("### Guards and actions of your own program")[1]
    table = table.split("\n\n", 3)[2]  # the paragraph, then the table
    missing = [f.name for f in attrs.fields(Context)
               if f.name not in INTERNAL and f"`ctx.{f.name}`" not in table]
    assert not missing, f"document these in {DOC.name} (or mark them internal): {missing}"
    stale = [name for name in INTERNAL if name not in attrs.fields_dict(Context)]
    assert not stale, stale


def test_every_documented_field_is_one_a_guard_can_read() -> None:
    """The table names no field that Context no longer has (the list equals the real one)."""
    import re

    table = DOC.read_text().split("### Guards and actions of your own program")[1]
    table = table.split("\n\n", 3)[2]
    documented = set(re.findall(r"`ctx\.(\w+)", table))
    assert documented, table
    fields = attrs.fields_dict(Context)
    unknown = sorted(n for n in documented if n not in fields and not hasattr(Context, n))
    assert not unknown, f"{DOC.name} documents ctx fields Context does not have: {unknown}"
    internal = sorted(documented & INTERNAL)
    assert not internal, f"{DOC.name} documents internal fields: {internal}"


def test_every_built_in_kind_is_documented_with_its_own_description() -> None:
    import re

    from fsm_agent import Vocabulary

    vocab = Vocabulary.builtin()
    text = DOC.read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `(\w+)` \| .* \| (.*) \|$", text, re.M) if m.group(1) in vocab.guard_kinds}
    assert sorted(set(vocab.guard_kinds) - set(rows)) == [], "guard kinds without a row"
    differ = {name: (rows[name], kind.description) for name, kind in vocab.guard_kinds.items()
              if rows.get(name) != kind.description}
    assert differ == {}, "the docs' 'true when' must be the kind's description"
    assert [n for n in vocab.action_kinds if f"`{n}`" not in text] == [], "undocumented actions"
