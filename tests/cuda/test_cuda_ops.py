"""Ops on CUDA devices: every expr op with cuda rows in every cuda dtype against the spec's NumPy
reference (contiguous, broadcast, strided through DLPack views of torch.cuda tensors, 0-d and
empty), and the device runtime (copies, allocator reuse, streams, DLPack both ways, mixed devices,
ops without cuda rows). Skipped without a CUDA device (CI has none; the GPU runs record results in
benchmarks/results/cuda-tests.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))
from cases import Case, as_numpy, cases, make_data, reference, to_inputs, tolerance  # noqa: E402

pytestmark = pytest.mark.skipif(not opforge.cuda.is_available(),
                                reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")


def cuda_cases() -> list[Case]:
    """The cpu cases of ops whose cuda rows the cuda wheel runs (expr ops: generated kernels), in the
    dtypes of those rows."""
    out = []
    for c in cases():
        if c.op.impl.kind == "expr" and c.op.target("cuda") is not None:
            rows = c.op.target("cuda").rows()
            if any(c.dtype in [str(d) for d in b.values()] for b, _ in rows) or not c.op.typevars:
                out.append(c)
    return out


CUDA_CASES = cuda_cases() if opforge.cuda.is_available() else []


def on_cuda(x):  # type: ignore[no-untyped-def]
    return None if x is None else opforge.tensor(x, device="cuda")


def check(case: Case, data) -> None:  # type: ignore[no-untyped-def]
    inputs = [on_cuda(x) for x in to_inputs(case.op, case.dtype, data)]
    outs = getattr(ops, case.op.name)(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = reference(case.op, data, case.attrs)
    rtol, atol = tolerance(case.op, case.dtype)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        assert o.device == "cuda:0", spec.name
        host = o.cpu()
        r = np.asarray(r)
        assert host.shape == r.shape, spec.name
        if host.dtype == "bool" or host.dtype.startswith(("int", "uint")):
            np.testing.assert_array_equal(host.numpy(), r.astype(host.dtype), err_msg=spec.name)
        else:
            np.testing.assert_allclose(as_numpy(host), r, rtol=rtol, atol=atol, err_msg=spec.name)


@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: c.id)
def test_forward_on_cuda_matches_numpy(case: Case) -> None:
    check(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(0)))


@pytest.mark.parametrize("shape", [(), (0, 3), (1, 5, 1), (4099,)], ids=str)
def test_edge_shapes_on_cuda(shape: tuple[int, ...]) -> None:
    x = np.linspace(-2.0, 2.0, int(np.prod(shape))).reshape(shape).astype(np.float32)
    y = ops.mul(on_cuda(x), on_cuda(x))
    np.testing.assert_allclose(y.cpu().numpy(), x * x, rtol=1e-6)


def test_strided_and_broadcast_inputs_through_torch_views() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    a = torch.randn(64, 130, device="cuda")[:, 1:129:2]  # strided view
    b = torch.randn(32, 1, 1, device="cuda").expand(32, 64, 64)  # stride-0 dimensions
    x, y = opforge.from_dlpack(a), opforge.from_dlpack(b)
    assert x.device == "cuda:0" and not np.array_equal(x.strides, (64, 1))
    np.testing.assert_allclose(ops.add(x, y).cpu().numpy(), (a + b).cpu().numpy(), rtol=1e-6)
    np.testing.assert_allclose(ops.gelu(x).cpu().numpy(), torch.nn.functional.gelu(a).cpu().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_copies_and_host_reads() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = opforge.tensor(x, device="cuda")
    assert t.device == "cuda:0" and t.to("cuda") is t
    np.testing.assert_array_equal(t.cpu().numpy(), x)
    np.testing.assert_array_equal(t.to("cpu").numpy(), x)
    assert opforge.tensor(x, device="cuda", dtype="float16").cpu().dtype == "float16"
    assert ops.sum(opforge.tensor(x)).item() == 66.0 and t.reshape([12]).cpu().shape == (12,)
    with pytest.raises(TypeError, match=r"\[numpy\] the tensor is on cuda:0: .*\.cpu\(\)"):
        t.numpy()
    with pytest.raises(TypeError, match=r"the tensor is on cuda:0"):
        memoryview(t)
    assert opforge.tensor([[7.5]], device="cuda").item() == 7.5
    assert "device='cuda:0'" in repr(t)


def test_allocator_reuses_freed_blocks() -> None:
    opforge.cuda.synchronize()
    base = opforge.cuda.memory_allocated()
    x = opforge.tensor(np.ones(1 << 20, np.float32), device="cuda")
    assert opforge.cuda.memory_allocated() == base + 4 * (1 << 20)
    for _ in range(100):  # one block in flight at a time: the pool hands the same memory back
        y = ops.mul(x, x)
        del y
    del x
    opforge.cuda.synchronize()
    assert opforge.cuda.memory_allocated() == base
    opforge.cuda.empty_cache()


def test_streams_order_work_and_restore() -> None:
    default = opforge.cuda.current_stream()
    s = opforge.cuda.Stream()
    with s:
        assert opforge.cuda.current_stream() == s
        x = opforge.tensor(np.arange(1 << 16, dtype=np.float32), device="cuda")
        y = ops.mul(x, x)
    s.synchronize()
    assert opforge.cuda.current_stream() == default
    np.testing.assert_array_equal(y.cpu().numpy(), np.arange(1 << 16, dtype=np.float32) ** 2)


def test_dlpack_with_torch_is_zero_copy_and_ordered() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    a = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    t = opforge.from_dlpack(a)
    assert t.__dlpack_device__() == (2, 0)
    b = torch.from_dlpack(ops.mul(t, t))
    assert b.device.type == "cuda"
    torch.testing.assert_close(b, a * a)
    back = torch.from_dlpack(t)
    assert back.data_ptr() == a.data_ptr()  # zero copy both ways
    # opforge's work on its own stream, consumed on torch's: __dlpack__(stream=) orders it
    with opforge.cuda.Stream():
        c = ops.add(t, t)
    torch.testing.assert_close(torch.from_dlpack(c), a + a)


def test_mixed_devices_and_ops_without_cuda_rows_are_clear_errors() -> None:
    x = opforge.tensor(np.ones(4, np.float32), device="cuda")
    with pytest.raises(RuntimeError, match=r"\[mul\] inputs are on different devices: 'x' on cuda:0, 'y' on cpu"):
        ops.mul(x, np.ones(4, np.float32))
    with pytest.raises(RuntimeError, match=r"\[matmul\] has no kernel for target cuda"):
        ops.matmul(x, x)
    # mul's cuda rows leave out its integer dtypes: checked against the cuda rows, not the cpu ones
    with pytest.raises(TypeError, match=r"\[mul\] dtype int64 is not supported on target cuda; supported \(T\): "
                                        r"float16; bfloat16; float32; float64"):
        ops.mul(opforge.tensor(np.ones(4, np.int64), device="cuda"), opforge.tensor(np.ones(4, np.int64), device="cuda"))


GRAD_OPS = [c for c in CUDA_CASES if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)]


@pytest.mark.parametrize("case", GRAD_OPS, ids=lambda c: c.id)
def test_gradients_on_cuda_match_the_cpu(case: Case) -> None:
    # backward on the device: the bprop formulas' ops, ReduceGrad's sums to a shape, accumulation
    data = make_data(case.op, case.dtype, case.shapes, np.random.default_rng(2))
    grads = {}
    for device in ("cpu", "cuda"):
        leaves = [None if x is None else opforge.tensor(x, device=device, requires_grad=inp.differentiable)
                  for x, inp in zip(to_inputs(case.op, case.dtype, data), case.op.inputs)]
        outs = getattr(ops, case.op.name)(*leaves, **case.attrs)
        out = outs[0] if isinstance(outs, tuple) else outs
        dout = np.random.default_rng(3).uniform(-1, 1, out.shape)
        out.backward(opforge.tensor(dout, dtype=out.dtype, device=device))
        grads[device] = [None if t is None or t.grad is None else t.grad for t in leaves]
    for g_cpu, g_cuda in zip(grads["cpu"], grads["cuda"]):
        assert (g_cpu is None) == (g_cuda is None)
        if g_cpu is not None:
            assert g_cuda.device == "cuda:0" and g_cuda.shape == g_cpu.shape
            np.testing.assert_allclose(g_cuda.cpu().numpy(), g_cpu.numpy(), rtol=1e-10, atol=1e-12)
