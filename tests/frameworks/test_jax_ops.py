"""opforge.jax: every op as a JAX operation, checked with JAX's own tools on inputs from its spec.

For each spec'd op and each of its test cases: the op under ``jax.jit`` matches the spec's NumPy
reference in every dtype it has; ``jax.test_util.check_grads`` passes in reverse mode (and forward
mode: every shipped op has a jvp) to order 2 for ops with differentiable inputs; ``jax.vmap``
equals a loop over the batch. Then the seeds' examples, bad input, op modules.

JAX 0.10 needs NumPy 2 (MindSpore NumPy 1): these tests run in their own environment, ``nox -s
jax`` (noxfile.py), and skip elsewhere, saying so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed (pip install "opforge[jax]"; `nox -s jax` runs these)')
jax.config.update("jax_enable_x64", True)  # (the float64 and int64 rows; the example runs without)

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import opforge  # noqa: E402
from opforge import _formulas  # noqa: E402
import opforge.jax as oj  # noqa: E402
from cases import Case, cases, make_data, reference, tolerance, widest_cases  # noqa: E402
from opforge.codegen.formula.syntax import ops_in  # noqa: E402

CASES = cases()
SPECS = {c.op.name: c.op for c in CASES}
GPU = jax.default_backend() == "gpu"  # (the cu130 wheel with JAX's CUDA plugin: arrays live on the GPU)
CPU = jax.devices("cpu")[0]


def runs_on_cuda(op: Any, dtype: str, derivatives: bool = False, seen: frozenset[str] = frozenset()) -> bool:
    """Whether the cuda build runs op in dtype: its cuda rows hold the dtype (any row, for an op
    without type variables; a composite op has no rows of its own), and so do the ops its composite
    formula calls (and, with derivatives, its bprop and jvp formulas)."""
    if op.impl.kind != "composite":
        target = op.target("cuda")
        if target is None:
            return False
        if op.typevars and not any(dtype in [str(d) for d in b.values()] for b, _ in target.rows()):
            return False
    formulas = op.formulas() if derivatives else [op.impl.formula] if op.impl.kind == "composite" else []
    called = {n for f in formulas for n in ops_in(f.ast)} & SPECS.keys()  # (operators too: x * x is mul)
    return all(runs_on_cuda(SPECS[n], dtype, derivatives, seen | {op.name}) for n in called - seen - {op.name})


def device_for(case: Case, derivatives: bool = False) -> Any:
    """JAX's default device; on a GPU, the CPU for a case the cuda build does not run (a dtype
    outside the op's cuda rows, an op without cuda kernels: such calls raise on the GPU, naming
    the op, see test_calls_the_cuda_build_does_not_run_raise_naming_the_op)."""
    return CPU if GPU and not runs_on_cuda(case.op, case.dtype, derivatives) else jax.devices()[0]


WIDEST = widest_cases()
GRAD_CASES = [c for c in WIDEST if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)]
VMAP_CASES = [c for c in WIDEST if any(s for s in c.shapes if s is not None)]


def jax_inputs(case: Case, data: list[Any]) -> list[Any]:
    out = []
    for inp, a in zip(case.op.inputs, data):
        if a is None:
            out.append(None)
            continue
        dtype = case.dtype if inp.dtype in dict(case.op.typevars) else inp.dtype
        out.append(jnp.asarray(np.asarray(a).astype(jnp.bfloat16 if dtype == "bfloat16" else dtype)))
    return out


def as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def test_every_op_is_a_jax_function() -> None:
    assert set(vars(oj.ops)) == set(_formulas.OPS)
    # ops with kernels are primitives lowering to the one FFI target; square is a formula over them
    assert set(oj._OWN.primitives) == {n for n, o in _formulas.OPS.items() if not (o.composite and o.bprop is None)}
    jaxpr = jax.make_jaxpr(lambda x: oj.ops.tanh(oj.ops.mul(x, x)))(jnp.ones(3))
    assert [e.primitive.name for e in jaxpr.eqns] == ["jit", "jit"]  # (each op call: a cached jit)
    assert "opforge.mul" in str(jaxpr) and "opforge.tanh" in str(jaxpr)
    text = jax.jit(lambda x: oj.ops.tanh(x)).lower(jnp.ones(3)).as_text()
    assert "stablehlo.custom_call @opforge" in text and 'opforge.name = "tanh"' in text
    # (nothing particular to this process: the op goes by name, so the HLO is the same elsewhere)
    assert "opforge.op " not in text and "opforge.process" not in text


def test_the_norms_fuse_parameter_gradients_only_when_they_are_asked_for() -> None:
    # layer_norm's bprop: if_needs(weight/bias, the fused dx-dweight-dbias op, dx alone); transpose
    # asks for the gradients of the live tangents only
    x, w, b = jnp.ones((4, 8)), jnp.full(8, 2.0), jnp.zeros(8)

    def loss(x, w, b):
        return oj.ops.layer_norm(x, w, b)[0].sum()

    assert "opforge.layer_norm_affine_backward" in str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w, b))
    only_x = str(jax.make_jaxpr(jax.grad(loss))(x, w, b))
    assert "opforge.layer_norm_backward" in only_x and "affine" not in only_x
    xs = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8)))
    np.testing.assert_allclose(jax.grad(loss)(xs, w, b), jax.grad(loss, argnums=(0, 1))(xs, w, b)[0], rtol=1e-6)


def test_cases_cover_every_op() -> None:
    assert {c.op.name for c in CASES} == set(_formulas.OPS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jit_matches_reference(case: Case, rng) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    op = getattr(oj.ops, case.op.name)
    with jax.default_device(device_for(case)):
        outs = as_tuple(jax.jit(lambda *xs: op(*xs, **case.attrs))(*jax_inputs(case, data)))
    refs = reference(case.op, data, case.attrs)
    rtol, atol = tolerance(case.op, case.dtype)
    assert len(outs) == len(refs)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        assert isinstance(o, jax.Array)
        expected = case.dtype if spec.dtype in dict(case.op.typevars) else spec.dtype
        assert str(o.dtype) == expected, spec.name
        r = np.asarray(r)
        assert o.shape == r.shape, spec.name
        if jnp.issubdtype(o.dtype, jnp.floating):
            np.testing.assert_allclose(np.asarray(o, np.float64), r, rtol=rtol, atol=atol, err_msg=spec.name)
        else:
            np.testing.assert_array_equal(np.asarray(o), r.astype(np.asarray(o).dtype), err_msg=spec.name)


def differentiable_fn(case: Case, args: list[Any]) -> tuple[Any, tuple[Any, ...]]:
    """The op as a function of its present differentiable inputs (the others fixed), returning its
    floating outputs only (integer outputs, indices, have no derivative)."""
    slots = [k for k, (inp, a) in enumerate(zip(case.op.inputs, args)) if inp.differentiable and a is not None]
    op = getattr(oj.ops, case.op.name)

    def fn(*diff: Any) -> Any:
        full = list(args)
        for k, t in zip(slots, diff):
            full[k] = t
        outs = tuple(o for o in as_tuple(op(*full, **case.attrs)) if jnp.issubdtype(o.dtype, jnp.floating))
        return outs[0] if len(outs) == 1 else outs

    return fn, tuple(args[k] for k in slots)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_check_grads_to_order_two(case: Case, rng) -> None:
    """Reverse mode (the spec's bprop) and forward mode (its jvp), and each differentiated again,
    against finite differences."""
    data = make_data(case.op, case.dtype, case.shapes, rng)
    with jax.default_device(device_for(case, derivatives=True)):
        fn, inputs = differentiable_fn(case, jax_inputs(case, data))
    rtol, atol = case.op.tests.grad_tolerance or (1e-3, 1e-5)
    modes = ("rev", "fwd") if case.op.jvp is not None else ("rev",)
    # (op by op, without compiling each transformed program: the same rules, half the time; the
    # lowering of the tangent maps is what the jit tests below compile)
    with jax.disable_jit(), jax.default_device(device_for(case, derivatives=True)):
        check_grads(fn, inputs, order=2, modes=modes, atol=max(atol, 1e-5), rtol=max(rtol, 1e-3), eps=1e-5)


# (the batch axis at 0 for every op, and at 1 too for ops whose batching rule reads axes or rows:
# elementwise ops move it first with the same code whatever it is)
VMAP_DIMS = [(c, d) for c in VMAP_CASES for d in ((0,) if _formulas.OPS[c.op.name].impl == "expr" else (0, 1))]


@pytest.mark.parametrize("case,in_dim", VMAP_DIMS, ids=lambda v: v.id if isinstance(v, Case) else f"dim{v}")
def test_vmap_equals_the_loop(case: Case, in_dim: int) -> None:
    with jax.default_device(device_for(case)):
        vmap_equals_the_loop(case, in_dim)


def vmap_equals_the_loop(case: Case, in_dim: int) -> None:
    samples = [jax_inputs(case, make_data(case.op, case.dtype, case.shapes, np.random.default_rng(s)))
               for s in range(3)]
    dims = [None if t is None else min(in_dim, t.ndim) for t in samples[0]]
    batched = [None if d is None else jnp.stack([s[k] for s in samples], axis=d) for k, d in enumerate(dims)]
    op = getattr(oj.ops, case.op.name)
    present = [k for k, t in enumerate(batched) if t is not None]

    def call(*xs: Any) -> Any:
        full: list[Any] = [None] * len(batched)
        for k, x in zip(present, xs):
            full[k] = x
        return op(*full, **case.attrs)

    got = jax.vmap(call, in_axes=tuple(dims[k] for k in present))(*(batched[k] for k in present))
    expected = [as_tuple(call(*(s[k] for k in present))) for s in samples]
    for j, g in enumerate(as_tuple(got)):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.stack([np.asarray(e[j], np.float64) for e in expected]),
                                   rtol=1e-12, atol=1e-12)


def test_vmap_of_an_output_shaped_after_an_unindexed_input() -> None:
    """layer_norm_affine_backward's axes index dy and x, not weight: with only dy batched, each
    example runs alone (one call on the batch would sum dweight over it)."""
    rng = np.random.default_rng(0)
    x, w, b = (jnp.asarray(rng.standard_normal(s)) for s in ((4, 6), 6, 6))
    m, r = x.mean(-1, keepdims=True), 1 / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
    dm, dr = jnp.asarray(rng.standard_normal((4, 1))), jnp.asarray(rng.standard_normal((4, 1)))
    dys = jnp.asarray(rng.standard_normal((3, 4, 6)))

    def call(dy: Any) -> Any:
        return oj.ops.layer_norm_affine_backward(dy, x, m, r, dm, dr, w, b)

    got = jax.vmap(call)(dys)
    assert [g.shape for g in got] == [(3, 4, 6), (3, 6), (3, 6)]
    for k, g in enumerate(got):
        want = np.stack([np.asarray(call(dy)[k]) for dy in dys])
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12, atol=1e-12)


def test_vmap_of_an_elementwise_op_is_one_call() -> None:
    """Elementwise ops batch in one call (the batch axes moved first and padded); others too where
    their axis attrs allow; the rest loop (jax.lax.map)."""
    x, y = jnp.ones((5, 3)), jnp.ones((3, 1))
    jaxpr = jax.make_jaxpr(jax.vmap(lambda a: oj.ops.mul(a, y)))(x)
    assert "opforge.mul" in str(jaxpr) and "scan" not in str(jaxpr)
    assert jax.vmap(lambda a: oj.ops.mul(a, y))(x).shape == (5, 3, 3)
    jaxpr = jax.make_jaxpr(jax.vmap(lambda a: oj.ops.softmax(a, axis=0)))(jnp.ones((5, 3, 4)))
    assert "scan" not in str(jaxpr)
    # matmul of a batched a by a b of at most 2 dims: the batch dim one more row of a (it looped)
    a, b = np.arange(15.0).reshape(5, 3), np.arange(6.0).reshape(3, 2)
    for row, want in ((a, a @ b), (a.T, a @ b)):
        f = jax.vmap(lambda r: oj.ops.matmul(r, b), in_axes=0 if row is a else 1)
        assert "scan" not in str(jax.make_jaxpr(f)(row))
        np.testing.assert_array_equal(f(row), want)


def test_jit_compiles_once_per_shape_and_attrs() -> None:
    op = oj._OWN.ops.leaky_relu
    traced = []
    real = oj._OWN._ops["leaky_relu"].meta
    oj._OWN._ops["leaky_relu"].meta = lambda *a: traced.append(a) or real(*a)
    try:
        x = jnp.arange(4.0)
        for _ in range(3):
            op(x, alpha=0.5)
        assert len(traced) == 2  # (the trace's abstract eval and the lowering: once)
        op(x + 1, alpha=0.5)
        assert len(traced) == 2
        op(x, alpha=0.25)  # a new attr value: a new compile
        assert len(traced) == 4
        op(jnp.arange(5.0), alpha=0.25)  # a new shape
        assert len(traced) == 6
    finally:
        oj._OWN._ops["leaky_relu"].meta = real


def test_optimizer_steps_take_traced_learning_rates_and_step_counts() -> None:
    """sgd_step's lr and adam_step's per-step scalars are inputs, not attrs: an lr schedule or the
    step count is a traced value under jax.jit and lax.scan, one program for every value (as attrs
    they could not be traced at all, and each new value compiled again)."""
    rng = np.random.default_rng(5)
    p, g, buf = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3))
    traces = []

    @jax.jit
    def sgd(p: Any, g: Any, buf: Any, lr: Any) -> Any:
        traces.append(lr)
        return oj.ops.sgd_step(p, g, buf, lr, momentum=0.9)

    for lr in (0.1, 0.05, 0.01):
        new_p, new_buf = sgd(p, g, buf, jnp.float32(lr))
        np.testing.assert_allclose(new_buf, 0.9 * buf + g, rtol=1e-6)
        np.testing.assert_allclose(new_p, p - np.float32(lr) * (0.9 * buf + g), rtol=1e-6, atol=1e-7)
    assert len(traces) == 1

    b1, b2, lr = 0.9, 0.999, 0.01

    def adam(carry: Any, t: Any) -> Any:  # (t: the step count, traced)
        w, m1, m2 = carry
        return oj.ops.adam_step(w, g, m1, m2, lr / (1 - b1 ** t), jnp.sqrt(1 - b2 ** t), 1.0, exp_avg_weight=1 - b1,
                                beta2=b2, exp_avg_sq_weight=1 - b2), None

    zeros = np.zeros_like(p)
    (w, m1, m2), _ = jax.jit(lambda c: jax.lax.scan(adam, c, jnp.arange(1.0, 4.0, dtype=jnp.float32)))((p, zeros, zeros))
    # the same three steps by opforge.optim.Adam (its scalars computed in double, as torch.optim's)
    want = opforge.tensor(p.copy(), requires_grad=True)
    opt = opforge.optim.Adam([want], lr=lr, betas=(b1, b2))
    for _ in range(3):
        want.grad = g
        opt.step()
    np.testing.assert_allclose(w, want.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(m2, opt.state[0]["exp_avg_sq"].numpy(), rtol=1e-5)


def test_the_gradient_of_a_mean_over_an_empty_axis_is_empty() -> None:
    """(numel(out) / numel(x) in mean's bprop: Python's division by 0 raised ZeroDivisionError)"""
    for shape in ((0, 3), (3, 0)):
        assert jax.grad(lambda a: oj.ops.sum(oj.ops.mean(a, axis=[0])))(jnp.zeros(shape)).shape == shape
    # the gradient's own gradient with respect to the output's cotangent: 0, as jnp's (was NaN)
    x = jnp.zeros((3, 0))
    _, vjp = jax.vjp(lambda a: oj.ops.mean(a, axis=[1]), x)
    ggy = jax.grad(lambda g: jnp.sum(vjp(g)[0]))(jnp.ones(3))
    np.testing.assert_array_equal(ggy, np.zeros(3))


def test_forward_mode_leaves_out_the_terms_of_inputs_without_tangents() -> None:
    """(pow's jvp read log(x) times a zero tangent of the exponent: NaN at x < 0; see
    tests/ops/test_forward_mode.py)"""
    x = jnp.array([-1.0, 2.0, -3.0])
    np.testing.assert_allclose(jax.jacfwd(lambda a: oj.ops.pow(a, 2.0))(x), np.diag(2 * np.asarray(x)))
    np.testing.assert_allclose(jax.hessian(lambda a: oj.ops.sum(oj.ops.pow(a, 3.0)))(x), np.diag(6 * np.asarray(x)))
    np.testing.assert_allclose(jax.jvp(lambda a: oj.ops.add(a, jnp.ones((2, 3))), (x,), (jnp.ones(3),))[1],
                               np.ones((2, 3)))


def test_an_attr_of_minus_zero_compiles_apart_from_zero() -> None:
    """-0.0 == 0.0 as floats, and the jitted call's cache took one for the other: leaky_relu(-1,
    alpha=-0.0) gave -0.0 after a call with alpha=0.0 (eager gives +0.0), clamp likewise."""
    x = jnp.array([-1.0, 2.0], jnp.float32)
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        for alpha in (first, second):
            got = np.asarray(oj.ops.leaky_relu(x, alpha=alpha))
            want = opforge.ops.leaky_relu(np.asarray(x), alpha=alpha).numpy()
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    both = jax.jit(lambda x: (oj.ops.clamp(x, min=0.0), oj.ops.clamp(x, min=-0.0)))(jnp.array([-1.0]))
    assert [bool(np.signbit(np.asarray(b))[0]) for b in both] == [False, True]
    nan = float("nan")  # (a NaN finds its own compilation again: equal to itself by its bits)
    assert oj._Float(nan) == oj._Float(nan) and oj._Float(0.0) != oj._Float(-0.0) and oj._Float(0.0) == 0


def test_python_numbers_take_the_dtype_of_their_partner_as_jax_takes_them() -> None:
    """x * 2.0 keeps x's dtype (bfloat16, float16, float32 with 64-bit types on), as jnp.multiply and
    opforge's own API do; before, the number was a float64 (float32) array and the call refused
    the mix. Numbers are checked as opforge's own API checks them."""
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        x = jnp.ones(3, dtype)
        assert oj.ops.mul(x, 2.0).dtype == jnp.multiply(x, 2.0).dtype == dtype
        assert oj.ops.mul(2, x).dtype == dtype and oj.ops.pow(x, 2).dtype == dtype
        assert jax.jit(lambda x: oj.ops.add(x, 1.5))(x).dtype == dtype
    assert oj.ops.mul(jnp.ones(3, jnp.int32), 3).dtype == jnp.int32
    assert oj.ops.mul(2, 1.5).dtype == jnp.float64  # (no array: JAX's default of the widest number)
    with pytest.raises(TypeError, match=r"\[add\] input 'y': a Python float cannot be int32 \(bound by input 'x'\)"):
        oj.ops.add(jnp.ones(3, jnp.int32), 1.5)
    with pytest.raises(ValueError, match=r"\[add\] input 'y': the Python int 1000 is out of range for int8"):
        oj.ops.add(jnp.ones(3, jnp.int8), 1000)
    with pytest.raises(ValueError, match=r"\[mul\] input 'x': the Python int 1267650600228229401496703205376 is "
                                         r"out of range for int64"):
        oj.ops.mul(2**100, 1)
    assert np.isinf(np.asarray(oj.ops.add(jnp.ones(2, jnp.float16), 1e300))).all()
    # (just past float16's largest value: rounded to it, as NumPy and jnp round it, not inf)
    assert np.asarray(oj.ops.mul(jnp.ones(2, jnp.float16), 65510.0)).tolist() == [65504.0, 65504.0]
    # (a float subclass is a float, an IntEnum an int; bfloat16 is a float dtype, its kind "V")
    class Half(float):
        pass
    with pytest.raises(TypeError, match=r"\[mul\] input 'y': a Python float cannot be int32"):
        oj.ops.mul(jnp.ones(2, jnp.int32), Half(2.5))
    import enum
    with pytest.raises(ValueError, match=r"\[mul\] input 'y': the Python int .* is out of range for int32"):
        oj.ops.mul(jnp.ones(2, jnp.int32), enum.IntEnum("E", {"BIG": 2**40}).BIG)
    assert np.isinf(np.asarray(oj.ops.mul(jnp.ones(2, jnp.bfloat16), 2**200).astype(np.float32))).all()
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"\[mul\] input 'x': the Python int 1099511627776 is out of range for "
                                             r"int32 \(JAX without 64-bit types\)"):
            oj.ops.mul(2**40, 1)


