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


NEEDS = """\
scaled:
  doc: x times an optional weight, plus an optional bias, with a fused gradient of both.
  inputs:
    x: T
    w: {dtype: T, optional: true}
    b: {dtype: T, optional: true}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {}
  impl:
    composite: if_given(w, x * w, x) + if_given(b, b, zeros_like(x))
  bprop:
    let:
      dw, db: if_given(w, if_given(b, norm_affine_grad(dout, x, ones_like(x), w, b)))
      gx: if_given(w, dout * w, dout)
      twice: gx + gx
    x: if_needs(w, gx, if_needs(b, twice * 0.5, dout * if_given(w, w, ones_like(dout))))
    w: if_given(w, if_given(b, dw, sum_to_like(dout * x, w)), dout)
    b: if_given(b, if_given(w, db, sum_to_like(dout, b)), dout)
"""


def test_if_needs_branches_on_the_gradients_asked_for(tmp_path: Path) -> None:
    # if_needs(w, a, b): a when the backward computes w's gradient (w is then given), else b; a let
    # is computed only when some taken branch reads it: gx when x's gradient is and w's or b's is
    # (twice, which reads gx, when b's is), the fused dw, db only for w's or b's gradient
    (tmp_path / "scaled.yaml").write_text(NEEDS, encoding="utf-8")
    op, table, cpp = rendered(tmp_path, "scaled.yaml")
    assert "if ((need_1 || need_2) && v_w && v_b) v_0 = ops::norm_affine_grad(" in cpp
    assert "if (need_1 && v_w && v_b) v_dw = v_0[0];" in cpp
    assert "if ((need_0 && need_1) || (need_0 && need_2)) v_gx = (v_w ? ops::mul(v_dout, v_w) : v_dout);" in cpp
    assert "if (need_0 && need_2) v_twice = ops::add(v_gx, v_gx);" in cpp
    assert "grads[0] = ctx->ReduceGrad(0, (need_1 ? v_gx : (need_2 ? " in cpp
    py = render_formulas([op], ["scaled.yaml"], table).text
    assert "v_gx = (F.mul(v_dout, v_w) if v_w is not None else v_dout) if (need[0] and need[1]) or " \
        "(need[0] and need[2]) else None" in py
    assert "v_twice = F.add(v_gx, v_gx) if need[0] and need[2] else None" in py
    assert "H.reduce_grad((v_gx if need[1] else (" in py
    assert "x: if_needs(w, gx, if_needs(b, twice * 0.5, dout * if_given(w, w, ones_like(dout))))" in op.to_yaml()


def test_frozen_norm_parameters_skip_the_fused_parameter_gradients() -> None:
    # layer_norm and rms_norm: the fused backward that also sums the parameters' gradients runs
    # only when one of them is trained; x's gradient alone is layer_norm_backward/rms_norm_backward
    ops = {o.name: o for o in load_specs([ROOT / "op_specs"])}
    for name, fused, cond in (("layer_norm", "layer_norm_affine_backward", "(need_1 || need_2) && v_weight && v_bias"),
                              ("rms_norm", "rms_norm_affine_backward", "need_1 && v_weight")):
        cpp = next(r.text for r in render_op(ops[name], ops, f"{name}.yaml") if r.name == f"{name}.cpp")
        assert f"if ({cond}) v_0 = ops::{fused}(" in cpp, name
        assert "(need_1 ? v_dx : " in cpp, name


def test_if_needs_reads_nothing_and_a_derived_jvp_takes_its_second_branch(tmp_path: Path) -> None:
    # if_needs's test is no read of the tensor (Forward saves x only for y's gradient, which reads
    # it, and y for nothing); the jvp derived from an elementwise bprop linear in dout takes
    # if_needs's second branch
    spec = """\
scaled2:
  doc: x times y, plus y.
  inputs:
    x: T
    y: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {}
  impl:
    composite: x * 2.0 + y
  bprop:
    x: if_needs(y, dout * 2.0, dout + dout)
    y: if_needs(x, dout, dout * x / x)
"""
    (tmp_path / "scaled2.yaml").write_text(spec, encoding="utf-8")
    op, _, cpp = rendered(tmp_path, "scaled2.yaml")
    assert "ctx->SaveForBackward({(need_1) ? v_x : nullptr});" in cpp
    assert op.jvp is not None and op.jvp.derived == "bprop"
    assert [f.text for _, f in op.jvp.tangents] == ["x_t + x_t + y_t * x / x"]
