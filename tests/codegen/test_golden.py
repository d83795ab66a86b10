"""Golden generated files for the fixture specs, compared byte for byte.

Regenerate after an intended change of the generated code, then review the diff:

    OPFORGE_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codegen import load_specs
from codegen.gen import Rendered, render_all, render_formulas, render_op, render_registry, render_stub

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = FIXTURES / "golden"
FIXTURE_OPS = sorted(p.stem for p in FIXTURES.glob("*.yaml"))
UPDATE = os.environ.get("OPFORGE_UPDATE_GOLDEN") == "1"


def source(name: str) -> str:
    return f"fixtures/{name}.yaml"


def rendered() -> list[Rendered]:
    """The fixture ops' files, rendered with op_specs/ as the table their formulas call."""
    ops = load_specs([FIXTURES, ROOT / "op_specs"])
    table = {o.name: o for o in ops}
    mine = [table[n] for n in FIXTURE_OPS]
    out = [r for op in mine for r in render_op(op, table, source(op.name))]
    sources = [source(op.name) for op in mine]
    return out + [render_registry(mine, sources), render_stub(mine, sources), render_formulas(mine, sources, table)]


RENDERED = {r.name: r.text for r in rendered()}


def test_fixtures_cover_each_impl_kind() -> None:
    ops = {o.name: o for o in load_specs([FIXTURES, ROOT / "op_specs"]) if o.name in FIXTURE_OPS}
    assert sorted({o.impl.kind for o in ops.values()}) == ["composite", "cpp", "expr", "pyfunc"]
    assert any(o.impl.kind == "expr" and len(o.outputs) > 1 for o in ops.values())
    assert any(len(o.outputs) > 1 and any(i.optional for i in o.inputs) for o in ops.values())


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_golden(name: str) -> None:
    golden = GOLDEN / f"{name}.golden"
    data = RENDERED[name].encode("utf-8")
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        if not golden.is_file() or golden.read_bytes() != data:
            golden.write_bytes(data)
        return
    assert golden.is_file(), f"no golden file {golden.name}: run with OPFORGE_UPDATE_GOLDEN=1"
    expected = golden.read_bytes()
    if data != expected:
        # a readable diff first, then the byte comparison (trailing whitespace, newlines)
        assert RENDERED[name] == expected.decode("utf-8")
        assert data == expected


def test_no_stale_golden_files() -> None:
    stale = sorted(p.name for p in GOLDEN.glob("*.golden") if p.name[: -len(".golden")] not in RENDERED)
    if UPDATE:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert stale == []


def test_render_op_matches_render_all() -> None:
    """render_op for one op gives what render_all gives for it inside the whole table."""
    ops = load_specs([FIXTURES, ROOT / "op_specs"])
    sources = {o.name: (source(o.name) if o.name in FIXTURE_OPS else f"op_specs/{o.name}.yaml")
               for o in ops}
    everything = {r.name: r.text for r in render_all(ops, sources)}
    for name in FIXTURE_OPS:
        for suffix in (".h", ".cpp"):
            assert everything[name + suffix] == RENDERED[name + suffix]
