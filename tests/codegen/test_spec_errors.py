"""Each kind of spec mistake gives its exact message: ``path:line:col: key.path: message``.

Every case is a small spec written to ``specs/<op>.yaml`` (in a temporary working directory,
so paths print short) and loaded with op_specs/ as the table of ops formulas may call.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from codegen import SpecError, SpecErrors, load_specs


def case(id: str, op: str, spec: str, expected: str):
    return pytest.param(op, textwrap.dedent(spec), textwrap.dedent(expected).strip(), id=id)


# A valid spec that most cases below change in one place (line numbers refer to it):
#  1 leaky:
#  2   doc: Leaky ReLU.
#  3   inputs:
#  4     x: T
#  5   attrs:
#  6     alpha: {type: float, default: 0.01}
#  7   outputs:
#  8     out: {dtype: T, shape: same(x)}
#  9   dtypes:
# 10     T: [float32, float64]
# 11   targets:
# 12     cpu: {}
# 13   impl:
# 14     expr: where(x > 0, x, alpha * x)
# 15   bprop:
# 16     x: where(x > 0, dout, alpha * dout)
LEAKY = """\
leaky:
  doc: Leaky ReLU.
  inputs:
    x: T
  attrs:
    alpha: {type: float, default: 0.01}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {}
  impl:
    expr: where(x > 0, x, alpha * x)
  bprop:
    x: where(x > 0, dout, alpha * dout)
"""


def leaky(old: str, new: str) -> str:
    """LEAKY with one piece of text replaced (which must occur exactly once)."""
    assert LEAKY.count(old) == 1, old
    return LEAKY.replace(old, new)


# A cpp op with an optional input (no kernel_root is given, so no kernel file is needed):
#  1 scale:
#  2   doc: Scale x by an optional weight.
#  3   inputs:
#  4     x: T
#  5     w: {dtype: T, optional: true}
#  6   outputs:
#  7     out: {dtype: T, shape: same(x)}
#  8   dtypes:
#  9     T: [float32]
# 10   targets:
# 11     cpu: {}
# 12   impl:
# 13     cpp: {}
# 14   bprop:
# 15     x: if_given(w, dout * w, dout)
# 16     w: dout * x
SCALE = """\
scale:
  doc: Scale x by an optional weight.
  inputs:
    x: T
    w: {dtype: T, optional: true}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32]
  targets:
    cpu: {}
  impl:
    cpp: {}
  bprop:
    x: if_given(w, dout * w, dout)
    w: dout * x