def test_weakly_typed_values_take_their_partners_dtype_as_jax_promotes() -> None:
    # (a Python number reaching the op as a weakly typed JAX value: an argument of jit or grad, a
    # scan carry, jnp.asarray(2.0); were refused as float32 beside bfloat16, float64 beside float32)
    x32 = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    x16 = x32.astype(jnp.bfloat16)
    assert jax.jit(oj.ops.mul)(x16, 2.0).dtype == jnp.bfloat16
    assert jax.jit(oj.ops.mul)(x32, 2.0).dtype == jnp.float32  # (2.0 a weak float64: 64-bit types are on)
    np.testing.assert_array_equal(oj.ops.add(x32, jnp.asarray(1)), x32 + 1)  # a weak int beside floats
    g = jax.grad(lambda s: oj.ops.sum(oj.ops.mul(x32, s)))(2.0)
    assert g.dtype == jax.grad(lambda s: jnp.sum(x32 * s))(2.0).dtype and float(g) == 15.0
    carry, _ = jax.lax.scan(lambda c, _: (oj.ops.add(c, x32[1, 2]), None), 0.0, None, length=3)
    assert float(carry) == 15.0
    # what JAX would promote to another dtype stays refused, naming the op
    with pytest.raises(TypeError, match=r"\[add\] inputs 'x' \(int32\) and 'y' \(float"):
        jax.jit(oj.ops.add)(jnp.ones(3, jnp.int32), 1.5)


