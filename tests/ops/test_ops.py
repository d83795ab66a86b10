"""Op tests generated from every spec's ``tests`` section (forward, gradients, edge shapes)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import opforge
from opforge import _formulas  # (opforge's own ops: list_ops() also has ops that tests load)
from opforge import ops

from cases import Case, assert_outputs, cases, grad_cases, make_data, reference, to_inputs

CASES = cases()
GRAD_CASES = grad_cases()
# Under the sanitizers (tests/test_sanitizers.py sets it) the gradient tests run the analytic
# backward (first and second order, instrumented) but not the central differences they compare it
# with: hundreds of forward or backward calls per case of kernels that already ran, which made
# most of the instrumented run's time.
SANITIZED = os.environ.get("OPFORGE_SANITIZED") == "1"


def run(case: Case, data):
    fn = getattr(ops, case.op.name)
    out = fn(*to_inputs(case.op, case.dtype, data), **case.attrs)
    return out if isinstance(out, tuple) else (out,)


def check_forward(case: Case, data) -> None:
    assert_outputs(case, run(case, data), reference(case.op, data, case.attrs))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_matches_numpy(case: Case) -> None:
    check_forward(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(0)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_non_contiguous(case: Case) -> None:
    data = make_data(case.op, case.dtype, case.shapes, np.random.default_rng(1), contiguous=False)
    assert any(a is not None and not a.flags.c_contiguous for a in data)
    check_forward(case, data)


def edge_cases(shape: tuple[int, ...]) -> list[Case]:
    """One case per (op, dtype) with every input of the given shape."""
    out: dict[str, Case] = {}
    for c in CASES:
        if c.op.tests.shapes or c.op.outputs[0].shape.kind not in ("same", "broadcast", "reduce"):
            continue
        case = Case(c.op, c.dtype, (shape,) * len(c.op.inputs), {})
        out.setdefault(case.id, case)
    return list(out.values())


@pytest.mark.parametrize("case", edge_cases(()), ids=lambda c: c.id)
def test_zero_dim(case: Case) -> None:
    check_forward(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(2)))


@pytest.mark.parametrize("case", edge_cases((0, 3)), ids=lambda c: c.id)
def test_empty(case: Case) -> None:
    check_forward(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(3)))


# ---------------------------------------------------------------------------- gradients


def _leaves(case: Case, data):
    leaves, args = [], []
    for inp, a in zip(case.op.inputs, data):
        if a is None:
            args.append(None)
            continue
        t = opforge.tensor(a, dtype=case.dtype if inp.dtype in dict(case.op.typevars) else inp.dtype,
                           requires_grad=inp.differentiable)
        args.append(t)
        if inp.differentiable:
            leaves.append((inp.name, t))
    return args, leaves


def _weights(case: Case, outs, rng):
    return [opforge.tensor(rng.standard_normal(o.shape)) if spec.differentiable else None
            for o, spec in zip(outs, case.op.outputs)]


def _scalar_loss(case: Case, args, weights) -> float:
    with opforge.no_grad():
        outs = getattr(ops, case.op.name)(*args, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return sum(float(np.sum(o.numpy() * w.numpy())) for o, w in zip(outs, weights) if w is not None)


def central_differences(base: np.ndarray, f, eps: float = 1e-6) -> np.ndarray:
    """d f / d base by central differences, perturbing base (a view of a leaf) in place."""
    grad = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        orig = base[i]
        base[i] = orig + eps
        hi = f()
        base[i] = orig - eps
        lo = f()
        base[i] = orig
        grad[i] = (hi - lo) / (2 * eps)
    return grad


def numerical_grad(case: Case, args, index: int, weights) -> np.ndarray:
    return central_differences(args[index].numpy(), lambda: _scalar_loss(case, args, weights))


def analytic(case: Case, args, leaves, weights, create_graph: bool = False):
    outs = getattr(ops, case.op.name)(*args, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [(o, w) for o, w in zip(outs, weights) if w is not None]
    return opforge.gradients([o for o, _ in pairs], [t for _, t in leaves], [w for _, w in pairs],
                             create_graph=create_graph, allow_unused=True)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradient_matches_central_differences(case: Case) -> None:
    rng = np.random.default_rng(4)
    data = make_data(case.op, case.dtype, case.shapes, rng)
    args, leaves = _leaves(case, data)
    outs = getattr(ops, case.op.name)(*args, **case.attrs)
    weights = _weights(case, outs if isinstance(outs, tuple) else (outs,), rng)
    grads = analytic(case, args, leaves, weights)
    rtol, atol = case.op.tests.grad_tolerance or (1e-5, 1e-6)
    for (name, leaf), g in zip(leaves, grads):
        assert g is not None, name
        assert g.shape == leaf.shape, f"gradient of {name} has shape {g.shape}, input {leaf.shape}"
        assert g.dtype == leaf.dtype
        if SANITIZED:
            continue
        index = [i for i, a in enumerate(args) if a is leaf][0]
        np.testing.assert_allclose(g.numpy(), numerical_grad(case, args, index, weights),
                                   rtol=rtol, atol=atol, err_msg=name)


def second_order_cases() -> list[Case]:
    out = []
    for c in GRAD_CASES:
        if c.shapes == ((3, 1), (1, 4), (3, 4))[:len(c.shapes)] or len(c.op.inputs) == 1 or c.op.tests.shapes:
            out.append(c)
    return out


@pytest.mark.parametrize("case", second_order_cases(), ids=lambda c: c.id)
def test_double_backward(case: Case) -> None:
    """d/dx of <v, grad f(x)> analytically (create_graph) vs central differences of grad f."""
    rng = np.random.default_rng(5)
    data = make_data(case.op, case.dtype, case.shapes, rng)
    args, leaves = _leaves(case, data)
    outs = getattr(ops, case.op.name)(*args, **case.attrs)
    weights = _weights(case, outs if isinstance(outs, tuple) else (outs,), rng)
    vs = [rng.standard_normal(t.shape) for _, t in leaves]

    def first(args_now, leaves_now, create):
        return analytic(case, args_now, leaves_now, weights, create_graph=create)

    grads = first(args, leaves, True)
    h = None
    for g, v in zip(grads, vs):
        if g is None or not g.requires_grad:
            continue
        term = ops.sum(ops.mul(g, v))
        h = term if h is None else ops.add(h, term)
    # no gradient depends on the inputs (e.g. add): then the numerical second derivative is zero
    second = ([None] * len(leaves) if h is None
              else opforge.gradients(h, [t for _, t in leaves], allow_unused=True))

    def first_order_dot_v() -> float:
        return sum(float(np.sum(g.numpy() * v)) for g, v in zip(first(args, leaves, False), vs) if g is not None)

    for k, (name, leaf) in enumerate(leaves):
        if SANITIZED:
            assert second[k] is None or second[k].shape == leaf.shape, name
            continue
        base = leaf.numpy()
        num = central_differences(base, first_order_dot_v)
        got = np.zeros_like(base) if second[k] is None else second[k].numpy()
        np.testing.assert_allclose(got, num, rtol=1e-4, atol=1e-5, err_msg=name)


REQUIRED_DOUBLE_BACKWARD = ("mul", "tanh", "sigmoid", "layer_norm")


def test_double_backward_covers_required_ops() -> None:
    names = {c.op.name for c in second_order_cases()}
    assert set(REQUIRED_DOUBLE_BACKWARD) <= names


def test_every_op_has_tests_and_every_differentiable_op_a_gradient_check() -> None:
    specs = [opforge.spec(n) for n in sorted(_formulas.OPS)]
    assert all(s.tests is not None for s in specs), [s.name for s in specs if s.tests is None]
    graded = {c.op.name for c in GRAD_CASES}
    assert {s.name for s in specs if any(i.differentiable for i in s.inputs)} <= graded
