"""Tensor: zero-copy exchange with NumPy and DLPack, dtypes, strides, 0-d and empty tensors."""

from __future__ import annotations

import gc
import threading

import re

import numpy as np
import pytest

import opforge
from opforge import ops

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_from_numpy_is_zero_copy_for_every_dtype(dtype: str) -> None:
    a = np.zeros((2, 3), dtype)
    t = opforge.from_numpy(a)
    assert t.dtype == dtype and t.shape == (2, 3) and t.strides == (3, 1)
    a[1, 2] = 1
    assert t.numpy()[1, 2] == 1
    assert np.shares_memory(t.numpy(), a)


def test_bfloat16_round_trips_through_float32() -> None:
    x = np.array([1.0, 0.5, -3.25, 1e-3], np.float32)
    b = opforge.tensor(x).astype("bfloat16")
    assert b.dtype == "bfloat16"
    np.testing.assert_allclose(b.astype("float32").numpy(), x, rtol=1e-2)
    with pytest.raises(TypeError, match=r"\[numpy\] NumPy has no bfloat16 dtype"):
        b.numpy()


def test_float16_conversion_is_exact_for_representable_values() -> None:
    h = np.array([0.0, -0.0, 1.0, 65504.0, 6.1e-5, 5.96e-8, np.inf, -np.inf], np.float16)
    t = opforge.tensor(h.astype(np.float32)).astype("float16")
    np.testing.assert_array_equal(t.numpy(), h)
    assert np.isnan(opforge.tensor(np.float32(np.nan)).astype("float16").item())


def test_every_float16_widens_exactly() -> None:
    # (to_float selects its case by bit masks, so that loops reading float16 vectorize: every one
    # of the 65,536 values, subnormals, infinities and NaN payloads included, as NumPy widens it)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = opforge.from_numpy(h).astype("float32").numpy()
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))
    # and through a kernel's loads: each value plus a float16 zero
    finite = h[~np.isnan(h)]
    np.testing.assert_array_equal(ops.add(finite, np.zeros_like(finite)).numpy().view(np.uint16),
                                  (finite + np.float16(0)).view(np.uint16))


def _saturated(x: np.ndarray, dtype: str) -> np.ndarray:
    """x truncated toward zero and clamped to dtype's range, NaN 0 (the reference of a float to
    integer conversion; NumPy's own cast leaves out-of-range values to the platform)."""
    info = np.iinfo(dtype)
    def one(v: float) -> int:
        if np.isnan(v):
            return 0
        if np.isinf(v):
            return int(info.max) if v > 0 else int(info.min)
        return min(max(int(v), int(info.min)), int(info.max))  # (int() truncates, exactly)
    return np.array([one(float(v)) for v in x], dtype)


@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("dst", ["uint8", "int8", "int16", "int32", "int64"])
def test_float_to_integer_conversion_truncates_and_saturates(src: str, dst: str) -> None:
    # a C++ conversion out of the integer's range is undefined: opforge saturates, NaN giving 0, as
    # CUDA and XLA do (the host and the device agree); in-range values truncate toward zero
    x = np.array([0.0, -0.0, 2.9, -2.9, -0.9, 127.9, 128.0, -128.9, -129.0, 255.9, 256.0, 300.7, -300.7,
                  32767.5, 32768.0, 65504.0, -65504.0, 2.0**31 - 128, 2.0**31, -(2.0**31), -(2.0**31) - 256,
                  2.0**40, 2.0**63, -(2.0**63), 1e30, -1e30, np.inf, -np.inf, np.nan, -np.nan])
    x = np.tile(x, 40)  # (the vectorized loop too)
    t = opforge.tensor(x).astype(src)
    exact = t.astype("float64").numpy()  # (the values src holds)
    got = t.astype(dst)
    assert got.dtype == dst
    np.testing.assert_array_equal(got.numpy(), _saturated(exact, dst))


def test_tensor_owner_is_kept_alive() -> None:
    a = np.arange(6.0)
    t = opforge.from_numpy(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), np.arange(6.0))
    view = ops.mul(t, 2.0).numpy()
    gc.collect()
    np.testing.assert_array_equal(view, np.arange(6.0) * 2)


