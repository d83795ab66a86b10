"""opforge ops under PyTorch's function transforms and forward-mode AD: every op's float64 cases
through ``torch.func.jvp`` (against central differences), ``torch.autograd.forward_ad``,
``torch.func.grad``/``vjp``/``jacrev`` (against ``torch.autograd.grad``), ``jacfwd`` against
``jacrev``, and ``hessian`` (forward over reverse: the jvp formulas of the backward ops)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import torch.autograd.forward_ad as fwAD  # noqa: E402

import opforge.torch as ot  # noqa: E402
from cases import Case, make_data, widest_cases  # noqa: E402
from torch_cases import differentiable_fn, torch_inputs  # noqa: E402

CASES = [c for c in widest_cases() if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)
         and any(o.differentiable for o in c.op.outputs)]


def _setup(case: Case, seed: int = 0) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
    data = make_data(case.op, case.dtype, case.shapes, np.random.default_rng(seed))
    fn, primals = differentiable_fn(case, torch_inputs(case, data))
    gen = torch.Generator().manual_seed(seed)
    tangents = tuple(torch.randn(p.shape, dtype=p.dtype, generator=gen) for p in primals)
    return fn, primals, tangents


def _tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_func_jvp_matches_central_differences(case: Case) -> None:
    fn, primals, tangents = _setup(case)
    out, tout = torch.func.jvp(fn, primals, tangents)
    h = 1e-6
    plus = fn(*(p + h * t for p, t in zip(primals, tangents)))
    minus = fn(*(p - h * t for p, t in zip(primals, tangents)))
    for t, a, b in zip(_tuple(tout), _tuple(plus), _tuple(minus)):
        torch.testing.assert_close(t, (a - b) / (2 * h), rtol=1e-5, atol=1e-6)
    for o, ref in zip(_tuple(out), _tuple(fn(*primals))):
        torch.testing.assert_close(o, ref)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_ad_dual_tensors(case: Case) -> None:
    fn, primals, tangents = _setup(case, 1)
    _, expected = torch.func.jvp(fn, primals, tangents)
    with fwAD.dual_level():
        out = fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
        got = [fwAD.unpack_dual(o).tangent for o in _tuple(out)]
    for g, e in zip(got, _tuple(expected)):
        assert g is not None, case.id
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_func_vjp_and_grad_match_autograd(case: Case) -> None:
    fn, primals, _ = _setup(case, 2)
    out, pullback = torch.func.vjp(fn, *primals)
    gen = torch.Generator().manual_seed(3)
    cots = tuple(torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in _tuple(out))
    got = pullback(cots if isinstance(out, tuple) else cots[0])
    leaves = [p.detach().requires_grad_(True) for p in primals]
    ref = torch.autograd.grad(_tuple(fn(*leaves)), leaves, cots, allow_unused=True)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r if r is not None else torch.zeros_like(g))

    def loss(*xs: Any) -> Any:
        terms = [(o * c).sum() for o, c in zip(_tuple(fn(*xs)), cots)]
        return sum(terms[1:], terms[0])

    grads = torch.func.grad(loss, argnums=tuple(range(len(primals))))(*primals)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r if r is not None else torch.zeros_like(g))


SMALL = [c for c in CASES if all(s is None or int(np.prod(s)) <= 64 for s in c.shapes)]


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_jacfwd_equals_jacrev(case: Case) -> None:
    fn, primals, _ = _setup(case, 4)
    argnums = tuple(range(len(primals)))
    fwd = torch.func.jacfwd(fn, argnums=argnums)(*primals)
    rev = torch.func.jacrev(fn, argnums=argnums)(*primals)
    torch.testing.assert_close(fwd, rev)


HESSIAN_OPS = ("tanh", "exp", "sigmoid", "gelu", "softmax", "log_softmax", "layer_norm", "rms_norm", "logsumexp",
               "mul", "div", "matmul", "linear", "cross_entropy", "sqrt", "pow")


@pytest.mark.parametrize("case", [c for c in SMALL if c.op.name in HESSIAN_OPS], ids=lambda c: c.id)
def test_hessian_forward_over_reverse(case: Case) -> None:
    """torch.func.hessian is jacfwd(jacrev): forward mode through the ops' backward ops."""
    fn, primals, _ = _setup(case, 5)
    gen = torch.Generator().manual_seed(6)
    weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in _tuple(fn(*primals))]

    def scalar(x: Any) -> Any:
        terms = [(o * w).sum() for o, w in zip(_tuple(fn(x, *primals[1:])), weights)]
        return sum(terms[1:], terms[0])  # (not sum(terms): 0 + a tensor fails under vmap of an empty batch)

    h = torch.func.hessian(scalar)(primals[0])
    if primals[0].numel() == 0:  # (torch.autograd.functional.hessian cannot stack an empty Jacobian)
        assert h.shape == primals[0].shape * 2
        return
    ref = torch.autograd.functional.hessian(scalar, primals[0])
    torch.testing.assert_close(h, ref)


