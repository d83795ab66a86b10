"""How ``impl.expr`` arithmetic is emitted: ops that may see integers (an integer or bool input or
output) call runtime/elementwise.h's fn::add, fn::sub, fn::mul, fn::div and fn::neg, whose integer
overflow wraps and whose division never traps, and convert values to their compute type C with
runtime/dtype.h's convert (a float out of an integer's range saturates); float-only ops keep C++'s
operators and C's constructor."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen import load_specs
from codegen.api import lowered_expr

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
mix:
  doc: Integer-safe arithmetic.
  inputs:
    x: T
    y: U
  outputs:
    out: {{dtype: T, shape: "broadcast(x, y)"}}
  dtypes:
    T: [{t}]
    U: [{u}]
  targets:
    cpu: {{}}
  impl:
    expr: -x / y + x * 2 - y
"""


def code(tmp_path: Path, t: str, u: str) -> str:
    (tmp_path / "mix.yaml").write_text(SPEC.format(t=t, u=u))
    (op,) = load_specs([tmp_path / "mix.yaml"], known=load_specs([ROOT / "op_specs"]))
    lowered = lowered_expr(op)
    assert lowered is not None
    return lowered.code


@pytest.mark.parametrize("t,u", [("int32", "float32"), ("float32", "bool"), ("float64, uint8", "float64")])
def test_ops_that_may_see_integers_call_the_wrapping_functions(tmp_path: Path, t: str, u: str) -> None:
    # (and constants, attrs and where's branches take C through convert: a float saturates)
    assert code(tmp_path, t, u) == "fn::sub(fn::add(fn::div(fn::neg(v_x), v_y), fn::mul(v_x, convert<C>(2))), v_y)"


def test_float_only_ops_keep_the_operators(tmp_path: Path) -> None:
    assert code(tmp_path, "float16, float32", "bfloat16, float64") == "((((-v_x) / v_y) + (v_x * C(2))) - v_y)"


def test_shipped_ops() -> None:
    ops = {o.name: o for o in load_specs([ROOT / "op_specs"])}
    assert lowered_expr(ops["add"]).code == "fn::add(v_x, v_y)"  # int32 and int64 rows
    assert lowered_expr(ops["neg"]).code == "fn::neg(v_x)"
    assert "fn::" not in lowered_expr(ops["sigmoid"]).code.replace("fn::exp", "")  # floats only


def test_a_negated_negative_literal_is_its_value(tmp_path: Path) -> None:
    # (its text was "--3": C++'s decrement, which does not compile)
    (tmp_path / "mix.yaml").write_text(SPEC.format(t="float32", u="float32").replace("-x / y + x * 2 - y",
                                                                                     "x + -(-3) - -(-(-2))"))
    (op,) = load_specs([tmp_path / "mix.yaml"], known=load_specs([ROOT / "op_specs"]))
    assert lowered_expr(op).code == "((v_x + C(3)) - C(-2))"


def test_pow_takes_both_arguments_in_the_compute_type(tmp_path: Path) -> None:
    # (fn::pow takes one type: pow(x + 1, 2) of int8 x was pow(int, signed char), and pow(x, x > 0)
    # pow(float, bool): neither compiled)
    (tmp_path / "mix.yaml").write_text(SPEC.format(t="int8, float32", u="bool").replace("-x / y + x * 2 - y",
                                                                                        "pow(x + 1, 2) + pow(x, y)"))
    (op,) = load_specs([tmp_path / "mix.yaml"], known=load_specs([ROOT / "op_specs"]))
    assert lowered_expr(op).code == ("fn::add(fn::pow(convert<C>(fn::add(v_x, convert<C>(1))), convert<C>(2)), "
                                     "fn::pow(convert<C>(v_x), convert<C>(v_y)))")