"""


def scale(old: str, new: str) -> str:
    assert SCALE.count(old) == 1, old
    return SCALE.replace(old, new)


CASES = [
    # ------------------------------------------------------------------ inplace
    case("inplace-name", "leaky", leaky("  impl:", "  inplace: leaky\n  impl:"),
         "specs/leaky.yaml:13:12: inplace: invalid value 'leaky': must be a name ending in '_' (PyTorch's: add_, mul_)"),
    case("inplace-dtype", "leaky", leaky("  impl:", "  inplace: leaky_\n  impl:").replace(
             "    out: {dtype: T, shape: same(x)}", "    out: {dtype: float64, shape: same(x)}"),
         "specs/leaky.yaml:13:12: inplace: an in-place variant writes the output into input 'x', so their dtypes "
         "must be the same: 'float64' vs 'T'"),
    case("inplace-two-outputs", "leaky", leaky("  impl:", "  inplace: leaky_\n  impl:").replace(
             "    out: {dtype: T, shape: same(x)}", "    out: {dtype: T, shape: same(x)}\n    mask: {dtype: T, shape: same(x)}").replace(
             "    expr: where(x > 0, x, alpha * x)", "    expr: {out: 'where(x > 0, x, alpha * x)', mask: 'x'}"),
         "specs/leaky.yaml:14:12: inplace: an in-place variant needs exactly one output, 'leaky' has 2"),
    case("foreach-not-a-boolean", "leaky", leaky("  impl:", "  foreach: yes please\n  impl:"),
         "specs/leaky.yaml:13:12: foreach: must be true or false, got a string"),
    case("input-named-out", "leaky", leaky("    x: T\n", "    out: T\n").replace(
             "    out: {dtype: T, shape: same(x)}", "    y: {dtype: T, shape: same(out)}").replace(
             "where(x > 0, x, alpha * x)", "where(out > 0, out, alpha * out)").replace(
             "    x: where(x > 0, dout, alpha * dout)", "    out: where(out > 0, dy, alpha * dy)"),
         "specs/leaky.yaml:4:5: inputs.out: 'out' cannot name an input: every op's Python function takes out= (the "
         "tensors that receive its results)"),
    # ------------------------------------------------------------------ YAML and file level
    case("yaml-syntax", "leaky", leaky("    x: T\n", "    x: [T\n"),
         "specs/leaky.yaml:5:8: invalid YAML: expected ',' or ']', but got ':'"),
    case("yaml-tab", "leaky", leaky("    x: T\n", "\tx: T\n"),
         r"specs/leaky.yaml:4:1: invalid YAML: found character '\t' that cannot start any token"),
    case("yaml-unsafe-tag", "leaky", leaky("    x: T\n", "    x: !!python/name:os.system T\n"),
         "specs/leaky.yaml:4:8: invalid YAML: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/name:os.system'"),
    case("duplicate-key", "leaky", leaky("  targets:", "  doc: Again.\n  targets:"),
         "specs/leaky.yaml:11:3: doc: duplicate key (first defined at line 2)"),
    case("duplicate-op", "leaky", LEAKY + "leaky: {}\n",
         "specs/leaky.yaml:17:1: leaky: duplicate key (first defined at line 1)"),
    case("empty-file", "leaky", "",
         "specs/leaky.yaml:1:1: a spec is a mapping with one key, the op name"),
    case("not-a-mapping", "leaky", "- leaky\n",
         "specs/leaky.yaml:1:1: a spec is a mapping with one key, the op name"),
    case("two-ops-in-one-file", "leaky", LEAKY + "other: {}\n",
         "specs/leaky.yaml:17:1: other: a spec file defines exactly one op (one top-level key)"),
    case("file-name-is-not-op-name", "leaky_relu", LEAKY,
         "specs/leaky_relu.yaml:1:1: leaky: op name must match the file name 'leaky_relu' "
         "(one name for one thing)"),
    case("op-body-not-a-mapping", "leaky", "leaky: 3\n",
         "specs/leaky.yaml:1:8: leaky: must be a mapping, got an integer"),
    case("reserved-op-name", "class", leaky("leaky:", "class:"),
         "specs/class.yaml:1:1: class: 'class' is a reserved word and cannot name an op"),
    case("invalid-op-name", "leaky-relu", leaky("leaky:", "leaky-relu:"),
         "specs/leaky-relu.yaml:1:1: leaky-relu: an op name must match [a-z_][a-z0-9_]*"),
    case("op-name-without-a-letter-before-its-digits", "_1", leaky("leaky:", "_1:"),
         "specs/_1.yaml:1:1: _1: an op name needs a letter before any digit (it names the generated C++ class, "
         "'1' here)"),
    # ------------------------------------------------------------------ schema: keys and types
    case("unknown-key-did-you-mean", "leaky", leaky("  doc:", "  dco:"),
         """
         specs/leaky.yaml:2:3: unknown key 'dco' (did you mean 'doc'?)
         specs/leaky.yaml:2:3: missing required key 'doc'
         """),
    case("unknown-key-bprop-misspelled", "leaky", leaky("  bprop:", "  bporp:"),
         "specs/leaky.yaml:15:3: unknown key 'bporp' (did you mean 'bprop'?)"),
    case("unknown-nested-key", "leaky", leaky("default: 0.01", "defualt: 0.01"),
         "specs/leaky.yaml:6:26: attrs.alpha: unknown key 'defualt' (did you mean 'default'?)"),
    case("unknown-impl-kind", "leaky", leaky("    expr:", "    exp:"),
         "specs/leaky.yaml:14:5: impl: unknown key 'exp' (did you mean 'expr'?)"),
    case("missing-doc", "leaky", leaky("  doc: Leaky ReLU.\n", ""),
         "specs/leaky.yaml:2:3: missing required key 'doc'"),
    case("missing-outputs", "leaky", leaky("  outputs:\n    out: {dtype: T, shape: same(x)}\n", ""),
         "specs/leaky.yaml:2:3: missing required key 'outputs'"),
    case("empty-targets", "leaky", leaky("  targets:\n    cpu: {}\n", "  targets: {}\n"),
         "specs/leaky.yaml:11:12: targets: must not be empty"),
    case("missing-impl", "leaky", leaky("  impl:\n    expr: where(x > 0, x, alpha * x)\n", ""),
         "specs/leaky.yaml:2:3: missing required key 'impl'"),
    case("missing-nested-key", "leaky", leaky("{type: float, default: 0.01}", "{default: 0.01}"),
         "specs/leaky.yaml:6:12: attrs.alpha: missing required key 'type'"),
    case("inputs-as-a-list", "leaky", leaky("  inputs:\n    x: T\n", "  inputs: [x]\n"),
         "specs/leaky.yaml:3:11: inputs: must be a mapping, got a list"),
    case("doc-as-a-list", "leaky", leaky("doc: Leaky ReLU.", "doc: [Leaky ReLU.]"),
         "specs/leaky.yaml:2:8: doc: must be a string, got a list"),
    case("flag-not-a-boolean", "leaky", leaky("    x: T\n", "    x: {dtype: T, optional: maybe}\n"),
         "specs/leaky.yaml:4:29: inputs.x.optional: must be true or false, got a string"),
    case("formula-not-a-string", "leaky", leaky("    x: where(x > 0, dout, alpha * dout)", "    x: 3"),
         "specs/leaky.yaml:16:8: bprop.x: must be a string, got an integer"),
    case("null-value", "leaky", leaky("    x: where(x > 0, dout, alpha * dout)", "    x:"),
         "specs/leaky.yaml:16:7: bprop.x: must not be null"),
    case("empty-outputs", "leaky", leaky("  outputs:\n    out: {dtype: T, shape: same(x)}\n",
                                         "  outputs: {}\n"),
         "specs/leaky.yaml:7:12: outputs: must not be empty"),
    case("invalid-input-name", "leaky", leaky("    x: T\n", "    X: T\n"),
         "specs/leaky.yaml:4:5: inputs: invalid name 'X': must match [a-z_][a-z0-9_]*"),
    case("attr-type-did-you-mean", "leaky", leaky("type: float", "type: flaot"),
         "specs/leaky.yaml:6:19: attrs.alpha.type: 'flaot' is not one of: bool, int, float, str, "
         "list[int], list[float] (did you mean 'float'?)"),
    case("flow-mapping-comma", "leaky", leaky("shape: same(x)", "shape: broadcast(x, x)"),
         "specs/leaky.yaml:8:41: outputs.out: unknown key 'x)' "
         "(a comma splits a {...} flow mapping: quote values that contain commas)"),
    # ------------------------------------------------------------------ dtypes and type variables
    case("unknown-dtype-did-you-mean", "leaky", leaky("    x: T\n", "    x: flaot32\n"),
         """
         specs/leaky.yaml:4:8: inputs.x.dtype: unknown dtype or type variable 'flaot32' (did you mean 'float32'?)
         specs/leaky.yaml:8:18: outputs.out.dtype: type variable 'T' is not bound by any input
         """),
    case("unknown-dtype-in-dtypes", "leaky", leaky("T: [float32, float64]", "T: [flaot32, float64]"),
         "specs/leaky.yaml:10:9: dtypes.T.0: 'flaot32' is not one of: bool, uint8, int8, int16, int32, "
         "int64, float16, bfloat16, float32, float64 (did you mean 'float32'?)"),
    case("unknown-type-variable", "leaky", leaky("    x: T\n", "    x: Tx\n"),
         """
         specs/leaky.yaml:4:8: inputs.x.dtype: unknown dtype or type variable 'Tx' (did you mean 'T'?)
         specs/leaky.yaml:8:18: outputs.out.dtype: type variable 'T' is not bound by any input
         """),
    case("unknown-type-variable-in-target", "leaky", leaky("    cpu: {}", "    cpu: {dtypes: {U: [float32]}}"),
         "specs/leaky.yaml:12:20: targets.cpu.dtypes.U: unknown type variable 'U'"),
    case("target-dtype-not-declared", "leaky", leaky("    cpu: {}", "    cpu: {dtypes: {T: [float16]}}"),
         "specs/leaky.yaml:12:24: targets.cpu.dtypes.T.0: float16 is not among the dtypes of T "
         "(float32, float64)"),
    case("unused-type-variable", "leaky", leaky("    T: [float32, float64]\n",
                                                "    T: [float32, float64]\n    U: [int32]\n"),
         "specs/leaky.yaml:11:5: dtypes.U: type variable 'U' is not used by any input or output"),
    case("integer-input-differentiable", "leaky",
         leaky("    x: T\n", "    x: T\n    n: {dtype: int32, differentiable: true}\n"),
         """
         specs/leaky.yaml:5:39: inputs.n.differentiable: an input of dtype int32 cannot be differentiable
         specs/leaky.yaml:9:28: outputs.out.shape: an expr op reads every input at each output position, so its output shape must cover all of them: 'n' is left out (use broadcast(x, n))
         specs/leaky.yaml:17:5: bprop: missing formula for differentiable input 'n' (or mark it differentiable: false)
         """),
    case("shape-only-input-differentiable", "leaky",
         leaky("    x: T\n", "    x: {dtype: T, shape_only: true, differentiable: true}\n"),
         "specs/leaky.yaml:4:53: inputs.x.differentiable: a shape_only input cannot be differentiable"),
    # ------------------------------------------------------------------ attrs
    case("attr-default-wrong-type", "leaky", leaky("default: 0.01", 'default: "small"'),
         "specs/leaky.yaml:6:35: attrs.alpha.default: default must be a finite float, got 'small'"),
    case("attr-default-not-in-choices", "leaky", leaky("default: 0.01}", "default: 0.01, choices: [0.1, 0.2]}"),
         "specs/leaky.yaml:6:35: attrs.alpha.default: default 0.01 is not one of the choices"),
    case("attr-choice-wrong-type", "leaky", leaky("default: 0.01}", "default: 0.01, choices: [0.01, a]}"),
         "specs/leaky.yaml:6:57: attrs.alpha.choices.1: choice must be float, got 'a'"),
    case("attr-min-on-str", "leaky", leaky("    alpha: {type: float, default: 0.01}\n",
                                           "    alpha: {type: float, default: 0.01}\n"
                                           "    mode: {type: str, default: fast, min: 0}\n"),
         "specs/leaky.yaml:7:43: attrs.mode.min: min/max apply to int and float attrs only"),
    case("attr-default-below-min", "leaky", leaky("default: 0.01}", "default: 0.01, min: 0.5}"),
         "specs/leaky.yaml:6:35: attrs.alpha.default: default 0.01 is below min 0.5"),
    case("attr-required-with-default", "leaky", leaky("default: 0.01}", "default: 0.01, required: true}"),
         "specs/leaky.yaml:6:51: attrs.alpha.required: a required attr cannot have a default"),
    # ------------------------------------------------------------------ names
    case("reserved-input-name", "leaky", leaky("    x: T\n", "    x: T\n    class: T\n"),
         """
         specs/leaky.yaml:5:5: inputs.class: 'class' is a reserved word and cannot name an input
         specs/leaky.yaml:9:28: outputs.out.shape: an expr op reads every input at each output position, so its output shape must cover all of them: 'class' is left out (use broadcast(x, class))
         specs/leaky.yaml:17:5: bprop: missing formula for differentiable input 'class' (or mark it differentiable: false)
         """),
    # found by the spec fuzzer: ops.pyi had `keepdims: bool` after `axis: ... = None` (a SyntaxError)
    case("required-attr-after-one-with-default", "leaky",
         leaky("    alpha: {type: float, default: 0.01}", "    alpha: {type: float, default: 0.01}\n    beta: {type: float}"),
         "specs/leaky.yaml:7:5: attrs.beta: a required attr cannot follow one with a default ('alpha'): "
         "list required attrs first"),
    case("reserved-attr-name", "leaky", leaky("    alpha:", "    lambda: {type: int, default: 0}\n    alpha:"),
         "specs/leaky.yaml:6:5: attrs.lambda: 'lambda' is a reserved word and cannot name an attr"),
    case("input-and-attr-share-a-name", "leaky", leaky("    alpha:", "    x: {type: int, default: 0}\n    alpha:"),
         "specs/leaky.yaml:6:5: attrs.x: 'x' names both an input and an attr"),
    case("output-gradient-name-clash", "leaky", leaky("    x: T\n", "    x: T\n    dout: T\n"),
         """
         specs/leaky.yaml:9:5: outputs.out: the gradient of output 'out' is named 'dout' in formulas, which clashes with an input, attr or output
         specs/leaky.yaml:9:28: outputs.out.shape: an expr op reads every input at each output position, so its output shape must cover all of them: 'dout' is left out (use broadcast(x, dout))
         specs/leaky.yaml:17:5: bprop: missing formula for differentiable input 'dout' (or mark it differentiable: false)
         """),
    # ------------------------------------------------------------------ shape rules
    case("shape-rule-unknown", "leaky", leaky("same(x)", "sam(x)"),
         "specs/leaky.yaml:8:28: outputs.out.shape: unknown shape rule 'sam' (did you mean 'same'?); rules: "
         "same(...), broadcast(...), reduce(...), matmul(...), infer(...), or an expression over shape(), dims(), "
         "dim(), rank() and the attrs"),
    case("shape-rule-unparsable", "leaky", leaky("same(x)", "x"),
         "specs/leaky.yaml:8:28: outputs.out.shape: 'x' is a tensor: use shape(x), dim(x, i) or rank(x)"),
    # shape expressions and checks (formula/dims.py)
    case("shape-expression-not-dimensions", "scale", scale("shape: same(x)", 'shape: "rank(x)"'),
         "specs/scale.yaml:7:29: outputs.out.shape: a shape rule must give dimensions, got a dimension"),
    case("shape-expression-optional-input", "scale", scale("shape: same(x)", 'shape: "shape(w)"'),
         "specs/scale.yaml:7:35: outputs.out.shape: optional input 'w' may be absent; use if_given(w, ..., ...)"),
    case("shape-expression-bad-operands", "scale", scale("shape: same(x)", 'shape: "shape(x) + dim(x, 0)"'),
         "specs/scale.yaml:7:38: outputs.out.shape: operator '+' does not apply to dimensions and a dimension"),
    case("check-not-a-bool", "scale", scale("  dtypes:", '  checks:\n    - {require: "rank(x)", error: "no"}\n  dtypes:'),
         "specs/scale.yaml:9:18: checks.0.require: a check must give a bool, got a dimension"),
    case("check-message-placeholder", "scale",
         scale("  dtypes:", '  checks:\n    - {require: "rank(x) > 0", error: "bad {dim(x)}"}\n  dtypes:'),
         "specs/scale.yaml:9:45: checks.0.error: dim() takes 2 arguments"),
    case("check-function-in-a-shape-expression", "scale", scale("shape: same(x)", 'shape: "shape(x) + reduce(x, k, true)"'),
         "specs/scale.yaml:7:40: outputs.out.shape: reduce() is for checks and their messages; an output whose shape "
         "is a broadcast, a reduction or a matmul takes the shape rule of that name as its whole rule"),
    case("check-broadcast-names-an-input-twice", "scale",
         scale("  dtypes:", '  checks:\n    - {require: "broadcasts(shape(x), broadcast(x, x))", error: "no"}\n  dtypes:'),
         "specs/scale.yaml:9:39: checks.0.require: broadcast() names each input once"),
    case("check-reduce-axis-not-an-attr", "scale",
         scale("  dtypes:", '  checks:\n    - {require: "shape(x) == reduce(x, 0, true)", error: "no"}\n  dtypes:'),
         "specs/scale.yaml:9:40: checks.0.require: reduce() takes a list[int] attr or an int attr with a value as its axis"),
    case("check-reads-an-attr-that-may-be-none", "leaky",
         leaky("    alpha: {type: float, default: 0.01}\n", "    alpha: {type: float, default: 0.01}\n    k: {type: int, required: false}\n")
         .replace("  dtypes:", '  checks:\n    - {require: "rank(x) > k", error: "no"}\n  dtypes:'),
         "specs/leaky.yaml:11:28: checks.0.require: attr 'k' may be None (it has no default): shape rules read "
         "attrs that have a value (a list[int] axis may go to reduce())"),
    case("check-reduce-over-an-optional-int-attr", "leaky",
         leaky("    alpha: {type: float, default: 0.01}\n", "    alpha: {type: float, default: 0.01}\n    k: {type: int, required: false}\n")
         .replace("  dtypes:", '  checks:\n    - {require: "shape(x) == reduce(x, k, true)", error: "no"}\n  dtypes:'),
         "specs/leaky.yaml:11:40: checks.0.require: reduce() takes a list[int] attr or an int attr with a value as its axis"),
    case("check-broadcast-optional-input", "scale",
         scale("  dtypes:", '  checks:\n    - {require: "broadcasts(shape(x), broadcast(x, w))", error: "no"}\n  dtypes:'),
         "specs/scale.yaml:9:52: checks.0.require: optional input 'w' may be absent; use if_given(w, ..., ...)"),
    case("shape-rule-arity", "leaky", leaky("shape: same(x)", 'shape: "same(x, x)"'),
         "specs/leaky.yaml:8:28: outputs.out.shape: same() takes 1 argument, got 2"),
    case("shape-rule-arity-variadic", "leaky", leaky("same(x)", "broadcast()"),
         "specs/leaky.yaml:8:28: outputs.out.shape: broadcast() takes at least 1 argument, got 0"),
    case("shape-rule-unknown-input", "leaky", leaky("same(x)", "same(xs)"),
         "specs/leaky.yaml:8:28: outputs.out.shape: shape rule same() names unknown input 'xs' "
         "(did you mean 'x'?)"),
    case("shape-rule-reduce-axis-not-an-attr", "leaky", leaky("shape: same(x)", 'shape: "reduce(x, alpha, true)"'),
         """
         specs/leaky.yaml:8:28: outputs.out.shape: reduce() axis 'alpha' must be a list[int] attr or a non-optional int attr
         specs/leaky.yaml:14:11: impl.expr: an expr op's output shape is same() or broadcast(), not reduce()
         """),
    case("shape-rule-reads-optional-input", "scale", scale("same(x)", "same(w)"),
         "specs/scale.yaml:7:28: outputs.out.shape: shape rule same() cannot read optional input 'w'"),
    # ------------------------------------------------------------------ impl
    case("impl-two-kinds", "leaky", leaky("  impl:\n", "  impl:\n    cpp: {}\n"),
         "specs/leaky.yaml:14:5: impl: give exactly one of expr, composite, cpp, aot, pyfunc"),
    case("aot-op-without-symbol", "leaky", leaky("    expr: where(x > 0, x, alpha * x)", "    aot: {library: libx.so}"),
         "specs/leaky.yaml:14:10: impl.aot: missing required key 'symbol'"),
    # the expr kernel reads every input at each output position: a rule leaving one out read past it
    case("expr-shape-rule-leaves-an-input-out", "leaky",
         leaky("    x: T\n  attrs", "    x: T\n    y: T\n  attrs").replace(
             "expr: where(x > 0, x, alpha * x)", "expr: where(x > 0, x, alpha * y)").replace(
             "    x: where(x > 0, dout, alpha * dout)", "    x: where(x > 0, dout, zeros_like(dout))\n    y: dout"),
         "specs/leaky.yaml:9:28: outputs.out.shape: an expr op reads every input at each output position, so its "
         "output shape must cover all of them: 'y' is left out (use broadcast(x, y))"),
    case("expr-broadcast-rule-leaves-an-input-out", "leaky",
         leaky("    x: T\n  attrs", "    x: T\n    y: T\n    z: T\n  attrs").replace(
             "shape: same(x)", 'shape: "broadcast(x, y)"').replace(
             "expr: where(x > 0, x, alpha * x)", "expr: where(x > 0, y, alpha * z)").replace(
             "    x: where(x > 0, dout, alpha * dout)",
             "    x: zeros_like(x)\n    y: where(x > 0, dout, zeros_like(dout))\n    z: where(x > 0, zeros_like(dout), alpha * dout)"),
         "specs/leaky.yaml:10:28: outputs.out.shape: an expr op reads every input at each output position, so its "
         "output shape must cover all of them: 'z' is left out (use broadcast(x, y, z))"),
    case("expr-op-with-reduce-shape", "leaky",
         leaky("shape: same(x)}", 'shape: "reduce(x, axis, true)"}').replace(
             "  outputs:", '    axis: {type: "list[int]", default: [0]}\n  outputs:'),
         "specs/leaky.yaml:15:11: impl.expr: an expr op's output shape is same() or broadcast(), not reduce()"),
    case("expr-op-with-optional-input", "scale", scale("cpp: {}", "expr: x * w"),
         "specs/scale.yaml:13:11: impl.expr: an expr op cannot have optional inputs"),
    case("expr-op-with-two-outputs-one-formula", "leaky",
         leaky("    out: {dtype: T, shape: same(x)}\n",
               "    out: {dtype: T, shape: same(x)}\n    out2: {dtype: T, shape: same(x)}\n"),
         "specs/leaky.yaml:15:11: impl.expr: an expr op with 2 outputs gives one formula per output: "
         "expr: {out: ..., out2: ...}"),
    case("expr-op-formula-for-unknown-output", "leaky",
         leaky("    out: {dtype: T, shape: same(x)}\n",
               "    out: {dtype: T, shape: same(x)}\n    out2: {dtype: T, shape: same(x)}\n").replace(
             "expr: where(x > 0, x, alpha * x)", "expr: {out: x, ou2: alpha * x}"),
         """
         specs/leaky.yaml:15:11: impl.expr: missing formula for output 'out2'
         specs/leaky.yaml:15:20: impl.expr.ou2: 'ou2' is not an output (did you mean 'out2'?)
         """),
    case("expr-op-mapping-formula-error-located", "leaky",
         leaky("expr: where(x > 0, x, alpha * x)", "expr: {out: alhpa * x}"),
         "specs/leaky.yaml:14:17: impl.expr.out: unknown name 'alhpa' (did you mean 'alpha'?)"),
    case("expr-op-outputs-of-other-shapes", "leaky",
         leaky("    out: {dtype: T, shape: same(x)}\n",
               "    out: {dtype: T, shape: same(x)}\n    red: {dtype: T, shape: \"reduce(x, axis, true)\"}\n"
               ).replace("  outputs:", '    axis: {type: "list[int]", default: [0]}\n  outputs:').replace(
             "expr: where(x > 0, x, alpha * x)", "expr: {out: x, red: x}"),
         "specs/leaky.yaml:16:11: impl.expr: an expr op's output shape is same() or broadcast(), not reduce()"),
    case("expr-op-select-output", "leaky", leaky("alpha * x)", "sin(x).y)"),
         "specs/leaky.yaml:14:34: impl.expr: an elementwise expression calls scalar functions, which have no "
         "outputs to select"),
    case("expr-unknown-function-did-you-mean", "leaky", leaky("alpha * x)", "alpha * tahn(x))"),
         "specs/leaky.yaml:14:35: impl.expr: unknown function 'tahn' in an elementwise expression "
         "(did you mean 'tanh'?)"),
    case("power-operator", "leaky", leaky("alpha * x)", "x ** 2)"),
         "specs/leaky.yaml:14:29: impl.expr: syntax error: '**' is not supported; use square(), or pow() in an expr"),
    case("expr-unknown-function", "leaky", leaky("alpha * x)", "alpha * sigmoid(x))"),
         "specs/leaky.yaml:14:35: impl.expr: unknown function 'sigmoid' in an elementwise expression"),
    case("expr-function-arity", "leaky", leaky("where(x > 0, x, alpha * x)", "where(x > 0, x)"),
         "specs/leaky.yaml:14:11: impl.expr: where() takes 3 arguments, got 2"),
    case("expr-unknown-name", "leaky", leaky("where(x > 0, x, alpha * x)", "where(x > 0, x, alhpa * x)"),
         "specs/leaky.yaml:14:27: impl.expr: unknown name 'alhpa' (did you mean 'alpha'?)"),
    case("expr-attr-that-may-be-none", "leaky",
         leaky("{type: float, default: 0.01}", "{type: float, required: false}").replace(
             "where(x > 0, dout, alpha * dout)", "where(x > 0, dout, zeros_like(dout))"),
         "specs/leaky.yaml:14:27: impl.expr: attr 'alpha' may be None; use if_given(alpha, ..., ...) or give it a default"),
    case("expr-string", "leaky", leaky("where(x > 0, x, alpha * x)", "where(x > 0, x, 'a')"),
         "specs/leaky.yaml:14:27: impl.expr: strings and lists are not allowed in an elementwise expression"),
    case("composite-not-a-tensor", "leaky", leaky("expr: where(x > 0, x, alpha * x)", "composite: alpha > 0"),
         "specs/leaky.yaml:14:16: impl.composite: a composite formula must give a tensor, got bool"),
    case("infer-shape-without-cpp", "leaky", leaky("same(x)", "infer(leaky_shape)"),
         """
         specs/leaky.yaml:14:11: impl.expr: shape rule infer() needs a cpp impl (the function lives in its kernel file)
         specs/leaky.yaml:14:11: impl.expr: an expr op's output shape is same() or broadcast(), not infer()
         """),
    case("pyfunc-infer-shape", "leaky", leaky("same(x)", "infer(leaky_shape)").replace(
             "expr: where(x > 0, x, alpha * x)", "pyfunc: my_ops:leaky"),
         "specs/leaky.yaml:14:13: impl.pyfunc: shape rule infer() needs a cpp impl (the function lives in its kernel file)"),
    case("pyfunc-not-module-colon-function", "leaky", leaky("expr: where(x > 0, x, alpha * x)", "pyfunc: my_ops.leaky"),
         "specs/leaky.yaml:14:13: impl.pyfunc: invalid value 'my_ops.leaky': must be 'module:function' "
         "(an importable, possibly dotted, module; a colon; a function name)"),
    case("pyfunc-missing-bprop", "leaky", leaky("expr: where(x > 0, x, alpha * x)", "pyfunc: my_ops:leaky").replace(
             "  bprop:\n    x: where(x > 0, dout, alpha * dout)\n", ""),
         "specs/leaky.yaml:1:1: bprop: missing: give a formula for each differentiable input (x), "
         "or mark inputs differentiable: false"),
    # ------------------------------------------------------------------ bprop
    case("bprop-missing", "scale", scale("  bprop:\n    x: if_given(w, dout * w, dout)\n    w: dout * x\n", ""),
         "specs/scale.yaml:1:1: bprop: missing: give a formula for each differentiable input (x, w), "
         "or mark inputs differentiable: false"),
    # (an expr op without a bprop gets one derived from its expression: tests/codegen/test_derive.py)
    # ------------------------------------------------------------------ jvp
    case("jvp-for-unknown-output", "scale", SCALE + "  jvp:\n    outt: x_t\n",
         """
         specs/scale.yaml:18:5: jvp: missing formula for differentiable output 'out' (or mark it differentiable: false)
         specs/scale.yaml:18:5: jvp.outt: 'outt' is not an output (did you mean 'out'?)
         """),
    case("jvp-optional-tangent-outside-if-given", "scale", SCALE + "  jvp:\n    out: x_t * w + x * w_t\n",
         "specs/scale.yaml:18:16: jvp.out: optional input 'w' may be absent; use if_given(w, ..., ...)"),
    case("jvp-optional-tangent-in-the-wrong-branch", "scale", SCALE + "  jvp:\n    out: if_given(w, x_t * w, w_t)\n",
         "specs/scale.yaml:18:31: jvp.out: 'w_t' is absent with optional input 'w'; use it in if_given(w, ..., ...)'s "
         "first branch"),
    case("jvp-unknown-name", "scale", SCALE + "  jvp:\n    out: if_given(w, x_t * w + x * w_t, xt)\n",
         "specs/scale.yaml:18:41: jvp.out: unknown name 'xt' (did you mean 'x_t'?)"),
    case("jvp-let-shadows-a-tangent", "scale", SCALE + "  jvp:\n    let:\n      x_t: x\n    out: x\n",
         "specs/scale.yaml:19:7: jvp.let.x_t: let name 'x_t' shadows an input, output, attr or tangent"),
    case("jvp-tangent-name-clash", "scale", scale("    x: T\n", "    x: T\n    x_t: {dtype: T, differentiable: false}\n")
         .replace("w: {dtype: T, optional: true}", "w: {dtype: T}") + "  jvp:\n    out: x_t\n",
         "specs/scale.yaml:19:5: jvp: the tangent of input 'x' is named 'x_t' in jvp formulas, which clashes "
         "with an input, output or attr"),
    case("bprop-for-unknown-input", "leaky", leaky("    x: where(x > 0, dout", "    xx: where(x > 0, dout"),
         """
         specs/leaky.yaml:16:5: bprop: missing formula for differentiable input 'x' (or mark it differentiable: false)
         specs/leaky.yaml:16:5: bprop.xx: 'xx' is not an input (did you mean 'x'?)
         """),
    case("bprop-missing-for-one-input", "scale", scale("    w: dout * x\n", ""),
         "specs/scale.yaml:15:5: bprop: missing formula for differentiable input 'w' "
         "(or mark it differentiable: false)"),
    case("bprop-for-non-differentiable-input", "scale",
         scale("optional: true}", "optional: true, differentiable: false}"),
         "specs/scale.yaml:16:5: bprop.w: input 'w' is not differentiable and takes no bprop formula"),
    case("bprop-let-shadows", "leaky", leaky("  bprop:\n", "  bprop:\n    let:\n      x: dout\n"),
         "specs/leaky.yaml:17:7: bprop.let.x: let name 'x' shadows an input, output, attr or gradient"),
    case("bprop-not-a-tensor", "leaky", leaky("where(x > 0, dout, alpha * dout)", "alpha * 2"),
         "specs/leaky.yaml:16:8: bprop.x: a gradient must be a tensor, got number"),
    case("bprop-gradient-of-non-differentiable-output", "leaky",
         leaky("shape: same(x)}", "shape: same(x), differentiable: false}"),
         "specs/leaky.yaml:16:21: bprop.x: unknown name 'dout' (did you mean 'out'?)"),
    # ------------------------------------------------------------------ formulas
    case("formula-syntax-error", "leaky", leaky("alpha * dout)", "alpha * dout))"),
         "specs/leaky.yaml:16:40: bprop.x: syntax error: unexpected ')'"),
    case("formula-syntax-error-quoted", "leaky", leaky("x: where(x > 0, dout, alpha * dout)",
                                                       'x: "where(x > 0, dout, alpha $ dout)"'),
         "specs/leaky.yaml:16:34: bprop.x: syntax error: unexpected character '$'"),
    case("formula-syntax-error-at-end", "leaky", leaky("alpha * x)", "alpha * x"),
         "specs/leaky.yaml:14:36: impl.expr: syntax error: expected ')', found end of formula"),
    case("formula-unknown-name-did-you-mean", "leaky", leaky("alpha * dout)", "alhpa * dout)"),
         "specs/leaky.yaml:16:27: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)"),
    case("formula-unknown-name-in-block-scalar", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)", "    x: >-\n      where(x > 0, dout,\n        alhpa * dout)"),
         "specs/leaky.yaml:16:8: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)"),
    case("formula-unknown-op-did-you-mean", "leaky", leaky("where(x > 0, dout, alpha * dout)", "mull(dout, x)"),
         "specs/leaky.yaml:16:8: bprop.x: unknown op 'mull' (did you mean 'mul'?)"),
    case("formula-unknown-op", "leaky", leaky("where(x > 0, dout, alpha * dout)", "frobnicate(dout)"),
         "specs/leaky.yaml:16:8: bprop.x: unknown op 'frobnicate'"),
    case("formula-op-arity", "leaky", leaky("where(x > 0, dout, alpha * dout)", "mul(dout)"),
         "specs/leaky.yaml:16:8: bprop.x: mul() takes 2 inputs (x, y), got 1"),
    case("formula-multi-output-op", "leaky", leaky("where(x > 0, dout, alpha * dout)", "layer_norm(dout)"),
         "specs/leaky.yaml:16:8: bprop.x: op 'layer_norm' has 3 outputs (y, mean, rstd): select one "
         "(layer_norm(...).y) or bind them all in a let (y, mean, rstd: layer_norm(...))"),
    case("formula-unknown-output", "leaky", leaky("where(x > 0, dout, alpha * dout)", "layer_norm(dout).mea"),
         "specs/leaky.yaml:16:25: bprop.x: op 'layer_norm' has no output 'mea' (did you mean 'mean'?); "
         "it has 3 outputs (y, mean, rstd)"),
    case("formula-select-single-output", "leaky", leaky("where(x > 0, dout, alpha * dout)", "mean(dout).out"),
         "specs/leaky.yaml:16:19: bprop.x: op 'mean' has one output: call it without selecting"),
    case("formula-select-nothing", "leaky", leaky("where(x > 0, dout, alpha * dout)", "layer_norm(dout)."),
         "specs/leaky.yaml:16:25: bprop.x: syntax error: expected an output name after '.', found end of formula"),
    case("let-binding-wrong-arity", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)", "    let:\n      y, m: layer_norm(dout)\n    x: y + m"),
         "specs/leaky.yaml:17:13: bprop.let.y, m: op 'layer_norm' has 3 outputs (y, mean, rstd), but the let "
         "binds 2 names (y, m)"),
    case("let-binding-not-a-call", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)",
               "    let:\n      y, m, r: 2 * layer_norm(dout)\n    x: y + m"),
         "specs/leaky.yaml:17:16: bprop.let.y, m, r: a let binding 3 names (y, m, r) needs a call of an op "
         "with 3 outputs"),
    case("let-binding-name-twice", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)",
               "    let:\n      y, y, r: layer_norm(dout)\n    x: y + r"),
         "specs/leaky.yaml:17:7: bprop.let.y, y, r: let name 'y' is bound twice"),
    case("formula-unknown-attr-keyword", "leaky", leaky("where(x > 0, dout, alpha * dout)", "sum(dout, axes=[0])"),
         "specs/leaky.yaml:16:18: bprop.x: sum() has no attr 'axes' (did you mean 'axis'?)"),
    case("formula-attr-wrong-type", "leaky", leaky("where(x > 0, dout, alpha * dout)", "sum(dout, keepdims=1.5)"),
         "specs/leaky.yaml:16:18: bprop.x: sum(): attr 'keepdims' must be bool, got float"),
    case("formula-attr-wrong-type-str", "leaky", leaky("where(x > 0, dout, alpha * dout)", 'sum(dout, axis="a")'),
         "specs/leaky.yaml:16:18: bprop.x: sum(): attr 'axis' must be optional list[int], got str"),
    case("formula-op-input-not-a-tensor", "leaky", leaky("where(x > 0, dout, alpha * dout)", "exp(alpha)"),
         "specs/leaky.yaml:16:12: bprop.x: exp(): inputs must be tensors, got float"),
    case("formula-optional-input-without-if-given", "scale", scale("if_given(w, dout * w, dout)", "dout * w"),
         "specs/scale.yaml:15:15: bprop.x: optional input 'w' may be absent; use if_given(w, ..., ...)"),
    case("guarded-let-used-where-absent", "scale",
         scale("    x: if_given(w, dout * w, dout)", "    let:\n      g: if_given(w, dout * w)\n    x: g"),
         "specs/scale.yaml:17:8: bprop.x: let 'g' is bound only when w is given; use it in "
         "if_given(w, ..., ...)'s first branch"),
    case("if-needs-in-a-jvp", "scale", SCALE + "  jvp:\n    out: if_needs(x, x_t, x_t)\n",
         "specs/scale.yaml:18:10: jvp.out: if_needs() is for bprop formulas: only a backward knows which "
         "gradients are asked for"),
    case("if-needs-of-an-output", "scale", scale("if_given(w, dout * w, dout)", "if_needs(out, dout, dout)"),
         "specs/scale.yaml:15:17: bprop.x: if_needs() needs a differentiable input as its first argument (x, w)"),
    case("if-needs-of-a-non-differentiable-input", "scale",
         scale("    w: {dtype: T, optional: true}", "    w: {dtype: T, optional: true, differentiable: false}").replace(
             "    x: if_given(w, dout * w, dout)\n    w: dout * x\n", "    x: if_needs(w, dout, dout)\n"),
         "specs/scale.yaml:15:17: bprop.x: if_needs() needs a differentiable input as its first argument (x)"),
    case("if-needs-branches-of-two-kinds", "scale", scale("if_given(w, dout * w, dout)", "if_needs(w, dout * w, 1.0)"),
         "specs/scale.yaml:15:8: bprop.x: if_needs(): both branches must be tensors or both numbers"),
    case("guarded-let-two-argument-if-given-elsewhere", "scale", scale("if_given(w, dout * w, dout)", "if_given(w, dout * w)"),
         "specs/scale.yaml:15:8: bprop.x: if_given() with two arguments (no value when absent) may only be a "
         "let's whole formula, binding the let only when the input is given"),
    case("guarded-let-on-required-input", "scale",
         scale("    x: if_given(w, dout * w, dout)", "    let:\n      g: if_given(x, dout)\n    x: g"),
         "specs/scale.yaml:16:19: bprop.let.g: if_given() binding a let needs an optional input as its first argument"),
    case("guarded-let-number", "scale",
         scale("    x: if_given(w, dout * w, dout)", "    let:\n      g: if_given(w, numel(w))\n    x: dout"),
         "specs/scale.yaml:16:10: bprop.let.g: a let bound by if_given() must give a tensor, got number"),
    case("formula-if-given-on-required-input", "scale", scale("if_given(w,", "if_given(x,"),
         "specs/scale.yaml:15:17: bprop.x: if_given() needs an optional input or optional attr as its first argument"),
    case("formula-helper-arity", "leaky", leaky("where(x > 0, dout, alpha * dout)", "zeros_like(dout, x)"),
         "specs/leaky.yaml:16:8: bprop.x: zeros_like() takes 1 argument, got 2"),
    # ------------------------------------------------------------------ tests section
    case("tests-missing-reference", "leaky", LEAKY + "  tests:\n    attrs: [{}]\n",
         "specs/leaky.yaml:18:5: tests: missing required key 'reference'"),
    case("tests-reference-not-python", "leaky", LEAKY + "  tests:\n    reference: np.where(x >\n",
         "specs/leaky.yaml:18:16: tests.reference: not a Python expression: '(' was never closed"),
    case("tests-unknown-attr", "leaky", LEAKY + "  tests:\n    reference: x\n    attrs: [{alpah: 1.0}]\n",
         "specs/leaky.yaml:19:14: tests.attrs.0.alpah: 'alpah' is not an attr (did you mean 'alpha'?)"),
    case("tests-shapes-count", "leaky", LEAKY + "  tests:\n    reference: x\n    shapes: [[[2], [3]]]\n",
         "specs/leaky.yaml:19:14: tests.shapes.0: gives 2 shapes for 1 inputs"),
]


# Mistakes whose message is wrong today (product bugs): each expects the message the product
# should give; the comment above it says what it gives now.
BUG_CASES = [
    # today 16:27, a column past the end of line 16: a plain scalar folded over two lines has no
    # newline left in its text, so it is taken for a one-line formula and columns are mapped
    # one to one. A formula over several lines is located at its start, as block scalars are.
    case("bug-formula-over-two-lines-plain", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)", "    x: where(x > 0,\n      dout, alhpa * dout)"),
         "specs/leaky.yaml:16:8: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)"),
    # today 16:28, same cause, for a double-quoted formula over two lines
    case("bug-formula-over-two-lines-quoted", "leaky",
         leaky("    x: where(x > 0, dout, alpha * dout)", '    x: "where(x > 0,\n      dout, alhpa * dout)"'),
         "specs/leaky.yaml:16:9: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)"),
    # today the key path is only 'type': duplicate keys are reported without their path
    case("bug-duplicate-nested-key", "leaky", leaky("{type: float, default: 0.01}", "{type: float, type: int}"),
         "specs/leaky.yaml:6:26: attrs.alpha.type: duplicate key (first defined at line 6)"),
    # today 12:10 (the value {}) with key path targets.cpx: a key that is not allowed (cerberus
    # keysrules 'allowed') is located at its value, unlike a key that is not a valid name
    case("bug-unknown-target", "leaky", leaky("    cpu: {}", "    cpx: {}"),
         "specs/leaky.yaml:12:5: targets: 'cpx' is not one of: cpu, cuda, ascend (did you mean 'cpu'?)"),
]


@pytest.mark.parametrize("op, spec, expected", CASES + BUG_CASES)
def test_spec_mistake_message(spec_errors, op: str, spec: str, expected: str) -> None:
    assert spec_errors({op: spec}) == expected


def test_spec_not_utf8_is_a_spec_error(in_tmp: Path) -> None:
    """Product bug: today a UnicodeDecodeError traceback escapes load_specs."""
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "leaky.yaml").write_bytes(b"leaky:\n  doc: \"caf\xe9\"\n")
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs"])
    (error,) = info.value.errors
    assert error.loc.path == "specs/leaky.yaml"
    assert "UTF-8" in error.message


def test_the_valid_base_specs_load(in_tmp: Path, real_ops) -> None:
    """The bases of the table are valid: each case's error comes from its one change."""
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "leaky.yaml").write_text(LEAKY)
    (in_tmp / "specs" / "scale.yaml").write_text(SCALE)
    ops = load_specs(["specs"], known=real_ops)
    assert [o.name for o in ops] == ["leaky", "scale"]