def test_tanh_jvp_is_not_zero() -> None:
    """Regression: torch.func.jvp of an opforge op used to return a zero tangent silently."""
    x = torch.tensor([0.0, 0.5, -1.0], dtype=torch.float64)
    _, t = torch.func.jvp(ot.ops.tanh, (x,), (torch.ones(3, dtype=torch.float64),))
    torch.testing.assert_close(t, 1 - torch.tanh(x) ** 2)
    with fwAD.dual_level():
        y = ot.ops.tanh(fwAD.make_dual(x, torch.ones_like(x)))
        assert fwAD.unpack_dual(y).tangent is not None


def test_an_op_without_jvp_raises_naming_it(tmp_path: Any) -> None:
    import opforge

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
    mod = opforge.load("rowscale_tfw", [tmp_path / "rowscale.yaml"], build_dir=tmp_path / "cache")
    tops = ot.register_module(mod, "rowscale_tfw")
    x = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"\[rowscale\] has no forward-mode derivative"):
        torch.func.jvp(tops.rowscale, (x,), (x,))
    # reverse mode works
    g = torch.func.grad(lambda a: tops.rowscale(a).sum())(x)
    torch.testing.assert_close(g, torch.full((3,), 6.0, dtype=torch.float64))


VMAP_CASES = [c for c in widest_cases() if any(s for s in c.shapes if s is not None)]


@pytest.mark.parametrize("in_dim", [0, 1])
@pytest.mark.parametrize("case", VMAP_CASES, ids=lambda c: c.id)
def test_vmap_equals_the_loop(case: Case, in_dim: int) -> None:
    """vmap over every tensor input (batch of 3, at in_dim where the input has that many dims)
    equals a loop over the batch; pytest turns torch's fallback warning into an error, so every
    op has a batching rule."""
    samples = [torch_inputs(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(s)))
               for s in range(3)]
    dims = [None if t is None else min(in_dim, t.dim()) for t in samples[0]]
    batched = [None if d is None else torch.stack([s[k] for s in samples], dim=d)
               for k, d in enumerate(dims)]
    op = getattr(ot.ops, case.op.name).default

    def call(*xs: Any) -> Any:
        return op(*xs, **case.attrs)

    got = torch.func.vmap(call, in_dims=tuple(dims))(*batched)
    expected = [call(*s) for s in samples]
    for k, g in enumerate(_tuple(got)):
        torch.testing.assert_close(g, torch.stack([_tuple(e)[k] for e in expected]))


def test_vmap_of_an_output_shaped_after_an_unindexed_input() -> None:
    """layer_norm_affine_backward's axes index dy and x, not weight: with only dy batched, one call
    on the batch would sum dweight over it, so each example runs alone (dweight (batch, n))."""
    torch.manual_seed(0)
    f64 = torch.float64
    x, w, b = torch.randn(4, 6, dtype=f64), torch.randn(6, dtype=f64), torch.randn(6, dtype=f64)
    m, r = x.mean(-1, keepdim=True), x.var(-1, keepdim=True).rsqrt()
    dm, dr = torch.randn(4, 1, dtype=f64), torch.randn(4, 1, dtype=f64)
    dys = torch.randn(3, 4, 6, dtype=f64)

    def call(dy: Any) -> Any:
        return ot.ops.layer_norm_affine_backward(dy, x, m, r, dm, dr, w, b)

    got = torch.func.vmap(call)(dys)
    expected = [call(dy) for dy in dys]
    assert [g.shape for g in got] == [(3, 4, 6), (3, 6), (3, 6)]
    for k, g in enumerate(got):
        torch.testing.assert_close(g, torch.stack([e[k] for e in expected]))


