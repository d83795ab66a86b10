"""The softmax group beyond the generated cases: bad input (exact messages), 0-d and empty
inputs, extreme values, long rows and columns (the online max/sum), 16-bit floats on large
inputs, every SIMD level, and gradients through cross_entropy."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import opforge
from opforge import ops

X = np.zeros((4, 5), np.float32)
LABELS = np.array([0, 1, 2, 3])


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def np_cross_entropy(x, labels):
    return np_log_softmax(x.astype(np.float64))[np.arange(len(labels)), labels] * -1


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("op", ["cross_entropy", "cross_entropy_backward"])
@pytest.mark.parametrize("label", [7, 5, -1])
def test_label_out_of_range_is_an_index_error(op, label) -> None:
    labels = np.array([0, 1, label, 3])
    args = (X, labels) if op == "cross_entropy" else (np.float32(1), X, labels)
    with pytest.raises(IndexError, match=re.escape(f"[{op}] label {label} is out of range for 5 classes")):
        getattr(ops, op)(*args)


def test_labels_are_checked_before_any_read() -> None:
    # a huge label would read far outside logits if it were used before the check
    with pytest.raises(IndexError, match=re.escape("[cross_entropy] label 4611686018427387904 is out of range")):
        ops.cross_entropy(X, np.array([0, 1, 2, 2 ** 62]), reduction="none")
    with pytest.raises(IndexError, match=re.escape("[cross_entropy] label 0 is out of range for 0 classes")):
        ops.cross_entropy(np.zeros((2, 0), np.float32), np.array([0, 0]))


def test_bad_cross_entropy_shapes_and_types() -> None:
    with pytest.raises(ValueError, match=re.escape("[cross_entropy] logits must have shape (N, C), got (5,)")):
        ops.cross_entropy(X[0], np.array([0]))
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy] labels must have shape (N,) = (4,) to match logits (4, 5), got (3,)")):
        ops.cross_entropy(X, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy] labels must have shape (N,) = (4,) to match logits (4, 5), got (4, 1)")):
        ops.cross_entropy(X, LABELS.reshape(4, 1))
    with pytest.raises(TypeError, match=re.escape("[cross_entropy] input 'labels' must be int64, got int32")):
        ops.cross_entropy(X, LABELS.astype(np.int32))
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy] attr 'reduction' must be one of: mean, sum, none; got avg")):
        ops.cross_entropy(X, LABELS, reduction="avg")
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy_backward] dy must have shape () or (N,) = (4,), got (3,)")):
        ops.cross_entropy_backward(np.ones(3, np.float32), X, LABELS)
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy_backward] logits must have shape (N, C), got (2, 2, 5)")):
        ops.cross_entropy_backward(np.float32(1), np.zeros((2, 2, 5), np.float32), LABELS[:2])
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy_grad_scale] dy must have shape () or (N,) = (4,), got (2, 2)")):
        ops.cross_entropy_grad_scale(np.ones((2, 2), np.float32), X, LABELS)
    with pytest.raises(ValueError, match=re.escape(
            "[cross_entropy_grad_scale] labels must have shape (N,) = (4,) to match logits (4, 5), got (3,)")):
        ops.cross_entropy_grad_scale(np.float32(1), X, LABELS[:3])
    with pytest.raises(ValueError, match=re.escape("[cross_entropy] attr 'label_smoothing'")):
        ops.cross_entropy(X, LABELS, label_smoothing=1.5)
    with pytest.raises(ValueError, match=re.escape("[cross_entropy_backward] attr 'label_smoothing'")):
        ops.cross_entropy_backward(np.float32(1), X, LABELS, label_smoothing=-0.1)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_bad_axis_is_an_index_error(op) -> None:
    fn = getattr(ops, op)
    with pytest.raises(IndexError, match=re.escape(f"[{op}] axis 2 is out of range for a tensor of rank 2")):
        fn(X, axis=2)
    with pytest.raises(IndexError, match=re.escape(f"[{op}] axis -3 is out of range for a tensor of rank 2")):
        fn(X, axis=-3)
    with pytest.raises(IndexError, match=re.escape(f"[{op}] axis 1 is out of range for a tensor of rank 0")):
        fn(np.float32(1), axis=1)
    with pytest.raises(TypeError, match=re.escape(f"[{op}] attr 'axis' must be an int, got list")):
        fn(X, axis=[0])


@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_bad_backward_input(op) -> None:
    fn = getattr(ops, op)
    with pytest.raises(ValueError, match=re.escape(
            f"[{op}] dout of shape (4, 5) and y of shape (5, 4) must have the same shape")):
        fn(X, X.T.copy())
    with pytest.raises(IndexError, match=re.escape(f"[{op}] axis 2 is out of range for a tensor of rank 2")):
        fn(X, X, axis=2)


def test_bad_logsumexp_axes() -> None:
    with pytest.raises(IndexError, match=re.escape("[logsumexp] axis 2 is out of range for a tensor of rank 2")):
        ops.logsumexp(X, axis=2)
    with pytest.raises(ValueError, match=re.escape("[logsumexp] axis -2 is repeated")):
        ops.logsumexp(X, axis=[0, -2])
    with pytest.raises(TypeError, match=re.escape("[logsumexp] dtype int64 is not supported on target cpu")):
        ops.logsumexp(np.arange(3))


# ---------------------------------------------------------------------------- edge shapes and values


def test_zero_dim() -> None:
    for axis in (0, -1):
        assert ops.softmax(np.float32(3), axis=axis).item() == 1.0
        assert ops.log_softmax(np.float32(3), axis=axis).item() == 0.0
    assert ops.logsumexp(np.float64(3)).item() == 3.0
    x = opforge.tensor(np.float64(0.5), requires_grad=True)
    ops.softmax(x).backward()
    assert x.grad.item() == 0.0


@pytest.mark.parametrize("shape,axis", [((0, 3), 0), ((0, 3), 1), ((3, 0), 1), ((3, 0), 0), ((2, 0, 4), 1)])
def test_empty(shape, axis) -> None:
    x = np.zeros(shape, np.float32)
    for op in (ops.softmax, ops.log_softmax):
        assert op(x, axis=axis).shape == shape
    for op in (ops.softmax_backward, ops.log_softmax_backward):
        assert op(x, x, axis=axis).shape == shape
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(x.astype(np.float64)).sum(axis=axis))
    np.testing.assert_array_equal(ops.logsumexp(x, axis=axis).numpy(), expected)  # -inf over an empty axis


def test_cross_entropy_without_rows() -> None:
    logits, labels = np.zeros((0, 5), np.float32), np.zeros(0, np.int64)
    assert np.isnan(ops.cross_entropy(logits, labels).item())  # a mean of nothing, as in NumPy
    assert ops.cross_entropy(logits, labels, reduction="sum").item() == 0.0
    assert ops.cross_entropy(logits, labels, reduction="none").shape == (0,)
    assert ops.cross_entropy_backward(np.float32(1), logits, labels).shape == (0, 5)


def np_cross_entropy_rows(x, labels, ignore_index=-100, label_smoothing=0.0):
    """torch's per-row loss: 0 where the label is ignore_index; the target (1 - e) onehot + e / C."""
    kept = labels != ignore_index
    lsm = np_log_softmax(x.astype(np.float64))
    nll = -lsm[np.arange(len(labels)), np.where(kept, labels, 0)]
    return np.where(kept, (1 - label_smoothing) * nll - label_smoothing * lsm.mean(1), 0.0), kept


