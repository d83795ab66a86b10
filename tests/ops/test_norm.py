"""Normalization ops beyond the generated tests: bad input (exact messages), fused vs general
paths, long rows, parallel paths, empty inputs, formats, and the fused backward ops against
NumPy formulas."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops

F32 = np.ones((2, 3), np.float32)


def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message) + "$")


# ---------------------------------------------------------------------------- bad input


def test_layer_norm_backward_shapes() -> None:
    kept = np.ones((2, 1), np.float32)
    with raises(ValueError, "[layer_norm_backward] dy of shape (2, 2) must have shape (2, 3) (the shape of x)"):
        ops.layer_norm_backward(np.ones((2, 2), np.float32), F32, kept, kept, kept, kept)
    with raises(ValueError, "[layer_norm_backward] mean of shape (2, 3) must have shape (2, 1) "
                            "(x reduced over axis, kept dims)"):
        ops.layer_norm_backward(F32, F32, F32, kept, kept, kept)
    with raises(ValueError, "[layer_norm_backward] drstd of shape (1, 3) must have shape (2, 1) "
                            "(x reduced over axis, kept dims)"):
        ops.layer_norm_backward(F32, F32, kept, kept, kept, np.ones((1, 3), np.float32))
    with raises(ValueError, "[layer_norm_backward] weight of shape (2,) does not broadcast to x of shape (2, 3)"):
        ops.layer_norm_backward(F32, F32, kept, kept, kept, kept, np.ones(2, np.float32))
    with raises(ValueError, "[layer_norm_backward] weight of shape (2, 2, 3) does not broadcast to x of shape (2, 3)"):
        ops.layer_norm_backward(F32, F32, kept, kept, kept, kept, np.ones((2, 2, 3), np.float32))


def test_rms_norm_bad_input() -> None:
    with raises(ValueError, "[rms_norm] weight of shape (4, 1, 3) does not broadcast to x of shape (2, 3)"):
        ops.rms_norm(F32, np.ones((4, 1, 3), np.float32))
    with raises(ValueError, "[rms_norm] weight of shape (2,) does not broadcast to x of shape (2, 3)"):
        ops.rms_norm(F32, np.ones(2, np.float32))
    with raises(ValueError, "[rms_norm] attr 'eps' must be >= 0, got -1"):
        ops.rms_norm(F32, eps=-1.0)
    with raises(IndexError, "[rms_norm] axis 2 is out of range for a tensor of rank 2"):
        ops.rms_norm(F32, axis=[2])
    with raises(ValueError, "[rms_norm] axis -1 is repeated"):
        ops.rms_norm(F32, axis=[1, -1])
    kept = np.ones((2, 1), np.float32)
    with raises(ValueError, "[rms_norm_backward] rstd of shape (2, 3) must have shape (2, 1) "
                            "(x reduced over axis, kept dims)"):
        ops.rms_norm_backward(F32, F32, F32, kept)


def test_norm_grad_ops_bad_shapes() -> None:
    kept = np.ones((2, 1), np.float32)
    with raises(ValueError, "[norm_weight_grad] weight of shape (5,) does not broadcast to "
                            "dy * (x - mean) * rstd of shape (2, 3)"):
        ops.norm_weight_grad(F32, F32, kept, np.ones(5, np.float32))
    with raises(ValueError, "[norm_weight_grad] shapes cannot be broadcast together: dy (2, 3), x (2, 3), "
                            "rstd (4, 1)"):
        ops.norm_weight_grad(F32, F32, np.ones((4, 1), np.float32), np.ones(3, np.float32))
    w3 = np.ones(3, np.float32)
    with raises(ValueError, "[norm_affine_grad] weight of shape (5,) does not broadcast to "
                            "dy * (x - mean) * rstd of shape (2, 3)"):
        ops.norm_affine_grad(F32, F32, kept, np.ones(5, np.float32), w3)
    with raises(ValueError, "[norm_affine_grad] bias of shape (2, 2) does not broadcast to dy of shape (2, 3)"):
        ops.norm_affine_grad(F32, F32, kept, w3, np.ones((2, 2), np.float32))
    with raises(ValueError, "[layer_norm_affine_backward] bias of shape (2, 2) does not broadcast to x of shape (2, 3)"):
        ops.layer_norm_affine_backward(F32, F32, kept, kept, kept, kept, w3, np.ones((2, 2), np.float32))
    with raises(ValueError, "[layer_norm_affine_backward] weight of shape (5,) does not broadcast to x of shape (2, 3)"):
        ops.layer_norm_affine_backward(F32, F32, kept, kept, kept, kept, np.ones(5, np.float32), w3)
    with raises(ValueError, "[layer_norm_affine_backward] dy of shape (2, 2) must have shape (2, 3) (the shape of x)"):
        ops.layer_norm_affine_backward(np.ones((2, 2), np.float32), F32, kept, kept, kept, kept, w3, w3)
    with raises(ValueError, "[rms_norm_affine_backward] drstd of shape (2, 3) must have shape (2, 1) "
                            "(x reduced over axis, kept dims)"):
        ops.rms_norm_affine_backward(F32, F32, kept, F32, w3)
    with raises(ValueError, "[sum_to_like] like of shape (2, 2, 3) does not broadcast to x of shape (2, 3)"):
        ops.sum_to_like(F32, np.ones((2, 2, 3), np.float32))
    with raises(ValueError, "[sum_to_like] like of shape (4,) does not broadcast to x of shape (2, 3)"):
        ops.sum_to_like(F32, np.ones(4, np.float32))


def test_bias_add_bad_input() -> None:
    x = np.ones((2, 3, 4), np.float32)
    with raises(ValueError, "[bias_add] bias of shape (4,) must have shape (3,): one value per channel of x "
                            "(shape (2, 3, 4), format NCHW, channel axis 1)"):
        ops.bias_add(x, np.ones(4, np.float32))
    with raises(ValueError, "[bias_add] bias of shape (3,) must have shape (4,): one value per channel of x "
                            "(shape (2, 3, 4), format NHWC, channel axis 2)"):
        ops.bias_add(x, np.ones(3, np.float32), format="NHWC")
    with raises(ValueError, "[bias_add] bias of shape (1, 3) must have shape (3,): one value per channel of x "
                            "(shape (2, 3, 4), format NCHW, channel axis 1)"):
        ops.bias_add(x, np.ones((1, 3), np.float32))
    with raises(ValueError, "[bias_add] x must have rank >= 2 (a batch axis and a channel axis), got shape (3,)"):
        ops.bias_add(np.ones(3, np.float32), np.ones(3, np.float32))
    with raises(ValueError, "[bias_add] attr 'format' must be one of: NCHW, NHWC; got NCDHW"):
        ops.bias_add(x, np.ones(3, np.float32), format="NCDHW")
    with raises(TypeError, "[bias_add] attr 'format' must be a str, got int"):
        ops.bias_add(x, np.ones(3, np.float32), format=1)
    tagged = opforge.tensor(x, format="NHWC")
    with raises(ValueError, '[bias_add] x is tagged NHWC but format is NCHW; pass format="NHWC"'):
        ops.bias_add(tagged, np.ones(3, np.float32))
    with raises(TypeError, "[bias_add] inputs 'x' (float32) and 'bias' (float64) must have the same dtype "
                           "(type variable T)"):
        ops.bias_add(x, np.ones(3))


def test_bias_add_grad_bad_input() -> None:
    with raises(ValueError, "[bias_add_grad] dy must have rank >= 2 (a batch axis and a channel axis), "
                            "got shape (3,)"):
        ops.bias_add_grad(np.ones(3, np.float32))
    tagged = opforge.tensor(np.ones((2, 3, 4), np.float32), format="NCHW")
    with raises(ValueError, '[bias_add_grad] dy is tagged NCHW but format is NHWC; pass format="NCHW"'):
        ops.bias_add_grad(tagged, format="NHWC")


# ---------------------------------------------------------------------------- layer_norm / rms_norm


def np_layer_norm(x, w, b, axis, eps):
    m = x.mean(axis=axis, keepdims=True)
    v = x.var(axis=axis, keepdims=True)
    r = 1 / np.sqrt(v + eps)
    return (x - m) * r * (1 if w is None else w) + (0 if b is None else b), m, r


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("float64", 1e-12)])
def test_layer_norm_long_rows_with_offset(dtype, tol) -> None:
    # rows longer than one summation chunk, a large mean: the variance must not cancel
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 10000)) + 1000).astype(dtype)
    w, b = rng.standard_normal(10000).astype(dtype), rng.standard_normal(10000).astype(dtype)
    y, m, r = ops.layer_norm(x, w, b)
    ey, em, er = np_layer_norm(x.astype(np.float64), w, b, -1, 1e-5)
    np.testing.assert_allclose(m.numpy(), em, rtol=tol)
    np.testing.assert_allclose(r.numpy(), er, rtol=200 * tol)
    np.testing.assert_allclose(y.numpy(), ey, rtol=200 * tol, atol=200 * tol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_fused_and_general_paths_agree(dtype) -> None:
    # (256, 300) is above the parallel threshold; weight of shape (256, 300) forces the general path
    rng = np.random.default_rng(1)
    x = opforge.tensor(rng.standard_normal((256, 300))).astype(dtype)
    w = rng.standard_normal(300)
    b = rng.standard_normal(300)
    wt, bt = opforge.tensor(w).astype(dtype), opforge.tensor(b).astype(dtype)
    wf = opforge.tensor(np.broadcast_to(w, (256, 300)).copy()).astype(dtype)
    bf = opforge.tensor(np.broadcast_to(b, (256, 300)).copy()).astype(dtype)
    tol = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
    for fast, general in [(ops.layer_norm(x, wt, bt), ops.layer_norm(x, wf, bf)),
                          (ops.rms_norm(x, wt), ops.rms_norm(x, wf))]:
        for a, c in zip(fast, general):
            np.testing.assert_allclose(a.astype("float64").numpy(), c.astype("float64").numpy(), rtol=tol, atol=tol)


def test_non_trailing_axes_take_the_general_path() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 5, 6))
    w = rng.standard_normal((4, 1, 6))
    y, m, r = ops.layer_norm(x, w, None, axis=[0, 2], eps=1e-3)
    ey, em, er = np_layer_norm(x, w, None, (0, 2), 1e-3)
    np.testing.assert_allclose(y.numpy(), ey, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.numpy(), em, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.numpy(), er, rtol=1e-12)
    y, r = ops.rms_norm(x, w, axis=[0])
    er = 1 / np.sqrt((x * x).mean(axis=0, keepdims=True) + 1e-6)
    np.testing.assert_allclose(r.numpy(), er, rtol=1e-12)
    np.testing.assert_allclose(y.numpy(), x * er * w, rtol=1e-12, atol=1e-12)


def test_empty_and_zero_dim() -> None:
    y, m, r = ops.layer_norm(np.ones((0, 5), np.float32), np.ones(5, np.float32), np.ones(5, np.float32))
    assert y.shape == (0, 5) and m.shape == (0, 1) and r.shape == (0, 1)
    y, m, r = ops.layer_norm(np.ones((3, 0), np.float32))
    assert y.shape == (3, 0) and m.shape == (3, 1) and np.isnan(m.numpy()).all()
    y, r = ops.rms_norm(np.ones((0, 5), np.float64))
    assert y.shape == (0, 5) and r.shape == (0, 1)
    y, r = ops.rms_norm(np.float32(2.0), axis=[])
    assert y.shape == () and np.isclose(float(y.numpy()), 1.0, rtol=1e-5)
    y, m, r = ops.layer_norm(np.float32(2.0), axis=[])
    assert float(y.numpy()) == 0.0 and float(m.numpy()) == 2.0
    dx = ops.layer_norm_backward(*(np.ones((0, 4)),) * 2, *(np.ones((0, 1)),) * 4)
    assert dx.shape == (0, 4)
    assert ops.sum_to_like(np.ones((0, 3)), np.ones(3)).numpy().tolist() == [0, 0, 0]
    assert ops.bias_add_grad(np.ones((0, 3, 2)), format="NCHW").numpy().tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------- fused backward


def composite_grads(x, w, b, dy, dm, dr, axis, eps, rms=False):
    """The gradients by autograd through the composite formula (opforge elementwise ops)."""
    xt, wt = opforge.tensor(x, requires_grad=True), opforge.tensor(w, requires_grad=True)
    keep = dict(axis=axis, keepdims=True)
    if rms:
        r = ops.div(1.0, ops.sqrt(ops.add(ops.mean(ops.mul(xt, xt), **keep), eps)))
        outs, grads_in = [ops.mul(ops.mul(xt, r), wt), r], [dy, dr]
        leaves = [xt, wt]
    else:
        bt = opforge.tensor(b, requires_grad=True)
        m = ops.mean(xt, **keep)
        c = ops.sub(xt, m)
        r = ops.div(1.0, ops.sqrt(ops.add(ops.mean(ops.mul(c, c), **keep), eps)))
        outs, grads_in = [ops.add(ops.mul(ops.mul(c, r), wt), bt), m, r], [dy, dm, dr]
        leaves = [xt, wt, bt]
    return [g.numpy() for g in opforge.gradients(outs, leaves, [opforge.tensor(g) for g in grads_in])]


@pytest.mark.parametrize("shape, axis", [((64, 1100), [-1]), ((8, 6, 50), [-2, -1]), ((6, 7, 8), [0, 2])])
def test_fused_backward_matches_composite(shape, axis) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * 3 + 1
    wshape = shape[-len(axis):] if axis == [-1] or axis == [-2, -1] else (shape[0], 1, shape[2])
    w, b = rng.standard_normal(wshape), rng.standard_normal(wshape)
    kept = tuple(1 if (d in axis or d - len(shape) in axis) else n for d, n in enumerate(shape))
    dy, dm, dr = rng.standard_normal(shape), rng.standard_normal(kept), rng.standard_normal(kept)
    xt, wt, bt = (opforge.tensor(a, requires_grad=True) for a in (x, w, b))
    outs = ops.layer_norm(xt, wt, bt, axis=axis, eps=1e-3)
    got = opforge.gradients(list(outs), [xt, wt, bt], [opforge.tensor(a) for a in (dy, dm, dr)])
    want = composite_grads(x, w, b, dy, dm, dr, axis, 1e-3)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-9, atol=1e-9)
    xt, wt = opforge.tensor(x, requires_grad=True), opforge.tensor(w, requires_grad=True)
    outs = ops.rms_norm(xt, wt, eps=1e-3, axis=axis)
    got = opforge.gradients(list(outs), [xt, wt], [opforge.tensor(a) for a in (dy, dr)])
    want = composite_grads(x, w, None, dy, None, dr, axis, 1e-3, rms=True)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-9, atol=1e-9)


def test_float32_backward_in_parallel_paths() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 384)).astype(np.float32)
    w, b = rng.standard_normal(384).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    dy = rng.standard_normal((512, 384)).astype(np.float32)
    xt, wt, bt = (opforge.tensor(a, requires_grad=True) for a in (x, w, b))
    y, _, _ = ops.layer_norm(xt, wt, bt)
    got = opforge.gradients([y], [xt, wt, bt], [opforge.tensor(dy)])
    want = composite_grads(*(a.astype(np.float64) for a in (x, w, b, dy)), np.zeros((512, 1)), np.zeros((512, 1)),
                           [-1], 1e-5)
    for g, e in zip(got, want):
        assert g.dtype == "float32"
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-4, atol=1e-3 * np.abs(e).max())


def test_sum_to_like_layouts() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5, 6))
    for like in [(6,), (5, 6), (4, 1, 1), (3, 1, 1, 1), (1, 4, 5, 1), (4, 1, 6), (1,), ()]:
        lead = x.ndim - len(like)
        e = x.sum(axis=tuple(range(lead))).sum(axis=tuple(i for i, s in enumerate(like) if s == 1), keepdims=True)
        got = ops.sum_to_like(x, np.zeros(like))
        assert got.shape == like
        np.testing.assert_allclose(got.numpy(), e, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- bias_add


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_bias_add_formats(dtype) -> None:
    rng = np.random.default_rng(6)
    x = rng.integers(-5, 5, (2, 3, 4, 5)).astype(dtype)
    np.testing.assert_array_equal(ops.bias_add(x, np.arange(3, dtype=dtype)).numpy(),
                                  x + np.arange(3, dtype=dtype).reshape(3, 1, 1))
    np.testing.assert_array_equal(ops.bias_add(x, np.arange(5, dtype=dtype), format="NHWC").numpy(),
                                  x + np.arange(5, dtype=dtype))
    np.testing.assert_array_equal(ops.bias_add_grad(x).numpy(), x.sum(axis=(0, 2, 3)))
    np.testing.assert_array_equal(ops.bias_add_grad(x, format="NHWC").numpy(), x.sum(axis=(0, 1, 2)))


def test_bias_add_tagged_tensors_and_gradient() -> None:
    rng = np.random.default_rng(7)
    x = opforge.tensor(rng.standard_normal((2, 4, 4, 3)), format="NHWC", requires_grad=True)
    bias = opforge.tensor(rng.standard_normal(3), requires_grad=True)
    out = ops.bias_add(x, bias, format="NHWC")
    assert out.format == "NHWC"
    np.testing.assert_allclose(out.numpy(), x.numpy() + bias.numpy())
    dout = rng.standard_normal((2, 4, 4, 3))
    gx, gb = opforge.gradients([out], [x, bias], [opforge.tensor(dout)])
    np.testing.assert_allclose(gx.numpy(), dout)
    np.testing.assert_allclose(gb.numpy(), dout.sum(axis=(0, 1, 2)), rtol=1e-12)
    nchw = opforge.tensor(rng.standard_normal((2, 3, 4, 4)).astype(np.float32), format="NCHW")
    assert ops.bias_add(nchw, np.ones(3, np.float32)).format == "NCHW"
    assert "NHWC" in str(opforge.op_info("bias_add"))


def test_bias_add_large_parallel() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16, 32, 24, 24)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    np.testing.assert_allclose(ops.bias_add(x, b).numpy(), x + b.reshape(32, 1, 1))
    np.testing.assert_allclose(ops.bias_add_grad(x).numpy(), x.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)
    xh = x.transpose(0, 2, 3, 1).copy()
    np.testing.assert_allclose(ops.bias_add(xh, b, format="NHWC").numpy(), xh + b)
    np.testing.assert_allclose(ops.bias_add_grad(xh, format="NHWC").numpy(),
                               xh.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-5)


@pytest.mark.parametrize("dtype, tol", [("float16", 2e-2), ("bfloat16", 1e-1), ("float32", 1e-4)])
def test_fused_backward_ops_low_precision_parallel(dtype, tol) -> None:
    # (256, 300) runs the parallel row and column loops; 16-bit rows go through float buffers
    rng = np.random.default_rng(9)

    def q(a):  # the values as the dtype holds them, in float64
        return opforge.tensor(a).astype(dtype).astype("float64").numpy()

    x, dy, w = q(rng.standard_normal((256, 300))), q(rng.standard_normal((256, 300))), q(rng.standard_normal(300))
    m = q(x.mean(-1, keepdims=True))
    r = q(1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5))
    dm, dr = q(rng.standard_normal((256, 1))), q(rng.standard_normal((256, 1)))
    args = [opforge.tensor(a).astype(dtype) for a in (dy, x, m, r, dm, dr, w)]
    dyt, xt, mt, rt, dmt, drt, wt = args

    def check(got, want):
        assert got.dtype == dtype
        np.testing.assert_allclose(got.astype("float64").numpy(), want, rtol=tol, atol=tol * np.abs(want).max())

    n = 300
    g, xh = dy * w, (x - m) * r
    want = r * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True)) + (dm - dr * r * r * xh) / n
    check(ops.layer_norm_backward(dyt, xt, mt, rt, dmt, drt, wt), want)
    xr = x * r
    want = r * (g - xr * (g * xr).mean(-1, keepdims=True)) - dr * r * r * xr / n
    check(ops.rms_norm_backward(dyt, xt, rt, drt, wt), want)
    check(ops.norm_weight_grad(dyt, xt, rt, wt, mt), (dy * xh).sum(0))
    check(ops.norm_weight_grad(dyt, xt, rt, wt), (dy * x * r).sum(0))
    check(ops.sum_to_like(dyt, wt), dy.sum(0))
    dw, db = ops.norm_affine_grad(dyt, xt, rt, wt, wt, mt)
    check(dw, (dy * xh).sum(0))
    check(db, dy.sum(0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape, axis, wshape, bshape", [
    ((256, 300), [-1], (300,), (300,)),         # the fused rows, in parallel
    ((3, 5, 7), [-2, -1], (5, 7), (5, 7)),       # fused, two normalized dims, one thread
    ((0, 6), [-1], (6,), (6,)),                  # no rows: zero gradients
    ((4, 6, 5), [-1], (6, 5), (5,)),             # weight along the rows: the two ops' general paths
    ((6, 4, 5), [0], (6, 1, 1), (6, 1, 1)),      # leading axis
], ids=str)
def test_layer_norm_affine_backward_is_the_two_ops(dtype, shape, axis, wshape, bshape) -> None:
    # one read of dy and x, the bits of layer_norm_backward (dx) and norm_affine_grad (dweight, dbias)
    rng = np.random.default_rng(11)
    kept = tuple(1 if (d in axis or d - len(shape) in axis) else n for d, n in enumerate(shape))
    dy, x, w, b = (opforge.tensor(rng.standard_normal(s)).astype(dtype) for s in (shape, shape, wshape, bshape))
    m, dm, dr = (opforge.tensor(rng.standard_normal(kept)).astype(dtype) for _ in range(3))
    r = opforge.tensor(rng.uniform(0.5, 2.0, kept)).astype(dtype)
    dx, dw, db = ops.layer_norm_affine_backward(dy, x, m, r, dm, dr, w, b, axis=axis)
    assert (dx.shape, dw.shape, db.shape) == (shape, wshape, bshape)
    want = [ops.layer_norm_backward(dy, x, m, r, dm, dr, w, axis=axis), *ops.norm_affine_grad(dy, x, r, w, b, m)]
    for got, e in zip((dx, dw, db), want):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.astype("float64").numpy(), e.astype("float64").numpy())
    if shape[0] == 0:
        assert not dw.astype("float64").numpy().any() and not db.astype("float64").numpy().any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape, axis, wshape", [
    ((256, 300), [-1], (300,)),       # the fused rows, in parallel
    ((3, 5, 7), [-2, -1], (5, 7)),    # fused, two normalized dims, one thread
    ((0, 6), [-1], (6,)),             # no rows: a zero gradient
    ((4, 6, 5), [-1], (6, 5)),        # weight along the rows: the two ops' general paths
    ((6, 4, 5), [0], (6, 1, 1)),      # leading axis
], ids=str)
def test_rms_norm_affine_backward_is_the_two_ops(dtype, shape, axis, wshape) -> None:
    # one read of dy and x, the bits of rms_norm_backward (dx) and norm_weight_grad (dweight)
    rng = np.random.default_rng(12)
    kept = tuple(1 if (d in axis or d - len(shape) in axis) else n for d, n in enumerate(shape))
    dy, x, w = (opforge.tensor(rng.standard_normal(s)).astype(dtype) for s in (shape, shape, wshape))
    dr = opforge.tensor(rng.standard_normal(kept)).astype(dtype)
    r = opforge.tensor(rng.uniform(0.5, 2.0, kept)).astype(dtype)
    dx, dw = ops.rms_norm_affine_backward(dy, x, r, dr, w, axis=axis)
    assert (dx.shape, dw.shape) == (shape, wshape)
    for got, e in zip((dx, dw), (ops.rms_norm_backward(dy, x, r, dr, w, axis=axis), ops.norm_weight_grad(dy, x, r, w))):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.astype("float64").numpy(), e.astype("float64").numpy())
    if shape[0] == 0:
        assert not dw.astype("float64").numpy().any()


@pytest.mark.parametrize("rms", [False, True])
def test_frozen_parameters_take_the_dx_only_backward(rms) -> None:
    # weight (and bias) given but frozen: x's gradient is layer_norm_backward's/rms_norm_backward's
    # (dx alone), with the same values as when the parameters train and the fused op runs
    rng = np.random.default_rng(5)
    x, w, b, dy = (rng.standard_normal(s) for s in ((6, 40), (40,), (40,), (6, 40)))
    fused, alone = ("rms_norm_affine_backward", "rms_norm_backward") if rms else \
        ("layer_norm_affine_backward", "layer_norm_backward")
    grads = {}
    for trained in (True, False):
        xt = opforge.tensor(x, requires_grad=True)
        params = [opforge.tensor(a, requires_grad=trained) for a in ((w,) if rms else (w, b))]
        y = (ops.rms_norm if rms else ops.layer_norm)(xt, *params)[0]
        (gx,) = opforge.gradients([y], [xt], [opforge.tensor(dy)], create_graph=True)
        assert gx.grad_fn == (fused if trained else alone), trained
        grads[trained] = gx.numpy()
    np.testing.assert_allclose(grads[False], grads[True], rtol=1e-12, atol=1e-12)
