"""Ops on CUDA devices: every expr op with cuda rows in every cuda dtype against the spec's NumPy
reference (contiguous, broadcast, strided through DLPack views of torch.cuda tensors, 0-d and
empty), and the device runtime (copies, allocator reuse, streams, DLPack both ways, mixed devices,
ops without cuda rows). Skipped without a CUDA device (CI has none; the GPU runs record results in
benchmarks/results/cuda-tests.md)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))
from cases import Case, all_specs, assert_outputs, cases, make_data, reference, to_inputs  # noqa: E402

pytestmark = pytest.mark.skipif(not opforge.cuda.is_available(),
                                reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")


def cuda_cases() -> list[Case]:
    """The cpu cases of ops whose cuda rows the cuda wheel runs (expr ops: generated kernels; cpp
    ops: their src/kernels/cuda/ files; composite ops: the kernels of the ops they call), in the
    dtypes of those rows."""
    out = []
    for c in cases():
        if c.op.impl.kind in ("expr", "cpp", "composite") and c.op.target("cuda") is not None:
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
    assert all(o.device == "cuda:0" for o in outs)
    assert_outputs(case, tuple(o.cpu() for o in outs), reference(case.op, data, case.attrs))


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
    with pytest.raises((TypeError, BufferError)) as info:  # (Python 3.12 wraps it: BufferError from TypeError)
        memoryview(t)
    assert "the tensor is on cuda:0" in str(info.value if info.type is TypeError else info.value.__cause__)
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


def test_a_stream_waits_for_another_on_the_device() -> None:
    # y is written on the default stream after ~0.1 s of matmuls; s reads it after wait_stream,
    # and only s is synchronized: without the device-side wait s would read y's block unwritten
    n, k = 4096, 32
    a = opforge.tensor(np.ones((n, n), np.float32), device="cuda")
    w = opforge.tensor(np.full(1 << 20, 3, np.float32), device="cuda")
    opforge.cuda.synchronize()
    default, s = opforge.cuda.current_stream(), opforge.cuda.Stream()
    outs = [ops.matmul(a, a) for _ in range(k)]
    y = ops.mul(w, w)
    s.wait_stream(default)
    with s:
        r = ops.add(y, y)
    s.synchronize()
    assert np.all(r.cpu().numpy() == 18)
    with pytest.raises(TypeError, match=r"wait_stream: expected an opforge.cuda.Stream, got int"):
        s.wait_stream(0)  # type: ignore[arg-type]
    del outs


def test_memory_used_on_another_stream_is_freed_after_that_work() -> None:
    # x is allocated on the default stream and read by work queued on s; freeing it must wait for
    # that work (runtime note_device_use / the free's join_uses), or the default stream's next
    # allocation, which gets x's block back, is written while s still reads it. (Without the join
    # the race is likely, not certain; with it the results are always right.)
    n, k = 4096, 64
    ones, huge = np.ones((n, n), np.float32), np.full((n, n), 1e30, np.float32)
    opforge.cuda.synchronize()
    opforge.cuda.empty_cache()  # (so that x's block is the one the pool hands back)
    x = opforge.tensor(ones, device="cuda")
    opforge.cuda.synchronize()
    s = opforge.cuda.Stream()
    with s:
        outs = [ops.matmul(x, x) for _ in range(k)]  # ~0.2 s queued on s, each reading x
    del x
    z = opforge.tensor(huge, device="cuda")
    s.synchronize()
    for o in outs:
        assert np.all(o.cpu().numpy() == n)
    assert np.all(z.cpu().numpy() == 1e30)
    # the other way round: memory of s freed while the default stream still reads it
    del outs, z
    opforge.cuda.synchronize()
    opforge.cuda.empty_cache()
    with s:
        w = opforge.tensor(ones, device="cuda")
    s.synchronize()
    more = [ops.matmul(w, w) for _ in range(k)]
    del w
    with s:
        z2 = opforge.tensor(huge, device="cuda")
    opforge.cuda.synchronize()
    for o in more:
        assert np.all(o.cpu().numpy() == n)
    assert np.all(z2.cpu().numpy() == 1e30)


def test_source_of_a_copy_to_another_device_is_freed_after_the_copy() -> None:
    # the peer copy runs on the destination's stream and reads x on device 0: x freed on device 0
    # must wait for it (the copy makes device 0's stream wait for an event after it), or device 0's
    # next allocation, which gets x's block back, is written while the copy still reads it
    if opforge.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (a copy between devices)")
    n, k = 4096, 32
    ones, huge = np.ones((n, n), np.float32), np.full((n, n), 1e30, np.float32)
    opforge.cuda.synchronize(0)
    opforge.cuda.empty_cache()
    busy = opforge.tensor(ones, device="cuda:1")
    work = [ops.matmul(busy, busy) for _ in range(k)]  # device 1's stream busy for a while
    x = opforge.tensor(ones, device="cuda:0")
    opforge.cuda.synchronize(0)
    y = x.to("cuda:1")  # queued behind the matmuls on device 1
    del x
    z = opforge.tensor(huge, device="cuda:0")
    assert np.all(y.cpu().numpy() == 1) and np.all(z.cpu().numpy() == 1e30)
    assert all(np.all(w.cpu().numpy() == n) for w in work)


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


def test_python_numbers_go_to_the_calls_device() -> None:
    """A Python number beside cuda tensors becomes a 0-d tensor on their device (a fill there, as
    torch's and JAX's scalars do; it was refused as an input on the cpu), checked as numbers are
    on the cpu; opforge.optim's steps pass their scalars so."""
    x = opforge.tensor(np.arange(4, dtype=np.float32), device="cuda")
    np.testing.assert_array_equal(ops.mul(x, 2.0).cpu().numpy(), np.arange(4) * 2.0)
    np.testing.assert_allclose(ops.pow(2.0, x).cpu().numpy(), 2.0 ** np.arange(4), rtol=1e-6)
    where = ops.where(ops.greater(x, 1.5), 1.0, -1.0)  # (numbers alone of their type variable: float32)
    assert where.device == "cuda:0" and where.dtype == "float32"
    np.testing.assert_array_equal(where.cpu().numpy(), [-1.0, -1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match=re.escape("[mul] input 'y': a Python float cannot be int64")):
        ops.mul(opforge.tensor(np.ones(4, np.int64), device="cuda"), 1.5)
    rng = np.random.default_rng(2)
    for make in (lambda ps: opforge.optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: opforge.optim.AdamW(ps, lr=0.01)):
        w0, grad = rng.standard_normal((2, 5, 3)).astype(np.float32)
        ws = [opforge.tensor(w0, device=d, requires_grad=True) for d in ("cpu", "cuda")]
        opts = [make([w]) for w in ws]
        for _ in range(3):
            for w, opt in zip(ws, opts):
                w.grad = opforge.tensor(grad, device=w.device)
                opt.step()
        # (nvcc contracts the step's multiply-adds into FMAs; the cpu build does not)
        np.testing.assert_allclose(ws[1].detach().cpu().numpy(), ws[0].detach().numpy(), rtol=2e-5, atol=1e-6)


def test_mixed_devices_and_ops_without_cuda_rows_are_clear_errors() -> None:
    x = opforge.tensor(np.ones(4, np.float32), device="cuda")
    with pytest.raises(RuntimeError, match=r"\[mul\] inputs are on different devices: 'x' on cuda:0, 'y' on cpu"):
        ops.mul(x, np.ones(4, np.float32))
    # leaky_relu_ext's kernel is a host function of an external library (impl aot): cpu only
    with pytest.raises(RuntimeError, match=r"\[leaky_relu_ext\] has no kernel for target cuda"):
        ops.leaky_relu_ext(x)
    # mul's cuda rows leave out its integer dtypes: checked against the cuda rows, not the cpu ones
    with pytest.raises(TypeError, match=r"\[mul\] dtype int64 is not supported on target cuda; supported \(T\): "
                                        r"float16; bfloat16; float32; float64"):
        ops.mul(opforge.tensor(np.ones(4, np.int64), device="cuda"), opforge.tensor(np.ones(4, np.int64), device="cuda"))


# ops without cuda rows (leaky_relu_ext: a host library's kernel): a bprop calling one cannot run on cuda
NO_CUDA = {o.name for o in all_specs() if o.target("cuda") is None}


def backward_needs(op) -> set[str]:  # type: ignore[no-untyped-def]
    """The ops without cuda rows that op's bprop formulas call."""
    texts = [f.text for _, f in op.bprop.lets + op.bprop.grads] if op.bprop else []
    return {n for n in NO_CUDA for t in texts if re.search(rf"\b{n}\(", t)}


GRAD_OPS = [c for c in CUDA_CASES if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)
            and not backward_needs(c.op)]


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