def test_linear_calls_transpose_as_jax_numpys() -> None:
    # (the op primitives had no transpose rule: jax.linear_transpose, a custom_jvp rule computing
    # its tangents with opforge ops under grad, and gmres/bicgstab (custom_linear_solve transposes
    # the matvec) raised NotImplementedError where jax.numpy's ops work; found by a JAX hunt)
    import jax.scipy.sparse.linalg as spl
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 5)))
    a = jnp.eye(5) * 3.0 + 0.1 * jnp.asarray(rng.standard_normal((5, 5)))
    w, b = jnp.asarray(rng.standard_normal((3, 5))), jnp.asarray(rng.standard_normal(3))
    ct = jnp.asarray(rng.standard_normal((4, 3)))
    O = oj.ops
    for ours, theirs, primal, cot in (
            (O.neg, jnp.negative, x, x),
            (lambda t: O.matmul(t, a), lambda t: t @ a, x, x),
            (lambda t: O.matmul(a, t.T), lambda t: a @ t.T, x, x.T),  # (its second operand)
            (lambda t: O.sum(t, axis=[1]), lambda t: jnp.sum(t, axis=1), x, x[:, 0]),
            (lambda t: O.mean(t, axis=[0], keepdims=True), lambda t: jnp.mean(t, axis=0, keepdims=True), x, x[:1]),
            (O.transpose, lambda t: t.T, x, x.T),
            (lambda t: O.mul(t, x), lambda t: t * x, x, x),
            (lambda t: O.linear(t, w), lambda t: t @ w.T, x, ct),
            (lambda t: O.softmax_backward(t, O.softmax(x)), None, x, x)):
        got = jax.linear_transpose(ours, primal)(cot)[0]
        want = jax.linear_transpose(theirs or (lambda t: jax.jvp(jax.nn.softmax, (x,), (t,))[1]), primal)(cot)[0]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    @jax.custom_jvp
    def f(t):  # type: ignore[no-untyped-def]
        return O.softmax(t)

    @f.defjvp
    def f_jvp(p, t):  # type: ignore[no-untyped-def]
        s = O.softmax(p[0])
        return s, O.softmax_backward(t[0], s, axis=-1)

    np.testing.assert_allclose(jax.grad(lambda t: jnp.sum(f(t) * t))(x),
                               jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * t))(x), rtol=1e-12, atol=1e-14)
    y = x[0]
    np.testing.assert_allclose(spl.gmres(lambda v: O.matmul(a, v), y)[0], spl.gmres(lambda v: a @ v, y)[0], rtol=1e-8)
    np.testing.assert_allclose(jax.grad(lambda r: spl.bicgstab(lambda v: O.matmul(a, v), r)[0].sum())(y),
                               jax.grad(lambda r: spl.bicgstab(lambda v: a @ v, r)[0].sum())(y), rtol=1e-8)
    # calls that are not linear in the transposed operand say so, naming the op
    for bad, name in ((O.exp, "exp"), (lambda t: O.mul(t, t), "mul"), (O.relu, "relu"), (O.sign, "sign")):
        with pytest.raises(NotImplementedError, match=rf"\[{name}\] is not linear in "):
            jax.linear_transpose(bad, x)(x)


