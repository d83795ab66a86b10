"""Multi-output ops in formulas: ``op(...).output`` selects one output, a let binds them all; both
are lowered to C++ (an element of the TensorList ops::<op> returns) and to Python (of the tuple the
framework's op returns)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from codegen import load_specs
from codegen.gen import render_formulas, render_op
from codegen.model import OpSpec

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
centered:
  doc: x minus its mean over the last axis.
  inputs:
    x: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {}
  impl:
    composite: x - layer_norm(x).mean
  bprop:
    let:
      y, m, r: layer_norm(dout)
    x: y / r + m - rms_norm(dout).y * 0
"""


def rendered(specs: Path, file: str) -> tuple[OpSpec, dict[str, OpSpec], str]:
    """The op of spec path ``specs`` (a file or folder) loaded with the shipped ones, the table, and
    its generated C++ (``<op>.cpp``, its spec named ``file``)."""
    ops = load_specs([ROOT / "op_specs"])
    (op,) = load_specs([specs], known=ops)
    table = {o.name: o for o in ops + [op]}
    cpp = next(r.text for r in render_op(op, table, file) if r.name == f"{op.name}.cpp")
    return op, table, cpp


def test_select_and_bind_lower_to_cpp_and_python(tmp_path: Path) -> None:
    (tmp_path / "centered.yaml").write_text(textwrap.dedent(SPEC), encoding="utf-8")
    op, table, cpp = rendered(tmp_path, "centered.yaml")
    assert "ops::sub(v_x, ops::layer_norm(v_x, nullptr, nullptr, std::vector<int64_t>{-1}, 1e-05)[1])" in cpp
    assert "TensorList v_0{};" in cpp
    assert "if (need_0) v_0 = ops::layer_norm(v_dout, nullptr, nullptr, std::vector<int64_t>{-1}, 1e-05);" in cpp
    assert "if (need_0) v_m = v_0[1];" in cpp and "if (need_0) v_r = v_0[2];" in cpp
    assert "ops::rms_norm(v_dout, nullptr, 1e-06, std::vector<int64_t>{-1})[0]" in cpp
    py = render_formulas([op], ["centered.yaml"], table).text
    assert "return F.sub(v_x, F.layer_norm(v_x, None, None, [-1], 1e-05)[1])" in py
    assert "v_0 = F.layer_norm(v_dout, None, None, [-1], 1e-05) if need[0] else None" in py
    assert "v_y = v_0[0] if need[0] else None" in py
    assert "let y, m, r = layer_norm(dout)" in cpp  # the docstring
    # the model writes the binding back as it was written
    assert "y, m, r: layer_norm(dout)" in op.to_yaml()


AFFINE = ROOT / "tests" / "fixtures" / "affine.yaml"  # (also compiled and run by tests/test_jit.py)


def test_guarded_let_is_bound_only_when_its_inputs_are_given() -> None:
    # `if_given(w, if_given(b, f))` as a let's formula: computed only when w and b are both given
    # (and a gradient needing it is), in C++ and in Python; a jvp let likewise, with w's tangent
    op, table, cpp = rendered(AFFINE, "affine.yaml")
    assert ("if ((need_1 || need_2) && v_w && v_b) v_0 = ops::norm_affine_grad(v_dout, v_x, ones_like(v_x), "
            "v_w, v_b, nullptr);") in cpp
    assert "if (need_1 && v_w && v_b) v_dw = v_0[0];" in cpp and "if (need_2 && v_w && v_b) v_db = v_0[1];" in cpp
    assert "(v_w ? (v_b ? v_dw : ops::sum_to_like(" in cpp
    assert ("const TensorPtr v_tw = (v_w) ? ops::add(ops::mul(v_x_t, v_w), ops::mul(v_x, v_w_t)) : TensorPtr{};"
            in cpp)
    py = render_formulas([op], ["affine.yaml"], table).text
    assert "v_0 = F.norm_affine_grad(v_dout, v_x, H.ones_like(v_x), v_w, v_b, None) if (need[1] or need[2]) " \
        "and v_w is not None and v_b is not None else None" in py
    assert "v_dw = v_0[0] if need[1] and v_w is not None and v_b is not None else None" in py
    assert "v_tw = F.add(" in py and "if v_w is not None else None" in py
    assert "let dw, db = if_given(w, if_given(b, norm_affine_grad(dout, x, ones_like(x), w, b)))" in cpp


def test_jvp_let_names_never_meet_the_outputs_list(tmp_path: Path) -> None:
    # a multi-output jvp let's TensorList is v_<k>j, which no spec name can take (j0 can)
    spec = SPEC + "  jvp:\n    let:\n      y, m, r: layer_norm(x_t)\n      j0: y * r\n    out: j0 + m\n"
    (tmp_path / "centered.yaml").write_text(textwrap.dedent(spec), encoding="utf-8")
    _, _, cpp = rendered(tmp_path, "centered.yaml")
    assert "const TensorList v_0j = ops::layer_norm(v_x_t," in cpp
    assert "const TensorPtr v_y = v_0j[0];" in cpp and "const TensorPtr v_j0 = ops::mul(v_y, v_r);" in cpp
