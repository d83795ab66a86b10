"""The hand-written CUDA kernels of part 2 beyond the spec cases that test_cuda_ops.py runs for
every op: row kernels (softmax, log_softmax, the norms, cross_entropy) on short rows (a warp per
row), long rows (a block per row, longer than shared memory), unaligned rows (no vectorized
loads) and strided axes; 16-bit inputs accumulating in float; the general (broadcasting) paths of
the norms; column sums; indices and labels out of range raising IndexError naming the op on the
device without touching memory through them; the deterministic embedding gradient. Skipped
without a CUDA device (CI has none; the GPU runs record results in benchmarks/results/cuda-tests.md)."""

from __future__ import annotations

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

pytestmark = pytest.mark.skipif(not opforge.cuda.is_available(),
                                reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")

TOL = {"float64": (1e-11, 1e-12), "float32": (2e-5, 2e-6), "float16": (5e-3, 2e-3), "bfloat16": (3e-2, 1e-2)}
ROW_LENGTHS = [1, 7, 1024, 1025, 4099, 100_003]  # warp rows, the first block row, odd and > shared memory


def cuda(x, dtype=None):  # type: ignore[no-untyped-def]
    return opforge.tensor(x, device="cuda", dtype=dtype)


def host(t) -> np.ndarray:  # type: ignore[no-untyped-def]
    t = t.detach().cpu()
    return (t.astype("float32") if t.dtype == "bfloat16" else t).numpy().astype(np.float64)


def softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def unaligned(x: np.ndarray):  # type: ignore[no-untyped-def]
    """float32 x on the device at an address 4 bytes past a 16-byte boundary (a contiguous torch
    view through DLPack)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    flat = torch.zeros(x.size + 1, dtype=torch.float32, device="cuda")
    flat[1:] = torch.from_numpy(np.ascontiguousarray(x, np.float32).ravel()).cuda()
    t = opforge.from_dlpack(flat[1:].view(*x.shape))
    assert t.shape == x.shape
    return t


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_softmax_and_log_softmax_rows(n: int, dtype: str) -> None:
    x = np.random.default_rng(n).standard_normal((3, n)) * 4
    rtol, atol = TOL[dtype]
    xd = host(cuda(x, dtype).cpu())  # the input as the device holds it (rounded to dtype)
    np.testing.assert_allclose(host(ops.softmax(cuda(x, dtype))), softmax_ref(xd, -1), rtol=rtol, atol=atol)
    want = xd - xd.max(axis=-1, keepdims=True)
    want -= np.log(np.exp(want).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(host(ops.log_softmax(cuda(x, dtype))), want, rtol=rtol, atol=atol * max(1, np.log(n)))


@pytest.mark.parametrize("shape,axis", [((5, 1025, 3), 1), ((4099, 2), 0), ((2, 3, 4), 0)], ids=str)
def test_softmax_group_over_strided_axes(shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)
    y = softmax_ref(x, axis) if x.ndim else np.ones(())
    np.testing.assert_allclose(host(ops.softmax(cuda(x), axis=axis)), y, rtol=1e-12, atol=1e-14)
    dx = ops.softmax_backward(cuda(g), cuda(y), axis=axis)
    np.testing.assert_allclose(host(dx), y * (g - (g * y).sum(axis=axis, keepdims=True)), rtol=1e-11, atol=1e-13)
    ly = np.log(y)
    dx = ops.log_softmax_backward(cuda(g), cuda(ly), axis=axis)
    np.testing.assert_allclose(host(dx), g - y * g.sum(axis=axis, keepdims=True), rtol=1e-11, atol=1e-13)


def test_rows_without_vectorized_loads_match_aligned_ones() -> None:
    x = np.random.default_rng(2).standard_normal((6, 2048)).astype(np.float32)
    for op in (ops.softmax, ops.log_softmax, lambda t: ops.layer_norm(t)[0], lambda t: ops.rms_norm(t)[0]):
        # (the two paths split the row among the threads differently: sums differ in rounding)
        np.testing.assert_allclose(host(op(unaligned(x))), host(op(cuda(x))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])  # (16-bit rows: exp_row's __expf)
def test_softmax_infinities_and_nan_as_on_the_cpu(dtype: str) -> None:
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0], [-np.inf, 0.0, 0.0],
                  [-200.0, 0.0, -90.0]], np.float32)
    rtol = 1e-6 if dtype == "float32" else TOL[dtype][0]
    for op in (ops.softmax, ops.log_softmax):  # (NaN where the cpu has NaN, the same values elsewhere)
        got, want = host(op(cuda(x, dtype))), host(op(opforge.tensor(x, dtype=dtype)))
        # (atol: exp(-90) is a float subnormal, which __expf flushes to 0 and a cpu may too)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-30, err_msg=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_long_rows_infinities_and_nan_as_on_the_cpu(dtype: str) -> None:
    # rows too long to hold (reduced tile by tile), the special values in some tiles and not others
    n = 20_000
    x = np.random.default_rng(3).standard_normal((6, n)).astype(dtype)
    x[0] = -np.inf                  # every tile -inf
    x[1, 15_000] = np.inf           # one +inf in a late tile
    x[2, 9_000] = np.nan            # a NaN in a middle tile
    x[3, :12_000] = -np.inf         # whole tiles of -inf before finite ones
    x[4, [5, n - 1]] = np.inf       # two +inf, first and last tile
    labels = np.array([0, 15_000, 1, 12_000, 5, 7])
    for op in (ops.softmax, ops.log_softmax):  # (NaN where the cpu has NaN, the same values elsewhere)
        np.testing.assert_allclose(host(op(cuda(x))), host(op(opforge.tensor(x))), rtol=1e-5, atol=1e-9)
    dout = np.ones(6, dtype)
    for name, run in (("loss", lambda on, d, t, l: ops.cross_entropy(on(t), on(l), reduction="none")),
                      ("grad", lambda on, d, t, l: ops.cross_entropy_backward(on(d), on(t), on(l), reduction="none"))):
        got, want = host(run(cuda, dout, x, labels)), host(run(opforge.tensor, dout, x, labels))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9, err_msg=name)


def test_long_rows_of_huge_equal_values_have_zero_variance() -> None:
    # (statistics merged tile by tile: an empty side must not multiply an overflowing d * d by 0)
    # (the variance is rounding noise, as on the cpu: only finite, with the mean right)
    x = np.full((2, 16_384), 1e20, np.float32)
    y, mean, rstd = (host(t) for t in ops.layer_norm(cuda(x)))
    assert np.isfinite(y).all() and np.isfinite(rstd).all() and (rstd > 0).all()
    np.testing.assert_allclose(mean, 1e20, rtol=1e-6)


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_layer_norm_and_rms_norm_rows(n: int, dtype: str) -> None:
    rng = np.random.default_rng(n)
    x, w, b = rng.standard_normal((4, n)) * 3 + 1, rng.standard_normal(n), rng.standard_normal(n)
    xd, wd, bd = (host(cuda(a, dtype).cpu()) for a in (x, w, b))
    rtol, atol = TOL[dtype]
    y, mean, rstd = ops.layer_norm(cuda(x, dtype), cuda(w, dtype), cuda(b, dtype))
    mu = xd.mean(-1, keepdims=True)
    rs = 1 / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(host(mean), mu, rtol=rtol, atol=atol * 10)
    np.testing.assert_allclose(host(rstd), rs, rtol=rtol * 10, atol=atol)
    np.testing.assert_allclose(host(y), (xd - mu) * rs * wd + bd, rtol=rtol * 10, atol=atol * 50)
    y, rstd = ops.rms_norm(cuda(x, dtype), cuda(w, dtype))
    rs = 1 / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(host(rstd), rs, rtol=rtol * 10, atol=atol)
    np.testing.assert_allclose(host(y), xd * rs * wd, rtol=rtol * 10, atol=atol * 50)


def test_half_norm_rows_accumulate_in_float() -> None:
    x = np.full((2, 60_000), 3.0, np.float16)
    x[:, ::2] = 5.0  # mean 4, variance 1: float16 sums would overflow (60000 * 25 > 65504)
    y, mean, rstd = ops.layer_norm(cuda(x))
    np.testing.assert_allclose(host(mean), 4.0, rtol=1e-3)
    np.testing.assert_allclose(host(rstd), 1 / np.sqrt(1 + 1e-5), rtol=1e-3)
    assert np.all(np.isfinite(host(y)))


@pytest.mark.parametrize("n", [4096, 16_384])  # block rows held in registers, and streamed tile by tile
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm_block_rows_and_gradients_with_weight_and_bias(n: int, dtype: str) -> None:
    # the 256-thread block path with weight and bias loaded in 16-byte packs, forward and backward
    # (layer_norm_backward, rms_norm_backward, the column sums), against float64 on the rounded inputs
    rng = np.random.default_rng(n)
    x, w, b = rng.standard_normal((4, n)) * 3 + 1, rng.standard_normal(n), rng.standard_normal(n)
    c = np.cos(np.arange(4 * n)).reshape(4, n)
    rtol, atol = TOL[dtype]
    for label, op, args in (("layer_norm", ops.layer_norm, (x, w, b)), ("rms_norm", ops.rms_norm, (x, w))):
        got = {}
        for device, dt in (("cuda", dtype), ("cpu", "float64")):
            ins = [opforge.tensor(host(cuda(a, dtype).cpu()), device=device, dtype=dt, requires_grad=True)
                   for a in args]
            outs = op(*ins)
            ops.sum(ops.mul(outs[0], opforge.tensor(c, device=device, dtype=dt))).backward()
            got[device] = [host(outs[0])] + [host(t.grad) for t in ins]
        for name, a, want in zip(["y", "dx", "dweight", "dbias"], got["cuda"], got["cpu"]):
            scale = np.abs(want).max()
            np.testing.assert_allclose(a, want, rtol=rtol * 3, atol=atol * 3 * scale, err_msg=f"{label} {name}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_frozen_norm_parameters_take_the_dx_only_backward(dtype: str) -> None:
    # weight and bias given but frozen: x's gradient is layer_norm_backward's/rms_norm_backward's
    # with a weight (not the fused op that also sums the parameters' gradients), as the trained case's
    rng = np.random.default_rng(7)
    x, w, b, dy = rng.standard_normal((64, 1024)), rng.standard_normal(1024), rng.standard_normal(1024), \
        rng.standard_normal((64, 1024))
    for name, op, params in (("layer_norm", ops.layer_norm, (w, b)), ("rms_norm", ops.rms_norm, (w,))):
        got = {}
        for trained in (True, False):
            xt = opforge.tensor(x, device="cuda", dtype=dtype, requires_grad=True)
            ps = [opforge.tensor(p, device="cuda", dtype=dtype, requires_grad=trained) for p in params]
            (gx,) = opforge.gradients([op(xt, *ps)[0]], [xt], [cuda(dy, dtype)], create_graph=True)
            assert gx.grad_fn == (f"{name}_affine_backward" if trained else f"{name}_backward"), (name, trained)
            got[trained] = host(gx)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got[False], got[True], rtol=rtol * 3, atol=atol * 3 * np.abs(got[True]).max(),
                                   err_msg=name)


def test_norm_rows_with_an_unaligned_weight_or_long_row_match_aligned_ones() -> None:
    # unaligned weight and bias (4 bytes past 16) turn the column packs off; an unaligned row too
    # long to hold runs the tile loop without vectors
    rng = np.random.default_rng(4)
    for n, what in ((4096, "weight"), (1024, "weight"), (20_000, "x")):
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, n), n, n))
        dy = rng.standard_normal((3, n)).astype(np.float32)
        xs = unaligned(x) if what == "x" else cuda(x)
        ws, bs = (unaligned(w), unaligned(b)) if what == "weight" else (cuda(w), cuda(b))
        y, mean, rstd = ops.layer_norm(xs, ws, bs)
        y0, mean0, rstd0 = ops.layer_norm(cuda(x), cuda(w), cuda(b))
        np.testing.assert_allclose(host(y), host(y0), rtol=1e-5, atol=1e-5)
        zeros = cuda(np.zeros((3, 1), np.float32))
        dx = ops.layer_norm_backward(cuda(dy), xs, mean0, rstd0, zeros, zeros, ws)
        dx0 = ops.layer_norm_backward(cuda(dy), cuda(x), mean0, rstd0, zeros, zeros, cuda(w))
        np.testing.assert_allclose(host(dx), host(dx0), rtol=1e-4, atol=1e-5)
        y, rstd = ops.rms_norm(xs, ws)
        np.testing.assert_allclose(host(y), host(ops.rms_norm(cuda(x), cuda(w))[0]), rtol=1e-5, atol=1e-5)
        dx = ops.rms_norm_backward(cuda(dy), xs, rstd, zeros, ws)
        dx0 = ops.rms_norm_backward(cuda(dy), cuda(x), rstd, zeros, cuda(w))
        np.testing.assert_allclose(host(dx), host(dx0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["axis0", "broadcast_weight", "two_axes"])
def test_norms_general_paths_and_gradients_match_the_cpu(case: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 6))
    kw, w = {"axis": [-1]}, rng.standard_normal(6)
    if case == "axis0":
        kw, w = {"axis": [0]}, rng.standard_normal((4, 1, 1))
    elif case == "broadcast_weight":
        w = rng.standard_normal((5, 1))
    elif case == "two_axes":
        kw, w = {"axis": [-2, -1]}, rng.standard_normal((5, 6))
    for op in (ops.layer_norm, ops.rms_norm):
        got = {}
        for device in ("cpu", "cuda"):
            xt = opforge.tensor(x, device=device, requires_grad=True)
            wt = opforge.tensor(w, device=device, requires_grad=True)
            outs = op(xt, wt, **kw)
            loss = ops.sum(ops.mul(outs[0], opforge.tensor(np.cos(np.arange(x.size)).reshape(x.shape), device=device)))
            loss = ops.add(loss, ops.sum(outs[-1]))  # rstd's gradient too
            loss.backward()
            got[device] = [host(t) for t in outs] + [host(xt.grad), host(wt.grad)]
        for a, b in zip(got["cpu"], got["cuda"]):
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 5), (70_000, 33), (2, 100_003), (0, 4)], ids=str)
def test_column_sums_bias_grad_and_sum_to_like(shape: tuple[int, ...]) -> None:
    dy = np.random.default_rng(4).standard_normal(shape)
    np.testing.assert_allclose(host(ops.bias_add_grad(cuda(dy), format="NHWC")), dy.sum(0), rtol=1e-10, atol=1e-10)
    like = np.zeros(shape[-1:])
    np.testing.assert_allclose(host(ops.sum_to_like(cuda(dy), cuda(like))), dy.sum(0), rtol=1e-10, atol=1e-10)
    d32 = cuda(dy, "float32")
    first = host(ops.sum_to_like(d32, cuda(like, "float32")))
    assert np.array_equal(first, host(ops.sum_to_like(d32, cuda(like, "float32"))))  # deterministic


@pytest.mark.parametrize("shape", [(3, 5), (70_000, 33), (2, 100_003), (0, 4)], ids=str)
def test_norm_affine_grad_fused_column_sums(shape: tuple[int, ...]) -> None:
    # weight and bias gradients in one pass (a pair of sums per column), against norm_weight_grad
    # and sum_to_like and float64 sums; bit-identical on a second run
    rng = np.random.default_rng(6)
    dy, x = rng.standard_normal(shape), rng.standard_normal(shape)
    m, r = rng.standard_normal(shape[:1] + (1,)), rng.uniform(0.5, 2.0, shape[:1] + (1,))
    w = np.ones(shape[-1:])
    dw, db = ops.norm_affine_grad(cuda(dy), cuda(x), cuda(r), cuda(w), cuda(w), cuda(m))
    np.testing.assert_allclose(host(dw), (dy * (x - m) * r).sum(0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(host(db), dy.sum(0), rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(host(dw), host(ops.norm_weight_grad(cuda(dy), cuda(x), cuda(r), cuda(w), cuda(m))))
    np.testing.assert_array_equal(host(db), host(ops.sum_to_like(cuda(dy), cuda(w))))
    for dtype, (rtol, atol) in (("float32", (1e-4, 1e-3)), ("bfloat16", (3e-2, 0.5))):
        args = [cuda(a, dtype) for a in (dy, x, r, w, w, m)]
        first = [host(t) for t in ops.norm_affine_grad(*args)]
        q = [host(a) for a in args]  # the values the dtype holds
        np.testing.assert_allclose(first[0], (q[0] * (q[1] - q[5]) * q[2]).sum(0), rtol=rtol, atol=atol)
        np.testing.assert_allclose(first[1], q[0].sum(0), rtol=rtol, atol=atol)
        again = [host(t) for t in ops.norm_affine_grad(*args)]
        assert all(np.array_equal(a, b) for a, b in zip(first, again))  # deterministic


def test_norm_affine_grad_general_paths() -> None:
    # bias of another shape than weight (the weight's column sums, the bias's sum to a shape), and
    # a weight varying along the rows (the product by broadcasting): the cpu kernel's results
    rng = np.random.default_rng(7)
    dy, x = rng.standard_normal((4, 6, 10)), rng.standard_normal((4, 6, 10))
    m, r = rng.standard_normal((4, 6, 1)), rng.uniform(0.5, 2.0, (4, 6, 1))
    for w, b in (((6, 10), (10,)), ((6, 1), (6, 10)), ((10,), (1,))):
        ins = (dy, x, r, np.ones(w), np.ones(b), m)
        want = ops.norm_affine_grad(*(opforge.tensor(a) for a in ins))
        got = ops.norm_affine_grad(*(cuda(a) for a in ins))
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_allclose(host(g), e.numpy(), rtol=1e-10, atol=1e-10)


def test_bias_add_and_its_gradient_in_both_formats() -> None:
    rng = np.random.default_rng(5)
    x, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)
    np.testing.assert_allclose(host(ops.bias_add(cuda(x), cuda(b))), x + b[:, None, None])
    np.testing.assert_allclose(host(ops.bias_add_grad(cuda(x))), x.sum((0, 2, 3)), rtol=1e-12)
    b5 = rng.standard_normal(5)
    np.testing.assert_allclose(host(ops.bias_add(cuda(x), cuda(b5), format="NHWC")), x + b5)
    with pytest.raises(ValueError, match=r"\[bias_add\] bias of shape \(5,\) must have shape \(3,\)"):
        ops.bias_add(cuda(x), cuda(b5))


@pytest.mark.parametrize("classes", [5, 1500, 32_000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_cross_entropy_and_gradient(classes: int, dtype: str) -> None:
    rng = np.random.default_rng(classes)
    logits, labels = rng.standard_normal((64, classes)) * 3, rng.integers(0, classes, 64)
    ld = host(cuda(logits, dtype).cpu())
    lse = np.log(np.exp(ld - ld.max(1, keepdims=True)).sum(1)) + ld.max(1)
    rows = lse - ld[np.arange(64), labels]
    rtol = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 1e-2}[dtype]
    for reduction, want in (("none", rows), ("sum", rows.sum()), ("mean", rows.mean())):
        got = ops.cross_entropy(cuda(logits, dtype), cuda(labels), reduction=reduction)
        np.testing.assert_allclose(host(got), want, rtol=rtol)
    dy = rng.standard_normal(64)
    g = ops.cross_entropy_backward(cuda(dy, dtype), cuda(logits, dtype), cuda(labels), reduction="none")
    want = softmax_ref(ld, 1)
    want[np.arange(64), labels] -= 1
    want *= host(cuda(dy, dtype).cpu())[:, None]
    np.testing.assert_allclose(host(g), want, rtol=rtol * 10, atol={"float64": 1e-14, "float32": 1e-7, "bfloat16": 1e-3}[dtype])


@pytest.mark.parametrize("classes", [5, 1500, 32_000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_ignore_index_and_label_smoothing_match_the_cpu(classes: int, dtype: str) -> None:
    # (rows left out are not read, mean counts the rows kept on the device, the smoothing term sums
    # the row in a pass of its own: the same numbers as the cpu kernels)
    rng = np.random.default_rng(classes + 1)
    logits, labels = rng.standard_normal((64, classes)) * 3, rng.integers(0, classes, 64)
    labels[::5] = -100
    dy = rng.standard_normal(64)
    rtol, atol = {"float64": (1e-12, 1e-14), "float32": (1e-5, 1e-7), "bfloat16": (2e-2, 1e-3)}[dtype]
    for kw in ({"label_smoothing": 0.1}, {"ignore_index": int(labels[1])}, {"label_smoothing": 1.0}, {}):
        for reduction in ("none", "sum", "mean"):
            lab = labels if "ignore_index" not in kw else np.where(labels == -100, 0, labels)
            got = host(ops.cross_entropy(cuda(logits, dtype), cuda(lab), reduction=reduction, **kw))
            want_cpu = host(ops.cross_entropy(cuda(logits, dtype).cpu(), opforge.tensor(lab), reduction=reduction, **kw))
            np.testing.assert_allclose(got, want_cpu, rtol=rtol, atol=atol, err_msg=f"{kw} {reduction}")
            d = dy if reduction == "none" else np.array(1.5)
            g = host(ops.cross_entropy_backward(cuda(d, dtype), cuda(logits, dtype), cuda(lab), reduction=reduction, **kw))
            g_cpu = host(ops.cross_entropy_backward(cuda(d, dtype).cpu(), cuda(logits, dtype).cpu(), opforge.tensor(lab),
                                                    reduction=reduction, **kw))
            np.testing.assert_allclose(g, g_cpu, rtol=rtol * 10, atol=atol * 10, err_msg=f"grad {kw} {reduction}")
            ignore = kw.get("ignore_index", -100)
            assert not g[lab == ignore].any()
            s = host(ops.cross_entropy_grad_scale(cuda(d, dtype), cuda(logits, dtype), cuda(lab), reduction=reduction,
                                                  ignore_index=ignore))
            s_cpu = host(ops.cross_entropy_grad_scale(cuda(d, dtype).cpu(), cuda(logits, dtype).cpu(), opforge.tensor(lab),
                                                      reduction=reduction, ignore_index=ignore))
            np.testing.assert_array_equal(s, s_cpu)


def test_cross_entropy_with_every_row_ignored_on_cuda() -> None:
    logits, labels = cuda(np.array([[1.0, np.inf], [np.nan, 0.0]])), cuda(np.array([-100, -100]))
    assert np.isnan(host(ops.cross_entropy(logits, labels)))  # 0 / 0 rows kept, as torch and the cpu
    assert host(ops.cross_entropy(logits, labels, reduction="sum")) == 0.0
    np.testing.assert_array_equal(host(ops.cross_entropy(logits, labels, reduction="none")), [0.0, 0.0])
    np.testing.assert_array_equal(host(ops.cross_entropy_backward(cuda(np.ones(())), logits, labels)), np.zeros((2, 2)))
    np.testing.assert_array_equal(host(ops.cross_entropy_grad_scale(cuda(np.ones(())), logits, labels)), np.zeros((2, 2)))
    with pytest.raises(IndexError, match=r"\[cross_entropy\] label -1 is out of range for 2 classes"):
        ops.cross_entropy(logits, cuda(np.array([-100, -1])))


@pytest.mark.parametrize("bad", [5, -1, 1 << 40])
def test_labels_and_indices_out_of_range_raise_on_cuda(bad: int) -> None:
    logits, labels = cuda(np.zeros((3, 5))), cuda(np.array([0, bad, 4]))
    msg = rf"\[cross_entropy\] label {bad} is out of range for 5 classes"
    with pytest.raises(IndexError, match=msg):
        ops.cross_entropy(logits, labels)
    with pytest.raises(IndexError, match=msg.replace("cross_entropy", "cross_entropy_backward")):
        ops.cross_entropy_backward(cuda(np.ones(())), logits, labels)
    w = cuda(np.ones((5, 4)))
    with pytest.raises(IndexError, match=rf"\[embedding\] index {bad} is out of range for weight with 5 rows"):
        ops.embedding(labels, w)
    with pytest.raises(IndexError, match=rf"\[embedding_backward\] index {bad} is out of range for weight with 5 rows"):
        ops.embedding_backward(cuda(np.ones((3, 4))), labels, w)
    x = cuda(np.ones((2, 5)))
    idx = cuda(np.array([[0, bad], [1, 2]]))
    with pytest.raises(IndexError, match=rf"\[take_along_axis\] index {bad} is out of range for axis -1 of size 5"):
        ops.take_along_axis(x, idx)
    with pytest.raises(IndexError, match=rf"\[scatter_add_along_axis\] index {bad} is out of range for axis -1 of size 5"):
        ops.scatter_add_along_axis(cuda(np.ones((2, 2))), idx, x)
    # the device is still usable: nothing was touched out of bounds (compute-sanitizer checks it too)
    assert host(ops.cross_entropy(logits, cuda(np.array([0, 1, 4])))) == pytest.approx(np.log(5))


def test_indices_into_empty_rows_or_an_empty_axis_raise_on_cuda_as_on_cpu() -> None:
    # (a (5, 0) table has rows of no elements, an axis of size 0 has no position: the cuda kernels
    # had no element to check an index at and returned empty results silently; a review's point)
    idx = np.array([0, 7, 2])
    for device in ("cpu", "cuda"):
        with pytest.raises(IndexError, match=r"\[embedding\] index 7 is out of range for weight with 5 rows"):
            ops.embedding(opforge.tensor(idx, device=device), opforge.tensor(np.ones((5, 0)), device=device))
        with pytest.raises(IndexError, match=r"\[scatter_add_along_axis\] index 0 is out of range for axis 0 of size 0"):
            ops.scatter_add_along_axis(opforge.tensor(np.ones(3), device=device), opforge.tensor(idx, device=device),
                                       opforge.tensor(np.ones(0), device=device), axis=0)
    assert ops.embedding(cuda(np.array([0, 4])), cuda(np.ones((5, 0)))).shape == (2, 0)


def test_index_checks_off_skip_the_wait_and_touch_nothing() -> None:
    # opforge.cuda.set_index_checks(False): no IndexError; a bad label's loss is NaN and its row's
    # gradient the softmax alone, a bad index's row zeros; nothing read or written out of bounds
    # (compute-sanitizer runs this file)
    logits, labels = cuda(np.zeros((3, 5))), cuda(np.array([0, 7, 4]))
    w, x = cuda(np.arange(20.0).reshape(5, 4)), cuda(np.ones((2, 5)))
    idx = cuda(np.array([[0, -1], [1, 2]]))
    assert opforge.cuda.index_checks()
    before = opforge.cuda.set_index_checks(False)
    try:
        assert before is True and opforge.cuda.index_checks() is False
        loss = host(ops.cross_entropy(logits, labels, reduction="none"))
        assert loss[0] == pytest.approx(np.log(5)) and np.isnan(loss[1]) and loss[2] == pytest.approx(np.log(5))
        g = host(ops.cross_entropy_backward(cuda(np.ones(3)), logits, labels, reduction="none"))
        np.testing.assert_allclose(g[1], np.full(5, 0.2))
        np.testing.assert_array_equal(host(ops.embedding(labels, w)), [[0, 1, 2, 3], [0, 0, 0, 0], [16, 17, 18, 19]])
        gw = host(ops.embedding_backward(cuda(np.ones((3, 4))), labels, w))
        np.testing.assert_array_equal(gw.sum(1), [4, 0, 0, 0, 4])
        np.testing.assert_array_equal(host(ops.take_along_axis(x, idx)), [[1, 0], [1, 1]])
        np.testing.assert_array_equal(host(ops.scatter_add_along_axis(cuda(np.ones((2, 2))), idx, x)),
                                      [[1, 0, 0, 0, 0], [0, 1, 1, 0, 0]])
    finally:
        opforge.cuda.set_index_checks(before)
    with pytest.raises(IndexError, match=r"\[cross_entropy\] label 7 is out of range for 5 classes"):
        ops.cross_entropy(logits, labels)


def test_embedding_gradient_is_deterministic_and_exact() -> None:
    rng = np.random.default_rng(6)
    idx = rng.integers(0, 50, (300, 7))  # many repeats per row
    dout = rng.standard_normal((300, 7, 33)).astype(np.float32)
    w = np.zeros((60, 33), np.float32)  # rows 50..59 are never picked: zeros
    want = np.zeros((60, 33))
    np.add.at(want, idx.ravel(), dout.reshape(-1, 33).astype(np.float64))
    runs = [host(ops.embedding_backward(cuda(dout), cuda(idx), cuda(w))) for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    np.testing.assert_allclose(runs[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(host(ops.embedding(cuda(idx), cuda(runs[0], "float32"))),
                                  runs[0][idx])


def test_take_and_scatter_along_axis_and_transpose() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 9, 5))
    idx = rng.integers(0, 9, (4, 6, 5))
    np.testing.assert_array_equal(host(ops.take_along_axis(cuda(x), cuda(idx), axis=1)),
                                  np.take_along_axis(x, idx, 1))
    src = rng.standard_normal((4, 6, 5))
    want = np.zeros_like(x)
    for o in range(4):
        for p in range(6):
            for j in range(5):
                want[o, idx[o, p, j], j] += src[o, p, j]
    got = ops.scatter_add_along_axis(cuda(src), cuda(idx), cuda(x), axis=1)
    np.testing.assert_allclose(host(got), want, rtol=1e-12)
    got16 = ops.scatter_add_along_axis(cuda(src, "float16"), cuda(idx), cuda(x, "float16"), axis=1)
    np.testing.assert_allclose(host(got16), want, rtol=1e-2, atol=1e-2)
    for shape in [(33, 65), (3, 1, 4099), (2, 0, 5), (70_000, 3)]:
        a = rng.integers(-100, 100, shape).astype(np.int16)
        np.testing.assert_array_equal(ops.transpose(cuda(a)).cpu().numpy(), np.swapaxes(a, -1, -2))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64"])
@pytest.mark.parametrize("xs,srcs,axis", [((1000,), (2_000_000,), 0), ((3, 5000), (3, 40_000), 1),
                                          ((2, 300, 4), (2, 5000, 4), 1), ((7,), (3000,), 0)], ids=str)
def test_scatter_of_few_long_lanes_matches_the_cpu(xs: tuple, srcs: tuple, axis: int, dtype: str) -> None:
    # (few lanes, long ones: sorted (lane, index) runs, a thread per output element, where a thread
    # per lane ran a 1-D scatter on one thread; the sums in the cpu's order)
    rng = np.random.default_rng(11)
    src = rng.integers(-50, 50, srcs) if dtype == "int64" else rng.standard_normal(srcs)
    idx = rng.integers(0, xs[axis], srcs)
    idx[(0,) * len(srcs)] = xs[axis] - 1
    x = np.zeros(xs)
    want = ops.scatter_add_along_axis(opforge.tensor(src, dtype=dtype), idx, opforge.tensor(x, dtype=dtype), axis=axis)
    got = ops.scatter_add_along_axis(cuda(src, dtype), cuda(idx), cuda(x, dtype), axis=axis)
    if dtype == "float16":
        np.testing.assert_allclose(host(got), want.astype("float64").numpy(), rtol=1e-3, atol=1e-2)
    else:
        np.testing.assert_array_equal(host(got), want.astype("float64").numpy())
    bad = idx.copy()
    bad[tuple(5 if d == axis else 0 for d in range(len(srcs)))] = xs[axis]
    with pytest.raises(IndexError, match=rf"\[scatter_add_along_axis\] index {xs[axis]} is out of range"):
        ops.scatter_add_along_axis(cuda(src, dtype), cuda(bad), cuda(x, dtype), axis=axis)


@pytest.mark.parametrize("shape", [(5000, 7), (5000, 1000), (3000, 1024), (600, 4096), (200, 6144), (300, 8192),
                                   (40, 8200), (3, 100_003), (0, 64)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_layer_norm_affine_backward_fused_rows(shape: tuple[int, int], dtype: str) -> None:
    # dx, dweight and dbias from one read of each row (rows held in registers: warp rows up to 1024,
    # block rows up to 8192 (4096 in float64), per-block column sums in shared memory added in block
    # order, 48 KB of them at 6144 with the block's static shared memory on top; longer rows run the
    # two ops): dx as layer_norm_backward's (the same arithmetic; an FMA
    # contracted otherwise may move a last bit), dweight and dbias as norm_affine_grad's and float64
    # sums of the values the dtype holds; bit-identical on a second run
    rng = np.random.default_rng(12)
    dy, x = rng.standard_normal(shape), rng.standard_normal(shape)
    m, r = rng.standard_normal(shape[:1] + (1,)), rng.uniform(0.5, 2.0, shape[:1] + (1,))
    dm, dr = rng.standard_normal(shape[:1] + (1,)), rng.standard_normal(shape[:1] + (1,))
    w, b = rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])
    args = [cuda(a, dtype) for a in (dy, x, m, r, dm, dr, w, b)]
    first = [host(t) for t in ops.layer_norm_affine_backward(*args)]
    dx = host(ops.layer_norm_backward(*args[:7]))
    np.testing.assert_allclose(first[0], dx, rtol={"float64": 1e-13, "float32": 1e-5, "bfloat16": 1e-2}[dtype],
                               atol=1e-6 * np.abs(dx).max(initial=0))
    q = [host(a) for a in args]  # the values the dtype holds
    rtol, atol = {"float64": (1e-10, 1e-9), "float32": (1e-4, 1e-3), "bfloat16": (2e-2, 0.05)}[dtype]
    atol *= np.sqrt(max(shape[0], 1))
    want = [(q[0] * (q[1] - q[2]) * q[3]).sum(0), q[0].sum(0)]
    separate = ops.norm_affine_grad(args[0], args[1], args[3], args[6], args[7], args[2])
    for got, e, sep in zip(first[1:], want, separate):
        np.testing.assert_allclose(got, e, rtol=rtol, atol=atol)
        np.testing.assert_allclose(got, host(sep), rtol=rtol, atol=atol)
    again = [host(t) for t in ops.layer_norm_affine_backward(*args)]
    assert all(np.array_equal(a, c) for a, c in zip(first, again))  # deterministic


def test_layer_norm_affine_backward_unaligned_rows() -> None:
    # rows 4 bytes past a 16-byte boundary: the per-element loads, the accumulators by plain column
    rng = np.random.default_rng(13)
    dy, x = rng.standard_normal((2000, 1000)), rng.standard_normal((2000, 1000))
    m, r = x.mean(-1, keepdims=True), 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    w, b = rng.standard_normal(1000), rng.standard_normal(1000)
    rest = [cuda(a, "float32") for a in (x, m, r, np.zeros_like(m), np.zeros_like(m), w, b)]
    dx, dw, db = ops.layer_norm_affine_backward(unaligned(dy), *rest)
    want = host(ops.layer_norm_backward(unaligned(dy), *rest[:6]))
    np.testing.assert_allclose(host(dx), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    q = [host(a) for a in rest]
    np.testing.assert_allclose(host(dw), (dy.astype(np.float32) * (q[0] - q[1]) * q[2]).sum(0), rtol=1e-4, atol=2e-2)
    np.testing.assert_allclose(host(db), dy.astype(np.float32).astype(np.float64).sum(0), rtol=1e-4, atol=2e-2)


@pytest.mark.parametrize("shape", [(5000, 7), (3000, 1024), (600, 4096), (300, 8192), (40, 8200), (0, 64)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_rms_norm_affine_backward_fused_rows(shape: tuple[int, int], dtype: str) -> None:
    # dx and dweight from one read of each row, as for layer_norm above: dx as rms_norm_backward's,
    # dweight as norm_weight_grad's and float64 sums of the values the dtype holds; deterministic
    rng = np.random.default_rng(14)
    dy, x = rng.standard_normal(shape), rng.standard_normal(shape)
    r, dr = rng.uniform(0.5, 2.0, shape[:1] + (1,)), rng.standard_normal(shape[:1] + (1,))
    w = rng.standard_normal(shape[-1:])
    args = [cuda(a, dtype) for a in (dy, x, r, dr, w)]
    first = [host(t) for t in ops.rms_norm_affine_backward(*args)]
    dx = host(ops.rms_norm_backward(*args))
    np.testing.assert_allclose(first[0], dx, rtol={"float64": 1e-13, "float32": 1e-5, "bfloat16": 1e-2}[dtype],
                               atol=1e-6 * np.abs(dx).max(initial=0))
    q = [host(a) for a in args]
    rtol, atol = {"float64": (1e-10, 1e-9), "float32": (1e-4, 1e-3), "bfloat16": (2e-2, 0.05)}[dtype]
    atol *= np.sqrt(max(shape[0], 1))
    np.testing.assert_allclose(first[1], (q[0] * q[1] * q[2]).sum(0), rtol=rtol, atol=atol)
    np.testing.assert_allclose(first[1], host(ops.norm_weight_grad(args[0], args[1], args[2], args[4])),
                               rtol=rtol, atol=atol)
    again = [host(t) for t in ops.rms_norm_affine_backward(*args)]
    assert all(np.array_equal(a, c) for a, c in zip(first, again))
