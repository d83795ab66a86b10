"""The linalg ops on CUDA devices (cuBLAS / cuBLASLt, src/kernels/cuda/linalg_common.cuh): batched and
broadcast products in every layout the kernels tell apart, empty dimensions, float16/bfloat16
against a float32 reference, float32 without TF32, linear with and without its bias, gradients
against torch's on CUDA, large shapes, streams and CUDA-graph capture. (The spec cases of every op
run in test_cuda_ops.py.) Skipped without a CUDA device."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

pytestmark = pytest.mark.skipif(not opforge.cuda.is_available(),
                                reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")


def on_cuda(x: Optional[np.ndarray], dtype: Optional[str] = None) -> Any:
    return None if x is None else opforge.tensor(x, device="cuda", dtype=dtype)


def host(t: Any) -> np.ndarray:
    """A CUDA tensor's values as float64 (16-bit floats converted on the device)."""
    return t.astype("float64").cpu().numpy()


def torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


# (a, b) shapes covering each path of batched_gemm: one GEMM (2-D, rows of a batch folded against a
# shared b, vectors), strided-batched over one stride, broadcast batches that need a loop, 1-D operands
MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((7, 3, 4), (4, 5)),             # batch folded into rows: one GEMM of 21 rows
    ((2, 3, 1, 4), (4,)),            # matrix-vector, folded
    ((4,), (4,)),                    # dot
    ((4,), (3, 4, 5)),               # a row vector against a batch: strided, a's stride 0
    ((3, 4), (7, 4, 5)),             # a shared: strided, stride 0
    ((6, 3, 4), (6, 4, 5)),          # one stride each
    ((2, 1, 3, 4), (5, 4, 6)),       # (2, 5) batch: a strided over 2, b over 5: a loop of strided calls
    ((2, 3, 1, 2, 4), (3, 5, 4, 2)),  # three batch dims, broadcast both ways
    ((1, 1, 3, 4), (1, 4, 2)),       # size-1 batch dims only
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_batched_and_broadcast_products_match_numpy(sa: tuple, sb: tuple, dtype: str) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = ops.matmul(on_cuda(a), on_cuda(b))
    assert got.device == "cuda:0" and got.shape == want.shape
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_backward_ops_sum_over_broadcast_dims(sa: tuple, sb: tuple) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    g = rng.standard_normal(np.matmul(a, b).shape)
    for device in ("cpu", "cuda"):  # the cpu kernels are the reference (the same layouts, OpenBLAS)
        ga = ops.matmul_backward_a(*(opforge.tensor(x, device=device) for x in (g, b, a)))
        gb = ops.matmul_backward_b(*(opforge.tensor(x, device=device) for x in (g, a, b)))
        if device == "cpu":
            want = (ga.numpy(), gb.numpy())
        else:
            assert ga.shape == a.shape and gb.shape == b.shape
            np.testing.assert_allclose(ga.cpu().numpy(), want[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(gb.cpu().numpy(), want[1], rtol=1e-12, atol=1e-12)


def test_weight_gradient_of_a_batched_product_is_one_gemm_over_the_rows() -> None:
    # b broadcast over (8, 16): its gradient sums a^T @ g over 128 matrices (the folded path)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 16, 5, 3)), rng.standard_normal((3, 4))
    g = rng.standard_normal((8, 16, 5, 4))
    got = ops.matmul_backward_b(on_cuda(g), on_cuda(a), on_cuda(b))
    np.testing.assert_allclose(got.cpu().numpy(), np.einsum("xymk,xymn->kn", a, g), rtol=1e-12, atol=1e-12)


def dirty_pool() -> None:
    """Leaves non-zero blocks in the allocator's pool, so that an output that is never written shows."""
    x = ops.add(on_cuda(np.full((1 << 16,), 7.0, np.float32)), on_cuda(np.ones((1 << 16,), np.float32)))
    del x


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_empty_dims(dtype: str) -> None:
    def run(fn: Any, *shapes: tuple) -> np.ndarray:
        dirty_pool()
        return host(fn(*(on_cuda(np.ones(s), dtype) for s in shapes)))

    np.testing.assert_array_equal(run(ops.matmul, (3, 0), (0, 5)), np.zeros((3, 5)))  # k == 0: zeros
    np.testing.assert_array_equal(run(ops.matmul, (2, 4, 0), (0, 6)), np.zeros((2, 4, 6)))
    assert run(ops.matmul, (0, 4), (4, 5)).shape == (0, 5)                              # m == 0
    assert run(ops.matmul, (3, 4), (4, 0)).shape == (3, 0)                              # n == 0
    assert run(ops.matmul, (0, 3, 4), (4, 2)).shape == (0, 3, 2)                        # empty batch
    np.testing.assert_array_equal(run(ops.matmul_backward_b, (0, 3, 2), (0, 3, 4), (4, 2)), np.zeros((4, 2)))
    np.testing.assert_array_equal(run(ops.matmul_backward_a, (3, 5), (0, 5), (3, 0)).shape, (3, 0))
    np.testing.assert_array_equal(run(ops.linear_backward_weight, (0, 5), (0, 3)), np.zeros((5, 3)))
    np.testing.assert_array_equal(run(ops.linear, (4, 0), (5, 0)), np.zeros((4, 5)))
    bias = np.arange(5.0)
    got = host(ops.linear(on_cuda(np.ones((4, 0)), dtype), on_cuda(np.ones((5, 0)), dtype), on_cuda(bias, dtype)))
    np.testing.assert_array_equal(got, np.broadcast_to(bias, (4, 5)))  # in_features == 0: the bias alone
    assert run(ops.linear, (0, 3), (5, 3), (5,)).shape == (0, 5)


@pytest.mark.parametrize("dtype,rtol", [("float16", 2e-3), ("bfloat16", 1e-2)])
def test_half_precision_against_a_float32_reference(dtype: str, rtol: float) -> None:
    # the inputs rounded to the dtype first: what remains is float accumulation and one rounding
    rng = np.random.default_rng(3)
    a, b, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 96, 256), (256, 80), (80, 256), (80,)))
    ta, tb, tw, tbias = (on_cuda(x, dtype) for x in (a, b, w, bias))
    a, b, w, bias = (host(t).astype(np.float32) for t in (ta, tb, tw, tbias))
    scale = np.sqrt(256)  # |entries| grow like sqrt(k)
    got = ops.matmul(ta, tb)
    assert got.dtype == dtype
    np.testing.assert_allclose(host(got), a @ b, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(host(ops.linear(ta, tw, tbias)), a @ w.T + bias, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(host(ops.linear(ta, tw)), a @ w.T, rtol=rtol, atol=rtol * scale)
    g = host(got).astype(np.float32)
    # a gradient summed over a broadcast batch: accumulated in float, rounded once
    np.testing.assert_allclose(host(ops.matmul_backward_b(got, ta, tb)), np.einsum("xmk,xmn->kn", a, g),
                               rtol=rtol, atol=rtol * scale * 8)
    np.testing.assert_allclose(host(ops.linear_backward_weight(got, ta)),
                               g.reshape(-1, 80).T @ a.reshape(-1, 256), rtol=rtol, atol=rtol * scale * 20)


def test_float32_products_are_not_tf32() -> None:
    # 1 + 2^-12 is a float32 but rounds to 1 in TF32 (10-bit mantissa): TF32 would give 1024, not 1024.25
    a = np.full((64, 1024), 1 + 2.0 ** -12, np.float32)
    b = np.ones((1024, 64), np.float32)
    np.testing.assert_array_equal(ops.matmul(on_cuda(a), on_cuda(b)).cpu().numpy(), np.full((64, 64), 1024.25))
    np.testing.assert_array_equal(ops.linear(on_cuda(a), on_cuda(b.T.copy()), on_cuda(np.zeros(64, np.float32)))
                                  .cpu().numpy(), np.full((64, 64), 1024.25))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs", [(3,), (6, 3), (2, 4, 3)], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_linear_with_and_without_bias(xs: tuple, with_bias: bool, dtype: str) -> None:
    rng = np.random.default_rng(4)
    x, w, bias = rng.standard_normal(xs), rng.standard_normal((5, 3)), rng.standard_normal(5)
    want = x @ w.T + (bias if with_bias else 0)
    got = ops.linear(on_cuda(x, dtype), on_cuda(w, dtype), on_cuda(bias, dtype) if with_bias else None)
    assert got.shape == want.shape
    np.testing.assert_allclose(host(got), want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("xs,ws", [((4, 3), (1, 3)), ((4, 1), (5, 1)), ((1, 3), (5, 3)), ((1, 1), (1, 1))], ids=str)
def test_linear_with_a_dimension_of_one_and_a_bias(xs: tuple, ws: tuple, dtype: str) -> None:
    # (cuBLASLt's heuristic may refuse a matrix with a dimension of 1 as invalid, as PyTorch found:
    # the bias is then added apart, never an error; a review's point, first run here)
    rng = np.random.default_rng(9)
    x, w, bias = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    got = ops.linear(on_cuda(x, dtype), on_cuda(w, dtype), on_cuda(bias, dtype))
    want = host(on_cuda(x, dtype)) @ host(on_cuda(w, dtype)).T + host(on_cuda(bias, dtype))
    np.testing.assert_allclose(host(got), want, rtol={"float16": 2e-3, "bfloat16": 1e-2}.get(dtype, 1e-5), atol=1e-2)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_linear_with_an_unaligned_bias(dtype: str) -> None:
    # (a bias 2 or 4 bytes past a 16-byte boundary, a torch slice through DLPack: no cuBLASLt
    # alignment preference covers the epilogue's bias, so it takes the GEMM and a bias pass)
    torch = torch_cuda()
    tdtype = getattr(torch, dtype)
    torch.manual_seed(1)
    a = torch.randn(64, 96, device="cuda", dtype=tdtype)
    w = torch.randn(80, 96, device="cuda", dtype=tdtype)
    bias = torch.randn(81, device="cuda", dtype=tdtype)[1:]
    assert bias.data_ptr() % 16 != 0
    got = ops.linear(opforge.from_dlpack(a), opforge.from_dlpack(w), opforge.from_dlpack(bias))
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == "float32" else dict(rtol=2e-3, atol=5e-2)
    torch.testing.assert_close(torch.from_dlpack(got).double(), a.double() @ w.double().T + bias.double(), **tol)


@pytest.mark.parametrize("sa,sb", [((2, 1, 3, 4), (5, 4, 6)), ((4,), (3, 4, 5)), ((7, 3, 4), (4,))], ids=str)
def test_matmul_gradients_match_torch(sa: tuple, sb: tuple) -> None:
    torch = torch_cuda()
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    dout = rng.standard_normal(np.matmul(a, b).shape)
    ta, tb = (opforge.tensor(x, device="cuda", requires_grad=True) for x in (a, b))
    ops.matmul(ta, tb).backward(on_cuda(dout))
    xa, xb = (torch.tensor(x, device="cuda", requires_grad=True) for x in (a, b))
    torch.matmul(xa, xb).backward(torch.tensor(dout, device="cuda"))
    assert ta.grad.device == "cuda:0"
    np.testing.assert_allclose(ta.grad.cpu().numpy(), xa.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tb.grad.cpu().numpy(), xb.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_linear_gradients_and_double_backward_match_torch(with_bias: bool) -> None:
    torch = torch_cuda()
    rng = np.random.default_rng(6)
    x, w, bias, dout = (rng.standard_normal(s) for s in ((2, 4, 3), (5, 3), (5,), (2, 4, 5)))
    leaves = [opforge.tensor(v, device="cuda", requires_grad=True) for v in (x, w, bias)]
    tleaves = [torch.tensor(v, device="cuda", requires_grad=True) for v in (x, w, bias)]
    if not with_bias:
        leaves, tleaves = leaves[:2], tleaves[:2]
    y = ops.linear(*leaves)
    grads = opforge.gradients([y], leaves, [on_cuda(dout)], create_graph=True)
    ty = torch.nn.functional.linear(*tleaves)
    tgrads = torch.autograd.grad(ty, tleaves, torch.tensor(dout, device="cuda"), create_graph=True)
    for g, tg in zip(grads, tgrads):
        np.testing.assert_allclose(g.detach().cpu().numpy(), tg.detach().cpu().numpy(), rtol=1e-12, atol=1e-12)
    # second order: through matmul and linear_backward_weight on the device
    (gg,) = opforge.gradients([ops.sum(ops.mul(grads[1], grads[1]))], [leaves[0]])
    (tgg,) = torch.autograd.grad((tgrads[1] * tgrads[1]).sum(), [tleaves[0]])
    np.testing.assert_allclose(gg.cpu().numpy(), tgg.cpu().numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_products_match_torch(dtype: str) -> None:
    torch = torch_cuda()
    tdtype = getattr(torch, dtype)
    torch.manual_seed(0)
    a = torch.randn(512, 768, device="cuda", dtype=tdtype)
    b = torch.randn(768, 1024, device="cuda", dtype=tdtype)
    w = torch.randn(1024, 768, device="cuda", dtype=tdtype)
    bias = torch.randn(1024, device="cuda", dtype=tdtype)
    x, y, tw, tbias = (opforge.from_dlpack(t) for t in (a, b, w, bias))  # zero copy
    ref = a.double() @ b.double()
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == "float32" else dict(rtol=1e-2, atol=0.3)
    torch.testing.assert_close(torch.from_dlpack(ops.matmul(x, y)).double(), ref, **tol)
    torch.testing.assert_close(torch.from_dlpack(ops.linear(x, tw, tbias)).double(),
                               a.double() @ w.double().T + bias.double(), **tol)
    g = torch.randn(512, 1024, device="cuda", dtype=tdtype)
    torch.testing.assert_close(torch.from_dlpack(ops.linear_backward_weight(opforge.from_dlpack(g), x)).double(),
                               g.double().T @ a.double(), **(tol if dtype == "float32" else dict(rtol=1e-2, atol=1.5)))
    if dtype == "float32":  # bit-for-bit the product torch's cuBLAS call gives, not only close
        assert torch.equal(torch.from_dlpack(ops.matmul(x, y)), a @ b)


def test_products_on_an_opforge_stream_are_ordered() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((512, 768)).astype(np.float32), rng.standard_normal((768, 1024)).astype(np.float32)
    x, y = on_cuda(a), on_cuda(b)
    s = opforge.cuda.Stream()
    with s:  # the products, their workspace and the result queued on s, after x * 2 on s
        out = ops.matmul(ops.mul(x, on_cuda(np.float32(2.0))), y)
        w = ops.linear(out, on_cuda(b), on_cuda(np.ones(768, np.float32)))  # out @ b^T + 1
    s.synchronize()
    want = (2 * a.astype(np.float64)) @ b
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(w.cpu().numpy(), want @ b.T + 1, rtol=1e-4, atol=1e-1)


def test_products_run_on_torchs_current_stream() -> None:
    torch = torch_cuda()
    import opforge.torch as ot

    s = torch.cuda.Stream()
    a = torch.randn(512, 768, device="cuda")
    b = torch.randn(768, 1024, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        a2 = a * 3  # queued on s
        c = ot.ops.matmul(a2, b)  # must see a2: runs on s, after it
        d = ot.ops.linear(c, b, None) + 1  # and its output is seen by the next torch kernel on s
        # opforge's own API on torch's stream (ExternalStream), DLPack both ways on s
        with opforge.cuda.ExternalStream(s.cuda_stream):
            e = torch.from_dlpack(ops.matmul(opforge.from_dlpack(a2), opforge.from_dlpack(b))) * 2
    s.synchronize()
    want = (a * 3).double() @ b.double()
    torch.testing.assert_close(c.double(), want, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(d.double(), want @ b.double().T + 1, rtol=1e-4, atol=0.5)
    torch.testing.assert_close(e.double(), 2 * want, rtol=1e-4, atol=2e-3)
    assert opforge.cuda.current_stream().cuda_stream == 0


def test_products_capture_into_a_cuda_graph() -> None:
    # cuBLAS takes its workspace from opforge's allocator (stream-ordered, capturable): no cudaMalloc
    # inside cuBLAS during capture. The first calls (handle, workspace size) happen before it.
    torch = torch_cuda()
    a = torch.randn(256, 384, device="cuda")
    b = torch.randn(384, 128, device="cuda")
    bias = torch.randn(384, device="cuda")
    x, y, tb = (opforge.from_dlpack(t) for t in (a, b, bias))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), opforge.cuda.ExternalStream(side.cuda_stream):
        ops.linear(ops.matmul(x, y), y, tb)  # warm-up on the capture stream: (a @ b) @ b^T + bias
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with opforge.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            out = ops.linear(ops.matmul(x, y), y, tb)
    a.mul_(2)  # the graph reads a's memory when replayed
    graph.replay()
    torch.cuda.synchronize()
    want = (a.double() @ b.double()) @ b.double().T + bias.double()
    torch.testing.assert_close(torch.from_dlpack(out).double(), want, rtol=1e-4, atol=1e-2)
    del out  # (memory the graph allocated: freed after its replay, before the graph goes)
    torch.cuda.synchronize()
