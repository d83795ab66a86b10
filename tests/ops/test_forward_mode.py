"""Forward mode (opforge.jvp, opforge.jacfwd) for every op with a jvp, checked per op case in
float64 against central differences and against reverse mode through the transpose identity
⟨J·v, u⟩ = ⟨v, Jᵀ·u⟩; reverse over forward (Hessian-vector products); the errors."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import opforge
from opforge import _formulas, ops

from cases import Case, grad_cases, make_data, to_inputs

JVP_CASES = [c for c in grad_cases() if _formulas.OPS[c.op.name].jvp is not None]
DIFF_OPS = sorted(n for n, o in _formulas.OPS.items() if any(i.differentiable for i in o.inputs)
                  and o.composite is None)


def _call(case: Case, inputs: list[Any]) -> tuple[Any, ...]:
    out = getattr(ops, case.op.name)(*inputs, **case.attrs)
    return out if isinstance(out, tuple) else (out,)


def _setup(case: Case, seed: int) -> tuple[list[Any], list[int], list[np.ndarray]]:
    """Inputs, the positions of the differentiable ones, and a random tangent for each."""
    rng = np.random.default_rng(seed)
    inputs = to_inputs(case.op, case.dtype, make_data(case.op, case.dtype, case.shapes, rng))
    diff = [k for k, i in enumerate(case.op.inputs) if i.differentiable and inputs[k] is not None]
    tangents = [rng.standard_normal(np.shape(inputs[k])) for k in diff]
    return inputs, diff, tangents


def _jvp(case: Case, inputs: list[Any], diff: list[int], tangents: list[np.ndarray]) -> tuple[Any, Any]:
    def f(*xs: Any) -> Any:
        full = list(inputs)
        for k, x in zip(diff, xs):
            full[k] = x
        return _call(case, full)

    return opforge.jvp(f, tuple(opforge.tensor(inputs[k]) for k in diff),
                       tuple(opforge.tensor(t) for t in tangents))


def _diff_outputs(case: Case) -> list[int]:
    return [k for k, o in enumerate(case.op.outputs) if o.differentiable]


@pytest.mark.parametrize("case", JVP_CASES, ids=lambda c: c.id)
def test_jvp_matches_central_differences(case: Case) -> None:
    inputs, diff, tangents = _setup(case, 0)
    outs, touts = _jvp(case, inputs, diff, tangents)
    h = 1e-6

    def shifted(sign: float) -> tuple[Any, ...]:
        full = list(inputs)
        for k, t in zip(diff, tangents):
            full[k] = np.asarray(inputs[k], dtype=np.float64) + sign * h * t
        return _call(case, full)

    plus, minus = shifted(1.0), shifted(-1.0)
    for k in _diff_outputs(case):
        numeric = (plus[k].numpy() - minus[k].numpy()) / (2 * h)
        np.testing.assert_allclose(touts[k].numpy(), numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case.id}: output {case.op.outputs[k].name}")
        np.testing.assert_array_equal(outs[k].numpy(), _call(case, inputs)[k].numpy())


@pytest.mark.parametrize("case", JVP_CASES, ids=lambda c: c.id)
def test_jvp_is_the_transpose_of_the_gradient(case: Case) -> None:
    """⟨J·v, u⟩ = ⟨v, Jᵀ·u⟩: the spec's jvp and bprop formulas describe the same derivative."""
    inputs, diff, tangents = _setup(case, 1)
    _, touts = _jvp(case, inputs, diff, tangents)
    rng = np.random.default_rng(2)
    leaves = list(inputs)
    for k in diff:
        leaves[k] = opforge.tensor(inputs[k], requires_grad=True)
    outs = _call(case, leaves)
    keep = _diff_outputs(case)
    us = [rng.standard_normal(outs[k].shape) for k in keep]
    grads = opforge.gradients([outs[k] for k in keep], [leaves[k] for k in diff],
                              grad_outputs=[opforge.tensor(u) for u in us], allow_unused=True)
    forward = sum(float(np.sum(touts[k].numpy() * u)) for k, u in zip(keep, us))
    reverse = sum(float(np.sum(t * (g.numpy() if g is not None else 0.0))) for t, g in zip(tangents, grads))
    assert forward == pytest.approx(reverse, rel=1e-9, abs=1e-9), case.id


def test_every_differentiable_op_has_forward_mode() -> None:
    """The shipped ops all have jvp formulas (written, or derived from their expression or bprop)."""
    missing = [n for n in DIFF_OPS if _formulas.OPS[n].jvp is None and _formulas.OPS[n].bprop is not None]
    assert missing == []


def test_tanh_tangent_is_not_zero() -> None:
    """Regression: a forward-mode call of an op never gives a silent zero tangent."""
    x = np.array([0.0, 0.5, -1.0])
    out, t = opforge.jvp(ops.tanh, (x,), (np.ones(3),))
    np.testing.assert_allclose(t.numpy(), 1 - np.tanh(x) ** 2)
    np.testing.assert_allclose(out.numpy(), np.tanh(x))