@pytest.mark.parametrize("smoothing", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_ignore_index_and_label_smoothing(ignore_index: int, smoothing: float) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 6)).astype(np.float64)
    labels = np.array([0, 2, -100, 5, 2, 1, -100, 3, 2])
    if ignore_index == 2:
        labels = np.where(labels == -100, 4, labels)  # -100 is no label then
    rows, kept = np_cross_entropy_rows(x, labels, ignore_index, smoothing)
    kw = {"ignore_index": ignore_index, "label_smoothing": smoothing}
    np.testing.assert_allclose(ops.cross_entropy(x, labels, reduction="none", **kw).numpy(), rows, rtol=1e-12)
    np.testing.assert_allclose(ops.cross_entropy(x, labels, reduction="sum", **kw).item(), rows.sum(), rtol=1e-12)
    mean = ops.cross_entropy(x, labels, **kw).item()
    assert mean == pytest.approx(rows.sum() / kept.sum(), rel=1e-12)  # over the rows kept, as torch
    # the gradient: softmax - (1 - e) onehot - e / C in the rows kept, over the rows kept for mean
    xt = opforge.from_numpy(x.copy())
    xt.requires_grad = True
    (g,) = opforge.gradients(ops.cross_entropy(xt, labels, **kw), [xt])
    onehot = np.eye(6)[np.where(kept, labels, 0)]
    expected = (np_softmax(x) - (1 - smoothing) * onehot - smoothing / 6) * kept[:, None] / kept.sum()
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert not g.numpy()[~kept].any()