def test_errors_and_jaxprs_name_the_op() -> None:
    # (each op's jitted call was named `call`: "argument operands[0] of _Op.__init__.<locals>.call")
    assert "name=softmax" in str(jax.make_jaxpr(oj.ops.softmax)(jnp.ones(3)))


def test_inputs_that_are_not_arrays_or_numbers_raise_naming_the_op() -> None:
    x = jnp.ones(3)
    for bad in ("a", [1.0, 2.0, 3.0], {"x": 1}, opforge.tensor(np.ones(3, np.float32))):
        with pytest.raises(TypeError, match=r"\[mul\] input 'x' must be a JAX or NumPy array or a Python number, "
                                            r"got "):
            oj.ops.mul(bad, x)
    with pytest.raises(TypeError, match=r"\[mul\] input 'y' complex numbers are not supported"):
        oj.ops.mul(x, 1j)
    with pytest.raises(ValueError, match=r"\[leaky_relu\] attr 'alpha' is out of range for float"):
        oj.ops.leaky_relu(x, alpha=2**1024)
    np.testing.assert_array_equal(oj.ops.sum(jnp.ones((2, 3)), axis=np.array(0)), [2, 2, 2])  # (a 0-d array: one axis)
    # a composite op's own checks first (square over mul: its errors were named [mul])
    with pytest.raises(TypeError, match=r"\[square\] dtype bool is not supported on target cpu"):
        oj.ops.square(jnp.ones(3, bool))
    with pytest.raises(TypeError, match=r"\[square\] input 'x' has dtype complex64"):
        oj.ops.square(jnp.ones(3, jnp.complex64))