def test_numpy_view_keeps_tensor_alive() -> None:
    arr = ops.add(np.ones(4), np.ones(4)).numpy()
    gc.collect()
    np.testing.assert_array_equal(arr, [2, 2, 2, 2])


def test_ops_on_arrays_return_tensors_sharing_memory_with_numpy() -> None:
    out = ops.mul(np.ones(3, np.float32), np.full(3, 2, np.float32))
    assert isinstance(out, opforge.Tensor)
    a = out.numpy()
    b = out.numpy()
    assert np.shares_memory(a, b)


def test_dlpack_both_ways_zero_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = opforge.from_dlpack(a)
    assert t.shape == (3, 2) and t.strides == (4, 2)
    a[0, 1] = 100
    assert t.numpy()[0, 1] == 100
    back = np.from_dlpack(t)
    assert np.shares_memory(back, a)
    assert t.__dlpack_device__() == (1, 0)
    cap = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)


def test_dlpack_owner_is_kept_alive() -> None:
    t = opforge.from_dlpack(np.arange(5, dtype=np.int64))
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), np.arange(5))


def test_tensor_copies_and_infers_dtype() -> None:
    a = np.ones(3, np.float32)
    t = opforge.tensor(a)
    a[0] = 5
    assert t.numpy()[0] == 1
    assert opforge.tensor([1, 2]).dtype == "int64"
    assert opforge.tensor([1.0, 2.0]).dtype == "float64"
    assert opforge.tensor([1.0], dtype="float16").dtype == "float16"
    assert opforge.tensor(np.float32(2.0)).shape == ()
    with pytest.raises(TypeError, match=r"\[tensor\] cannot make a tensor from list"):
        opforge.tensor(["a"])
    with pytest.raises(TypeError, match=r"\[tensor\] unknown dtype 'float8'"):
        opforge.tensor([1.0], dtype="float8")


def test_zero_dim_and_empty_tensors() -> None:
    s = ops.add(np.float64(2.0), np.float64(3.0))
    assert s.shape == () and s.item() == 5.0 and float(s) == 5.0
    e = ops.exp(np.zeros((0, 3), np.float32))
    assert e.shape == (0, 3) and e.numpy().size == 0
    assert ops.sum(np.zeros((0, 3))).item() == 0.0
    assert ops.sum(np.zeros((0, 3)), axis=0).shape == (3,)


def test_non_contiguous_inputs() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    view = base.T[::2]
    np.testing.assert_array_equal(ops.neg(view).numpy(), -view)
    np.testing.assert_array_equal(ops.add(view, base.T[1::2]).numpy(), view + base.T[1::2])
    rev = np.arange(5.0)[::-1]
    np.testing.assert_array_equal(ops.mul(rev, 2.0).numpy(), rev * 2)


def test_python_scalars_take_the_bound_dtype() -> None:
    x = np.ones(3, np.float16)
    assert ops.mul(x, 2.0).dtype == "float16"
    assert ops.mul(2, np.ones(3, np.int32)).dtype == "int32"
    assert ops.mul(2.0, 3.0).dtype == "float32"
    assert ops.where(True, 1.0, 2.0).item() == 1.0


def test_tensor_methods_and_operators() -> None:
    x = opforge.tensor([1.0, -2.0, 3.0])
    np.testing.assert_array_equal((x * 2 + 1 - x / 2).numpy(), [2.5, -2.0, 5.5])
    np.testing.assert_array_equal((2 - x).numpy(), [1.0, 4.0, -1.0])
    np.testing.assert_array_equal((-x).numpy(), [-1.0, 2.0, -3.0])
    np.testing.assert_array_equal((x > 0).numpy(), [True, False, True])
    assert x.sum().item() == 2.0 and len(x) == 3 and x.ndim == 1 and x.size == 3
    assert repr(x) == "tensor([ 1., -2.,  3.], dtype=float64)"
    assert x.reshape([3, 1]).shape == (3, 1)
    # NumPy defers to Tensor's operators instead of broadcasting over a Tensor object
    assert isinstance(np.ones(3) * x, opforge.Tensor)
    m = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal((x @ opforge.tensor(m)).numpy(), x.numpy() @ m)
    np.testing.assert_array_equal((m.T @ x).numpy(), m.T @ x.numpy())  # __rmatmul__


