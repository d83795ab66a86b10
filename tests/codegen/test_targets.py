"""`targets` is optional: without it an op registers every built target with every declared dtype and
format (as MindSpore derives registration info from the inputs when none is given), and a spec
generates the same files whether it leaves the key out or restates that default."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from codegen import load_spec_file, load_specs
from codegen.gen import render_all, render_module
from codegen.model import DType, Format, OpSpec
from codegen.targets import BUILDS, HOST

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

SPEC = """\
scale2:
  doc: Twice x.
  inputs:
    x: T
    n: {dtype: I, differentiable: false}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
    I: [int32, int64]
  impl:
    cpp: {}
  bprop:
    x: 2 * dout
"""

# a targets block that says only what leaving the key out says
_RESTATED = "  targets:\n    cpu: {}\n"
_TARGETS = re.compile(r"^  targets:\n(?:    .*\n)+", re.M)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scale2.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_absent_targets_register_the_host_target_every_dtype_and_format(tmp_path: Path) -> None:
    # whatever the build: a spec means the same rows in the cpu and the cuda wheel
    op = load_spec_file(_write(tmp_path, SPEC))
    assert op.targets_derived
    assert [t.name for t in op.targets] == [HOST] == ["cpu"]
    for t in op.targets:
        assert t.dtypes == (("T", (DType.FLOAT32, DType.FLOAT64)), ("I", (DType.INT32, DType.INT64)))
        assert t.formats == tuple(Format)
        assert len(t.rows()) == 2 * 2 * len(Format)


def test_given_targets_still_narrow(tmp_path: Path) -> None:
    text = SPEC.replace("  impl:", "  targets:\n    cpu: {dtypes: {T: [float32]}, formats: [NCHW]}\n  impl:")
    op = load_spec_file(_write(tmp_path, text))
    assert not op.targets_derived
    (cpu,) = op.targets
    assert cpu.rows() == [({"T": DType.FLOAT32, "I": i}, Format.NCHW) for i in (DType.INT32, DType.INT64)]


def test_to_yaml_leaves_absent_targets_out_and_keeps_given_ones(tmp_path: Path) -> None:
    derived = load_spec_file(_write(tmp_path, SPEC))
    assert "targets" not in derived.to_yaml()
    restated = load_spec_file(_write(tmp_path, SPEC.replace("  impl:", _RESTATED + "  impl:")))
    # the same rows, but a spec that names its targets keeps naming them (in a build with more
    # targets, leaving the key out would register more)
    assert restated.targets == derived.targets and not restated.targets_derived
    assert "targets:\n    cpu:" in restated.to_yaml()


def _toggled(text: str, op: OpSpec) -> str:
    """The spec text with a default-restating targets block removed, or added where absent."""
    if op.targets_derived:
        return text.replace("\n  impl:", "\n" + _RESTATED + "  impl:", 1)
    return _TARGETS.sub("", text, count=1)


@pytest.mark.parametrize("spec_dir", [ROOT / "op_specs", FIXTURES], ids=["op_specs", "fixtures"])
def test_a_default_restating_targets_block_changes_no_generated_file(spec_dir: Path, tmp_path: Path) -> None:
    known = [] if spec_dir == ROOT / "op_specs" else load_specs([ROOT / "op_specs"])
    ops = load_specs([spec_dir], known=known)
    other = tmp_path / spec_dir.name
    other.mkdir()
    toggled = 0
    for op in ops:
        text = Path(op.path).read_text(encoding="utf-8")
        new = _toggled(text, op)
        candidate = other / Path(op.path).name
        candidate.write_text(new, encoding="utf-8")
        flipped = load_spec_file(candidate)
        if flipped.targets == op.targets and flipped.targets_derived != op.targets_derived:
            toggled += 1
        else:  # it narrows: not a default restated (keep the spec as it is)
            candidate.write_text(text, encoding="utf-8")
    assert toggled >= max(1, sum(op.targets_derived for op in ops))  # every spec without targets, at least
    again = load_specs([other], known=known)
    sources = {o.name: f"{spec_dir.name}/{o.name}.yaml" for o in ops}

    def render(specs: list[OpSpec]) -> list[tuple[str, str]]:
        out = render_module(specs, sources, "m", known) if known else render_all(specs, sources)
        return [(r.name, r.text) for r in out]

    assert render(again) == render(ops)
