"""out= on every op, in-place variants declared by `inplace:` in the spec, and the version counter
that keeps both from corrupting gradients (PyTorch's rules: a tensor saved for backward and then
written makes that backward fail; a leaf that requires grad is not written while gradients are
recorded)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops

rng = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------- out=

@pytest.mark.parametrize("name,args,attrs", [
    ("add", (f32(3, 4), f32(4)), {}),                         # expr, broadcast
    ("gelu", (f32(5, 6),), {}),                               # expr, one input
    ("matmul", (f32(3, 5), f32(5, 2)), {}),                   # cpp
    ("softmax", (f32(4, 7),), {"axis": -1}),                  # cpp, row kernel
    ("sum", (f32(4, 7),), {"axis": [1]}),                     # reduction
    ("linear", (f32(6, 5), f32(3, 5), f32(3)), {}),           # composite of several kernels
], ids=lambda v: v if isinstance(v, str) else "")
def test_out_writes_the_result_into_the_given_tensor(name, args, attrs) -> None:  # type: ignore[no-untyped-def]
    fn = getattr(ops, name)
    want = fn(*args, **attrs).numpy()
    out = opforge.tensor(np.full(want.shape, np.nan, want.dtype))
    version = out._version
    got = fn(*args, **attrs, out=out)
    assert got is out
    np.testing.assert_array_equal(out.numpy(), want)
    assert out._version == version + 1


def test_out_with_several_outputs_takes_a_tuple() -> None:
    x = f32(4, 6)
    values, indices = ops.max(x, axis=1)
    v_out = opforge.tensor(np.zeros(4, np.float32))
    i_out = opforge.tensor(np.zeros(4, np.int64))
    got = ops.max(x, axis=1, out=(v_out, i_out))
    assert got[0] is v_out and got[1] is i_out
    np.testing.assert_array_equal(v_out.numpy(), values.numpy())
    np.testing.assert_array_equal(i_out.numpy(), indices.numpy())
    with pytest.raises(TypeError, match=re.escape("[max] out= needs a tuple of 2 tensors, one per output")):
        ops.max(x, axis=1, out=v_out)
    p = opforge.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=re.escape("[sincos] out tensors 0 and 1 share memory: each output needs its own")):
        ops.sincos(np.zeros((2, 3), np.float32), out=(p, p))
    assert p.numpy().tolist() == [[1.0] * 3] * 2


def test_out_into_a_strided_view_and_into_an_input() -> None:
    base = opforge.tensor(np.zeros((4, 6), np.float32))
    view = opforge.from_numpy(base.numpy()[:, ::2])      # non-contiguous: the result is copied in
    a, b = f32(4, 3), f32(4, 3)
    ops.mul(a, b, out=view)
    np.testing.assert_array_equal(base.numpy()[:, ::2], a * b)
    np.testing.assert_array_equal(base.numpy()[:, 1::2], 0)
    x = opforge.tensor(f32(5, 5))
    x0 = x.numpy().copy()
    ops.mul(x, x, out=x)                                 # elementwise, exactly aliased: written in the kernel
    np.testing.assert_array_equal(x.numpy(), x0 * x0)
    m = opforge.tensor(f32(5, 5))
    m0 = m.numpy().copy()
    ops.matmul(m, m, out=m)                              # not elementwise: computed apart, then copied
    np.testing.assert_allclose(m.numpy(), m0 @ m0, rtol=1e-5, atol=1e-5)


def test_out_overlapping_an_input_of_another_wrapper_is_computed_apart() -> None:
    # (each wrapping of one NumPy array is a Storage of its own: the overlap is found by memory)
    a, b = np.random.default_rng(0).standard_normal((2, 64, 64))
    want = a @ b
    ops.matmul(a, b, out=opforge.from_numpy(a))
    np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
    t = opforge.tensor(np.arange(1000.0))
    ops.mul(t.numpy()[::-1], 2.0, out=t)                 # elementwise, reversed: not an exact alias
    np.testing.assert_array_equal(t.numpy(), np.arange(1000.0)[::-1] * 2)
    t = opforge.tensor(np.arange(1000.0))
    ops.add_(t, t.numpy()[::-1])
    np.testing.assert_array_equal(t.numpy(), np.arange(1000.0) + np.arange(1000.0)[::-1])
    s = np.ones(1000)
    s[::2] = 5
    want = s[:-1] * 2
    ops.mul(s[:-1], 2.0, out=opforge.from_numpy(s[1:]))  # shifted by one element
    np.testing.assert_array_equal(s[1:], want)
    m = np.arange(64.0).reshape(8, 8)
    want = m.T.copy()
    ops.transpose(m, out=opforge.from_numpy(m))
    np.testing.assert_array_equal(m, want)
    buf = np.zeros((2, 3))
    with pytest.raises(ValueError, match=re.escape("[sincos] out tensors 0 and 1 share memory: each output needs its own")):
        ops.sincos(np.ones((2, 3)), out=(opforge.from_numpy(buf), opforge.from_numpy(buf)))
    assert not buf.any()
    halves = np.zeros((2, 2, 3))                         # one array, memory apart: allowed
    ops.sincos(np.ones((2, 3)), out=(opforge.from_numpy(halves[0]), opforge.from_numpy(halves[1])))
    np.testing.assert_allclose(halves, [np.sin(np.ones((2, 3))), np.cos(np.ones((2, 3)))])


@pytest.mark.parametrize("out,message", [
    (np.zeros((3, 4), np.float64), "[add] out is float64 of shape (3, 4), but output 'out' is float32 of shape (3, 4)"),
    (np.zeros((4, 3), np.float32), "[add] out is float32 of shape (4, 3), but output 'out' is float32 of shape (3, 4)"),
    (np.zeros((4,), np.float32), "[add] out is float32 of shape (4,), but output 'out' is float32 of shape (3, 4)"),
])
def test_out_of_the_wrong_dtype_or_shape_is_refused_and_left_alone(out: np.ndarray, message: str) -> None:
    t = opforge.tensor(out)
    with pytest.raises(ValueError, match=re.escape(message)):
        ops.add(f32(3, 4), f32(3, 4), out=t)
    np.testing.assert_array_equal(t.numpy(), out)
    assert t._version == 0


def test_out_that_cannot_be_written() -> None:
    frozen = np.zeros((3,), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=re.escape("[exp] out is read-only")):
        ops.exp(f32(3), out=opforge.from_numpy(frozen))
    with pytest.raises(TypeError, match=re.escape("[exp] out= must be an opforge.Tensor, got ndarray")):
        ops.exp(f32(3), out=np.zeros(3, np.float32))
    assert ops.exp(np.zeros(3, np.float32), out=None).numpy().tolist() == [1.0, 1.0, 1.0]


def test_out_records_no_gradients() -> None:
    x = opforge.tensor(f32(3), requires_grad=True)
    out = opforge.tensor(np.zeros(3, np.float32))
    with pytest.raises(RuntimeError, match=re.escape("[exp] out= does not record gradients, but an input requires grad")):
        ops.exp(x, out=out)
    with opforge.no_grad():
        ops.exp(x, out=out)
    np.testing.assert_allclose(out.numpy(), np.exp(x.numpy()), rtol=1e-6)
    assert not out.requires_grad


# ---------------------------------------------------------------------------- in-place variants

@pytest.mark.parametrize("name,other", [("add_", 1.5), ("mul_", f32(4)), ("relu_", None), ("clamp_", None),
                                        ("exp_", None), ("pow_", 2.0)])
def test_inplace_variant_writes_into_its_first_input(name: str, other) -> None:  # type: ignore[no-untyped-def]
    base = name[:-1]
    x0 = f32(3, 4)
    args = () if other is None else (other,)
    attrs = {"min": -0.5, "max": 0.5} if base == "clamp" else {}
    want = getattr(ops, base)(x0, *args, **attrs).numpy()
    x = opforge.tensor(x0)
    got = getattr(ops, name)(x, *args, **attrs)
    assert got is x and x._version == 1
    np.testing.assert_array_equal(x.numpy(), want)


def test_inplace_keeps_the_shape_and_dtype_of_its_input() -> None:
    x = opforge.tensor(np.ones(4, np.float32))
    with pytest.raises(ValueError, match=re.escape("[add_] x is float32 of shape (4,), but output 'out' is float32 "
                                                   "of shape (3, 4)")):
        ops.add_(x, f32(3, 4))
    assert x.numpy().tolist() == [1.0] * 4 and x._version == 0
    with pytest.raises(TypeError, match=re.escape("[add_] writes into 'x', which must be an opforge.Tensor, "
                                                  "got ndarray")):
        ops.add_(np.ones(4, np.float32), 1.0)
    with pytest.raises(TypeError, match=re.escape("[add] unexpected keyword 'out'")):
        ops.add_(x, 1.0, out=x)                          # (the variant's out is its first input)


def test_inplace_on_a_leaf_that_requires_grad_only_under_no_grad() -> None:
    w = opforge.tensor(f32(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=re.escape("[mul_] 'x' is a leaf tensor that requires grad")):
        ops.mul_(w, 0.5)
    w0 = w.numpy().copy()
    with opforge.no_grad():
        ops.mul_(w, 0.5)                                 # the optimizer's update
    np.testing.assert_array_equal(w.numpy(), w0 * np.float32(0.5))
    assert w.requires_grad and w.grad_fn is None


def test_a_tensor_saved_for_backward_and_then_written_fails_that_backward() -> None:
    w = opforge.tensor(f32(3), requires_grad=True)
    x = opforge.tensor(f32(3))
    y = ops.mul(w, x)                                    # saves x for w's gradient
    with opforge.no_grad():
        ops.add_(x, 1.0)
    with pytest.raises(RuntimeError, match=r"\[mul\] saved tensor 1 \(of shape \(3,\)\) was modified in place after "
                                           r"mul used it: it is at version 1, saved at version 0"):
        ops.sum(y).backward()
    y = ops.mul(w, x)                                    # saved again at version 1: fine
    ops.sum(y).backward()
    np.testing.assert_array_equal(w.grad.numpy(), x.numpy())


def test_out_into_a_saved_tensor_is_caught_too() -> None:
    w = opforge.tensor(f32(3), requires_grad=True)
    y = ops.exp(w)                                       # saves its output
    with opforge.no_grad():
        ops.neg(f32(3), out=y)
    with pytest.raises(RuntimeError, match=r"\[exp\] saved tensor 0 .* was modified in place"):
        ops.sum(y).backward()


def test_inplace_on_an_intermediate_takes_its_gradient_like_pytorch() -> None:
    a0, b0 = f32(3, 4), f32(3, 4)
    a = opforge.tensor(a0, requires_grad=True)
    b = opforge.tensor(b0, requires_grad=True)
    h = ops.add(a, 1.0)
    assert ops.mul_(h, b) is h                           # mul_ saves h's old value (a copy) for b's gradient
    ops.relu_(h)
    ops.sum(h).backward()
    mask = ((a0 + 1) * b0 > 0).astype(np.float32)
    np.testing.assert_allclose(a.grad.numpy(), mask * b0, rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), mask * (a0 + 1), rtol=1e-6)


def test_inplace_on_memory_shared_with_another_tensor_is_refused_while_recording() -> None:
    a = opforge.tensor(f32(6), requires_grad=True)
    h = ops.add(a, 1.0)
    v = h.reshape([2, 3])                                # a view of h's memory, with history
    with pytest.raises(RuntimeError, match=re.escape("[relu_] 'x' shares its memory with another tensor")):
        ops.relu_(v)
    e = ops.exp(a)                                       # exp saved e itself
    with pytest.raises(RuntimeError, match=re.escape("[mul_] 'x' shares its memory with another tensor")):
        ops.mul_(e, 2.0)


def test_forward_mode_tangents_are_refused_by_out_and_inplace() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return ops.exp(x, out=opforge.tensor(np.zeros(3, np.float32)))
    with pytest.raises(RuntimeError, match=re.escape("[exp] out= does not carry forward-mode tangents")):
        opforge.jvp(f, (opforge.tensor(f32(3)),), (opforge.tensor(f32(3)),))


def test_inplace_names_are_in_the_ops_module_and_stub() -> None:
    for name in ("add_", "sub_", "mul_", "div_", "clamp_", "relu_", "exp_", "sigmoid_", "tanh_"):
        assert callable(getattr(ops, name)), name
    assert "In place: ``add_(x: Tensor, y: TensorLike) -> Tensor``" in ops.add.__doc__
