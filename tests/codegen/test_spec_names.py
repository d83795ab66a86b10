"""Spec values that would otherwise reach the C++ compiler (or mislead it) are spec errors."""

from __future__ import annotations

import pytest

from test_spec_errors import LEAKY, leaky


def renamed(name: str, text: str = LEAKY) -> str:
    return text.replace("leaky:", f"{name}:", 1)


@pytest.mark.parametrize("files, expected", [
    pytest.param({"foo_bar": renamed("foo_bar"), "foo_bar_": renamed("foo_bar_")},
                 "specs/foo_bar_.yaml:1:1: foo_bar_: generates C++ name FooBar, as op 'foo_bar' does "
                 "(specs/foo_bar.yaml)", id="class-name-collision"),
    # (each op's header declares <Cls>Attrs, <Cls>Expr and <Cls>ExprArgs beside its class)
    pytest.param({"foo": renamed("foo"), "foo_attrs": renamed("foo_attrs")},
                 "specs/foo_attrs.yaml:1:1: foo_attrs: generates C++ name FooAttrs, as op 'foo' does "
                 "(specs/foo.yaml)", id="attrs-struct-collision"),
    pytest.param({"tensor": renamed("tensor")},
                 "specs/tensor.yaml:1:1: tensor: 'tensor' would generate class Tensor, which the runtime "
                 "already defines", id="runtime-class"),
    pytest.param({"zeros_like": renamed("zeros_like")},
                 "specs/zeros_like.yaml:1:1: zeros_like: 'zeros_like' is a reserved word and cannot name an op",
                 id="helper-name"),
    pytest.param({"leaky": leaky("    alpha: {type", "    int64_t: {type").replace("alpha *", "int64_t *")},
                 "specs/leaky.yaml:6:5: attrs.int64_t: 'int64_t' is a reserved word and cannot name an attr",
                 id="attr-named-like-a-type"),
    pytest.param({"leaky": leaky("default: 0.01", "default: .inf")},
                 "specs/leaky.yaml:6:35: attrs.alpha.default: default must be a finite float, got inf",
                 id="infinite-default"),
    pytest.param({"leaky": leaky("default: 0.01}", "default: 0.01, min: .nan}")},
                 "specs/leaky.yaml:6:46: attrs.alpha.min: min must be a finite number, got nan",
                 id="nan-bound"),
    pytest.param({"leaky": leaky("alpha * x)", "1e400 * x)")},
                 "specs/leaky.yaml:14:27: impl.expr: syntax error: number 1e400 is out of range",
                 id="literal-out-of-range"),
    pytest.param({"leaky": leaky("alpha * x)", "010 * x)")},  # (C++ read it as octal: x * 8)
                 "specs/leaky.yaml:14:27: impl.expr: syntax error: integer 010 has a leading zero; write 10",
                 id="octal-looking-literal"),
    pytest.param({"leaky": leaky("alpha * x)", "-(" * 150 + "x" + ")" * 150 + ")")},
                 "specs/leaky.yaml:14:11: impl.expr: syntax error: formula nests more than 100 levels",
                 id="deep-nesting"),
    pytest.param({"leaky": leaky("alpha * x)", " + ".join(["x"] * 300) + ")")},
                 "specs/leaky.yaml:14:11: impl.expr: syntax error: formula nests more than 100 levels",
                 id="long-chain"),
])
def test_spec_value_errors(spec_errors, files, expected) -> None:
    assert spec_errors(files) == expected


def test_int_attr_default_beyond_int64(spec_errors) -> None:
    spec = leaky("alpha: {type: float, default: 0.01}", "alpha: {type: int, default: 99999999999999999999}")
    spec = spec.replace("alpha * x", "x").replace("alpha * dout", "dout")
    assert spec_errors({"leaky": spec}) == ("specs/leaky.yaml:6:33: attrs.alpha.default: default must be an "
                                            "int64, got 99999999999999999999")