def test_max_gradient_scatters_on_cuda() -> None:
    # max's gradient scatters through scatter_add_along_axis (part 2's cuda kernel)
    assert backward_needs(next(o for o in all_specs() if o.name == "max")) == set()
    grads = []
    for device in ("cpu", "cuda"):
        x = opforge.tensor(np.array([[1.0, 5.0, 5.0], [7.0, 2.0, 3.0]]), device=device, requires_grad=True)
        values, _ = ops.max(x, axis=1)
        ops.sum(values).backward()
        grads.append(x.grad.cpu().numpy())
    np.testing.assert_array_equal(grads[1], grads[0])
    np.testing.assert_array_equal(grads[1], [[0, 1, 0], [1, 0, 0]])


# ---------------------------------------------------------------------------- reductions (CUB)

REDUCE_SHAPES = [
    (1 << 22,),        # one row: the device-wide reduction
    (3, 100_003),      # few long rows: split into chunks, then the chunks' partials
    (4096, 37),        # many short rows: a block per row
    (0, 5), (5, 0), (),
]


@pytest.mark.parametrize("shape", REDUCE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_sum_and_mean_over_every_layout(shape: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(4)
    x = (rng.integers(-50, 50, shape) if dtype == "int64" else rng.standard_normal(shape)).astype(dtype)
    t = on_cuda(x)
    axes: list = [None] + ([[-1], [0]] if x.ndim == 2 else [])
    for axis in axes:
        want = np.sum(x.astype(np.float64), axis=None if axis is None else tuple(axis))
        got = ops.sum(t, axis=axis).cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-3 if dtype == "float32" else 0)
        if dtype != "int64":
            with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # (NumPy's "Mean of empty slice")
                want_mean = np.mean(x.astype(np.float64), axis=None if axis is None else tuple(axis))
            np.testing.assert_allclose(ops.mean(t, axis=axis).cpu().numpy(), want_mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_arithmetic_wraps_as_numpy_on_cuda(dtype: str) -> None:
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, info.max, -1, info.min, 0, 7], dtype)
    y = np.array([1, -1, info.max, info.min, info.min, info.min, -9], dtype)
    with np.errstate(over="ignore"):
        for op, want in [("add", np.add(x, y)), ("sub", np.subtract(x, y)), ("neg", np.negative(x)),
                         ("abs", np.abs(x))]:
            got = getattr(ops, op)(*[on_cuda(a) for a in ((x, y) if op in ("add", "sub") else (x,))])
            np.testing.assert_array_equal(got.cpu().numpy(), want, err_msg=op)
        b = np.arange(1, 6, dtype=dtype)
        xs = np.full((3, 5, 4), info.max, dtype)
        np.testing.assert_array_equal(ops.bias_add(on_cuda(xs), on_cuda(b)).cpu().numpy(), xs + b[:, None])
        src = np.full((4, 3), info.max, dtype)
        got = ops.scatter_add_along_axis(on_cuda(src), on_cuda(np.zeros((4, 3), np.int64)), on_cuda(src), axis=0)
        np.testing.assert_array_equal(got.cpu().numpy()[0], src.sum(axis=0, dtype=dtype))
    big = np.array([[2 ** 60 + 1, 0], [1, 2]], np.int64)  # exact above 2^53
    for axis in [None, [0], [1]]:
        want = big.sum(axis=None if axis is None else tuple(axis))
        np.testing.assert_array_equal(ops.sum(on_cuda(big), axis=axis).cpu().numpy(), want)


