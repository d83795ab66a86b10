"""Bad calls raise a Python exception that names the op and says what is allowed; none crash."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops

F32 = np.ones((2, 3), np.float32)


def test_undeclared_dtype_lists_what_the_target_supports() -> None:
    with pytest.raises(TypeError, match=re.escape(
            "[exp] dtype int64 is not supported on target cpu; supported (T): "
            "float16; bfloat16; float32; float64")):
        ops.exp(np.arange(3))


def test_unsupported_array_dtype_names_the_op() -> None:
    with pytest.raises(TypeError, match=r"^\[mul\] input 'x' has unsupported element format 'Zf'"):
        ops.mul(np.ones(3, np.complex64), np.ones(3, np.complex64))


def test_unbroadcastable_shapes() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "[add] shapes cannot be broadcast together: x (2, 3), y (4,)")):
        ops.add(F32, np.ones(4, np.float32))


def test_wrong_attr_type() -> None:
    with pytest.raises(TypeError, match=re.escape("[leaky_relu] attr 'alpha' must be a float, got str")):
        ops.leaky_relu(F32, alpha="0.1")
    with pytest.raises(TypeError, match=re.escape("[sum] attr 'keepdims' must be a bool, got int")):
        ops.sum(F32, keepdims=1)
    with pytest.raises(TypeError, match=re.escape("[sum] attr 'axis' must be an int or a list of ints, got float")):
        ops.sum(F32, axis=1.5)


def test_attr_constraint() -> None:
    with pytest.raises(ValueError, match=re.escape("[layer_norm] attr 'eps' must be >= 0, got -1")):
        ops.layer_norm(F32, eps=-1.0)
    # (a NaN compares false with anything: it passed `eps < 0` and gave NaN results)
    with pytest.raises(ValueError, match=re.escape("[layer_norm] attr 'eps' must be >= 0, got nan")):
        ops.layer_norm(F32, eps=float("nan"))


def test_str_attrs_that_c_strings_cannot_carry() -> None:
    """(a lone surrogate raised pybind11's RuntimeError without the op; a NUL cut the message)"""
    with pytest.raises(ValueError, match=re.escape("[gelu] attr 'approximate' must be a str of Unicode characters")):
        ops.gelu(F32, approximate="\ud800")
    with pytest.raises(ValueError, match=re.escape("[gelu] attr 'approximate' must not contain a NUL character")):
        ops.gelu(F32, approximate="none\x00x")


def test_missing_required_input_or_attr_and_unknown_keyword() -> None:
    with pytest.raises(TypeError, match=re.escape("[mul] missing required input 'y'; signature: mul(x, y)")):
        ops.mul(F32)
    with pytest.raises(TypeError, match=re.escape(
            "[leaky_relu] unexpected keyword 'alhpa' (did you mean 'alpha'?); signature: leaky_relu(x, alpha)")):
        ops.leaky_relu(F32, alhpa=0.1)
    with pytest.raises(TypeError, match=re.escape("[mul] got multiple values for 'x'")):
        ops.mul(F32, F32, x=F32)
    with pytest.raises(TypeError, match=re.escape("[neg] takes at most 1 arguments neg(x), got 2")):
        ops.neg(F32, F32)


def test_big_endian_arrays_are_refused_with_the_conversion() -> None:
    for a in (np.ones(3, ">f8"), memoryview(np.ones(3, ">f8"))):
        with pytest.raises(TypeError, match=re.escape("[neg] input 'x' is big-endian ('>d'): opforge reads native "
                                                      "byte order; convert it first")):
            ops.neg(a)


def test_none_and_non_array_inputs() -> None:
    with pytest.raises(TypeError, match=re.escape("[mul] input 'y' must be a tensor, got None")):
        ops.mul(F32, None)
    with pytest.raises(TypeError, match=re.escape(
            "[mul] input 'x' must be a tensor, NumPy array, DLPack producer or capsule, or Python scalar, got object")):
        ops.mul(object(), F32)
    with pytest.raises(TypeError, match=re.escape("[neg] input 'x' must be a tensor, NumPy array, DLPack "
                                                  "producer or capsule, or Python scalar, got list")):
        ops.neg([1.0, 2.0])


def test_two_dtypes_for_one_type_variable() -> None:
    with pytest.raises(TypeError, match=re.escape(
            "[mul] inputs 'x' (float32) and 'y' (float64) must have the same dtype (type variable T)")):
        ops.mul(F32, np.ones((2, 3)))


def test_concrete_dtype_input() -> None:
    with pytest.raises(TypeError, match=re.escape("[where] input 'condition' must be bool, got float32")):
        ops.where(F32, F32, F32)


def test_axis_out_of_range_is_an_index_error() -> None:
    with pytest.raises(IndexError, match=re.escape("[sum] axis 2 is out of range for a tensor of rank 2")):
        ops.sum(F32, axis=2)
    with pytest.raises(ValueError, match=re.escape("[mean] axis -2 is repeated")):
        ops.mean(F32, axis=[0, -2])


def test_format_not_in_registration_table() -> None:
    x = opforge.tensor(np.ones((1, 2, 2, 2), np.float32), format="NCHW")
    y = opforge.tensor(np.ones((1, 2, 2, 2), np.float32), format="NHWC")
    assert ops.mul(x, x).format == "NCHW"
    with pytest.raises(ValueError, match=re.escape("[mul] inputs mix formats NCHW and NHWC")):
        ops.mul(x, y)


def test_weight_that_does_not_broadcast() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "[layer_norm] weight of shape (4, 1, 3) does not broadcast to x of shape (2, 3)")):
        ops.layer_norm(F32, np.ones((4, 1, 3), np.float32))
    with pytest.raises(ValueError, match=re.escape(
            "[layer_norm] weight of shape (3, 1) does not broadcast to x of shape (2, 3)")):
        ops.layer_norm(F32, np.ones((3, 1), np.float32))