# ---------------------------------------------------------------------------- the seeds


def test_seed_000_network_value_and_grad_in_jax() -> None:
    """MyNet: z = mul(x, y); out = mul(z, p) with weight p = 2.0, x = 2, y = 3: gradients with
    respect to the inputs and the parameter."""
    def net(x: Any, y: Any, p: Any) -> Any:
        return oj.ops.mul(oj.ops.mul(x, y), p)

    out, grads = jax.value_and_grad(net, argnums=(0, 1, 2))(jnp.float32(2.0), jnp.float32(3.0), jnp.float32(2.0))
    assert out.dtype == jnp.float32 and out.shape == () and float(out) == 12.0
    assert [float(g) for g in grads] == [6.0, 4.0, 6.0]


def test_seed_002_square_grad_in_jax() -> None:
    x = jnp.array([1.0, 4.0, 9.0], jnp.float32)
    np.testing.assert_array_equal(jax.grad(lambda t: oj.ops.sum(oj.ops.square(t)))(x), [2.0, 8.0, 18.0])
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda t: oj.ops.sum(oj.ops.square(t))))(x), [2.0, 8.0, 18.0])


def test_seed_000_broadcast_gradient_reduced_to_the_input_shape() -> None:
    gx, gy = jax.grad(lambda x, y: oj.ops.sum(oj.ops.mul(x, y)), argnums=(0, 1))(
        jnp.ones((2, 3), jnp.float32), jnp.array([1.0, 2.0, 3.0], jnp.float32))
    assert gx.shape == (2, 3) and gy.shape == (3,)
    np.testing.assert_array_equal(gy, [2.0, 2.0, 2.0])