def test_a_term_of_an_input_without_a_tangent_is_left_out_not_multiplied_by_zero() -> None:
    """d/dx x**2 at x < 0 is 2x; the jvp formula's term of the exponent's tangent reads log(x),
    NaN there, and a missing tangent taken as zeros made the tangent NaN (0 * NaN) in every face
    (opforge's own, torch.func, JAX). A term is left out when none of the tangents it reads was
    given, and the sum broadcast to the output's shape as it was."""
    x = np.array([-1.0, 2.0, -3.0])
    _, t = opforge.jvp(lambda a: ops.pow(a, np.float64(2.0)), (x,), (np.ones(3),))
    np.testing.assert_allclose(t.numpy(), 2 * x)
    _, t = opforge.jvp(lambda a: ops.div(np.float64(1.0), a), (x,), (np.ones(3),))
    np.testing.assert_allclose(t.numpy(), -1 / x**2)
    _, t = opforge.jvp(lambda a: ops.add(a, np.ones((2, 3))), (x,), (np.ones(3),))  # (broadcast by the other)
    np.testing.assert_array_equal(t.numpy(), np.ones((2, 3)))
    _, t = opforge.jvp(lambda b: ops.sub(np.ones((2, 3)), b), (x,), (np.ones(3),))  # (a negated term alone)
    np.testing.assert_array_equal(t.numpy(), -np.ones((2, 3)))


def test_jvp_of_a_composition_and_partial_tangents() -> None:
    x, y = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    out, t = opforge.jvp(lambda a, b: ops.sum(ops.mul(ops.exp(a), b)), (x, y), (np.array([1.0, 0.0]), np.zeros(2)))
    assert out.item() == pytest.approx(float(np.sum(np.exp(x) * y)))
    assert t.item() == pytest.approx(np.exp(1.0) * 3.0)
    # an output that does not depend on the primals has a zero tangent
    const = opforge.tensor(np.ones(2))
    _, t0 = opforge.jvp(lambda a: const, (x,), (np.ones(2),))
    np.testing.assert_array_equal(t0.numpy(), np.zeros(2))


def test_jacfwd_refuses_an_argnums_out_of_range() -> None:
    f = opforge.jacfwd(lambda a, b: ops.mul(a, b), argnums=2)
    with pytest.raises(IndexError, match=re.escape("[jacfwd] argnums 2 is out of range for 2 arguments")):
        f(np.ones(2), np.ones(2))
    np.testing.assert_array_equal(opforge.jacfwd(lambda a, b: ops.mul(a, b), argnums=-1)(np.ones(2), np.full(2, 3.0))
                                  .numpy(), np.eye(2))


def test_jacfwd_matches_reverse_mode() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))

    def f(a: Any) -> Any:
        return ops.softmax(ops.linear(a, w), axis=-1)

    jac = opforge.jacfwd(f)(x).numpy()
    assert jac.shape == (2, 4, 2, 3)
    for i in range(2):
        for j in range(4):
            u = np.zeros((2, 4))
            u[i, j] = 1.0
            leaf = opforge.tensor(x, requires_grad=True)
            g, = opforge.gradients(f(leaf), leaf, grad_outputs=[opforge.tensor(u)])
            np.testing.assert_allclose(jac[i, j], g.numpy(), rtol=1e-10, atol=1e-12)


def test_reverse_over_forward_gives_hessian_vector_products() -> None:
    rng = np.random.default_rng(4)
    x, v = rng.standard_normal(5), rng.standard_normal(5)

    def f(a: Any) -> Any:
        return ops.sum(ops.mul(ops.tanh(a), ops.exp(a)))

    def directional(a: Any) -> Any:
        return opforge.jvp(f, (a,), (opforge.tensor(v),))[1]

    hvp = opforge.grad(directional)(opforge.tensor(x)).numpy()
    # f = Σ tanh(x) exp(x): its Hessian is diagonal with (tanh exp)''
    t, e = np.tanh(x), np.exp(x)
    second = e * (t + 2 * (1 - t * t) - 2 * t * (1 - t * t))
    np.testing.assert_allclose(hvp, second * v, rtol=1e-10)


def test_forward_over_reverse_and_nesting_raise() -> None:
    x = np.array([1.0, 2.0])
    with pytest.raises(RuntimeError, match="gradient inside forward mode"):
        opforge.jvp(opforge.grad(lambda a: ops.sum(ops.exp(a))), (x,), (np.ones(2),))
    with pytest.raises(RuntimeError, match="nested forward mode"):
        opforge.jvp(lambda a: opforge.jvp(ops.exp, (a,), (np.ones(2),))[1], (x,), (np.ones(2),))


def test_bad_tangents_raise() -> None:
    x = np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="tangent has shape"):
        opforge.jvp(ops.exp, (x,), (np.ones(3),))
    with pytest.raises(ValueError, match="2 primals but 1 tangents"):
        opforge.jvp(ops.add, (x, x), (x,))
    with pytest.raises(TypeError, match="floating-point"):
        opforge.jvp(ops.neg, (np.array([1, 2]),), (np.array([1, 2]),))


def test_an_op_without_jvp_raises_naming_it(tmp_path: Any) -> None:
    """A cpp op whose spec has no jvp (and whose bprop is not elementwise-linear) refuses forward
    mode with an error naming it, instead of a zero tangent."""
    (tmp_path / "rowscale.yaml").write_text("""
rowscale:
  doc: x times the sum of x (a non-elementwise op without a jvp).
  inputs:
    x: float64
  outputs:
    out: {dtype: float64, shape: same(x)}
  impl:
    composite: x * sum(x, keepdims=True)
  bprop:
    x: dout * sum(x, keepdims=True) + sum(dout * x, keepdims=True)
""")
    mod = opforge.load("rowscale_fw", [tmp_path / "rowscale.yaml"], build_dir=tmp_path / "cache")
    with pytest.raises(RuntimeError, match=r"\[rowscale\] has no forward-mode derivative"):
        opforge.jvp(mod.rowscale, (np.ones(3),), (np.ones(3),))