def test_cross_entropy_with_every_row_ignored() -> None:
    x = np.array([[1.0, np.inf], [np.nan, 0.0]], np.float32)
    labels = np.array([-100, -100])
    assert np.isnan(ops.cross_entropy(x, labels).item())  # 0 / 0 rows kept, as torch
    assert ops.cross_entropy(x, labels, reduction="sum").item() == 0.0
    assert not ops.cross_entropy(x, labels, reduction="none").numpy().any()  # rows not read: no NaN
    for reduction in ("mean", "sum", "none"):
        dx = ops.cross_entropy_backward(np.float32(1), x, labels, reduction=reduction, label_smoothing=0.5)
        np.testing.assert_array_equal(dx.numpy(), np.zeros((2, 2), np.float32))
        scale = ops.cross_entropy_grad_scale(np.float32(1), x, labels, reduction=reduction)
        np.testing.assert_array_equal(scale.numpy(), np.zeros((2, 2), np.float32))


def test_labels_beside_ignore_index_are_still_checked() -> None:
    with pytest.raises(IndexError, match=re.escape("[cross_entropy] label -1 is out of range for 5 classes")):
        ops.cross_entropy(X, np.array([0, -100, -1, 1]))
    with pytest.raises(IndexError, match=re.escape("[cross_entropy_backward] label -100 is out of range for 5")):
        ops.cross_entropy_backward(np.float32(1), X, np.array([0, -100, 1, 1]), ignore_index=-1)
    # an ignore_index among the classes leaves that class's rows out
    x = np.arange(20, dtype=np.float64).reshape(4, 5) % 3
    rows, _ = np_cross_entropy_rows(x, LABELS, ignore_index=1)
    np.testing.assert_allclose(ops.cross_entropy(x, LABELS, ignore_index=1).item(), rows.sum() / 3, rtol=1e-12)


def test_large_and_infinite_values() -> None:
    x = np.array([[1e4, 1e4 + 1, 1e4 - 3], [-1e30, 0.0, -np.inf], [-np.inf, -np.inf, -np.inf],
                  [np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0]], np.float32)
    sm = ops.softmax(x).numpy()
    np.testing.assert_allclose(sm[:2], np_softmax(x[:2].astype(np.float64)), rtol=1e-6, atol=0)
    assert np.isnan(sm[2:]).all()  # no finite element in the row, or a NaN: NaN, as x - max gives
    ls = ops.log_softmax(x).numpy()
    np.testing.assert_allclose(ls[0], np_log_softmax(x[0].astype(np.float64)), rtol=1e-6)
    assert ls[1, 1] == 0.0 and ls[1, 2] == -np.inf and ls[1, 0] == np.float32(-1e30)
    lse = ops.logsumexp(x, axis=-1).numpy()
    np.testing.assert_allclose(lse[:2], [1e4 + 1 + np.log1p(np.exp(-1) + np.exp(-4)), 0.0], rtol=1e-7)
    assert lse[2] == -np.inf and lse[3] == np.inf and np.isnan(lse[4])
    loss = ops.cross_entropy(x[:2], np.array([1, 2]), reduction="none").numpy()
    assert loss[0] == pytest.approx(np.log1p(np.exp(-1) + np.exp(-4)), rel=1e-6) and loss[1] == np.inf