# ---------------------------------------------------------------------- mistakes across files


def test_missing_kernel_file(in_tmp: Path, real_ops) -> None:
    spec = scale("    cpu: {}\n", "    cpu: {}\n    cuda: {}\n    ascend: {}\n")
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "scale.yaml").write_text(spec)
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs"], kernel_root=Path("."), known=real_ops)
    # only the cpu kernels are built so far: cuda and ascend need no kernel file yet
    assert str(info.value) == ("specs/scale.yaml:15:10: impl.cpp: missing kernel file "
                               "src/kernels/cpu/scale.cpp for target cpu")
    (in_tmp / "src" / "kernels" / "cpu").mkdir(parents=True)
    (in_tmp / "src" / "kernels" / "cpu" / "scale.cpp").write_text("")
    assert [o.name for o in load_specs(["specs"], kernel_root=Path("."), known=real_ops)] == ["scale"]


def test_two_ops_with_one_name(in_tmp: Path, real_ops) -> None:
    for d in ("a", "b"):
        (in_tmp / d).mkdir()
        (in_tmp / d / "leaky.yaml").write_text(LEAKY)
    with pytest.raises(SpecErrors) as info:
        load_specs(["a", "b"], known=real_ops)
    assert str(info.value) == "b/leaky.yaml:1:1: leaky: two ops named 'leaky' (also a/leaky.yaml)"