# tests/test_jit.py's op, renamed (both files may run in one process, whose op registry is one)
INT_POW = (Path(__file__).resolve().parent.parent / "fixtures" / "int_pow.yaml").read_text()
INT_POW = INT_POW.replace("int_pow:", "int_pow_dev:")


def test_integer_pow_of_an_expr_wraps_on_cuda_as_on_cpu(tmp_path: Path) -> None:
    # fn::pow of integers (elementwise.h's int_pow) in device code: exact, wrapping, 1/x truncated
    # for a negative exponent; tests/test_jit.py holds the cpu kernel to NumPy
    (tmp_path / "int_pow_dev.yaml").write_text(INT_POW)
    m = opforge.load("jit_int_pow_dev", [tmp_path / "int_pow_dev.yaml"], build_dir=tmp_path / "cache")
    assert m.__opforge_formulas__["int_pow_dev"].runs == ("cpu", "cuda")
    for dtype in ["int8", "uint8", "int32", "int64"]:
        info = np.iinfo(dtype)
        base = np.array([3, 3, -3, 7, 0, 0, 2, 2, -1, -1, 1, 2, 5, -7], np.int64)
        exp = np.array([39, 40, 41, 0, 0, 5, info.bits - 1, info.bits, -5, -4, -5, -1, 1, -3], np.int64)
        x, y = base.astype(dtype), exp.astype(dtype)  # (wrapped as NumPy casts)
        want = m.int_pow_dev(x, y).numpy()
        got = m.int_pow_dev(on_cuda(x), on_cuda(y)).cpu().numpy()
        np.testing.assert_array_equal(got, want, err_msg=dtype)
        ok = (y >= 0) if info.min < 0 else np.ones(len(y), bool)
        np.testing.assert_array_equal(got[ok], np.power(x[ok], y[ok]), err_msg=dtype)