def test_hessian_jacfwd_jacrev_and_linearize_agree_with_jnp() -> None:
    x = jnp.linspace(-1.0, 1.0, 5)

    def f(a: Any) -> Any:
        return oj.ops.sum(oj.ops.mul(oj.ops.tanh(a), oj.ops.exp(a)))

    def g(a: Any) -> Any:
        return jnp.sum(jnp.tanh(a) * jnp.exp(a))

    for transform in (jax.grad, jax.hessian, jax.jacfwd, jax.jacrev, lambda h: jax.jacrev(jax.jacfwd(h))):
        np.testing.assert_allclose(transform(f)(x), transform(g)(x), rtol=1e-12, atol=1e-12)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.hessian(f)))(xs), jax.vmap(jax.hessian(g))(xs), rtol=1e-12,
                               atol=1e-12)
    _, lin = jax.linearize(f, x)
    _, lin_ref = jax.linearize(g, x)
    np.testing.assert_allclose(lin(jnp.ones(5)), lin_ref(jnp.ones(5)), rtol=1e-12)


def test_multi_output_op_gradients_flow_through_every_output() -> None:
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4)))

    def f(a: Any) -> Any:
        y, mean, rstd = oj.ops.layer_norm(a)
        return oj.ops.sum(y * y) + oj.ops.sum(mean) + oj.ops.sum(rstd)

    def g(a: Any) -> Any:
        mean = a.mean(-1, keepdims=True)
        var = ((a - mean) ** 2).mean(-1, keepdims=True)
        rstd = 1 / jnp.sqrt(var + 1e-5)
        return jnp.sum(((a - mean) * rstd) ** 2) + jnp.sum(mean) + jnp.sum(rstd)

    np.testing.assert_allclose(jax.grad(f)(x), jax.grad(g)(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jax.jvp(f, (x,), (x,))[1], jax.jvp(g, (x,), (x,))[1], rtol=1e-10)


def test_int32_indices_without_x64() -> None:
    """JAX without 64-bit types has no int64: int64 inputs take its int32 arrays (widened in the
    handler) and int64 results come back as int32."""
    script = """
import jax, jax.numpy as jnp, numpy as np
import opforge.jax as oj
logits = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32)
labels = jnp.array([0, 2, 1, 2])
assert labels.dtype == jnp.int32
loss = oj.ops.cross_entropy(logits, labels)
ref = -jax.nn.log_softmax(logits)[jnp.arange(4), labels].mean()
np.testing.assert_allclose(loss, ref, rtol=1e-6)
g = jax.grad(lambda l: oj.ops.cross_entropy(l, labels))(logits)
np.testing.assert_allclose(g, jax.grad(lambda l: -jax.nn.log_softmax(l)[jnp.arange(4), labels].mean())(logits), atol=1e-6)
v, i = oj.ops.max(logits, axis=1)
assert i.dtype == jnp.int32 and (np.asarray(i) == np.asarray(logits).argmax(1)).all(), i
e = oj.ops.embedding(i, logits)
np.testing.assert_array_equal(e, np.asarray(logits)[np.asarray(i)])
print("ok")
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


# ---------------------------------------------------------------------------- bad input


def test_bad_calls_raise_naming_the_op_at_trace_time() -> None:
    x = jnp.ones((2, 3))
    with pytest.raises(TypeError, match=r"\[mul\] input 'x' has dtype complex64, which opforge does not have; "
                                        r"supported dtypes: bool, uint8"):
        oj.ops.mul(jnp.ones(3, jnp.complex64), jnp.ones(3, jnp.complex64))
    with pytest.raises(TypeError, match=r"\[tanh\]"):  # (a dtype the op's rows do not list)
        oj.ops.tanh(jnp.ones(3, jnp.int32))
    with pytest.raises(ValueError, match=r"\[mul\]"):
        jax.jit(oj.ops.mul)(x, jnp.ones(4))
    with pytest.raises(TypeError, match=r"\[leaky_relu\] attr 'alpha' must be a float, got str"):
        oj.ops.leaky_relu(x, alpha="0.1")
    with pytest.raises(TypeError, match=r"\[leaky_relu\] attr 'alpha' must be a float, got bool"):
        oj.ops.leaky_relu(x, alpha=True)  # (not taken for 1.0: jit would cache it as equal)
    with pytest.raises(ValueError, match=r"\[cross_entropy\]"):
        oj.ops.cross_entropy(x, jnp.array([0, 1]), reduction="average")
    with pytest.raises(TypeError, match=r"\[mul\] got an unexpected keyword argument 'z'"):
        oj.ops.mul(x, x, z=1)
    with pytest.raises(TypeError, match=r"\[mul\] missing input 'y'"):
        oj.ops.mul(x)
    # checks that only the kernels made: at trace time too (an empty result runs no kernel in XLA,
    # so these calls returned results)
    S = jax.ShapeDtypeStruct
    with pytest.raises(IndexError, match=r"\[softmax\] axis 7 is out of range for a tensor of rank 2"):
        jax.eval_shape(lambda x: oj.ops.softmax(x, axis=7), S((2, 3), jnp.float32))
    with pytest.raises(IndexError, match=r"\[softmax\] axis 7 is out of range for a tensor of rank 3"):
        oj.ops.softmax(jnp.zeros((1, 0, 3)), axis=7)
    with pytest.raises(ValueError, match=r"\[softmax_backward\] dout of shape \(0,\) and y of shape \(1, 0\) must "
                                         r"have the same shape"):
        oj.ops.softmax_backward(jnp.zeros((0,)), jnp.zeros((1, 0)))
    with pytest.raises(ValueError, match=r"\[cross_entropy_grad_scale\] logits must have shape \(N, C\)"):
        oj.ops.cross_entropy_grad_scale(jnp.zeros(()), jnp.zeros((0,)), jnp.zeros((0,), jnp.int64))
    # (an axis is checked against the input it is of: indices without it, keepdims false, are fine;
    # max's gradient and tangent take them)
    y = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jax.grad(lambda y: oj.ops.sum(oj.ops.max(y, axis=-2)[0]))(y), [[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(jax.jvp(lambda y: oj.ops.max(y, axis=1)[0], (y,), (jnp.ones_like(y),))[1], [1, 1])
    with pytest.raises(IndexError, match=r"\[layer_norm_backward\] axis 1 is out of range for a tensor of rank 1"):
        o = jnp.ones((4, 6))  # (every input the axes index is checked, where no keepdims takes the axis out)
        oj.ops.layer_norm_backward(o, jnp.ones((0,)), o, o, o, o, axis=[1])
    with pytest.raises(ValueError, match=r"\[min\] cannot take the min over axis 1 of size 0"):
        jax.eval_shape(lambda y: oj.ops.min(y, axis=1), S((2, 0), jnp.float32))


def test_indices_out_of_range_raise_naming_the_op_without_reading_out_of_bounds() -> None:
    table = jnp.ones((4, 2))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"OUT_OF_RANGE: \[embedding\]"):
        jax.block_until_ready(oj.ops.embedding(jnp.array([0, 4]), table))
    logits = jnp.ones((2, 3))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\[cross_entropy\]"):
        jax.block_until_ready(jax.jit(oj.ops.cross_entropy)(logits, jnp.array([0, -1])))
    # the process goes on
    np.testing.assert_array_equal(oj.ops.embedding(jnp.array([3]), table), [[1.0, 1.0]])


def test_importing_opforge_jax_starts_no_backend() -> None:
    """The handler and its state's type are registered without starting JAX's backends, so what
    configures them after the import (XLA_FLAGS here; JAX_PLATFORMS, jax.distributed.initialize())
    still applies; the ops then run."""
    import subprocess
    import sys

    code = (
        "import os, jax, jax.numpy as jnp\n"
        "import opforge.jax as oj\n"
        "from jax._src import xla_bridge\n"
        "assert not xla_bridge.backends_are_initialized()\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'\n"
        "x = jax.device_put(jnp.arange(3.0), jax.devices('cpu')[2])\n"
        "print(len(jax.devices('cpu')), oj.ops.mul(x, x).tolist())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[0] == "3 [0.0, 1.0, 4.0]"


def test_calls_of_the_target_written_by_hand_are_checked_not_trusted(tmp_path: Any) -> None:
    """A program can reach the handler without opforge.jax's lowering (jax.ffi.ffi_call, an edited
    or foreign export): an attr it leaves out takes the op's default; a required input or attr
    left out, an attr of another type, a missing opforge.* attribute or a name of no op raise
    naming what is wrong, when the program is instantiated or run; nothing crashes."""
    x = -jnp.ones(4, jnp.float32)
    (tmp_path / "jx_scaled.yaml").write_text("""