def test_formula_calling_an_op_outside_the_table(in_tmp: Path) -> None:
    """Without op_specs/ loaded, the ops that formula operators stand for are missing."""
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "leaky.yaml").write_text(leaky("where(x > 0, dout, alpha * dout)", "dout * alpha"))
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs"])
    assert str(info.value) == ("specs/leaky.yaml:16:13: bprop.x: operator '*' needs op 'mul', "
                               "which is not defined")


def test_unreadable_spec(in_tmp: Path) -> None:
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs/missing.yaml"])
    assert str(info.value) == "specs/missing.yaml:1:1: cannot read spec: No such file or directory"


def test_spec_errors_collects_every_file_sorted(in_tmp: Path, real_ops) -> None:
    """One run reports every mistake of every file (all dirs), sorted by file, line and column."""
    files = {
        "specs/zeta.yaml": leaky("leaky:", "zeta:").replace("  dtypes:", "  dtyps:"),
        "specs/alpha.yaml": leaky("leaky:", "alpha:").replace("same(x)", "same(y)")
                                                       .replace("default: 0.01", "default: a"),
        "specs/beta.yaml": leaky("leaky:", "beta:").replace("    x: T\n", "    x: {dtype: T\n"),
        "specs/gamma.yaml": LEAKY.replace("leaky:", "gamma:"),  # valid: no errors of its own
        "specs/epsilon.yaml": leaky("leaky:", "epsilon:").replace("alpha * dout)", "alhpa * dout)"),
        "more/delta.yaml": leaky("leaky:", "delta:").replace("  bprop:", "  bporp:"),
    }
    for rel, text in files.items():
        (in_tmp / rel).parent.mkdir(exist_ok=True)
        (in_tmp / rel).write_text(text)
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs", "more"], known=real_ops)  # "more" is read last, listed first
    assert all(isinstance(e, SpecError) for e in info.value.errors)
    # formulas of the specs that load are checked against the op table in the same run
    assert str(info.value) == textwrap.dedent("""\
        more/delta.yaml:15:3: unknown key 'bporp' (did you mean 'bprop'?)
        specs/alpha.yaml:6:35: attrs.alpha.default: default must be a finite float, got 'a'
        specs/alpha.yaml:8:28: outputs.out.shape: shape rule same() names unknown input 'y'
        specs/beta.yaml:5:8: invalid YAML: expected ',' or '}', but got ':'
        specs/epsilon.yaml:16:27: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)
        specs/zeta.yaml:9:3: unknown key 'dtyps' (did you mean 'dtypes'?)""")


