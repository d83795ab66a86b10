"""The generated op table (opforge._formulas) agrees with the compiled ops it describes.

Framework adapters compute gradients with the Python lowering of each spec's bprop formulas and
fake outputs with its shape rules. Here both are evaluated with opforge's own ops as ``F``, and
compared, for every spec'd test case, with what the C++ Function classes and kernels give: so
the Python lowering of every formula is checked without any framework installed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import opforge
from opforge import _formulas  # (opforge's own ops: list_ops() also has ops that tests load)
from opforge import _C, _formulas, ops
from opforge._opdef import ShapeHelpers

from cases import Case, cases, make_data, to_inputs

F = SimpleNamespace(**{name: getattr(ops, name) for name in sorted(_formulas.OPS)})


class H(ShapeHelpers):
    """The helpers of opforge/_opdef.py over opforge tensors (NumPy where no op does it)."""

    @staticmethod
    def scalar_like(value: Any, like: opforge.Tensor) -> opforge.Tensor:
        return opforge.tensor(np.array(value, dtype=np.float64)).astype(like.dtype)

    @staticmethod
    def with_number(t: opforge.Tensor, value: Any, fn: Any, F: Any) -> opforge.Tensor:  # noqa: N803
        if t.dtype in ("float16", "bfloat16"):
            return fn(F, t.astype("float32"), H.scalar_like(value, t.astype("float32"))).astype(t.dtype)
        return fn(F, t, H.scalar_like(value, t))

    @staticmethod
    def zeros_like(t: opforge.Tensor) -> opforge.Tensor:
        return _C._zeros_like(t)

    @staticmethod
    def cast_like(t: opforge.Tensor, like: opforge.Tensor) -> opforge.Tensor:
        return t.astype(like.dtype)

    @staticmethod
    def ones_like(t: opforge.Tensor) -> opforge.Tensor:
        return ops.add(_C._zeros_like(t), H.scalar_like(1, t))

    @staticmethod
    def numel(t: opforge.Tensor) -> int:
        return t.size

    @staticmethod
    def numel_ratio(a: opforge.Tensor, b: opforge.Tensor) -> float:
        return 0.0 if b.size == 0 else a.size / b.size

    @staticmethod
    def expand_reduced(g: opforge.Tensor, like: opforge.Tensor, axes: Any, keepdims: bool) -> opforge.Tensor:
        a = g.numpy()
        if not keepdims:
            rank = like.ndim
            for ax in sorted({x % rank for x in (range(rank) if axes is None else axes)}):
                a = np.expand_dims(a, ax)
        return opforge.tensor(np.broadcast_to(a, like.shape).copy())

    @staticmethod
    def reduce_grad(g: opforge.Tensor, meta: tuple) -> opforge.Tensor:
        shape, dtype = meta
        a = g.numpy()
        lead = a.ndim - len(shape)
        a = a.sum(axis=tuple(range(lead))) if lead else a
        a = a.sum(axis=tuple(k for k, n in enumerate(shape) if n == 1 and a.shape[k] != 1), keepdims=True)
        return opforge.tensor(a).astype(dtype)


GRAD_CASES = [c for c in cases() if c.dtype == "float64" and c.op.bprop is not None]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_python_bprop_matches_cpp_backward(case: Case, rng) -> None:
    op = _formulas.OPS[case.op.name]
    data = make_data(case.op, case.dtype, case.shapes, rng)
    inputs = [None if a is None else opforge.tensor(a, requires_grad=spec.differentiable)
              for spec, a in zip(case.op.inputs, to_inputs(case.op, case.dtype, data))]
    outs = getattr(ops, op.name)(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    diff = [k for k, o in enumerate(op.outputs) if o.differentiable]
    douts = [opforge.tensor(rng.uniform(-1, 1, outs[k].shape)) for k in diff]
    wanted = [k for k, t in enumerate(inputs) if t is not None and op.inputs[k].differentiable]
    expected = opforge.gradients([outs[k] for k in diff], [inputs[k] for k in wanted], douts, allow_unused=True)

    attrs = [case.attrs.get(a.name, a.default) for a in op.attrs]
    with opforge.no_grad():
        need = [k in wanted for k in range(len(inputs))]
        meta = [None if t is None else (t.shape, t.dtype) for t in inputs]
        got = op.bprop(F, H, need, meta, *[None if t is None else t.detach() for t in inputs],
                       *[o.detach() for o in outs], *douts, *attrs)
    assert len(got) == len(op.inputs)
    for k, e in zip(wanted, expected):
        assert got[k] is not None, op.inputs[k].name
        np.testing.assert_allclose(got[k].numpy(), np.zeros(inputs[k].shape) if e is None else e.numpy(),
                                   rtol=1e-10, atol=1e-12, err_msg=op.inputs[k].name)
    assert all(got[k] is None for k in range(len(inputs)) if k not in wanted)


@pytest.mark.parametrize("case", [c for c in cases() if c.dtype in ("float64", "int64", "bool")],
                         ids=lambda c: c.id)
def test_meta_rule_matches_a_real_call(case: Case, rng) -> None:
    """opforge._C._meta.<op> on stand-ins of the inputs gives the real outputs' shapes and dtypes."""
    data = make_data(case.op, case.dtype, case.shapes, rng)
    inputs = to_inputs(case.op, case.dtype, data)
    outs = getattr(ops, case.op.name)(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    stand_ins = [None if a is None else _C._meta_tensor(list(np.shape(a)), opforge.tensor(a).dtype)
                 for a in inputs]
    metas = getattr(_C._meta, case.op.name)(*stand_ins, **case.attrs)
    assert metas == [(o.shape, o.dtype) for o in outs]


def test_composite_formula_matches_the_op() -> None:
    x = opforge.tensor(np.array([1.0, -2.0, 3.0]))
    np.testing.assert_array_equal(_formulas.OPS["square"].composite(F, H, x).numpy(), ops.square(x).numpy())


def test_meta_rules_check_like_calls() -> None:
    x = _C._meta_tensor([4, 5], "float32")
    with pytest.raises(ValueError, match=r"\[linear\] x's last dimension 5 differs"):
        _C._meta.linear(x, _C._meta_tensor([3, 6], "float32"))
    with pytest.raises(TypeError, match=r"\[exp\] dtype int32 is not supported"):
        _C._meta.exp(_C._meta_tensor([2], "int32"))
    with pytest.raises(ValueError, match=r"\[gelu\] attr 'approximate' must be one of"):
        _C._meta.gelu(x, approximate="nope")
    assert _C._meta.bias_add(_C._meta_tensor([2, 3, 4, 4], "float32", "NCHW"),
                             _C._meta_tensor([3], "float32"), format="NCHW") == [((2, 3, 4, 4), "float32")]
    with pytest.raises(ValueError, match="negative dimension"):
        _C._meta_tensor([-1], "float32")


def test_dlpack_capsules_are_inputs() -> None:
    a = np.arange(4.0)
    src = opforge.from_numpy(a)
    capsule = src.__dlpack__()
    t = opforge.from_dlpack(capsule)
    assert t.numpy().ctypes.data == a.ctypes.data
    with pytest.raises(ValueError, match=r"\[from_dlpack\] input 'x': this DLPack capsule was already consumed"):
        opforge.from_dlpack(capsule)
    np.testing.assert_array_equal(ops.mul(src.__dlpack__(), 2.0).numpy(), a * 2)


JVP_CASES = [c for c in cases() if c.dtype == "float64" and _formulas.OPS[c.op.name].jvp is not None]


@pytest.mark.parametrize("case", JVP_CASES, ids=lambda c: c.id)
def test_python_jvp_matches_cpp_forward_mode(case: Case, rng) -> None:
    """The Python lowering of the jvp formulas (what opforge.torch's jvp runs) gives the tangents
    the C++ Jvp gives (opforge.jvp)."""
    op = _formulas.OPS[case.op.name]
    inputs = to_inputs(case.op, case.dtype, make_data(case.op, case.dtype, case.shapes, rng))
    diff = [k for k, i in enumerate(op.inputs) if i.differentiable and inputs[k] is not None]
    tangents = [rng.standard_normal(np.shape(inputs[k])) for k in diff]

    def f(*xs: Any) -> Any:
        full = list(inputs)
        for k, x in zip(diff, xs):
            full[k] = x
        return getattr(ops, op.name)(*full, **case.attrs)

    outs, expected = opforge.jvp(f, tuple(opforge.tensor(inputs[k]) for k in diff),
                                 tuple(opforge.tensor(t) for t in tangents))
    outs, expected = (outs, expected) if isinstance(outs, tuple) else ((outs,), (expected,))
    attrs = [case.attrs.get(a.name, a.default) for a in op.attrs]
    given = [None] * len(op.inputs)
    for k, t in zip(diff, tangents):
        given[k] = opforge.tensor(t)
    got = op.jvp(F, H, given, *[None if a is None else opforge.tensor(a) for a in inputs], *outs, *attrs)
    assert len(got) == len(op.outputs)
    for k, o in enumerate(op.outputs):
        if not o.differentiable:
            assert got[k] is None
            continue
        g = np.broadcast_to(got[k].numpy(), outs[k].shape)
        np.testing.assert_allclose(g, expected[k].numpy(), rtol=1e-10, atol=1e-12, err_msg=o.name)


def _derived_bprop(name: str) -> Any:
    """The bprop codegen derives from an expr op's expression, as a Python function over F and H
    (the op table's lowering), for an op whose spec writes its own."""
    import dataclasses

    from opforge.codegen import api
    from opforge.codegen.dest.op_table import _bprop
    from opforge.codegen.formula.lang import PY
    from opforge.codegen.model import Bprop, derive_formulas

    spec = opforge.spec(name)
    lets, grads = derive_formulas(spec.impl, spec.inputs, spec.outputs, [a.name for a in spec.attrs], "bprop")
    derived = dataclasses.replace(spec, bprop=Bprop(lets, grads, spec.impl.loc, derived="impl.expr"), jvp=None)
    table = {n: api.record_signature(o) for n, o in _formulas.OPS.items()}
    lowered = api.lower_formulas(derived, table, PY)
    params = ([f"v_{i.name}" for i in spec.inputs] + [f"v_{o.name}" for o in spec.outputs]
              + [f"v_{o.grad_name}" for o in spec.outputs if o.differentiable] + [f"a_{a.name}" for a in spec.attrs])
    source = f"def bprop(F, H, need, meta, {', '.join(params)}):\n" + "".join(
        f"    {line}\n" for line in _bprop(derived, lowered.bprop))
    scope: dict[str, Any] = {}
    exec(source, scope)  # the generated Python, as _formulas.py would hold it
    return scope["bprop"], [f.text for _, f in grads]


WRITTEN = [c for c in GRAD_CASES if c.op.impl.kind == "expr" and not c.op.bprop.derived]


@pytest.mark.parametrize("case", WRITTEN, ids=lambda c: c.id)
def test_written_bprop_matches_the_derived_one(case: Case, rng) -> None:
    """An expr op whose spec writes its bprop (a fused backward op, or PyTorch's choice at a
    kink): the written formula equals the one derived from its expression, at generic points."""
    op = _formulas.OPS[case.op.name]
    derived, texts = _derived_bprop(op.name)
    data = make_data(case.op, case.dtype, case.shapes, rng)
    inputs = [None if a is None else opforge.tensor(a) for a in to_inputs(case.op, case.dtype, data)]
    outs = getattr(ops, op.name)(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    douts = [opforge.tensor(rng.uniform(-1, 1, outs[k].shape)) for k, o in enumerate(op.outputs) if o.differentiable]
    attrs = [case.attrs.get(a.name, a.default) for a in op.attrs]
    need = [i.differentiable for i in op.inputs]
    meta = [(t.shape, t.dtype) for t in inputs]
    written = op.bprop(F, H, need, meta, *inputs, *outs, *douts, *attrs)
    got = derived(F, H, need, meta, *inputs, *outs, *douts, *attrs)
    for k, i in enumerate(op.inputs):
        if i.differentiable:
            np.testing.assert_allclose(got[k].numpy(), written[k].numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=f"{op.name}: d{i.name} derived as {texts}")


SHAPE_CASES = [c for c in cases() if _formulas.OPS[c.op.name].shapes is not None]


@pytest.mark.parametrize("case", SHAPE_CASES, ids=lambda c: c.id)
def test_python_shape_rules_match_the_cpp_ones(case: Case, rng) -> None:
    """The Python lowering of shape expressions and checks (what fake kernels run on symbolic
    sizes) gives the shapes the C++ rules give."""
    op = _formulas.OPS[case.op.name]
    inputs = to_inputs(case.op, case.dtype, make_data(case.op, case.dtype, case.shapes, rng))
    attrs = [case.attrs.get(a.name, a.default) for a in op.attrs]
    metas = getattr(_C._meta, op.name)(*[None if a is None else opforge.tensor(a) for a in inputs], *attrs)
    got = op.shapes(H, *[None if a is None else tuple(np.shape(a)) for a in inputs], *attrs)
    for k, o in enumerate(op.outputs):
        if o.shape == "expression":
            assert tuple(got[k]) == tuple(metas[k][0]), o.name


BAD_SHAPES = [
    ("linear", [(2, 5), (4, 3), None], "x's last dimension 5 differs from weight's in_features 3"),
    ("linear", [(), (4, 3), None], "x must have rank >= 1, got shape ()"),
    ("linear", [(2, 3), (4, 3), (5,)], "bias must have shape (4,) (out_features), got (5,)"),
    ("linear", [(2, 3), (3,), None], "weight must have shape (out_features, in_features), got (3,)"),
    ("transpose", [(3,)], "x must have rank >= 2 (the last two dims are swapped), got shape (3,)"),
    ("embedding", [(2,), (4,)], "weight must be 2-D (num_embeddings, embedding_dim), got shape (4,)"),
    ("cross_entropy", [(4, 3), (5,)], "labels must have shape (N,) = (4,) to match logits (4, 3), got (5,)"),
    ("bias_add_grad", [(3,)], "dy must have rank >= 2 (a batch axis and a channel axis), got shape (3,)"),
    ("linear_backward_weight", [(2, 3), (4, 5)], "grad and x must have rank >= 1 and the same leading dimensions"),
]


@pytest.mark.parametrize("name, shapes, message", BAD_SHAPES, ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(BAD_SHAPES)])
def test_shape_checks_raise_the_same_message_in_both_languages(name: str, shapes: list, message: str) -> None:
    import re

    op = _formulas.OPS[name]
    attrs = [a.default for a in op.attrs]
    dtypes = [("int64" if i.dtype == "int64" else "float32") for i in op.inputs]
    tensors = [None if s is None else opforge.tensor(np.zeros(s, dtype=d)) for s, d in zip(shapes, dtypes)]
    pattern = re.escape(f"[{name}] {message}")
    with pytest.raises(ValueError, match=pattern):
        getattr(ops, name)(*tensors, *attrs)
    with pytest.raises(ValueError, match=pattern):
        op.shapes(H, *[None if s is None else tuple(s) for s in shapes], *attrs)