def test_str_choices_are_escaped_in_generated_code(in_tmp, real_ops) -> None:
    from codegen import load_specs
    from codegen.gen import render_op

    spec = leaky("    alpha: {type: float, default: 0.01}",
                 '    alpha: {type: float, default: 0.01}\n    mode: {type: str, default: "a\\"b", choices: ["a\\"b", "c\\\\d"]}')
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "leaky.yaml").write_text(spec)
    (op,) = load_specs(["specs"], known=real_ops)
    cpp = next(r.text for r in render_op(op, {o.name: o for o in real_ops + [op]}, "specs/leaky.yaml")
               if r.name.endswith(".cpp"))
    assert r'''"attr 'mode' must be one of: a\"b, c\\d; got "''' in cpp
    assert r'''attrs.mode == std::string("a\"b")''' in cpp


def test_parentheses_alone_do_not_nest_and_very_deep_ones_are_errors(spec_errors) -> None:
    spec = leaky("alpha * x)", "(" * 120 + "x" + ")" * 120 + ")")
    # parentheses add no depth: the only error is the misspelt name planted below
    errors = spec_errors({"leaky": spec.replace("alpha * dout", "alhpa * dout")})
    assert errors == "specs/leaky.yaml:16:27: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)"
    deep = leaky("alpha * x)", "(" * 2000 + "x" + ")" * 2000 + ")")
    assert spec_errors({"leaky": deep}) == ("specs/leaky.yaml:14:11: impl.expr: syntax error: "
                                            "formula nests more than 100 levels")


# Names that passed the checks before and then broke generated code: a trailing line break (the
# schema regexes were anchored with `$`), C library macros and names, identifiers C++ reserves,
# and non-ASCII digits in formulas (str.isdigit and int accept them).
@pytest.mark.parametrize("files, expected", [
    pytest.param({"leaky": leaky("    x: T\n", '    "class\\n": T\n')},
                 "specs/leaky.yaml:4:5: inputs: invalid name 'class\\n': must match [a-z_][a-z0-9_]*",
                 id="name-with-trailing-newline"),
    pytest.param({"leaky": leaky("  bprop:\n", '  bprop:\n    let:\n      "two\\n": 2 * dout\n')},
                 "specs/leaky.yaml:17:7: bprop.let: invalid name 'two\\n': must match [a-z_][a-z0-9_]* "
                 "(or several, comma-separated)",
                 id="let-name-with-trailing-newline"),
    pytest.param({"leaky": LEAKY.replace("alpha", "errno")},
                 "specs/leaky.yaml:6:5: attrs.errno: 'errno' is a reserved word and cannot name an attr",
                 id="c-macro-errno"),
    pytest.param({"leaky": LEAKY.replace("alpha", "assert")},
                 "specs/leaky.yaml:6:5: attrs.assert: 'assert' is a reserved word and cannot name an attr",
                 id="c-macro-assert"),
    pytest.param({"leaky": LEAKY.replace("alpha", "stdout")},
                 "specs/leaky.yaml:6:5: attrs.stdout: 'stdout' is a reserved word and cannot name an attr",
                 id="c-macro-stdout"),
    pytest.param({"leaky": LEAKY.replace("alpha", "bitand")},
                 "specs/leaky.yaml:6:5: attrs.bitand: 'bitand' is a reserved word and cannot name an attr",
                 id="alternative-token"),
    pytest.param({"leaky": LEAKY.replace("alpha", "a__b")},
                 "specs/leaky.yaml:6:5: attrs.a__b: 'a__b' is reserved for the C++ implementation (it contains "
                 "'__' or starts with '_' and an uppercase letter) and cannot name an attr",
                 id="double-underscore"),
    pytest.param({"errno": renamed("errno")},
                 "specs/errno.yaml:1:1: errno: 'errno' is a reserved word and cannot name an op",
                 id="op-named-errno"),
    pytest.param({"x__y": renamed("x__y")},
                 "specs/x__y.yaml:1:1: x__y: 'x__y' is reserved for the C++ implementation (it contains '__' or "
                 "starts with '_' and an uppercase letter) and cannot name an op",
                 id="op-named-with-double-underscore"),
    pytest.param({"leaky": leaky("alpha * x)", "\u0663 * x)")},
                 "specs/leaky.yaml:14:27: impl.expr: syntax error: unexpected character '\u0663'",
                 id="arabic-indic-digit"),
])
def test_names_that_break_generated_code(spec_errors, files, expected) -> None:
    assert spec_errors(files) == expected