@pytest.mark.parametrize("name, make, kwargs", [
    ("mul", lambda: (torch.randn(4, 3, 5), torch.randn(5)), {}),               # elementwise: broadcast
    ("softmax", lambda: (torch.randn(4, 3, 5),), {"axis": -1}),               # axis shifted past the batch
    ("sum", lambda: (torch.randn(4, 3, 5),), {}),                             # None: every logical axis
    ("max", lambda: (torch.randn(4, 3, 5),), {"axis": 0}),
    ("layer_norm", lambda: (torch.randn(4, 3, 5), torch.randn(5)), {"axis": [-1]}),
    ("take_along_axis", lambda: (torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3, 2))), {"axis": 1}),
    ("matmul", lambda: (torch.randn(4, 3, 5), torch.randn(5, 2)), {}),        # batch dims broadcast
    ("linear", lambda: (torch.randn(4, 3, 5), torch.randn(2, 5)), {}),        # batch_inputs: x's rows
    ("embedding", lambda: (torch.randint(0, 6, (4, 3)), torch.randn(6, 2)), {}),
])
def test_vmap_runs_the_op_once(name: str, make: Any, kwargs: dict) -> None:
    """Ops with a batching rule run once on the whole batch (opforge's call trace), and match
    the per-example results."""
    import opforge

    args = make()
    op = getattr(ot.ops, name).default
    in_dims = (0,) + (None,) * (len(args) - 1)
    if name == "take_along_axis":
        in_dims = (0, 0)
    opforge._C._trace_gil(True)
    try:
        got = torch.func.vmap(lambda *xs: op(*xs, **kwargs), in_dims=in_dims)(*args)
    finally:
        calls = [n for n, _ in opforge._C._trace_gil(False)]
    assert calls.count(name) == 1, calls
    for b in range(4):
        one = op(*(a[b] if d == 0 else a for a, d in zip(args, in_dims)), **kwargs)
        for g, e in zip(_tuple(got), _tuple(one)):
            torch.testing.assert_close(g[b], e)


def test_transforms_under_autocast_meet_one_dtype() -> None:
    # (functorch's kernel sits above Autocast's: the autograd.Function saved the uncast inputs and
    # its gradients and tangents mixed bfloat16 with float32: "[cross_entropy_backward] inputs 'dy'
    # (float32) and 'logits' (bfloat16) must have the same dtype")
    F = torch.nn.functional
    torch.manual_seed(0)
    x, lab = torch.randn(3, 5, dtype=torch.bfloat16), torch.randint(0, 5, (3,))
    w, xs, labs = torch.randn(4, 5), torch.randn(8, 5), torch.randint(0, 4, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g = torch.func.grad(lambda a: ot.ops.cross_entropy(a, lab))(x)
        torch.testing.assert_close(g, torch.func.grad(lambda a: F.cross_entropy(a, lab))(x), rtol=2e-2, atol=2e-2)
        g = torch.func.grad(lambda a: ot.ops.layer_norm(a)[0].float().pow(2).sum())(x)
        assert g.dtype == torch.bfloat16
        _, t = torch.func.jvp(ot.ops.softmax, (x,), (x,))
        assert t.dtype == torch.float32  # (softmax's policy: float32, as its output)
        # per-sample gradients of a mixed-precision layer: float32 weights, bfloat16 products
        ours = torch.func.vmap(torch.func.grad(lambda w, a, l: ot.ops.cross_entropy(ot.ops.linear(a[None], w), l[None])),
                               in_dims=(None, 0, 0))(w, xs, labs)
        theirs = torch.func.vmap(torch.func.grad(lambda w, a, l: F.cross_entropy(F.linear(a[None], w), l[None])),
                                 in_dims=(None, 0, 0))(w, xs, labs)
        assert ours.dtype == theirs.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, rtol=3e-2, atol=3e-2)