def test_half_sums_accumulate_in_float() -> None:
    x = np.full(60_000, 1.0, np.float16)  # a float16 accumulator would stop at 2048 (60000 is a float16)
    assert ops.sum(opforge.tensor(x, device="cuda")).cpu().numpy().astype(np.float32) == 60_000.0


@pytest.mark.parametrize("shape,axis", [((3, 100_003), 1), ((100_003, 3), 0), ((7, 5, 9), 1), ((1 << 21,), 0),
                                        ((), -1)], ids=str)
@pytest.mark.parametrize("which", ["max", "min"])
def test_max_min_values_and_first_index(shape: tuple[int, ...], axis: int, which: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.integers(-20, 20, shape).astype(np.float32)  # many ties: the first index must win
    values, indices = getattr(ops, which)(on_cuda(x), axis=axis)
    np.testing.assert_array_equal(values.cpu().numpy(), getattr(np, which)(x, axis=axis))
    np.testing.assert_array_equal(indices.cpu().numpy(), getattr(np, f"arg{which}")(x, axis=axis))


def test_max_min_nan_wins_and_empty_axis_raises() -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan], [-np.inf, -np.inf, -np.inf, -np.inf], [-0.0, 0.0, 2.0, 2.0]], np.float32)
    for which in ("max", "min"):
        values, indices = getattr(ops, which)(on_cuda(x), axis=1)
        np.testing.assert_array_equal(indices.cpu().numpy(), getattr(np, f"arg{which}")(x, axis=1))
        np.testing.assert_array_equal(values.cpu().numpy(), getattr(np, which)(x, axis=1))
        with pytest.raises(ValueError, match=rf"\[{which}\] cannot take the {which} over axis 1 of size 0"):
            getattr(ops, which)(on_cuda(np.ones((2, 0), np.float32)), axis=1)
    assert np.signbit(ops.min(on_cuda(x[2:, :2]), axis=1)[0].cpu().numpy()[0])  # the element itself: -0.0