def nine_inputs(count: int) -> str:
    names = ["x"] + [f"i{k}" for k in range(count - 1)]
    return (LEAKY.replace("    x: T\n", "".join(f"    {n}: {{dtype: T, differentiable: false}}\n" for n in names))
            .replace("shape: same(x)", f"shape: 'broadcast({', '.join(names)})'")
            .replace("  bprop:\n    x: where(x > 0, dout, alpha * dout)\n", "")
            .replace("where(x > 0, x, alpha * x)", " + ".join(names)))


def test_an_op_takes_at_most_8_inputs(spec_errors, in_tmp, real_ops) -> None:
    # 9 inputs passed the check and built, then failed at import on every later opforge.load
    from conftest import write_specs
    from codegen import load_specs
    write_specs(in_tmp, {"ok/leaky.yaml": nine_inputs(8)})
    assert len(load_specs(["ok"], known=real_ops)[0].inputs) == 8
    assert spec_errors({"leaky": nine_inputs(9)}) == (
        "specs/leaky.yaml:12:5: inputs.i7: an op takes at most 8 inputs (this one has 9): the MindSpore bprop "
        "bindings and the AOT entry points (one per combination of optional inputs) stop there")


def test_call_left_open_at_the_end_of_a_formula(spec_errors) -> None:
    # found by tests/fuzz/test_spec_fuzz.py: `dout(` raised IndexError in the formula parser
    assert spec_errors({"leaky": leaky("alpha * dout)", "alpha * dout(")}) == (
        "specs/leaky.yaml:16:40: bprop.x: syntax error: unexpected end of formula")


COMPOSITE = """\
pick:
  doc: A composite with numbers beside tensors of other dtypes.
  inputs:
    x: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  impl:
    composite: FORMULA
"""


def test_a_number_in_a_formula_takes_the_dtype_of_its_type_variables_tensor(in_tmp, real_ops, spec_errors) -> None:
    """where(x > 0, x, 0)'s 0 is x's dtype, not the condition's (bool): it was, and the call raised
    a dtype mismatch; where(x > 0, 1.5, -2.5) silently returned bools. Numbers with no tensor of
    their type variable beside them are refused where the formula is."""
    from codegen import load_specs
    from codegen.gen import render_op

    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "pick.yaml").write_text(COMPOSITE.replace("FORMULA", "where(x > 0, x, 0)"))
    (op,) = load_specs(["specs"], known=real_ops)
    cpp = next(r.text for r in render_op(op, {o.name: o for o in real_ops + [op]}, "specs/pick.yaml")
               if r.name.endswith(".cpp"))
    assert "scalar_like(0, v_x)" in cpp and "scalar_like(0, ops::greater" not in cpp
    assert spec_errors({"pick": COMPOSITE.replace("FORMULA", "where(x > 0, 1.5, -2.5)")}) == (
        "specs/pick.yaml:10:29: impl.composite: where(): the number for input 'x' has no tensor of its type "
        "variable beside it to take a dtype from: write it as a tensor (a tensor of the intended dtype times the "
        "number)")


def test_composites_that_call_themselves_are_refused(spec_errors) -> None:
    """(each call recursed until the stack overflowed: SIGSEGV)"""
    one = COMPOSITE.replace("FORMULA", "pick(x) + 1")
    assert spec_errors({"pick": one}) == ("specs/pick.yaml:10:16: impl.composite: the composite formula calls "
                                          "itself: it would recurse without end")
    a = COMPOSITE.replace("pick:", "ra:").replace("FORMULA", "rb(x) + 1")
    b = COMPOSITE.replace("pick:", "rb:").replace("FORMULA", "exp(ra(x))")
    assert spec_errors({"ra": a, "rb": b, "pick": COMPOSITE.replace("FORMULA", "exp(x)")}) == (
        "specs/ra.yaml:10:16: impl.composite: the composite formula calls itself through rb: it would recurse "
        "without end\nspecs/rb.yaml:10:16: impl.composite: the composite formula calls itself through ra: it would "
        "recurse without end")