def test_format_tags() -> None:
    x = opforge.tensor(np.ones((1, 2, 2, 2)), format="NHWC")
    assert x.format == "NHWC" and ops.exp(x).format == "NHWC"
    with pytest.raises(ValueError, match="unknown format 'NCWH'"):
        x.with_format("NCWH")


def test_read_only_memory_stays_read_only() -> None:
    a = np.arange(4.0)
    a.setflags(write=False)
    t = opforge.from_numpy(a)
    assert not t.numpy().flags.writeable
    assert memoryview(t).readonly
    with pytest.raises(ValueError, match="read-only"):
        t.numpy()[0] = 1
    b = b"abcd"
    with pytest.raises(ValueError, match="read-only"):
        opforge.from_numpy(b).numpy()[0] = 65
    assert b == b"abcd"
    # DLPack: the versioned capsule says read-only; the legacy one carries a copy
    back = np.from_dlpack(t)
    assert not back.flags.writeable or not np.shares_memory(back, a)
    assert ops.add(t, 1.0).numpy().flags.writeable


def test_kernels_run_without_the_gil() -> None:
    """Kernels of calls with 16384 input elements or more run with the GIL released; tiny calls
    keep it (releasing and taking it back would cost more than the kernel, as in NumPy)."""
    opforge._C._trace_gil(True)
    ops.mul(np.ones(20000), 2.0)
    ops.sum(np.ones((200, 200)))
    ops.mul(np.ones(3), 2.0)
    calls = opforge._C._trace_gil(False)
    assert calls == [("mul", False), ("sum", False), ("mul", True)]


def test_ops_run_concurrently_in_threads() -> None:
    a = np.random.default_rng(0).standard_normal((256, 256))
    results = []

    def work() -> None:
        results.append(ops.tanh(ops.mul(a, a)).numpy().sum())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 4 and np.allclose(results, np.tanh(a * a).sum())


def test_list_ops_backend_and_op_info() -> None:
    # every wheel (cpu, cu130) has the cpu kernels
    assert "cpu" in opforge._formulas.BUILDS[opforge.backend].targets
    assert {"mul", "layer_norm", "where", "sum"} <= set(opforge.list_ops())
    info, gpu = opforge.op_info("where")  # one entry per target, as MindSpore's CustomRegOp
    assert info["op_name"] == "where" and info["target"] == "CPU" and gpu["target"] == "GPU"
    assert info["inputs"] == [{"index": 0, "name": "condition", "param_type": "required"},
                              {"index": 1, "name": "x", "param_type": "required"},
                              {"index": 2, "name": "y", "param_type": "required"}]
    assert info["outputs"] == [{"index": 0, "name": "out", "param_type": "required"}]
    assert info["attr"] == []
    assert (("bool", "NCHW"), ("float32", "NCHW"), ("float32", "NCHW"), ("float32", "NCHW")) in info["dtype_format"]
    ln = opforge.op_info("layer_norm")[0]
    assert ln["inputs"][1] == {"index": 1, "name": "weight", "param_type": "optional"}
    assert ln["attr"] == [
        {"name": "axis", "param_type": "optional", "value_type": "list[int]", "default_value": "[-1]"},
        {"name": "eps", "param_type": "optional", "value_type": "float", "default_value": "1e-05"}]
    targets = [i["target"] for i in opforge.op_info("mul")]
    assert targets == ["CPU", "GPU"]
    # an op function's own registration (two modules may define ops of one name)
    assert opforge.op_info(ops.where) == opforge.op_info("where")
    assert opforge.op_info(opforge._C._meta.layer_norm)[0] == ln
    with pytest.raises(TypeError, match=r"\[op_info\] takes an op function"):
        opforge.op_info(len)
    with pytest.raises(ValueError, match=r"\[op_info\] unknown op 'mull'"):
        opforge.op_info("mull")


