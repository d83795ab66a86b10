"""The elem group's ops beyond the generated spec tests: bad input (exact messages), NaN and tie
semantics, the parallel paths of the kernels, and gradients the spec tests cannot reach."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import opforge
from opforge import ops

W = np.arange(12, dtype=np.float32).reshape(4, 3)


def raises(exc, msg):
    return pytest.raises(exc, match="^" + re.escape(msg) + "$")


# ---------------------------------------------------------------------------- bad input


def test_embedding_index_out_of_range_names_the_op() -> None:
    with raises(IndexError, "[embedding] index 4 is out of range for weight with 4 rows"):
        ops.embedding(np.array([0, 4]), W)
    with raises(IndexError, "[embedding] index -1 is out of range for weight with 4 rows"):
        ops.embedding(np.array([[0, -1]]), W)
    with raises(IndexError, "[embedding] index 0 is out of range for weight with 0 rows"):
        ops.embedding(np.array([0]), np.ones((0, 3), np.float32))
    big = np.zeros(1 << 17, np.int64)  # the parallel validation scan
    big[-5] = 1 << 40
    with raises(IndexError, "[embedding] index 1099511627776 is out of range for weight with 4 rows"):
        ops.embedding(big, W)
    with raises(IndexError, "[embedding_backward] index 9 is out of range for weight with 4 rows"):
        ops.embedding_backward(np.ones((2, 3), np.float32), np.array([0, 9]), W)


def test_embedding_bad_shapes_and_dtypes() -> None:
    with raises(ValueError, "[embedding] weight must be 2-D (num_embeddings, embedding_dim), got shape (3,)"):
        ops.embedding(np.array([0]), np.ones(3, np.float32))
    with raises(TypeError, "[embedding] input 'indices' must be int64, got int32"):
        ops.embedding(np.array([0], np.int32), W)
    with raises(TypeError, "[embedding] input 'indices' must be int64, got float64"):
        ops.embedding(np.array([0.0]), W)
    with raises(ValueError, "[embedding_backward] dout of shape (2, 2) does not match indices of shape (2,) "
                            "and embedding_dim 3: expected (2, 3)"):
        ops.embedding_backward(np.ones((2, 2), np.float32), np.array([0, 1]), W)


def test_max_min_bad_axis_and_empty_axis() -> None:
    with raises(IndexError, "[max] axis 2 is out of range for a tensor of rank 2"):
        ops.max(np.ones((2, 3)), axis=2)
    with raises(IndexError, "[min] axis -3 is out of range for a tensor of rank 2"):
        ops.min(np.ones((2, 3)), axis=-3)
    with raises(ValueError, "[max] cannot take the max over axis 1 of size 0"):
        ops.max(np.ones((2, 0)), axis=1)
    with raises(ValueError, "[min] cannot take the min over axis 0 of size 0"):
        ops.min(np.ones((0, 3)), axis=0)
    with raises(TypeError, "[max] attr 'axis' must be an int, got list"):
        ops.max(np.ones((2, 3)), axis=[0])
    values, indices = ops.max(np.ones((0, 3)), axis=1)  # empty lanes, non-empty axis
    assert values.shape == indices.shape == (0,)


def test_bad_attr_choice_and_types() -> None:
    with raises(ValueError, "[gelu] attr 'approximate' must be one of: none, tanh; got foo"):
        ops.gelu(W, approximate="foo")
    with raises(ValueError, "[gelu_backward] attr 'approximate' must be one of: none, tanh; got Tanh"):
        ops.gelu_backward(W, W, approximate="Tanh")
    with raises(TypeError, "[gelu] attr 'approximate' must be a str, got None"):
        ops.gelu(W, approximate=None)
    with raises(TypeError, "[clamp] attr 'min' must be a float, got str"):
        ops.clamp(W, min="a")
    with raises(TypeError, "[pow] dtype int64 is not supported on target cpu; supported (T): "
                           "float16; bfloat16; float32; float64"):
        ops.pow(np.arange(3), np.arange(3))


def test_take_and_scatter_bad_input() -> None:
    x = np.ones((2, 3))
    with raises(ValueError, "[take_along_axis] indices of shape (1, 2) do not fit x of shape (2, 3) along axis 1 "
                            "(keepdims=True: same rank, equal sizes on the other axes)"):
        ops.take_along_axis(x, np.array([[2, 0]]), axis=1)
    with raises(ValueError, "[take_along_axis] indices of shape (3,) do not fit x of shape (2, 3) along axis 1 "
                            "(keepdims=False: x's shape without the axis)"):
        ops.take_along_axis(x, np.array([2, 1, 0]), axis=1, keepdims=False)
    with raises(IndexError, "[take_along_axis] index -1 is out of range for axis 1 of size 3"):
        ops.take_along_axis(x, np.array([[2], [-1]]), axis=1)
    with raises(IndexError, "[take_along_axis] index 3 is out of range for axis -1 of size 3"):
        ops.take_along_axis(x, np.array([[3], [0]]))
    with raises(IndexError, "[take_along_axis] axis 2 is out of range for a tensor of rank 2"):
        ops.take_along_axis(x, np.array([[0], [0]]), axis=2)
    with raises(ValueError, "[scatter_add_along_axis] src of shape (2, 1) must have the shape of indices (2, 2)"):
        ops.scatter_add_along_axis(np.ones((2, 1)), np.array([[0, 1], [1, 1]]), x, axis=1)
    with raises(IndexError, "[scatter_add_along_axis] index 5 is out of range for axis 0 of size 2"):
        ops.scatter_add_along_axis(np.ones((1, 3)), np.array([[0, 5, 1]]), x, axis=0)


# ---------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_nan_ties_and_ranks(op: str) -> None:
    x = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, np.nan, 5.0, np.nan], [-1.0, -1.0, -1.0, -1.0]])
    for axis in (0, 1, -1):
        for keepdims in (False, True):
            v, i = getattr(ops, op)(x, axis=axis, keepdims=keepdims)
            np.testing.assert_array_equal(v.numpy(), getattr(np, op)(x, axis=axis, keepdims=keepdims))
            np.testing.assert_array_equal(i.numpy(), getattr(np, "arg" + op)(x, axis=axis, keepdims=keepdims))
            assert i.dtype == "int64"
    v, i = getattr(ops, op)(np.array([4, 7, 7, -2, 7], np.int32))  # 1-D, ties: the first index
    assert v.item() == (7 if op == "max" else -2) and i.item() == (1 if op == "max" else 3)
    v, i = getattr(ops, op)(np.array(2.5), axis=0)  # 0-d with axis 0, as the reduce rule allows
    assert v.item() == 2.5 and i.item() == 0


@pytest.mark.parametrize("shape, axis", [((300, 257), 1), ((257, 300), 0), ((3, 40000), 1), ((40000, 3), 0),
                                         ((5, 1000, 20), 1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_max_min_large_match_numpy(shape, axis, dtype: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-50, 50, shape).astype(dtype)  # ties everywhere
    if dtype != "int64":
        x.flat[rng.integers(0, x.size, 20)] = np.nan
    for op in ("max", "min"):
        v, i = getattr(ops, op)(x, axis=axis)
        np.testing.assert_array_equal(i.numpy(), getattr(np, "arg" + op)(x, axis=axis))
        np.testing.assert_array_equal(v.numpy(), getattr(np, op)(x, axis=axis))


def test_max_gradient_goes_to_the_first_extremum_and_double_backward_is_zero() -> None:
    x = opforge.tensor(np.array([[1.0, 5.0, 5.0], [7.0, 2.0, 7.0]]), requires_grad=True)
    v, _ = ops.max(x, axis=1)
    (g,) = opforge.gradients(v, [x], [opforge.tensor(np.array([10.0, 20.0]))], create_graph=True)
    np.testing.assert_array_equal(g.numpy(), [[0, 10, 0], [20, 0, 0]])
    (gg,) = opforge.gradients(ops.sum(ops.mul(g, g)), [x], allow_unused=True)
    assert gg is None or not np.any(gg.numpy())


def test_take_and_scatter_along_axis_keepdims_false_and_repeats() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 4))
    idx = rng.integers(0, 5, (3, 4))
    out = ops.take_along_axis(x, idx, axis=1, keepdims=False)
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, idx[:, None, :], 1)[:, 0, :])
    idx2 = rng.integers(0, 5, (3, 7, 4))  # more positions than the axis has: repeats accumulate
    src = rng.standard_normal((3, 7, 4))
    got = ops.scatter_add_along_axis(src, idx2, x, axis=1).numpy()
    want = np.zeros_like(x)
    for a in range(3):
        for p in range(7):
            for c in range(4):
                want[a, idx2[a, p, c], c] += src[a, p, c]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(ops.take_along_axis(x, idx2, axis=1).numpy(), np.take_along_axis(x, idx2, 1))
    # gradients: take <-> scatter, both ways, with keepdims False too
    xt = opforge.tensor(x, requires_grad=True)
    w = rng.standard_normal((3, 4))
    (gx,) = opforge.gradients(ops.take_along_axis(xt, idx, axis=1, keepdims=False), [xt], [opforge.tensor(w)])
    want = np.zeros_like(x)
    np.put_along_axis(want, idx[:, None, :], w[:, None, :], 1)
    np.testing.assert_array_equal(gx.numpy(), want)
    st = opforge.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    v = rng.standard_normal(x.shape)
    (gs,) = opforge.gradients(ops.scatter_add_along_axis(st, idx, x, axis=1, keepdims=False), [st], [opforge.tensor(v)])
    np.testing.assert_array_equal(gs.numpy(), np.take_along_axis(v, idx[:, None, :], 1)[:, 0, :])


def test_scatter_large_parallel_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    x = np.zeros((64, 50, 700), np.float32)
    idx = rng.integers(0, 50, (64, 80, 700))
    src = rng.standard_normal((64, 80, 700)).astype(np.float32)
    got = ops.scatter_add_along_axis(src, idx, x, axis=1).numpy()
    want = np.zeros(x.shape)
    np.add.at(want, (np.arange(64)[:, None, None], idx, np.arange(700)[None, None, :]), src.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    half = ops.scatter_add_along_axis(src.astype(np.float16), idx, x.astype(np.float16), axis=1).numpy()
    np.testing.assert_allclose(half.astype(np.float64), want, rtol=5e-3, atol=2e-2)


def test_embedding_large_and_repeated_rows() -> None:
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((1000, 96)).astype(np.float32)
    idx = rng.integers(0, 1000, (40, 50))
    out = ops.embedding(idx, weight)
    assert out.shape == (40, 50, 96)
    np.testing.assert_array_equal(out.numpy(), weight[idx])
    dout = rng.standard_normal((40, 50, 96)).astype(np.float32)
    want = np.zeros((1000, 96))
    np.add.at(want, idx, dout.astype(np.float64))
    got = ops.embedding_backward(dout, idx, weight).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for dt, tol in (("float16", 1e-2), ("float64", 1e-12)):  # 16-bit floats accumulate in float
        want = np.zeros((1000, 96))
        np.add.at(want, idx, dout.astype(dt).astype(np.float64))
        got = ops.embedding_backward(dout.astype(dt), idx, weight.astype(dt)).numpy()
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    # the weight gradient through autograd, with every index repeated
    w = opforge.tensor(weight.astype(np.float64), requires_grad=True)
    rep = np.array([[3, 3], [3, 7]])
    (gw,) = opforge.gradients(ops.embedding(rep, w), [w], [opforge.tensor(np.ones((2, 2, 96)))])
    assert gw.numpy()[3].tolist() == [3.0] * 96 and gw.numpy()[7].tolist() == [1.0] * 96
    assert not np.any(np.delete(gw.numpy(), [3, 7], axis=0))


def test_embedding_backward_is_deterministic_across_thread_counts() -> None:
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 8, 200000)  # many repeats per row
    dout = rng.standard_normal((200000, 3)).astype(np.float32)
    weight = np.zeros((8, 3), np.float32)
    a = ops.embedding_backward(dout, idx, weight).numpy()
    b = ops.embedding_backward(dout, idx, weight).numpy()
    np.testing.assert_array_equal(a, b)
    # the rows are summed in ascending position order
    want = np.zeros((8, 3), np.float32)
    for r in range(8):
        for row in dout[idx == r]:
            want[r] += row
    np.testing.assert_array_equal(a, want)


def test_maximum_minimum_ties_split_the_gradient_and_nan_propagates() -> None:
    x = opforge.tensor(np.array([1.0, 2.0, 3.0, np.nan]), requires_grad=True)
    y = opforge.tensor(np.array([1.0, 5.0, 0.0, 1.0]), requires_grad=True)
    for op, wx, wy in (("maximum", [0.5, 0, 1, 1], [0.5, 1, 0, 1]), ("minimum", [0.5, 1, 0, 1], [0.5, 0, 1, 1])):
        out = getattr(ops, op)(x, y)
        np.testing.assert_array_equal(out.numpy(), getattr(np, op)(x.numpy(), y.numpy()))
        gx, gy = opforge.gradients(out, [x, y], [opforge.tensor(np.ones(4))])
        np.testing.assert_array_equal(gx.numpy(), wx)
        np.testing.assert_array_equal(gy.numpy(), wy)


def test_clamp_bounds_and_gradient_mask() -> None:
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0, np.nan])
    np.testing.assert_array_equal(ops.clamp(x).numpy(), x)
    np.testing.assert_array_equal(ops.clamp(x, min=-1.0, max=1.0).numpy(), np.clip(x, -1.0, 1.0))
    np.testing.assert_array_equal(ops.clamp(x, max=0.0).numpy(), np.minimum(x, 0.0))
    xt = opforge.tensor(x, requires_grad=True)
    (g,) = opforge.gradients(ops.clamp(xt, min=-1.0, max=1.0), [xt], [opforge.tensor(np.ones(6))])
    np.testing.assert_array_equal(g.numpy(), [0, 1, 1, 1, 0, 0])  # bounds included, like PyTorch


def test_clamp_with_a_nan_bound_gives_nan_as_numpy_and_torch() -> None:
    # (every comparison with NaN is false: the selects returned x unchanged, with a zero gradient)
    x = np.array([-2.0, 0.5, 3.0, np.nan])
    for kw in ({"min": math.nan}, {"max": math.nan}, {"min": math.nan, "max": 1.0}, {"min": -1.0, "max": math.nan}):
        ref = np.minimum(np.maximum(x, kw.get("min", -np.inf)), kw.get("max", np.inf))
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            out = ops.clamp(opforge.tensor(x, dtype=dtype), **kw)
            np.testing.assert_array_equal(out.astype("float64").numpy(), ref)
    np.testing.assert_array_equal(ops.clamp(x, min=-1.0, max=1.0).numpy(), [-1.0, 0.5, 1.0, np.nan])
    # ties give x, as PyTorch's clamp (NumPy's minimum/maximum give the bound)
    for v, kw, negative in ((-0.0, {"min": 0.0}, True), (0.0, {"min": -0.0}, False), (0.0, {"max": -0.0}, False),
                            (-0.0, {"max": 0.0}, True)):
        assert np.signbit(ops.clamp(np.array([v]), **kw).numpy()[0]) == negative, (v, kw)


@pytest.mark.parametrize("dtype, x, y", [("float16", 1.0, 300.0), ("float16", 100.0, 1000.0),
                                          ("float32", 1e20, 1e20), ("float32", 1e-30, 1e-30),
                                          ("bfloat16", 1e20, 1e20)])
def test_div_gradient_and_tangent_in_y_do_not_square_y(dtype: str, x: float, y: float) -> None:
    # the derived -(dout * x / (y * y)) rounded y * y to the dtype: 0 in float16 for |y| > 256,
    # 0 or -inf in float32 at 1e20 or 1e-30 (torch: -grad * (x / y) / y)
    exact = -x / (y * y)
    xt = opforge.tensor(np.array([x]), dtype=dtype)
    yt = opforge.tensor(np.array([y]), dtype=dtype, requires_grad=True)
    (g,) = opforge.gradients(ops.div(xt, yt), [yt], [opforge.tensor(np.ones(1), dtype=dtype)])
    _, tangent = opforge.jvp(lambda v: ops.div(xt, v), (yt.detach(),), (opforge.tensor(np.ones(1), dtype=dtype),))
    for got in (g, tangent):
        assert abs(float(got.astype("float64").numpy()[0]) / exact - 1) < 1e-2, (got, exact)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_numbers_in_gradient_formulas_are_computed_in_float32_beside_16_bit_tensors(dtype: str) -> None:
    # mean's gradient scales by 1/n: rounded to float16 first it was 1.3% off at n = 1e6 (and 0
    # past 2^25); the number is a float32 and dout widened, the result rounded once
    n = 1_000_000
    x = opforge.tensor(np.ones(n), dtype=dtype, requires_grad=True)
    (g,) = opforge.gradients(ops.mean(x), [x], [opforge.tensor(np.array(1024.0), dtype=dtype)])
    exact = opforge.tensor(np.array(1024.0 / n)).astype(dtype).astype("float64").numpy()
    assert g.dtype == dtype
    np.testing.assert_array_equal(g.astype("float64").numpy()[:3], [exact] * 3)


def test_div_gradient_does_not_read_the_quotient_an_in_place_op_changed() -> None:
    # (the written dy read out: z = div(x, y); z.add_(10) then backward raised "shares its memory
    # with a tensor saved for backward"; torch's formula reads x and y)
    x = opforge.tensor(np.array([2.0]), requires_grad=True)
    y = opforge.tensor(np.array([2.0]), requires_grad=True)
    z = ops.div(x, y)
    ops.add_(z, np.array([10.0]))
    gx, gy = opforge.gradients(ops.sum(z), [x, y])
    assert (gx.numpy()[0], gy.numpy()[0]) == (0.5, -0.5)


def test_long_float_sums_are_accurate_in_every_layout() -> None:
    # float32 partial sums are flushed into a double every block: a column sum of 2^24 + 2^22 ones
    # stalled at 2^24 (mean 0.84, as NumPy's column sums), and 2^24 row elements lost digits
    n = (1 << 24) + (1 << 22)
    ones = np.ones((n, 2), np.float16)
    np.testing.assert_array_equal(ops.mean(ones, axis=[0]).numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(ops.sum(ones[:, :1].astype(np.float32), axis=[0]).numpy(), [n])
    del ones
    x = (np.random.default_rng(0).standard_normal(1 << 24) + 3).astype(np.float32)
    exact = x.astype(np.float64).sum()
    assert abs(float(ops.sum(x).numpy()) / exact - 1) < 1e-7  # (was 5.7e-7; torch's: 1.2e-8)


def test_pow_gradient_in_y_at_zero_base() -> None:
    x = opforge.tensor(np.array([0.0, 0.0, 2.0]), requires_grad=True)
    y = opforge.tensor(np.array([2.0, 0.0, 3.0]), requires_grad=True)
    gx, gy = opforge.gradients(ops.pow(x, y), [x, y], [opforge.tensor(np.ones(3))])
    np.testing.assert_allclose(gx.numpy(), [0.0, 0.0, 12.0])
    np.testing.assert_allclose(gy.numpy(), [0.0, 0.0, 8.0 * math.log(2.0)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_large_inputs_and_extremes(approximate: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(-12, 12, 300000)  # the OpenMP path of the expr loop
    x[:4] = [-1e4, 1e4, -40.0, 0.0]
    if approximate == "tanh":
        ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    else:
        ref = 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / np.sqrt(2)))
    got = ops.gelu(x, approximate=approximate).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ops.gelu(x.astype(np.float32), approximate=approximate).numpy(), ref,
                               rtol=2e-6, atol=1e-6)
    d = ops.gelu_backward(np.ones_like(x), x, approximate=approximate).numpy()
    assert np.all(np.isfinite(d)) and d[1] == 1.0 and d[0] == 0.0


def test_silu_extremes_are_finite() -> None:
    x = np.array([-1e4, -100.0, 0.0, 100.0, 1e4], np.float32)
    np.testing.assert_array_equal(ops.silu(x).numpy(), [-0.0, -0.0, 0.0, 100.0, 1e4])
    xt = opforge.tensor(x.astype(np.float64), requires_grad=True)
    (g,) = opforge.gradients(ops.silu(xt), [xt], [opforge.tensor(np.ones(5))])
    np.testing.assert_allclose(g.numpy(), [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)


# ---------------------------------------------------------------------------- integer arithmetic

# Integer arithmetic wraps around as NumPy's does: in the generated expressions (fn::add and the
# others) and in the hand-written kernels' sums. A signed overflow would be undefined behaviour in
# C++: the sanitizer build (tests/test_sanitizers.py runs this file) fails on one.


def _extremes(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, info.max, -1, info.min, info.max, 0, 46341], dtype)
    y = np.array([1, -1, info.max, info.min, info.min, info.min, info.min, 46341], dtype)
    return x, y


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_add_sub_mul_neg_abs_wrap_as_numpy(dtype: str) -> None:
    x, y = _extremes(dtype)
    with np.errstate(over="ignore"):
        for op, ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)]:
            np.testing.assert_array_equal(getattr(ops, op)(x, y).numpy(), ufunc(x, y), err_msg=op)
            np.testing.assert_array_equal(getattr(ops, op)(x[:, None], y[None, :]).numpy(),  # broadcast loop
                                          ufunc(x[:, None], y[None, :]), err_msg=op)
        np.testing.assert_array_equal(ops.neg(x).numpy(), -x)
        np.testing.assert_array_equal(ops.abs(x).numpy(), np.abs(x))  # abs(min) is min
        np.testing.assert_array_equal(ops.square(x).numpy(), x * x)
        big = np.full(1 << 17, np.iinfo(dtype).max, dtype)  # the threaded, vectorized loop
        np.testing.assert_array_equal(ops.add(big, big).numpy(), big + big)
        np.testing.assert_array_equal(ops.neg(-big - 1).numpy(), -big - 1)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_sums_are_exact_and_wrap_as_numpy(dtype: str) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    x = rng.integers(info.max // 4, info.max, (70_000, 3), dtype=dtype, endpoint=True)
    x[::7] = info.min + 1
    for axis in [None, 0, 1, [0, 1]]:  # whole, column sums (threaded), row sums, the general walk
        want = np.sum(x, axis=None if axis is None else axis if isinstance(axis, int) else tuple(axis), dtype=dtype)
        np.testing.assert_array_equal(ops.sum(x, axis=axis).numpy(), want, err_msg=str(axis))
    z = rng.integers(info.min, info.max, (5, 6, 7), dtype=dtype)
    np.testing.assert_array_equal(ops.sum(z, axis=[0, 2]).numpy(), np.sum(z, axis=(0, 2), dtype=dtype))
    if dtype == "int64":  # above 2^53 a sum through a double is rounded: each axis is exact
        w = np.array([[2 ** 60 + 1, 0], [1, 2]], np.int64)
        for axis in [0, 1, None]:
            np.testing.assert_array_equal(ops.sum(w, axis=axis).numpy(), w.sum(axis))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_bias_add_its_grad_and_scatter_add_wrap_as_numpy(dtype: str) -> None:
    info = np.iinfo(dtype)
    x = np.full((3, 20, 2, 2), info.max, dtype)
    b = np.arange(1, 21, dtype=dtype)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ops.bias_add(x, b).numpy(), x + b[:, None, None])
        xh = np.moveaxis(x, 1, -1).copy()
        np.testing.assert_array_equal(ops.bias_add(xh, b, format="NHWC").numpy(), xh + b)
    for shape in [(9, 3, 5), (9, 20, 40)]:  # inner runs under 16 (column sums) and longer (row sums)
        dy = np.full(shape, info.max, dtype)
        np.testing.assert_array_equal(ops.bias_add_grad(dy).numpy(), dy.sum(axis=(0, 2), dtype=dtype))
        np.testing.assert_array_equal(ops.bias_add_grad(dy, format="NHWC").numpy(), dy.sum(axis=(0, 1), dtype=dtype))
    src = np.full((4, 3), info.max, dtype)
    idx = np.zeros((4, 3), np.int64)
    got = ops.scatter_add_along_axis(src, idx, np.zeros((4, 3), dtype), axis=0).numpy()
    want = np.zeros((4, 3), dtype)
    want[0] = src.sum(axis=0, dtype=dtype)
    np.testing.assert_array_equal(got, want)
