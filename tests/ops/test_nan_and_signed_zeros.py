"""Regression tests of the differences the conformance suites found (issue 16): NaN propagation
and signed zeros of ops built from comparisons, standalone (no framework needed)."""

from __future__ import annotations

import numpy as np
import pytest

import opforge
from opforge import ops

NAN = float("nan")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_relu_propagates_nan_and_passes_its_gradient(dtype: str) -> None:
    x = opforge.tensor(np.array([NAN, -1.0, 0.0, -0.0, 2.0], dtype), requires_grad=True)
    y = ops.relu(x)
    got = y.numpy()
    assert np.isnan(got[0]) and list(got[1:]) == [0.0, 0.0, 0.0, 2.0]
    assert np.signbit(got[3])  # -0.0 stays -0.0, as in PyTorch
    ops.sum(y).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 0.0, 0.0, 1.0])  # NaN passes dout (torch)


def test_sign_and_abs_of_zeros_and_nan() -> None:
    x = np.array([-0.0, 0.0, NAN, -3.0, 3.0], np.float32)
    s = ops.sign(x).numpy()
    assert not np.signbit(s[0]) and s[1] == 0.0 and np.isnan(s[2]) and list(s[3:]) == [-1.0, 1.0]
    a = ops.abs(x).numpy()
    assert not np.signbit(a[0]) and np.isnan(a[2]) and list(a[3:]) == [3.0, 3.0]


def test_abs_gradient_is_zero_at_zero_and_nan() -> None:
    x = opforge.tensor(np.array([NAN, 0.0, -0.0, -2.0, 2.0]), requires_grad=True)
    ops.sum(ops.abs(x)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0, -1.0, 1.0])


def test_ops_built_from_comparisons_propagate_nan() -> None:
    x = np.array([NAN, 1.0], np.float32)
    assert np.isnan(ops.leaky_relu(x).numpy()[0])
    assert np.isnan(ops.clamp(x, min=0.0, max=0.5).numpy()[0])
    assert np.isnan(ops.maximum(x, np.zeros(2, np.float32)).numpy()[0])
    assert np.isnan(ops.minimum(np.zeros(2, np.float32), x).numpy()[0])
    values, indices = ops.max(np.array([[1.0, NAN, 3.0]], np.float32), axis=1)
    assert np.isnan(values.numpy()[0]) and indices.numpy()[0] == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_rsqrt_gradient_and_tangent_at_signed_zeros(dtype: str) -> None:
    # -0.5 rsqrt(x)^3, as torch: +inf at -0.0 (rsqrt(-0.0) is -inf), -inf at +0.0
    x = opforge.tensor(np.array([-0.0, 0.0, 4.0], dtype))
    x.requires_grad = True
    (g,) = opforge.gradients(ops.sum(ops.rsqrt(x)), [x])
    np.testing.assert_array_equal(g.numpy().astype(np.float64), [np.inf, -np.inf, -0.0625])
    _, t = opforge.jvp(ops.rsqrt, (x.detach(),), (opforge.tensor(np.ones(3, dtype)),))
    np.testing.assert_array_equal(t.numpy().astype(np.float64), [np.inf, -np.inf, -0.0625])