@pytest.mark.parametrize("shape,axis", [((3, 100_003), [1]), ((64, 33), [0]), ((4, 5, 6), [0, 2]), ((1 << 20,), None),
                                        ((2, 0), [1])], ids=str)
def test_logsumexp_matches_numpy(shape: tuple[int, ...], axis) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(6).standard_normal(shape) * 30
    want = np.logaddexp.reduce(x, axis=None if axis is None else tuple(axis)) if x.size else np.full(shape[0], -np.inf)
    for dtype, rtol in (("float64", 1e-12), ("float32", 1e-5)):
        got = ops.logsumexp(on_cuda(x.astype(dtype)), axis=axis).cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=rtol)


def test_logsumexp_infinities_and_nan() -> None:
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0], [-np.inf, 0.0]], np.float32)
    got = ops.logsumexp(on_cuda(x), axis=[1]).cpu().numpy()
    np.testing.assert_array_equal(got[:2], [-np.inf, np.inf])
    assert np.isnan(got[2]) and got[3] == 0.0


def test_dlpack_with_cupy_both_ways_on_cupys_stream() -> None:
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    a = cp.arange(1 << 20, dtype=cp.float32)
    t = opforge.from_dlpack(a)  # CuPy's __dlpack__ orders its work before our current stream's
    assert t.device == "cuda:0" and t.shape == (1 << 20,)
    s = cp.cuda.Stream(non_blocking=True)
    with opforge.cuda.Stream():  # made on one of our streams, consumed on CuPy's: an event orders it
        y = ops.mul(t, t)
    with s:
        b = cp.from_dlpack(y)
        total = float(b.sum())
    assert cp.from_dlpack(y).data.ptr == b.data.ptr  # the same memory each time: no copies
    assert total == float((a * a).sum())
    assert cp.from_dlpack(t).data.ptr == a.data.ptr  # zero copy back


def test_double_backward_on_cuda_matches_the_cpu() -> None:
    x0 = np.linspace(-2.0, 2.0, 11)
    results = {}
    for device in ("cpu", "cuda"):
        x = opforge.tensor(x0, device=device, requires_grad=True)
        y = ops.sum(ops.mul(ops.tanh(x), ops.exp(x)))
        (g,) = opforge.gradients([y], [x], create_graph=True)
        (gg,) = opforge.gradients([ops.sum(g)], [x])
        assert gg.device == ("cuda:0" if device == "cuda" else "cpu")
        results[device] = (g.detach().cpu().numpy(), gg.cpu().numpy())
    for a, b in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_moves_between_devices_are_differentiable() -> None:
    a = np.linspace(-1.0, 1.0, 7)
    x = opforge.tensor(a, device="cuda", requires_grad=True)
    y = ops.sum(ops.mul(x.cpu(), x.cpu()))  # the loss on the host, x on the device
    assert y.device == "cpu"
    y.backward()
    assert x.grad.device == "cuda:0"
    np.testing.assert_allclose(x.grad.cpu().numpy(), 2 * a, rtol=1e-12)
    h = opforge.tensor(a, requires_grad=True)
    (g,) = opforge.gradients([ops.sum(ops.exp(h.to("cuda")))], [h])
    assert g.device == "cpu"
    np.testing.assert_allclose(g.numpy(), np.exp(a), rtol=1e-12)
    # forward mode: the tangent comes along to the other device
    value, tangent = opforge.jvp(lambda t: ops.sum(ops.mul(t.cpu(), t.cpu())), (x.detach(),),
                                 (opforge.tensor(np.ones(7), device="cuda"),))
    assert tangent.device == "cpu"
    np.testing.assert_allclose(tangent.numpy(), 2 * a.sum(), rtol=1e-12)
