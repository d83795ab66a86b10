"""The model turns back into YAML: every shipped spec, written by OpSpec.to_yaml and read again,
gives the same model (locations aside), and writing that again gives the same text."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from codegen import load_spec_file, load_specs
from codegen.gen import render_module
from codegen.model import OpSpec

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHIPPED = sorted(ROOT.glob("op_specs/*.yaml")) + sorted(FIXTURES.glob("*.yaml"))
LOCATION_FIELDS = {"loc", "path", "inline"}  # where a spec was written, and how (not what it says)


def _what(obj: Any) -> Any:
    """A model value without its locations, comparable with ==."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__name__,) + tuple((f.name, _what(getattr(obj, f.name)))
                                             for f in dataclasses.fields(obj) if f.name not in LOCATION_FIELDS)
    if isinstance(obj, (tuple, list)):
        return tuple(_what(x) for x in obj)
    return obj


@pytest.fixture(scope="module")
def shipped() -> dict[str, OpSpec]:
    ops = load_specs([ROOT / "op_specs"], kernel_root=ROOT)
    ops += load_specs([FIXTURES], known=ops)
    return {o.name: o for o in ops}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_round_trip(path: Path, shipped: dict[str, OpSpec], tmp_path: Path) -> None:
    op = shipped[path.stem]
    text = op.to_yaml()
    (tmp_path / path.name).write_text(text, encoding="utf-8")
    again = load_spec_file(tmp_path / path.name)
    assert _what(again) == _what(op)
    assert again.to_yaml() == text


def _plain(obj: Any) -> Any:
    """The model as opforge.load's cache of parsed specs reads it back: enums as plain strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = object.__new__(type(obj))
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, _plain(getattr(obj, f.name)))
        return out
    if isinstance(obj, Enum):
        return str.__str__(obj)
    if isinstance(obj, tuple):
        return tuple(_plain(x) for x in obj)
    return obj


def test_plain_string_model_generates_the_same(shipped: dict[str, OpSpec]) -> None:
    # opforge.load keeps opforge's own specs as JSON, whose strings come back where the model had enums
    ops = load_specs([ROOT / "op_specs"], kernel_root=ROOT)
    mine = [shipped[p.stem] for p in sorted(FIXTURES.glob("*.yaml"))]
    sources = {o.name: f"{o.name}.yaml" for o in mine}
    plain_known = [_plain(o) for o in ops]
    assert {type(a.type) for o in plain_known for a in o.attrs} == {str}
    want = render_module(mine, sources, "m", ops)
    got = render_module([_plain(o) for o in mine], sources, "m", plain_known)
    assert [(r.name, r.text) for r in got] == [(r.name, r.text) for r in want]
