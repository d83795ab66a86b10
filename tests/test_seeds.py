"""The seed documents' examples, with opforge ops and opforge autograd."""

from __future__ import annotations

import numpy as np

import opforge
from opforge import ops


def test_seed_000_custom_mul_net_value_and_grad() -> None:
    """MyNet: z = mul(x, y); out = mul(z, p) with weight p = 2.0, x = 2, y = 3."""
    p = opforge.tensor(np.float32(2.0), requires_grad=True)

    def net(x, y):
        z = ops.mul(x, y)
        return ops.mul(z, p)

    x = opforge.tensor(np.float32(1.0)) * 2
    y = opforge.tensor(np.float32(1.0)) * 3
    grad_op = opforge.value_and_grad(net, grad_position=(0, 1), weights=[p])
    out, grads = grad_op(x, y)
    assert out.dtype == "float32" and out.shape == ()
    assert out.item() == 12.0
    assert [g.item() for g in grads[0]] == [6.0, 4.0]
    assert len(grads[1]) == 1 and grads[1][0].item() == 6.0


def test_seed_002_square_grad() -> None:
    x = np.array([1.0, 4.0, 9.0], np.float32)
    dx = opforge.grad(lambda t: ops.sum(ops.square(t)))(x)
    np.testing.assert_array_equal(dx.numpy(), [2.0, 8.0, 18.0])


def test_seed_000_broadcasting_mul_reduces_gradient_to_input_shape() -> None:
    """The seed's CustomMul never reduces a broadcast gradient; opforge must."""
    x = opforge.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = opforge.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    ops.sum(ops.mul(x, y)).backward()
    assert x.grad.shape == (2, 3) and y.grad.shape == (3,)
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0, 2.0])


def test_seed_004_leaky_relu() -> None:
    x = np.array([[0.0, -0.1], [-0.2, 1.0]], np.float32)
    np.testing.assert_allclose(ops.leaky_relu(x).numpy(), [[0, -0.001], [-0.002, 1]], rtol=1e-6)