def test_exp_is_accurate_to_float32_rounding() -> None:
    # softmax of float32 over a wide range of values against float64: a few ulp at most
    x = np.random.default_rng(0).uniform(-80, 0, (64, 4096)).astype(np.float32)
    x[:, 0] = 0
    ref = np_softmax(x.astype(np.float64))
    got = ops.softmax(x).numpy()
    tiny = ref < 1e-37  # the subnormal range: absolute error
    np.testing.assert_allclose(got[~tiny], ref[~tiny], rtol=3e-7 * 4, atol=0)
    np.testing.assert_allclose(got[tiny], ref[tiny], rtol=0, atol=2e-45)


# ---------------------------------------------------------------------------- long rows and columns


def test_long_rows_use_the_online_max_and_sum() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (3, 40000))
    x[0, :20000] = -np.inf  # a whole chunk of -inf first: it adds nothing
    x[1, 30000] = 50.0      # the max in a late chunk rescales the earlier sums
    # float32: x - max rounds by up to |x - max| * 2^-24 before exp, so small terms carry a few 1e-6
    for dtype, tol in (("float64", 1e-12), ("float32", 5e-6)):
        xs, x = x.astype(dtype), x.astype(dtype).astype(np.float64)  # the reference sees the rounded input
        np.testing.assert_allclose(ops.softmax(xs).numpy(), np_softmax(x), rtol=tol, atol=1e-30)
        np.testing.assert_allclose(ops.log_softmax(xs).numpy()[:, 20000:], np_log_softmax(x)[:, 20000:], rtol=tol,
                                   atol=tol)
        np.testing.assert_allclose(ops.logsumexp(xs, axis=1).numpy(),
                                   np.log(np.exp(x - 50).sum(axis=1)) + 50, rtol=tol)
        labels = np.array([25000, 30000, 7])
        np.testing.assert_allclose(ops.cross_entropy(xs, labels, reduction="none").numpy(),
                                   np_cross_entropy(x, labels), rtol=tol * 10, atol=tol)
        dx = ops.cross_entropy_backward(np.array([1.0, 2.0, 3.0], dtype), xs, labels, reduction="none").numpy()
        ref = np_softmax(x) * np.array([[1.0], [2.0], [3.0]])
        ref[np.arange(3), labels] -= [1.0, 2.0, 3.0]
        np.testing.assert_allclose(dx, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,axis", [((20000, 3), 0), ((4, 3000, 70), 1), ((64, 300, 17), 1), ((300, 5000), 0)])
def test_strided_axes(shape, axis) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(0, 4, shape)
    if shape == (20000, 3):
        x[:10000, 0] = -np.inf  # the first blocks of column 0 are all -inf
    # float32: x - max rounds by up to |x - max| * 2^-24 before exp, so small terms carry a few 1e-6
    for dtype, tol in (("float64", 1e-12), ("float32", 5e-6)):
        xs, x = x.astype(dtype), x.astype(dtype).astype(np.float64)  # the reference sees the rounded input
        np.testing.assert_allclose(ops.softmax(xs, axis=axis).numpy(), np_softmax(x, axis), rtol=tol, atol=1e-30)
        np.testing.assert_allclose(ops.log_softmax(xs, axis=axis).numpy(), np_log_softmax(x, axis), rtol=tol,
                                   atol=tol)
        np.testing.assert_allclose(ops.logsumexp(xs, axis=axis).numpy(),
                                   np.log(np.exp(x).sum(axis=axis)), rtol=tol)
        g = rng.normal(size=shape).astype(dtype).astype(np.float64)
        y = np_softmax(x, axis).astype(dtype).astype(np.float64)
        np.testing.assert_allclose(ops.softmax_backward(g.astype(dtype), y.astype(dtype), axis=axis).numpy(),
                                   y * (g - (g * y).sum(axis=axis, keepdims=True)), rtol=tol * 10, atol=tol)
        ly = np_log_softmax(x, axis).astype(dtype).astype(np.float64)
        np.testing.assert_allclose(ops.log_softmax_backward(g.astype(dtype), ly.astype(dtype), axis=axis).numpy(),
                                   g - np.exp(ly) * g.sum(axis=axis, keepdims=True), rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("dtype,rtol,atol", [("float16", 4e-3, 2e-3), ("bfloat16", 2e-2, 1e-2)])
@pytest.mark.parametrize("shape,axis", [((300, 700), -1), ((3, 700, 50), 1), ((2000, 40), 0), ((2, 20000), 1)])
def test_16_bit_floats_on_large_inputs(dtype, rtol, atol, shape, axis) -> None:
    x = opforge.tensor(np.random.default_rng(3).normal(0, 3, shape)).astype(dtype)
    x64 = x.astype("float64").numpy()
    np.testing.assert_allclose(ops.softmax(x, axis=axis).astype("float64").numpy(), np_softmax(x64, axis),
                               rtol=rtol, atol=atol)
    np.testing.assert_allclose(ops.log_softmax(x, axis=axis).astype("float64").numpy(), np_log_softmax(x64, axis),
                               rtol=rtol, atol=atol * 4)
    np.testing.assert_allclose(ops.logsumexp(x, axis=axis).astype("float64").numpy(),
                               np.log(np.exp(x64).sum(axis=axis)), rtol=rtol, atol=atol)
    if len(shape) == 2 and axis in (1, -1):
        labels = np.arange(shape[0]) % shape[1]
        np.testing.assert_allclose(ops.cross_entropy(x, labels, reduction="none").astype("float64").numpy(),
                                   np_cross_entropy(x64, labels), rtol=rtol, atol=atol * 4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape,axis", [((37, 1029), -1), ((5, 300, 33), 1)])
def test_16_bit_floats_round_like_astype(dtype, shape, axis) -> None:
    # the 16-bit path computes in float exactly like the float32 one, then rounds to nearest even
    x = opforge.tensor(np.random.default_rng(10).normal(0, 3, shape)).astype(dtype)
    x32 = x.astype("float32")
    for op in (ops.softmax, ops.log_softmax):
        got = op(x, axis=axis).astype("float32").numpy()
        want = op(x32, axis=axis).astype(dtype).astype("float32").numpy()
        np.testing.assert_array_equal(got, want)
    special = opforge.tensor(np.array([[np.inf, 1.0, -np.inf, 70000.0], [np.nan, 0.0, 1e-8, -1e-8]])).astype(dtype)
    np.testing.assert_array_equal(ops.log_softmax(special).astype("float32").numpy(),
                                  ops.log_softmax(special.astype("float32")).astype(dtype).astype("float32").numpy())


@pytest.mark.parametrize("axis,keepdims", [([0, 2], False), ([0, 2], True), ([1], False), ([0, 1], True), (None, False)])
def test_logsumexp_any_axes(axis, keepdims) -> None:
    x = np.random.default_rng(4).normal(0, 3, (6, 1, 5, 7))
    ref = np.log(np.exp(x).sum(axis=None if axis is None else tuple(axis), keepdims=keepdims))
    np.testing.assert_allclose(ops.logsumexp(x, axis=axis, keepdims=keepdims).numpy(), ref, rtol=1e-12)
    # the same on a non-contiguous view (gathered into a contiguous copy first)
    v = np.repeat(x, 2, axis=2)[:, :, ::2]
    np.testing.assert_allclose(ops.logsumexp(v, axis=axis, keepdims=keepdims).numpy(), ref, rtol=1e-12)


def test_every_simd_level_gives_the_same_results() -> None:
    code = (
        "import numpy as np, opforge; from opforge import ops\n"
        "x = np.random.default_rng(5).normal(0, 5, (33, 1037)).astype(np.float32)\n"
        "g = np.random.default_rng(6).normal(0, 1, (33, 1037)).astype(np.float32)\n"
        "y, ly = ops.softmax(x).numpy(), ops.log_softmax(x).numpy()\n"
        "outs = [y, ly, ops.softmax(x, axis=0).numpy(), ops.log_softmax(x, axis=0).numpy(),\n"
        "        ops.logsumexp(x, axis=1).numpy(), ops.logsumexp(x, axis=0).numpy(),\n"
        "        ops.softmax_backward(g, y).numpy(), ops.log_softmax_backward(g, ly, axis=0).numpy(),\n"
        "        ops.cross_entropy(x, np.arange(33) * 31, reduction='none').numpy(),\n"
        "        ops.cross_entropy_backward(np.float32(1), x, np.arange(33)).numpy(),\n"
        "        ops.softmax(x.astype(np.float64)).numpy(), ops.log_softmax(x.astype(np.float64), axis=0).numpy(),\n"
        "        ops.softmax(x.astype(np.float16)).numpy().astype(np.float32),\n"
        "        ops.log_softmax(opforge.tensor(x).astype('bfloat16'), axis=0).astype('float32').numpy()]\n"
        "np.savez(__import__('sys').argv[1], *outs)\n")
    results = {}
    for level in ("sse2", "avx2", "native"):
        env = dict(os.environ, OPFORGE_SOFTMAX_SIMD=level)
        path = f"{os.environ.get('TMPDIR', '/tmp')}/opforge_softmax_{os.getpid()}_{level}.npz"
        subprocess.run([sys.executable, "-c", code, path], env=env, check=True)
        with np.load(path) as f:
            results[level] = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
        os.remove(path)
    for level in ("sse2", "avx2"):
        for k, (a, b) in enumerate(zip(results[level], results["native"])):
            tol = {12: 1e-3, 13: 8e-3}.get(k, 5e-6)  # 16-bit outputs may round the other way: 1 ulp
            np.testing.assert_allclose(a, b, rtol=tol, atol=1e-6, err_msg=f"{level} output {k}")


# ---------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradient_matches_softmax_minus_onehot(reduction) -> None:
    rng = np.random.default_rng(7)
    logits = opforge.tensor(rng.normal(size=(6, 4)), requires_grad=True)
    labels = np.array([0, 3, 1, 1, 2, 0])
    loss = ops.cross_entropy(logits, labels, reduction=reduction)
    w = rng.normal(size=loss.shape)
    ops.sum(ops.mul(loss, w)).backward()
    ref = np_softmax(logits.numpy())
    ref[np.arange(6), labels] -= 1
    ref *= (w.reshape(-1, 1) if reduction == "none" else w) / (6 if reduction == "mean" else 1)
    np.testing.assert_allclose(logits.grad.numpy(), ref, rtol=1e-12, atol=1e-15)


def test_softmax_second_derivative_through_the_fused_backward() -> None:
    x = opforge.tensor(np.random.default_rng(8).normal(size=(3, 5)), requires_grad=True)
    w = np.random.default_rng(9).normal(size=(3, 5))
    (g,) = opforge.gradients(ops.sum(ops.mul(ops.softmax(x), w)), [x], create_graph=True)
    assert g.grad_fn is not None
    (h,) = opforge.gradients(ops.sum(ops.square(g)), [x])
    assert h.shape == (3, 5) and np.isfinite(h.numpy()).all()