def test_formulas_calling_a_broken_spec_are_not_reported_as_unknown_ops(in_tmp: Path, real_ops) -> None:
    (in_tmp / "specs").mkdir()
    (in_tmp / "specs" / "scale.yaml").write_text(SCALE.replace("  doc:", "  dco:"))
    (in_tmp / "specs" / "leaky.yaml").write_text(leaky("where(x > 0, dout, alpha * dout)",
                                                       "scale(dout)"))
    with pytest.raises(SpecErrors) as info:
        load_specs(["specs"], known=real_ops)
    assert [e.loc.path for e in info.value.errors] == ["specs/scale.yaml", "specs/scale.yaml"]


def test_spec_errors_sorts_by_file_line_column() -> None:
    from codegen.errors import Loc

    errors = SpecErrors([SpecError(Loc("b.yaml", 1, 1), "", "b1"),
                         SpecError(Loc("a.yaml", 9, 2), "k", "a9.2"),
                         SpecError(Loc("a.yaml", 10, 1), "", "a10"),
                         SpecError(Loc("a.yaml", 9, 1), "k", "a9.1")])
    assert [e.message for e in errors.errors] == ["a9.1", "a9.2", "a10", "b1"]
    assert str(errors) == "a.yaml:9:1: k: a9.1\na.yaml:9:2: k: a9.2\na.yaml:10:1: a10\nb.yaml:1:1: b1"