@pytest.mark.parametrize("edit,expected", [
    pytest.param(lambda s: s.replace("  dtypes:", "  batch_inputs: [zz]\n  dtypes:"),
                 "specs/leaky.yaml:9:18: batch_inputs.0: 'zz' is not an input", id="batch-inputs"),
    pytest.param(lambda s: s.replace("    out: {dtype: T, shape: same(x)}",
                                     "    out: {dtype: T, shape: same(x)}\n    dout: {dtype: T, shape: same(x)}"),
                 "specs/leaky.yaml:8:5: outputs.out: the gradient of output 'out' is named 'dout' in formulas, which "
                 "clashes with an input, attr or output", id="dout-output"),
    pytest.param(lambda s: s.replace("    x: T\n", "    x: float64\n    w: {dtype: T, optional: true}\n")
                 .replace("where(x > 0, x, alpha * x)", "x").replace("where(x > 0, dout, alpha * dout)", "dout"),
                 "specs/leaky.yaml:9:18: outputs.out.dtype: type variable 'T' is bound only by optional inputs: a "
                 "call without them could not tell the output's dtype", id="optional-binds-type"),
])
def test_spec_mistakes_found_by_an_op_author_hunt(spec_errors, edit, expected) -> None:
    """(each passed `opforge check`: the first failed later with a traceback from opforge.torch, the
    second did not compile, the third raised a TypeError naming bool at every call without w)"""
    errors = spec_errors({"leaky": edit(leaky("alpha * x)", "alpha * x)"))})
    assert errors.split("\n")[0] == expected, errors


@pytest.mark.parametrize("name", ["memory_error", "tensor_list", "dims_of", "make_attrs", "issubnormal"])
def test_op_names_the_runtime_or_the_c_library_takes_are_refused(spec_errors, name: str) -> None:
    errors = spec_errors({name: leaky("alpha * x)", "alpha * x)").replace("leaky:", f"{name}:")})
    assert f"{name}: '{name}' " in errors and ("already defines" in errors or "reserved word" in errors), errors


def test_a_multi_output_expr_with_an_output_without_gradient_derives_its_bprop(in_tmp, real_ops) -> None:
    """(an int64 output computed from x, or one marked differentiable: false, failed the check with
    "unknown name 'di'": the derived bprop read the gradient of every output)"""
    from codegen import load_specs

    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "d_idx.yaml").write_text(
        "d_idx:\n  doc: a value and its index.\n  inputs:\n    x: T\n  outputs:\n    y: {dtype: T, shape: same(x)}\n"
        "    i: {dtype: int64, shape: same(x)}\n  dtypes:\n    T: [float32, float64]\n  impl:\n    expr:\n"
        "      y: exp(x)\n      i: x * 4\n")
    (op,) = load_specs(["specs"], known=real_ops)
    assert [(k, f.text) for k, f in op.bprop.grads] == [("x", "dy * y")]


def test_a_subnormal_float_default_is_refused(spec_errors) -> None:
    """(torch's schema parser reads defaults with stod, which refuses 1e-310: opforge.torch's
    register_module failed for the whole module)"""
    assert spec_errors({"leaky": leaky("default: 0.01", "default: 1.0e-310")}) == (
        "specs/leaky.yaml:6:35: attrs.alpha.default: default 1e-310 is subnormal, which PyTorch's op schema cannot "
        "hold; use 0 or a float of at least 2.2250738585072014e-308 in magnitude")


@pytest.mark.parametrize("fn", ["int", "kName", "Shape", "errno", "meta"])
def test_an_infer_function_named_as_cpp_or_generated_code_is_refused(spec_errors, fn: str) -> None:
    """(each passed opforge check, then did not compile, with the kernel file defining it)"""
    errors = spec_errors({"leaky": leaky("same(x)", f"infer({fn})")})
    assert (f"specs/leaky.yaml:8:28: outputs.out.shape: infer() function name '{fn}' is taken by C++, the runtime or "
            "the op's generated code; name the function after the op (infer_<op>_shape)") in errors.split("\n"), errors