jx_scaled:
  doc: x times a required attr.
  inputs:
    x: T
  attrs:
    scale: {type: float, required: true}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32]
  impl:
    expr: x * scale
""")
    own = dict(oj._OWN._ops, **oj.register_module(
        opforge.load("jx_scaled", [tmp_path / "jx_scaled.yaml"], build_dir=tmp_path / "cache"))._ops)

    def call(op: str, n_inputs: int, n_out: int = 1, **attrs: Any) -> Any:
        o = own[op]
        given = {"opforge.name": o.name, "opforge.abi": o.abi, "opforge.op": o.number,
                 "opforge.inputs": (1 << n_inputs) - 1, "opforge.widen": 0, "opforge.narrow": 0, **attrs}
        out = [jax.ShapeDtypeStruct(x.shape, x.dtype)] * n_out
        f = jax.ffi.ffi_call(oj.TARGET, out if n_out > 1 else out[0])
        with jax.default_device(CPU):
            return jax.block_until_ready(f(*[x] * n_inputs, **{k: v for k, v in given.items() if v is not None}))

    np.testing.assert_allclose(call("leaky_relu", 1), np.full(4, -0.01), rtol=1e-6)  # (alpha: its default)
    np.testing.assert_allclose(call("leaky_relu", 1, alpha=0.5), np.full(4, -0.5))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\[leaky_relu\] attr 'alpha' is not a float"):
        call("leaky_relu", 1, alpha=np.int64(2))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\[jx_scaled\] attr 'scale' is required"):
        call("jx_scaled", 1)
    np.testing.assert_allclose(call("jx_scaled", 1, scale=3.0), np.full(4, -3.0))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\[mul\] input 'y' is required"):
        call("mul", 1)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"a call without its opforge\.\* attributes"):
        call("mul", 2, **{"opforge.abi": None})
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"NOT_FOUND: \[no_such_op\] is not an op of this process"):
        call("mul", 2, **{"opforge.name": "no_such_op", "opforge.op": 1 << 40})
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"FAILED_PRECONDITION: \[mul\] was lowered for another "):
        call("mul", 2, **{"opforge.abi": 12345})
    np.testing.assert_array_equal(call("mul", 2), np.ones(4))  # (the process goes on)


def test_calls_on_many_threads_of_every_rank_agree_with_numpy() -> None:
    """The handler wraps XLA's buffers in wrappers it recycles per thread (rebound to each call's
    buffers, ranks 0 to 4 in turn): programs run from several threads at once, each mixing ranks,
    a transpose and reductions, give NumPy's results."""
    from concurrent.futures import ThreadPoolExecutor

    def program(a: Any, b: Any, c: Any) -> Any:
        t = oj.ops.transpose(oj.ops.mul(a, b))  # (the last two axes swapped)
        return oj.ops.add(oj.ops.sum(t, axis=[0]), oj.ops.sum(oj.ops.mul(c, c)))

    f = jax.jit(program)
    rng = np.random.default_rng(7)
    shapes = [((2, 5), ()), ((2, 3, 4), (3,)), ((2, 1, 3, 2), ()), ((1, 1), (2, 2))]
    data = [(rng.standard_normal(s), rng.standard_normal(s), rng.standard_normal(c)) for s, c in shapes]

    def expected(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.sum(np.swapaxes(a * b, -1, -2), axis=0) + np.sum(c * c)

    def worker(k: int) -> int:
        with jax.default_device(CPU):
            for r in range(40):
                a, b, c = data[(k + r) % len(data)]
                np.testing.assert_allclose(np.asarray(f(a, b, c)), expected(a, b, c), rtol=1e-12)
        return k

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(worker, range(4))) == [0, 1, 2, 3]


