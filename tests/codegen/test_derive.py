"""Symbolic differentiation of elementwise formulas (codegen/formula/derive.py) and its use by the
model: an expr op without a bprop gets one derived, every expr op a jvp (from its written bprop
when that is elementwise and linear in the output gradient, else from its expression)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from codegen import load_specs
from codegen.formula import derive
from codegen.formula.syntax import parse


def derived(expr: str, inputs: tuple[str, ...] = ("x", "y"), mode: str = "bprop") -> dict[str, str]:
    got = derive.derive(derive.ExprOp(inputs, inputs, [("out", parse(expr))]), mode, set())
    assert got.lets == () or mode, got
    return dict(got.formulas)


@pytest.mark.parametrize("expr, expected", [
    ("x + y", {"x": "dout", "y": "dout"}),
    ("x - y", {"x": "dout", "y": "-dout"}),
    ("x * y", {"x": "dout * y", "y": "dout * x"}),
    ("x / y", {"x": "dout / y", "y": "-(dout * x / (y * y))"}),
    ("exp(x)", {"x": "dout * out", "y": "zeros_like(y)"}),           # exp's derivative is its output
    ("tanh(x)", {"x": "dout * (1 - out * out)", "y": "zeros_like(y)"}),
    ("log(x)", {"x": "dout / x", "y": "zeros_like(y)"}),
    ("2 * x + 0 * y", {"x": "2 * dout", "y": "zeros_like(y)"}),       # no * 1, no + 0
    ("where(x > 0, x, 0.1 * x)", {"x": "where(x > 0, dout, 0.1 * dout)", "y": "zeros_like(y)"}),
    ("floor(x) * y", {"x": "zeros_like(x)", "y": "dout * floor(x)"}),
    ("abs(x)", {"x": "dout * sign(x)", "y": "zeros_like(y)"}),       # PyTorch's subgradient: 0 at 0
])
def test_reverse_mode_rules(expr: str, expected: dict[str, str]) -> None:
    assert derived(expr) == expected


def test_maximum_splits_ties_evenly() -> None:
    got = derive.derive(derive.ExprOp(("x", "y"), ("x", "y"), [("out", parse("maximum(x, y)"))]), "bprop", set())
    assert dict(got.lets) == {"e0": "x > y", "e1": "x < y", "e2": "0.5 * dout"}
    assert dict(got.formulas) == {"x": "where(e0, dout, where(e1, zeros_like(dout), e2))",
                                  "y": "where(e0, zeros_like(dout), where(e1, dout, e2))"}


def test_forward_mode_and_multiple_outputs() -> None:
    op = derive.ExprOp(("x",), ("x",), [("s", parse("sin(x)")), ("c", parse("cos(x)"))])
    assert dict(derive.derive(op, "jvp", set()).formulas) == {"s": "x_t * c", "c": "-(x_t * s)"}
    assert dict(derive.derive(op, "bprop", set()).formulas) == {"x": "ds * c - dc * s"}
    assert derived("x * y", mode="jvp") == {"out": "x_t * y + y_t * x"}


def test_tensors_of_another_dtype_are_cast_like_the_gradients_input() -> None:
    # (ops take one dtype per type variable: `dout * n` with n int32 raised at the first backward)
    dtypes = {"x": "T", "n": "int32", "w": "U", "out": "T"}
    op = derive.ExprOp(("x", "n", "w"), ("x", "w"), [("out", parse("x * n * w"))], None, dtypes)
    assert dict(derive.derive(op, "bprop", set()).formulas) == {
        "x": "dout * cast_like(n, x) * cast_like(w, x)",
        "w": "cast_like(dout, w) * cast_like(x, w) * cast_like(n, w)"}
    jvp = derive.derive(op, "jvp", set())
    assert jvp.lets == (("e0", "cast_like(n, out)"),)  # (read twice: one cast)
    assert dict(jvp.formulas) == {"out": "x_t * e0 * cast_like(w, out) + cast_like(w_t, out) * x * e0"}
    # a comparison of one dtype's tensors stays in it (n int32 > 2048 in float16 would compare 2048)
    gate = derive.ExprOp(("x", "n"), ("x",), [("out", parse("where(n > 2048, x, 3 * x)"))], None,
                         {"x": "T", "n": "int32", "out": "T"})
    assert dict(derive.derive(gate, "bprop", set()).formulas) == {"x": "where(n > 2048, dout, 3 * dout)"}
    # one dtype: no cast
    same = derive.ExprOp(("x", "y"), ("x", "y"), [("out", parse("x * y"))], None, {"x": "T", "y": "T", "out": "T"})
    assert dict(derive.derive(same, "bprop", set()).formulas) == {"x": "dout * y", "y": "dout * x"}


def test_an_attr_test_stays_a_choice_and_repeats_become_lets() -> None:
    op = derive.ExprOp(("x",), ("x",), [("out", parse('where(mode == "a", exp(x * x), x * x * x)'))])
    got = derive.derive(op, "bprop", {"e0"})
    assert got.lets == (("e1", "x + x"), ("e2", "x * x"))  # (e0 is taken)
    assert dict(got.formulas) == {"x": 'where(mode == "a", dout * exp(e2) * e1, dout * (e1 * x + e2))'}


@pytest.mark.parametrize("text", [
    "a - (b - c)", "a / (b * c)", "-(a * b)", "-a * b", "a * -b", "(a + b) * c", "a - -1",
    'where(k == "s", a, b) + f(a, b=c).o', "a < b + c", "(a < b) == (c > d)", "[1, 2.5, -3]",
])
def test_unparse_round_trips(text: str) -> None:
    tree = parse(text)
    again = derive.unparse(tree)
    assert derive.unparse(parse(again)) == again
    assert parse(again) == parse(again)  # (positions aside, the same tree: checked on the text)


def test_linear_in_the_output_gradient() -> None:
    linear = ["dout", "-dout * x", "where(x > 0, dout, zeros_like(dout))", "dout / y + 2 * dout",
              "if_given(w, dout * w, dout)"]
    for text in linear:
        assert derive.is_linear_in(parse(text), "dout"), text
    for text in ["dout * dout", "exp(dout)", "sum(dout)", "where(dout > 0, dout, x)", "dout + 1"]:
        assert not derive.is_linear_in(parse(text), "dout"), text


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_an_expr_op_without_bprop_gets_derived_formulas(tmp_path: Path, real_ops) -> None:
    path = write(tmp_path, "softplus", """\
        softplus:
          doc: log(1 + exp(x)).
          inputs:
            x: T
          outputs:
            out: {dtype: T, shape: same(x)}
          dtypes:
            T: [float32, float64]
          impl:
            expr: log1p(exp(x))
        """)
    op, = load_specs([path], known=real_ops)
    assert op.bprop is not None and op.bprop.derived == "impl.expr"
    assert [(n, f.text) for n, f in op.bprop.grads] == [("x", "dout * exp(x) / (1 + exp(x))")]
    assert op.jvp is not None and op.jvp.derived == "impl.expr"
    assert [(n, f.text) for n, f in op.jvp.tangents] == [("out", "x_t * exp(x) / (1 + exp(x))")]
    assert "bprop" not in op.to_yaml() and "jvp" not in op.to_yaml()  # derived, not written


def test_a_written_elementwise_bprop_gives_the_jvp(real_ops) -> None:
    relu = next(o for o in real_ops if o.name == "relu")
    assert relu.jvp is not None and relu.jvp.derived == "bprop"
    # PyTorch's choice at 0 (slope 0) holds in forward mode too
    assert [(n, f.text) for n, f in relu.jvp.tangents] == [("out", "where(x <= 0, zeros_like(x_t), x_t)")]
    softmax = next(o for o in real_ops if o.name == "softmax")
    assert softmax.jvp is not None and softmax.jvp.derived == ""  # written in its spec