def test_backward_errors() -> None:
    x = opforge.tensor([1.0, 2.0], requires_grad=True)
    y = ops.mul(x, x)
    with pytest.raises(RuntimeError, match=re.escape("[backward] grad can be implicitly created only")):
        y.backward()
    z = ops.sum(y)
    z.backward()
    with pytest.raises(RuntimeError, match=re.escape("[sum] trying to backward through the graph a second time")):
        z.backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        opforge.tensor([1.0]).backward()
    with pytest.raises(TypeError, match="only floating-point tensors can require gradients, got int64"):
        opforge.tensor([1, 2], requires_grad=True)


def test_python_scalars_never_lose_their_value() -> None:
    with pytest.raises(TypeError, match=re.escape(
            "[mul] input 'y': a Python float cannot be int64 (bound by input 'x'); "
            "pass an array of the intended dtype")):
        ops.mul(np.array([1, 2]), 2.5)
    with pytest.raises(ValueError, match=re.escape(
            "[add] input 'y': the Python int 1099511627776 is out of range for int32 (bound by input 'x')")):
        ops.add(np.array([1], np.int32), 2 ** 40)
    with pytest.raises(ValueError, match=re.escape("[add] input 'y': the Python int is out of range for int64")):
        ops.add(np.array([1]), 2 ** 70)
    # scalars alone: the widest kind decides, whatever the order
    assert ops.add(1, 2.5).item() == 3.5 and ops.add(2.5, 1).item() == 3.5
    assert ops.mul(3, 0.5).dtype == "float32"
    with pytest.raises(TypeError, match=r"^\[exp\] dtype int64 is not supported"):
        ops.exp(3)


def test_attr_values_of_the_wrong_kind_are_type_errors() -> None:
    with pytest.raises(TypeError, match=re.escape("[leaky_relu] attr 'alpha' must be a float, got ndarray")):
        ops.leaky_relu(F32, alpha=np.array(0.1))
    with pytest.raises(TypeError, match=re.escape("[leaky_relu] attr 'alpha' must be a float, got Tensor")):
        ops.leaky_relu(F32, alpha=opforge.tensor([0.1, 0.2]))
    with pytest.raises(TypeError, match=re.escape("[leaky_relu] attr 'alpha' must be a float, got bool")):
        ops.leaky_relu(F32, alpha=True)
    with pytest.raises(TypeError, match=re.escape("[sum] attr 'axis' must be an int or a list of ints, got ndarray")):
        ops.sum(F32, axis=np.array([0]))
    with pytest.raises(ValueError, match=re.escape("[sum] attr 'axis' is out of range for int64")):
        ops.sum(F32, axis=2 ** 64)
    assert ops.leaky_relu(F32, alpha=np.float32(0.5)).shape == (2, 3)
    assert ops.sum(F32, axis=np.int64(1)).shape == (2,)


def test_shapes_too_large_to_allocate() -> None:
    a = np.broadcast_to(np.float64(1), (3, 1))
    b = np.broadcast_to(np.float64(2), (1, 768614336404564651))
    with pytest.raises(ValueError, match=re.escape("[add] shape (3, 768614336404564651) has too many elements")):
        ops.add(a, b)
    with pytest.raises(ValueError, match=r"^\[reshape\] invalid dimension -2"):
        opforge.tensor(np.arange(6.0)).reshape([-2, -3])
    assert opforge.tensor(np.arange(6.0)).reshape([-1, 2]).shape == (3, 2)
