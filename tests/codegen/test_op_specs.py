"""Every spec in op_specs/ parses, alone and together, into one op per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen import OpSpec, load_spec_file, load_specs

ROOT = Path(__file__).resolve().parents[2]
SPEC_DIR = ROOT / "op_specs"
SPEC_FILES = sorted(SPEC_DIR.glob("*.yaml"))


def test_op_specs_is_not_empty() -> None:
    assert len(SPEC_FILES) >= 20


def test_load_specs_returns_every_op() -> None:
    ops = load_specs([SPEC_DIR], kernel_root=ROOT)
    assert [op.name for op in ops] == sorted(p.stem for p in SPEC_FILES)
    assert all(isinstance(op, OpSpec) for op in ops)


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_each_spec_loads_on_its_own(path: Path) -> None:
    op = load_spec_file(path, kernel_root=ROOT)
    assert op.name == path.stem
    assert op.doc and op.outputs and op.targets
    assert op.impl.kind in ("expr", "composite", "cpp", "aot")
    # the op's location is its name, the first key of its file
    assert op.loc.line >= 1 and op.loc.col == 1


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_each_op_has_cuda_rows_or_says_why_not(path: Path) -> None:
    """Issue 15: every shipped op runs on CUDA, or its doc says why it does not."""
    op = load_spec_file(path, kernel_root=ROOT)
    if op.target("cuda") is None:
        assert "CPU only:" in op.doc, f"{op.name}: no cuda rows, and its doc does not say why ('CPU only: ...')"
