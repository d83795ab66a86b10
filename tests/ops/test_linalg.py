"""linalg ops (matmul, transpose, linear and their backward ops): bad input, and the BLAS paths
the small generated cases do not reach (large, batched, broadcast, vector and empty products)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops


def _raises(exc, message: str):
    return pytest.raises(exc, match="^" + re.escape(message) + "$")


def _rand(rng, *shape, dtype=np.float64):
    return rng.uniform(-1, 1, shape).astype(dtype)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("a, b, message", [
    ((), (3,), "[matmul] matmul needs inputs of rank >= 1, got () and (3,)"),
    ((3,), (), "[matmul] matmul needs inputs of rank >= 1, got (3,) and ()"),
    ((2, 3), (4, 5), "[matmul] matmul inner dimensions differ: (2, 3) @ (4, 5)"),
    ((3,), (4,), "[matmul] matmul inner dimensions differ: (3,) @ (4,)"),
    ((2, 3), (2,), "[matmul] matmul inner dimensions differ: (2, 3) @ (2,)"),
    ((2, 3, 4), (3, 4, 5), "[matmul] matmul batch dimensions cannot be broadcast: (2, 3, 4) @ (3, 4, 5)"),
])
def test_matmul_bad_shapes(a, b, message) -> None:
    with _raises(ValueError, message):
        ops.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32))


def test_matmul_bad_dtypes() -> None:
    with pytest.raises(TypeError, match=r"^\[matmul\] "):
        ops.matmul(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float64))
    with pytest.raises(TypeError, match=r"^\[matmul\] dtype int64 is not supported on target cpu"):
        ops.matmul(np.zeros((2, 2), np.int64), np.zeros((2, 2), np.int64))


@pytest.mark.parametrize("shape", [(), (3,)])
def test_transpose_needs_rank_2(shape) -> None:
    with _raises(ValueError, f"[transpose] x must have rank >= 2 (the last two dims are swapped), got shape {shape}"):
        ops.transpose(np.zeros(shape))


@pytest.mark.parametrize("x, w, bias, message", [
    ((), (5, 3), None, "[linear] x must have rank >= 1, got shape ()"),
    ((4, 3), (3,), None, "[linear] weight must have shape (out_features, in_features), got (3,)"),
    ((4, 3), (1, 5, 3), None, "[linear] weight must have shape (out_features, in_features), got (1, 5, 3)"),
    ((4, 3), (5, 4), None, "[linear] x's last dimension 3 differs from weight's in_features 4: x (4, 3), weight (5, 4)"),
    ((4, 3), (5, 3), (3,), "[linear] bias must have shape (5,) (out_features), got (3,)"),
    ((4, 3), (5, 3), (1, 5), "[linear] bias must have shape (5,) (out_features), got (1, 5)"),
    ((4, 3), (5, 3), (), "[linear] bias must have shape (5,) (out_features), got ()"),
])
def test_linear_bad_shapes(x, w, bias, message) -> None:
    with _raises(ValueError, message):
        ops.linear(np.zeros(x), np.zeros(w), None if bias is None else np.zeros(bias))


@pytest.mark.parametrize("grad, x", [((), (3,)), ((4, 5), ()), ((4, 5), (3, 3)), ((2, 4, 5), (4, 3))])
def test_linear_backward_weight_bad_shapes(grad, x) -> None:
    message = ("[linear_backward_weight] grad and x must have rank >= 1 and the same leading dimensions, "
               f"got grad {grad}, x {x}")
    with _raises(ValueError, message):
        ops.linear_backward_weight(np.zeros(grad), np.zeros(x))


@pytest.mark.parametrize("op, args, message", [
    ("matmul_backward_a", ((3, 4), (4, 5), (3, 4)),
     "[matmul_backward_a] grad has shape (3, 4), matmul(a, b) has shape (3, 5): a (3, 4), b (4, 5)"),
    ("matmul_backward_b", ((5,), (3, 4), (4, 5)),
     "[matmul_backward_b] grad has shape (5,), matmul(a, b) has shape (3, 5): a (3, 4), b (4, 5)"),
    ("matmul_backward_a", ((3, 5), (2, 5), (3, 4)), "[matmul_backward_a] matmul inner dimensions differ: (3, 4) @ (2, 5)"),
])
def test_matmul_backward_bad_shapes(op, args, message) -> None:
    with _raises(ValueError, message):
        getattr(ops, op)(*(np.zeros(s) for s in args))


# ---------------------------------------------------------------------------- shapes and values


@pytest.mark.parametrize("a, b", [
    ((3, 0), (0, 5)), ((0,), (0,)), ((2, 3, 0), (0, 4)), ((0,), (0, 4)), ((3, 0), (0,)),
    ((1, 3, 4), (0, 4, 2)), ((0, 1, 3, 4), (5, 4, 2)), ((2, 3, 4), (2, 4, 0)),
])
def test_matmul_empty(a, b) -> None:
    rng = np.random.default_rng(0)
    x, y = _rand(rng, *a), _rand(rng, *b)
    out = ops.matmul(x, y)
    assert out.shape == np.matmul(x, y).shape
    np.testing.assert_array_equal(out.numpy(), np.matmul(x, y))
    tx, ty = opforge.tensor(x, requires_grad=True), opforge.tensor(y, requires_grad=True)
    ga, gb = opforge.gradients(ops.matmul(tx, ty), [tx, ty], [opforge.tensor(np.ones(out.shape))])
    assert ga.shape == a and gb.shape == b
    d = np.ones(out.shape)
    np.testing.assert_array_equal(ga.numpy(), _grad_a(d, x, y))
    np.testing.assert_array_equal(gb.numpy(), _grad_b(d, x, y))


def _sum_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def _promoted(d, a, b):
    d = d[..., None] if b.ndim == 1 else d
    return np.expand_dims(d, -2) if a.ndim == 1 else d


def _grad_a(d, a, b):
    g = _promoted(d, a, b) @ np.swapaxes(b[:, None] if b.ndim == 1 else b, -1, -2)
    return _sum_to(g[..., 0, :] if a.ndim == 1 else g, a.shape)


def _grad_b(d, a, b):
    g = np.swapaxes(a[None, :] if a.ndim == 1 else a, -1, -2) @ _promoted(d, a, b)
    return _sum_to(g[..., 0] if b.ndim == 1 else g, b.shape)


LARGE = [
    ((96, 80), (80, 112)),              # one GEMM, its columns split over threads
    ((133, 120), (120, 41)),            # rows split over threads, a ragged last block
    ((20, 300), (300, 150)),            # columns split: few rows, a long inner dimension
    ((200,), (200, 150)),               # vector @ matrix: GEMV
    ((150, 200), (200,)),               # matrix @ vector: GEMV
    ((1, 300), (300, 1)),               # 1 x 1 result
    ((6, 40, 30), (30, 20)),            # batch folded into the rows of one GEMM
    ((30, 20), (6, 20, 40)),            # shared a, batched b
    ((64, 8, 8), (64, 8, 8)),           # many small GEMMs: OpenMP over the batch
    ((5, 1, 40, 30), (3, 30, 20)),      # broadcast batch on both sides
    ((300,), (4, 300, 7)),              # vector against a batch
    ((4, 20, 300), (300,)),
    ((7, 1, 9, 33), (1, 6, 33, 9)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("a, b", LARGE)
def test_matmul_large(a, b, dtype) -> None:
    rng = np.random.default_rng(1)
    x, y = _rand(rng, *a, dtype=dtype), _rand(rng, *b, dtype=dtype)
    ref = np.matmul(x.astype(np.float64), y.astype(np.float64))
    tol = 1e-5 if dtype == "float32" else 1e-12
    out = ops.matmul(x, y)
    assert out.dtype == dtype and out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=tol, atol=tol * a[-1])
    # gradients, whose broadcast batch dims are summed inside the backward ops
    tx, ty = opforge.tensor(x, requires_grad=True), opforge.tensor(y, requires_grad=True)
    d = _rand(rng, *ref.shape, dtype=dtype)
    ga, gb = opforge.gradients(ops.matmul(tx, ty), [tx, ty], [opforge.tensor(d)])
    d64, x64, y64 = d.astype(np.float64), x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(ga.numpy(), _grad_a(d64, x64, y64), rtol=tol, atol=tol * 300)
    np.testing.assert_allclose(gb.numpy(), _grad_b(d64, x64, y64), rtol=tol, atol=tol * 300)


@pytest.mark.parametrize("dtype, tol", [("float16", 2e-3), ("bfloat16", 1e-2)])
def test_matmul_half_types(dtype, tol) -> None:
    """float16/bfloat16 are computed in float32: only the final rounding differs."""
    rng = np.random.default_rng(2)
    x = opforge.tensor(_rand(rng, 3, 50, 64)).astype(dtype)
    y = opforge.tensor(_rand(rng, 64, 40)).astype(dtype)
    ref = np.matmul(x.astype("float64").numpy(), y.astype("float64").numpy())
    out = ops.matmul(x, y)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.astype("float64").numpy(), ref, rtol=tol, atol=tol)


def test_matmul_repeated_calls_are_deterministic() -> None:
    """Outputs start uninitialized: BLAS must overwrite them (beta = 0), never read them."""
    rng = np.random.default_rng(3)
    for a, b in [((50, 1), (1, 40)), ((1, 64), (64, 33)), ((64, 17), (17,)), ((8, 2, 3), (3, 5))]:
        x, y = _rand(rng, *a, dtype=np.float32), _rand(rng, *b, dtype=np.float32)
        first = ops.matmul(x, y).numpy().copy()
        assert np.isfinite(first).all()
        for _ in range(20):
            poison = ops.neg(np.full(first.shape, np.nan, np.float32))
            del poison  # a freed NaN block of the output's size, which malloc likely hands out next
            np.testing.assert_array_equal(ops.matmul(x, y).numpy(), first)


def test_transpose_values_and_dtypes() -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(-100, 100, (3, 70, 45)).astype(np.int64)
    for dtype in ["bool", "int32", "int64", "float16", "float32", "float64"]:
        out = ops.transpose(x.astype(dtype))
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.numpy(), np.swapaxes(x.astype(dtype), -1, -2))
    assert ops.transpose(np.zeros((2, 0, 3))).shape == (2, 3, 0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xshape", [(64, 96), (3, 5, 96), (96,), (0, 96)])
def test_linear_large(xshape, bias) -> None:
    """(64, 96) by (112, 96)^T is large enough for blas::gemm to split it over threads."""
    rng = np.random.default_rng(5)
    x, w = _rand(rng, *xshape, dtype=np.float32), _rand(rng, 112, 96, dtype=np.float32)
    b = _rand(rng, 112, dtype=np.float32) if bias else None
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    out = ops.linear(x, w, b)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-4)
    tx, tw = opforge.tensor(x, requires_grad=True), opforge.tensor(w, requires_grad=True)
    tb = None if b is None else opforge.tensor(b, requires_grad=True)
    d = _rand(rng, *ref.shape, dtype=np.float32)
    leaves = [tx, tw] + ([tb] if tb is not None else [])
    grads = opforge.gradients(ops.linear(tx, tw, tb), leaves, [opforge.tensor(d)])
    d2, x2 = d.reshape(-1, 112).astype(np.float64), x.reshape(-1, 96).astype(np.float64)
    np.testing.assert_allclose(grads[0].numpy(), (d2 @ w.astype(np.float64)).reshape(x.shape), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(grads[1].numpy(), d2.T @ x2, rtol=1e-5, atol=1e-4)
    if tb is not None:
        np.testing.assert_allclose(grads[2].numpy(), d2.sum(axis=0), rtol=1e-5, atol=1e-4)


def test_linear_empty_in_features_gives_bias() -> None:
    out = ops.linear(np.zeros((4, 0)), np.zeros((3, 0)), np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(out.numpy(), np.tile([1.0, 2.0, 3.0], (4, 1)))
    assert ops.linear_backward_weight(np.zeros((0, 3)), np.zeros((0, 2))).numpy().tolist() == [[0, 0]] * 3


def test_linear_matches_matmul_of_transpose() -> None:
    rng = np.random.default_rng(6)
    x, w = _rand(rng, 2, 7, 5), _rand(rng, 4, 5)
    np.testing.assert_allclose(ops.linear(x, w).numpy(), ops.matmul(x, ops.transpose(w)).numpy(), rtol=1e-12)


def test_mlp_trains() -> None:
    """A two-layer network fit by gradient descent: matmul/linear gradients through a whole graph."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 4))
    y = np.sin(x.sum(axis=1, keepdims=True))
    w1 = opforge.tensor(rng.standard_normal((16, 4)) * 0.5, requires_grad=True)
    b1 = opforge.tensor(np.zeros(16), requires_grad=True)
    w2 = opforge.tensor(rng.standard_normal((1, 16)) * 0.5, requires_grad=True)
    losses = []
    for _ in range(200):
        h = ops.tanh(ops.linear(x, w1, b1))
        loss = ops.mean(ops.square(ops.linear(h, w2) - y))
        grads = opforge.gradients(loss, [w1, b1, w2])
        losses.append(loss.item())
        with opforge.no_grad():
            for p, g in zip((w1, b1, w2), grads):
                p.numpy()[...] -= 0.1 * g.numpy()
    assert losses[-1] < 0.25 * losses[0]