def test_spec_model_is_readable_for_adapters() -> None:
    s = opforge.spec("leaky_relu")
    assert [a.name for a in s.attrs] == ["alpha"] and s.attrs[0].default == 0.01
    assert dict(s.bprop.grads)["x"].text == "where(x > 0, dout, dout * alpha)"  # derived from its expression
    assert s.bprop.derived == "impl.expr" and dict(s.jvp.tangents)["out"].text == "where(x > 0, x_t, x_t * alpha)"
    assert s.outputs[0].shape.kind == "same"


def test_numpy_scalars_keep_their_dtype() -> None:
    # np.float64 subclasses Python's float: it was taken as a Python scalar (float32 by default)
    assert ops.abs(np.float64(0.1)).dtype == "float64"
    assert ops.abs(np.float64(0.1)).item() == 0.1
    assert ops.abs(np.float32(0.1)).dtype == "float32"
    assert ops.abs(np.int64(3)).dtype == "int64"
    assert ops.abs(0.1).dtype == "float32"  # a Python float still follows the scalar rule


def test_copy_writes_into_the_tensor_broadcast_and_converted() -> None:
    x = opforge.tensor(np.zeros((2, 3), np.float32))
    view = x.numpy()
    assert x.copy_(np.arange(3, dtype=np.int64)) is x  # broadcast, converted; the same memory
    np.testing.assert_array_equal(view, [[0, 1, 2], [0, 1, 2]])
    version = x._version
    x.copy_(2.5)  # (a write: autograd's saved copies of x see it)
    np.testing.assert_array_equal(view, np.full((2, 3), 2.5, np.float32))
    assert x._version > version
    x.copy_(opforge.tensor(np.ones((2, 3), np.float64)))
    np.testing.assert_array_equal(view, np.ones((2, 3)))
    a = opforge.tensor(np.arange(9.0).reshape(3, 3))
    a.copy_(a.numpy().T)  # (src overlaps the tensor's memory: read before written)
    np.testing.assert_array_equal(a.numpy(), np.arange(9.0).reshape(3, 3).T)


def test_copy_of_a_python_number_is_exact_and_checked_as_ops_check_numbers() -> None:
    t = opforge.tensor(np.zeros(1, np.int64))
    for v in (2**53 + 1, -2**63, 2**63 - 1):
        t.copy_(v)
        assert t.item() == v
    u = opforge.tensor(np.zeros(2, np.int8))
    with pytest.raises(ValueError, match=re.escape("[copy_] the Python int 1000 is out of range for int8")):
        u.copy_(1000)
    with pytest.raises(ValueError, match=re.escape("[copy_] the Python int is out of range for int64")):
        t.copy_(2**63)
    with pytest.raises(TypeError, match=re.escape("[copy_] a Python float cannot be int8")):
        u.copy_(1.5)
    assert u.numpy().tolist() == [0, 0]
    u.copy_(True)
    assert u.numpy().tolist() == [1, 1]
    f = opforge.tensor(np.zeros(1, np.float32))
    f.copy_(2**24 + 1)
    assert f.item() == 2**24  # (rounded to float32 as NumPy rounds it)


def test_copy_errors_name_the_rule() -> None:
    x = opforge.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\[copy_\] shapes cannot be broadcast together: self \(2, 3\), src \(2, 2\)"):
        x.copy_(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"\[copy_\] src of shape \(1, 2, 3\) does not broadcast to the tensor's"):
        x.copy_(np.ones((1, 2, 3)))
    with pytest.raises(TypeError, match=r"\[copy_\] input 'src' must be a tensor, got None"):
        x.copy_(None)
    w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"\[copy_\] does not record gradients, but the tensor requires grad"):
        w.copy_(np.zeros(3))
    with opforge.no_grad():  # (a parameter's update: allowed)
        w.copy_(np.zeros(3))
    np.testing.assert_array_equal(w.detach().numpy(), np.zeros(3))
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"\[copy_\] the tensor is read-only"):
        opforge.from_numpy(ro).copy_(0.0)
    assert ro[0] == 1
    base = np.zeros(3, np.float32)
    spread = np.lib.stride_tricks.as_strided(base, shape=(4, 3), strides=(0, 4), writeable=True)
    with pytest.raises(ValueError, match=r"\[copy_\] the tensor has elements that share memory \(a broadcast view\)"):
        opforge.from_numpy(spread).copy_(np.ones((4, 3)))
    assert not base.any()