@pytest.fixture
def host_arrays() -> Any:
    """Op modules (opforge.load) compile cpu kernels only: their tests put arrays on the CPU device
    (JAX's default there anyway; on a GPU their calls raise, see the test after them)."""
    with jax.default_device(CPU):
        yield


def test_register_module_ops_with_gradients_and_no_forward_mode(tmp_path: Any, host_arrays: Any) -> None:
    (tmp_path / "jx_softplus.yaml").write_text("""
jx_softplus:
  doc: Softplus log(1 + exp(beta * x)) / beta.
  inputs:
    x: T
  attrs:
    beta: {type: float, default: 1.0}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32, float64]
  impl:
    expr: log1p(exp(beta * x)) / beta
  bprop:
    x: dout * sigmoid(beta * x)
""")
    (tmp_path / "jx_rowscale.yaml").write_text("""
jx_rowscale:
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
    m = opforge.load("jx_mod", sorted(tmp_path.glob("*.yaml")), build_dir=tmp_path / "cache")
    s = oj.register_module(m)
    assert oj.register_module(m) is s
    x = jnp.array([[-2.0, 0.5, 3.0], [1.0, -1.0, 0.0]])
    sp = np.log1p(np.exp(2.0 * np.asarray(x))) / 2.0
    np.testing.assert_allclose(jax.jit(lambda a: s.ops.jx_softplus(a, beta=2.0))(x), sp, rtol=1e-12)
    # its bprop calls opforge's sigmoid; check_grads differentiates that again
    check_grads(lambda a: s.ops.jx_softplus(a, beta=2.0), (x,), order=2, modes=("rev", "fwd"))
    ones = jnp.ones(3)
    np.testing.assert_allclose(jax.grad(lambda a: oj.ops.sum(s.ops.jx_rowscale(a)))(ones), np.full(3, 6.0))
    with pytest.raises(NotImplementedError, match=r"\[jx_rowscale\] has no forward-mode derivative"):
        jax.jvp(s.ops.jx_rowscale, (ones,), (ones,))
    with pytest.raises(TypeError, match=r"is not an opforge op module"):
        oj.register_module(np)


def test_a_pyfunc_op_runs_on_xlas_thread_and_takes_the_gil(tmp_path: Any, monkeypatch: Any, host_arrays: Any) -> None:
    """A pyfunc op's kernel is a Python function: the handler, on XLA's thread, takes the GIL for
    it (JAX releases it while the computation runs), eagerly and under jit and grad."""
    import shutil

    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # (pyfunc_helpers, the module the spec names)
    shutil.copy(ROOT / "tests" / "codegen" / "fixtures" / "np_softplus.yaml", tmp_path)
    m = opforge.load("jx_pyfunc", [tmp_path / "np_softplus.yaml"], build_dir=tmp_path / "cache")
    s = oj.register_module(m)
    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    np.testing.assert_allclose(s.ops.np_softplus(x), np.log1p(np.exp(np.asarray(x))), rtol=1e-6)
    g = jax.jit(jax.grad(lambda a: oj.ops.sum(s.ops.np_softplus(a))))(x)
    np.testing.assert_allclose(g, 1 / (1 + np.exp(-np.asarray(x))), rtol=1e-6)


@pytest.mark.skipif(not GPU, reason="no JAX GPU device (the cu130 wheel, JAX's CUDA plugin and a GPU)")
def test_calls_the_cuda_build_does_not_run_raise_naming_the_op() -> None:
    """On a GPU: an op without cuda kernels fails to compile naming the op and where it runs; a
    dtype outside the op's cuda rows fails at run time naming the op and the cuda rows; the process
    goes on."""
    with pytest.raises(NotImplementedError, match=r"\[leaky_relu_ext\] has no cuda kernel in this build "
                                                  r"\(it runs on: cpu\)"):
        oj.ops.leaky_relu_ext(jnp.ones(3, jnp.float32))
    ints = jnp.ones(4, jnp.int32)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\[mul\] dtype int32 is not supported on target cuda; "
                                                         r"supported \(T\): float16; bfloat16; float32; float64"):
        np.asarray(oj.ops.mul(ints, ints))
    x = jnp.arange(4.0, dtype=jnp.float32)
    assert list(x.devices())[0].platform == "gpu"
    np.testing.assert_array_equal(oj.ops.mul(x, x), np.arange(4.0) ** 2)
