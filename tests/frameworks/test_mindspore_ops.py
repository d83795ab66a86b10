"""opforge.mindspore: every op as a MindSpore aot Custom primitive, in PyNative and Graph mode.

For each spec'd op and each of its test cases (in float64 where the op takes it): the MindSpore
op matches the spec's NumPy reference, and ``ms.grad`` through it (the bprop built from the
spec's formulas over opforge's MindSpore primitives) matches opforge's own autograd (the C++
Function classes) for a random output gradient. Every op also runs forward and backward inside
an ``nn.Cell`` in GRAPH_MODE. The seed documents' examples and bad input are checked at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason='MindSpore is not installed (pip install mindspore==2.10.0 "numpy<2")')

from mindspore import Tensor, nn  # noqa: E402

import opforge  # noqa: E402
from opforge import _formulas  # noqa: E402  (opforge's own ops: list_ops() also has ops that tests load)
import opforge.mindspore as om  # noqa: E402
from mindspore_seeds import LeakyReluNet, MyNet, SquareNet  # noqa: E402  (examples/)
from cases import Case, make_data, reference, widest_cases  # noqa: E402
from mindspore_cases import check_outputs, ms_inputs, opforge_grads  # noqa: E402

ms.set_device(device_target="CPU")
ms.runtime.launch_blocking()  # synchronous PyNative: errors surface at the call that made them
try:  # MindSpore's kernel thread pool: 2 threads (it may only be set once per process)
    ms.device_context.cpu.op_tuning.threads_num(2)
except RuntimeError:
    pass


@pytest.fixture(params=["pynative", "graph"])
def mode(request) -> Any:
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=old)


@pytest.fixture
def pynative() -> Any:
    old = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=old)


CASES = widest_cases()
GRAD_CASES = [c for c in CASES if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)
              and (c.op.bprop is not None or c.op.impl.kind == "composite")]
# one case per op for Graph mode (each compiles a graph)
GRAPH_CASES = list({c.op.name: c for c in reversed(CASES)}.values())


def test_every_op_is_there() -> None:
    names = set(_formulas.OPS)
    assert {c.op.name for c in CASES} == names
    for name in names:
        assert hasattr(om.ops, name) and hasattr(om.functional, name), name


def test_the_installed_aot_extra_is_the_layout_opforge_calls(tmp_path) -> None:
    # (src/aot/aot_extra.cpp calls MindSpore's AotExtra through a copy of its class)
    root = os.path.dirname(ms.__file__)
    with open(os.path.join(root, om._AOT_EXTRA_HEADER)) as f:
        header = f.read()
    assert om._aot_extra_layout(header) == om._AOT_EXTRA_LAYOUT
    om._check_aot_extra(root, ms.__version__)
    # another order of the getters, or another member: refused before any call, naming it
    fake = tmp_path / os.path.dirname(om._AOT_EXTRA_HEADER)
    fake.mkdir(parents=True)
    swapped = header.replace("virtual int64_t GetAttrInt(std::string name) = 0;", "@").replace(
        "virtual float GetAttrFloat(std::string name) = 0;", "virtual int64_t GetAttrInt(std::string name) = 0;").replace(
        "@", "virtual float GetAttrFloat(std::string name) = 0;")
    assert swapped != header
    (tmp_path / om._AOT_EXTRA_HEADER).write_text(swapped)
    with pytest.raises(ImportError, match=r"MindSpore 9.0.0's AotExtra .* is not the layout opforge calls \(member 3: "
                       r"'virtual float GetAttrFloat\(std::string name\) = 0;' where opforge reads 'virtual int64_t"):
        om._check_aot_extra(str(tmp_path), "9.0.0")
    (tmp_path / om._AOT_EXTRA_HEADER).write_text(header.replace("std::vector<size_t> workspace_;",
                                                               "std::vector<size_t> workspace_;\n  int flags_;"))
    with pytest.raises(ImportError, match=r"member 11: 'int flags_;' where opforge reads 'AotKernelData"):
        om._check_aot_extra(str(tmp_path), "9.0.0")
    # no header to check: MindSpore 2.10 only
    (tmp_path / om._AOT_EXTRA_HEADER).unlink()
    om._check_aot_extra(str(tmp_path), "2.10.1")
    with pytest.raises(ImportError, match="MindSpore 2.11.0 ships no .*custom_aot_extra.h to check its layout"):
        om._check_aot_extra(str(tmp_path), "2.11.0")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_matches_reference(case: Case, rng, pynative) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    outs = getattr(om.functional, case.op.name)(*ms_inputs(case, data), **case.attrs)
    check_outputs(case, outs, reference(case.op, data, case.attrs))


def _expected_grads(case: Case, data: list[Any], weights: list[np.ndarray]) -> list[Any]:
    """Gradients of sum(out_k * w_k) over the differentiable outputs, from opforge's autograd."""
    inputs, wanted, grads = opforge_grads(case, data, weights)
    return [np.zeros(inputs[k].shape) if g is None else g.numpy() for k, g in zip(wanted, grads)]


def _loss_fn(case: Case, call: Any, inputs: list[Any], weights: list[np.ndarray]) -> tuple[Any, list[int]]:
    op = case.op
    wanted = [k for k, t in enumerate(inputs) if t is not None and op.inputs[k].differentiable]
    diff = [k for k, o in enumerate(op.outputs) if o.differentiable]
    ws = [Tensor(w) for w in weights]

    def fn(*diff_inputs: Any) -> Any:
        full = list(inputs)
        for k, t in zip(wanted, diff_inputs):
            full[k] = t
        outs = call(*full)
        outs = outs if isinstance(outs, tuple) else (outs,)
        loss = 0
        for k, w in zip(diff, ws):
            loss = loss + (outs[k] * w).sum()
        return loss

    return fn, wanted


def _weights(case: Case, data: list[Any], rng) -> list[np.ndarray]:
    outs = reference(case.op, data, case.attrs)
    return [rng.uniform(-1, 1, np.shape(outs[k])) for k, o in enumerate(case.op.outputs) if o.differentiable]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradients_match_opforge_autograd(case: Case, rng, pynative) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    weights = _weights(case, data, rng)
    inputs = ms_inputs(case, data)
    fn, wanted = _loss_fn(case, lambda *a: getattr(om.functional, case.op.name)(*a, **case.attrs), inputs, weights)
    grads = ms.grad(fn, grad_position=tuple(range(len(wanted))))(*(inputs[k] for k in wanted))
    grads = grads if isinstance(grads, tuple) else (grads,)
    for k, g, e in zip(wanted, grads, _expected_grads(case, data, weights)):
        np.testing.assert_allclose(g.asnumpy(), e, rtol=1e-9, atol=1e-12, err_msg=case.op.inputs[k].name)


def _cell_for(case: Case) -> Any:
    """An nn.Cell calling the op's primitive for this case's attrs and present inputs."""
    op = case.op
    present = [s is not None for s in case.shapes]
    without = tuple(i.name for i, p in zip(op.inputs, present) if not p)
    prim = om.primitive(op.name, without=without, **case.attrs)

    class OpCell(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.op = prim

        def construct(self, *xs: Any) -> Any:
            return self.op(*xs)

    return OpCell()


@pytest.mark.parametrize("case", GRAPH_CASES, ids=lambda c: c.id)
def test_graph_mode_forward_and_gradients(case: Case, rng) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    inputs = ms_inputs(case, data)
    present = [t for t in inputs if t is not None]
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        cell = _cell_for(case)
        check_outputs(case, cell(*present), reference(case.op, data, case.attrs))
        if case in GRAD_CASES:
            weights = _weights(case, data, rng)
            slots = [k for k, t in enumerate(inputs) if t is not None]

            class Loss(nn.Cell):
                def __init__(self) -> None:
                    super().__init__()
                    self.inner = cell
                    self.ws = [Tensor(w) for w in weights]

                def construct(self, *xs: Any) -> Any:
                    outs = self.inner(*xs)
                    outs = outs if isinstance(outs, tuple) else (outs,)
                    loss = 0
                    for k in DIFF:
                        loss = loss + (outs[k] * self.ws[DIFF.index(k)]).sum()
                    return loss

            DIFF = tuple(k for k, o in enumerate(case.op.outputs) if o.differentiable)  # noqa: N806
            wanted = [k for k in slots if case.op.inputs[k].differentiable]
            positions = tuple(slots.index(k) for k in wanted)
            grads = ms.grad(Loss(), grad_position=positions)(*present)
            grads = grads if isinstance(grads, tuple) else (grads,)
            for k, g, e in zip(wanted, grads, _expected_grads(case, data, weights)):
                np.testing.assert_allclose(g.asnumpy(), e, rtol=1e-9, atol=1e-12, err_msg=case.op.inputs[k].name)
    finally:
        ms.set_context(mode=old)


# ---------------------------------------------------------------------------- the seeds' examples


def test_seed_000_value_and_grad(mode) -> None:
    x = Tensor(1.0, ms.float32) * 2
    y = Tensor(1.0, ms.float32) * 3
    net = MyNet()
    out, grads = ms.value_and_grad(net, grad_position=(0, 1), weights=net.trainable_params())(x, y)
    assert float(out.asnumpy()) == 12.0
    assert [float(g.asnumpy()) for g in grads[0]] == [6.0, 4.0]
    assert [float(g.asnumpy()) for g in grads[1]] == [6.0]


def test_seed_002_square_bprop(mode) -> None:
    x = Tensor(np.array([1.0, 4.0, 9.0], np.float32))
    dx = ms.grad(SquareNet())(x)
    np.testing.assert_array_equal(dx.asnumpy(), [2.0, 8.0, 18.0])


def test_seed_004_leaky_relu(mode) -> None:
    x0 = np.array([[0.0, -0.1], [-0.2, 1.0]]).astype(np.float32)
    out = LeakyReluNet("leaky_relu")(Tensor(x0))
    np.testing.assert_allclose(out.asnumpy(), [[0.0, -0.001], [-0.002, 1.0]], rtol=1e-6)
    dx = ms.grad(LeakyReluNet("leaky_relu"))(Tensor(x0))
    np.testing.assert_allclose(dx.asnumpy(), [[0.01, 0.01], [0.01, 1.0]], rtol=1e-6)


# ---------------------------------------------------------------------------- attrs, modes, errors


def test_attrs_reach_the_kernel_exactly(mode) -> None:
    """float attrs travel as text: a float64 kernel sees the exact double (not a float32)."""
    x = np.array([-1.0, -3.0, 2.0])
    out = om.primitive("leaky_relu", alpha=0.1)(Tensor(x))
    np.testing.assert_array_equal(out.asnumpy(), np.where(x > 0, x, 0.1 * x))
    y = om.primitive("sum", axis=[0], keepdims=True)(Tensor(np.arange(6.0).reshape(2, 3)))
    np.testing.assert_array_equal(y.asnumpy(), [[3.0, 5.0, 7.0]])
    z = om.primitive("clamp", min=-0.5)(Tensor(x))  # max=None
    np.testing.assert_array_equal(z.asnumpy(), np.maximum(x, -0.5))


def test_attrs_at_their_defaults_are_left_to_the_entry_point(mode) -> None:
    # MindSpore writes every primitive attr into each PyNative call's cache key; the entry point
    # reads an absent attr as the spec's default, so defaults stay out of the primitive
    x = np.array([-1.0, -3.0, 2.0])
    assert "alpha" not in om.ops.leaky_relu.attrs
    np.testing.assert_array_equal(om.ops.leaky_relu(Tensor(x)).asnumpy(), np.where(x > 0, x, 0.01 * x))
    given = om.primitive("leaky_relu", alpha=0.2)
    assert given.attrs["alpha"] == "0.2"
    np.testing.assert_array_equal(given(Tensor(x)).asnumpy(), np.where(x > 0, x, 0.2 * x))
    kept = om.primitive("sum", keepdims=True)
    assert "axis" not in kept.attrs and kept.attrs["keepdims"] == "True"
    np.testing.assert_array_equal(kept(Tensor(np.arange(6.0).reshape(2, 3))).asnumpy(), [[15.0]])
    clamp = om.primitive("clamp", min=-0.5)  # max: an optional attr without a value, as its default
    assert clamp.attrs["min"] == "-0.5" and "max" not in clamp.attrs
    np.testing.assert_array_equal(clamp(Tensor(x)).asnumpy(), np.maximum(x, -0.5))

    def attr(atype: str, default: Any) -> Any:
        return opforge._opdef.AttrDef("a", atype, False, default, None)

    assert om._reads_as_default(attr("float", 1), 1.0)  # (the text "1" parses as 1.0)
    assert not om._reads_as_default(attr("float", 0.1), 0.1000001)
    assert om._reads_as_default(attr("list[int]", (1, 2)), [1, 2])
    assert not om._reads_as_default(attr("int", 1), True)
    assert om._reads_as_default(attr("str", "it's"), "it's")  # (repr's double quotes come off)
    assert not om._reads_as_default(attr("str", "a\\b"), "a\\b")  # (repr escapes the backslash)
    assert not om._reads_as_default(opforge._opdef.AttrDef("a", "float", True, None, None), 0.0)


def test_primitives_are_cached_and_named() -> None:
    assert om.primitive("leaky_relu", alpha=0.2) is om.primitive("leaky_relu", alpha=0.2)
    assert om.primitive("leaky_relu") is om.ops.leaky_relu
    p = om.primitive("linear", without=("bias",))
    assert p.func.endswith(":opforge_linear__without__bias")
    assert p.func.startswith(om.LIBRARY)


def test_primitives_are_told_apart_by_attr_type_and_bits() -> None:
    """The primitive cache compared attrs by ==: alpha=True (refused) then alpha=1.0 was refused
    too; 1 then True was taken; alpha=-0.0 ran alpha=0.0's primitive (-0.0 where opforge gives 0.0)."""
    x = Tensor(np.array([-2.0, 1.0], np.float32))
    with pytest.raises(TypeError, match=r"\[leaky_relu\] attr 'alpha' must be a float, got bool"):
        om.functional.leaky_relu(x, alpha=True)
    np.testing.assert_array_equal(om.functional.leaky_relu(x, alpha=1.0).asnumpy(), [-2.0, 1.0])
    np.testing.assert_array_equal(om.functional.sum(x, axis=0, keepdims=False).asnumpy(), -1.0)
    with pytest.raises(TypeError, match=r"\[sum\] attr 'keepdims' must be a bool, got int"):
        om.functional.sum(x, axis=0, keepdims=0)
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        for alpha in (first, second):
            got = om.functional.leaky_relu(x, alpha=alpha).asnumpy()
            want = opforge.ops.leaky_relu(x.asnumpy(), alpha=alpha).numpy()
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert om.primitive("leaky_relu", alpha=-0.0) is not om.primitive("leaky_relu", alpha=0.0)
    # (a required input given None: a bare StopIteration, which map() swallowed)
    with pytest.raises(TypeError, match=r"\[mul\] input 'y' is required \(not optional\): got None"):
        list(map(lambda t: om.functional.mul(t, None), [x]))


def test_optimizer_steps_take_their_per_step_scalars_as_inputs(pynative) -> None:
    """sgd_step's lr and adam_step's step_size, bias_correction2_sqrt and param_scale are inputs:
    a training loop whose step size changes every step uses one primitive (as attrs, each value
    made a primitive MindSpore keeps, ~100 KB, for the process's life)."""
    rng = np.random.default_rng(3)
    p, g = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    zeros = np.zeros((3, 4), np.float32)
    before = om._primitive.cache_info().currsize
    for t in (1, 2, 3):
        scalars = [Tensor(np.float32(v)) for v in (0.01 / (1 - 0.9 ** t), (1 - 0.999 ** t) ** 0.5, 1.0)]
        got = om.functional.adam_step(Tensor(p), Tensor(g), Tensor(zeros), Tensor(zeros), *scalars)
        want = opforge.ops.adam_step(p, g, zeros, zeros, *(s.asnumpy() for s in scalars))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.asnumpy(), b.numpy(), rtol=1e-6)
        lr = Tensor(np.float32(0.1 / t))
        new_p, _ = om.functional.sgd_step(Tensor(p), Tensor(g), Tensor(zeros), lr)
        np.testing.assert_allclose(new_p.asnumpy(), p - np.float32(0.1 / t) * g, rtol=1e-6)
    assert om._primitive.cache_info().currsize - before <= 2  # (adam_step's and sgd_step's, at most)


def test_functional_calls_with_keyword_attrs_inside_a_cell(mode) -> None:
    """(in Graph mode the functional form is compiled by MindSpore's parser: attrs given by keyword
    raised AttributeError, and after the attr keys a SIGSEGV, from kwargs.pop and a set
    comprehension it does not take)"""

    class Net(nn.Cell):  # type: ignore[misc]
        def construct(self, x: Any) -> Any:
            return om.functional.sum(om.functional.leaky_relu(x, alpha=0.5), axis=[1], keepdims=True)

    x = np.array([[-2.0, 1.0, 3.0], [4.0, -6.0, 0.0]], np.float32)
    got = Net()(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, np.where(x > 0, x, 0.5 * x).sum(axis=1, keepdims=True))


def test_gradients_of_broadcasting_ops_in_bfloat16(pynative) -> None:
    """(MindSpore's sum, which reduced a broadcast operand's gradient, has no bfloat16 CPU kernel:
    opforge's sum_to_like does it)"""
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).astype(ms.bfloat16)
    b = Tensor(np.arange(4, dtype=np.float32)).astype(ms.bfloat16)
    f = lambda x, b: om.ops.sum(om.ops.mul(x, b))  # noqa: E731
    gx, gb = ms.grad(f, grad_position=(0, 1))(x, b)
    assert gx.dtype == gb.dtype == ms.bfloat16
    np.testing.assert_array_equal(gb.astype(ms.float32).asnumpy(), [12, 15, 18, 21])
    np.testing.assert_array_equal(gx.astype(ms.float32).asnumpy(), np.tile(np.arange(4.0), (3, 1)))


def test_gradients_of_sums_over_no_axis_and_of_0d_tensors(pynative) -> None:
    """axis=[] is every axis; a 0-d tensor's axis 0 is no axis (its gradient raised
    ZeroDivisionError in the bprop's expand_reduced)."""
    g0 = ms.grad(lambda t: om.functional.sum(t, axis=[0]))(Tensor(np.array(2.0)))
    assert g0.shape == () and float(g0.asnumpy()) == 1.0
    g = ms.grad(lambda t: om.functional.sum(t, axis=[]))(Tensor(np.ones((2, 3))))
    np.testing.assert_array_equal(g.asnumpy(), np.ones((2, 3)))


def test_optional_inputs(mode) -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(4, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2,))
    with_bias = om.ops.linear(Tensor(x), Tensor(w), Tensor(b))
    without = om.primitive("linear", without=("bias",))(Tensor(x), Tensor(w))
    np.testing.assert_allclose(with_bias.asnumpy(), x @ w.T + b, rtol=1e-12)
    np.testing.assert_allclose(without.asnumpy(), x @ w.T, rtol=1e-12)


def test_unsupported_dtype_names_the_op(mode) -> None:
    x = Tensor(np.array([1, 2], np.int32))
    with pytest.raises(TypeError, match=r"\[exp\] dtype int32 is not supported on target cpu; supported \(T\): "
                                        r"float16; bfloat16; float32; float64"):
        om.ops.exp(x)


def test_graph_compile_failures_dump_outside_the_checkout(tmp_path, monkeypatch) -> None:
    """A graph that fails to compile makes MindSpore write rank_<id>/om/analyze_fail.ir under
    MS_OM_PATH (conftest points it at a temporary directory), never into the current directory."""
    monkeypatch.setenv("MS_OM_PATH", str(tmp_path / "om"))
    monkeypatch.chdir(tmp_path)

    class Exp(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.exp = om.ops.exp

        def construct(self, x: Any) -> Any:
            return self.exp(x)

    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(TypeError, match=r"\[exp\] dtype int32 is not supported"):
            Exp()(Tensor(np.array([1, 2], np.int32)))
    finally:
        ms.set_context(mode=old)
    assert list((tmp_path / "om").glob("rank_*/om/analyze_fail.ir"))
    assert not (tmp_path / "rank_0").exists()


def test_float64_is_not_cast_for_a_float32_op(pynative) -> None:
    """MindSpore casts inputs a reg_info lacks; opforge lists every row, so a float64 input keeps
    its precision and a dtype the op does not take is refused, never converted."""
    big = Tensor(np.array([1e40, -1e40]))
    np.testing.assert_array_equal(om.ops.neg(big).asnumpy(), [-1e40, 1e40])
    with pytest.raises(TypeError, match=r"\[embedding\] .*int64"):
        om.ops.embedding(Tensor(np.array([0.5])), Tensor(np.ones((2, 2))))


def test_bad_shape_and_attr_name_the_op(mode) -> None:
    with pytest.raises(ValueError, match=r"\[linear\] x's last dimension 3 differs"):
        om.ops.linear(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5))), Tensor(np.ones(4)))
    with pytest.raises(ValueError, match=r"\[gelu\] attr 'approximate' must be one of"):
        om.primitive("gelu", approximate="nope")(Tensor(np.ones(2)))
    with pytest.raises(TypeError, match=r"\[leaky_relu\] unknown attr\(s\) beta"):
        om.primitive("leaky_relu", beta=1.0)
    with pytest.raises(ValueError, match=r"\[linear\] 'x' is not an optional input; optional inputs: bias"):
        om.primitive("linear", without=("x",))
    with pytest.raises(ValueError, match=r"unknown op 'nope'"):
        om.primitive("nope")
    # (checks that were the kernel's alone: MindSpore's RuntimeError at the launch, without the op)
    with pytest.raises(ValueError, match=r"\[bias_add\] bias of shape \(5,\) must have shape \(4,\)"):
        om.ops.bias_add(Tensor(np.ones((3, 4))), Tensor(np.ones(5)))
    with pytest.raises(ValueError, match=r"\[softmax_backward\] dout of shape \(3,\) and y of shape \(4,\)"):
        om.ops.softmax_backward(Tensor(np.ones(3)), Tensor(np.ones(4)))


def test_wrong_input_count(pynative) -> None:
    with pytest.raises(TypeError, match=r"\[mul\] this primitive takes 2 inputs \(x, y\), got 1"):
        om.ops.mul(Tensor(np.ones(2)))


@pytest.mark.parametrize("arg", [None, [1.0] * 4, (1.0,) * 4], ids=["None", "list", "tuple"])
def test_an_input_that_is_not_a_tensor_is_named(pynative, arg) -> None:
    # (the cache of inferred shapes raised "'NoneType' object is not iterable" / "unhashable type")
    what = {type(None): "None", list: "a list", tuple: "a tuple"}[type(arg)]
    with pytest.raises(TypeError, match=rf"\[mul\] input 'y' must be a Tensor, got {what}"):
        om.ops.mul(Tensor(np.ones((3, 4), np.float32)), arg)


def test_values_the_kernel_refuses_raise_the_ops_error(mode) -> None:
    """MindSpore learns only the entry point's status: PyNative (synchronous here, as
    launch_blocking makes it) raises opforge's exception with the op's message, an IndexError that
    is a RuntimeError as MindSpore's was; Graph mode MindSpore's RuntimeError naming the entry point."""
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    labels = Tensor(np.array([0, 1, 7], np.int64))
    if mode == "graph":
        class Loss(nn.Cell):
            def construct(self, x, labels):  # type: ignore[no-untyped-def]
                return om.ops.cross_entropy(x, labels)

        with pytest.raises(RuntimeError, match=r"function\(opforge_cross_entropy\) is 3"):
            Loss()(x, labels).asnumpy()
        return
    with pytest.raises(om.LaunchIndexError, match=r"^\[cross_entropy\] label 7 is out of range for 4 classes$") as e:
        om.ops.cross_entropy(x, labels)
    assert isinstance(e.value, IndexError) and isinstance(e.value, RuntimeError)
    with pytest.raises(IndexError, match=r"\[take_along_axis\] index 9 is out of range for axis 1 of size 4"):
        om.functional.take_along_axis(x, Tensor(np.array([[0], [9], [1]], np.int64)), axis=1)
    with pytest.raises(IndexError, match=r"\[cross_entropy_backward\] label 7 is out of range for 4 classes"):
        om.ops.cross_entropy_backward(Tensor(np.float32(1.0)), x, labels)
    assert float(om.ops.cross_entropy(x, Tensor(np.array([0, 1, 2], np.int64))).asnumpy()) > 0  # and goes on


def test_one_mask_for_two_wheres_in_pynative(pynative) -> None:
    # PyNative adds up the gradients of an input given to two primitives with Add, which refuses
    # the bool zeros of where's condition: opforge's primitives cut bool inputs off the graph
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    y = Tensor(np.zeros(3, np.float32))

    def f(x):  # type: ignore[no-untyped-def]
        c = om.ops.greater(x, y)
        return (om.ops.where(c, x, y) + om.ops.where(c, y, om.ops.mul(x, 2.0))).sum()

    np.testing.assert_allclose(ms.grad(f)(x).asnumpy(), [1.0, 2.0, 1.0])
    # a second derivative through one where of a comparison (its bprop's where takes the mask again)
    g = ms.grad(ms.grad(lambda x: om.ops.where(om.ops.greater(x, y), om.ops.mul(x, x), y).sum()))
    np.testing.assert_allclose(g(x).asnumpy(), [2.0, 0.0, 2.0])


def test_reductions_over_every_axis_beside_an_axis_list_in_one_graph(mode) -> None:
    # Graph mode failed to compile the gradient (sorted() of a comprehension over axis lists of
    # two lengths in one graph: "Inner exception ... flags size: 1 values size: 2")
    mean1 = om.primitive("mean", axis=[1])

    class Loss(nn.Cell):
        def construct(self, x, z):  # type: ignore[no-untyped-def]
            return om.ops.mean(x) + om.ops.sum(mean1(z))  # a global loss and a per-row term

    x, z = Tensor(np.ones((3, 5), np.float32)), Tensor(np.ones((4, 6), np.float32))
    gx, gz = ms.grad(Loss(), grad_position=(0, 1))(x, z)
    np.testing.assert_allclose(gx.asnumpy(), np.full((3, 5), 1 / 15), rtol=1e-6)
    np.testing.assert_allclose(gz.asnumpy(), np.full((4, 6), 1 / 6), rtol=1e-6)


def test_python_numbers_in_graph_mode_reach_the_op_as_tensors_of_their_partners_dtype(tmp_path) -> None:
    """In Graph mode MindSpore hands the C++ InferShape the shapes of tensor inputs only: a Python
    number given for an input was left out, and the inputs after it read past MindSpore's arrays
    ("bad shape from the host", or a dimension of garbage, printed by the entry point). The
    primitives' signature makes each number a 0-d tensor of its partner's dtype first, as
    MindSpore's own ops do; PyNative calls convert them so too."""
    code = """
import numpy as np, mindspore as ms
from mindspore import Tensor, nn
import opforge.mindspore as om
ms.set_context(mode=ms.GRAPH_MODE)
class Step(nn.Cell):
    def construct(self, p, q):
        return (om.ops.sgd_step(q, q, q, 0.1)[0], om.ops.adam_step(q, q, q, q, 0.1, 0.3, 1.0)[0],
                om.ops.mul(p, 2.0), om.ops.pow(2.0, p), om.ops.where(p > 0, 1.0, p), om.ops.mul(p, 2))
p, q = Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float64))
for r in Step()(p, q):  # (Graph mode takes a Python float as float32 first: 0.1 is 0.100000001...)
    print(r.dtype, np.round(r.asnumpy(), 6).tolist())
ms.set_context(mode=ms.PYNATIVE_MODE)
for r in (om.ops.sgd_step(q, q, q, 0.1)[0], om.ops.adam_step(q, q, q, q, 0.1, 0.3, 1.0)[0], om.ops.mul(p, 2)):
    print(r.dtype, np.round(r.asnumpy(), 6).tolist())
"""
    (tmp_path / "graph_numbers.py").write_text(code)  # (Graph mode compiles a file's source, not -c's)
    r = subprocess.run([sys.executable, str(tmp_path / "graph_numbers.py")], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "opforge AOT entry point failed" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.split("\n")[:9] == [
        "Float64 [0.9, 0.9, 0.9]", "Float64 [0.97, 0.97, 0.97]", "Float32 [2.0, 2.0, 2.0]", "Float32 [2.0, 2.0, 2.0]",
        "Float32 [1.0, 1.0, 1.0]", "Float32 [2.0, 2.0, 2.0]",
        "Float64 [0.9, 0.9, 0.9]", "Float64 [0.97, 0.97, 0.97]", "Float32 [2.0, 2.0, 2.0]"]
    with pytest.raises(TypeError, match=r"\[mul\] input 'y': a Python float cannot be int64 \(bound by input 'x'\)"):
        om.ops.mul(Tensor(np.ones(3, np.int64)), 1.5)


def test_graph_mode_refuses_arguments_that_are_not_tensors_before_the_shape_rule_reads_them(tmp_path) -> None:
    """A number with no tensor of its type variable beside it (``where(c, 1.0, -1.0)``), or for an
    input of a fixed dtype (indices), a None or a tuple: MindSpore leaves it a scalar and out of
    the shapes it hands the C++ InferShape, whose later inputs read past MindSpore's arrays. Each
    primitive's __check__ (which Graph mode runs first) refuses it, naming the op and input."""
    code = """
import numpy as np, mindspore as ms
from mindspore import Tensor, nn
import opforge.mindspore as om
ms.set_context(mode=ms.GRAPH_MODE)
class Where(nn.Cell):
    def construct(self, c):
        return om.ops.where(c, 1.0, -1.0)
class Take(nn.Cell):
    def construct(self, x):
        return om.functional.take_along_axis(x, 0, axis=0)
class Pair(nn.Cell):
    def construct(self, x):
        return om.ops.add((x, x), x)
class Fine(nn.Cell):
    def construct(self, c, x):
        return om.ops.where(c, x, 0.0)
c, x = Tensor(np.array([True, False])), Tensor(np.ones(2, np.float32))
for net, args in ((Where(), (c,)), (Take(), (x,)), (Pair(), (x,))):
    try:
        net(*args)
        print("ran")
    except TypeError as e:
        print(str(e).splitlines()[0])
print(Fine()(c, x).asnumpy().tolist())
"""
    (tmp_path / "graph_scalars.py").write_text(code)  # (Graph mode compiles a file's source, not -c's)
    r = subprocess.run([sys.executable, str(tmp_path / "graph_scalars.py")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "opforge AOT entry point failed" not in r.stderr, r.stderr[-3000:]
    lines = r.stdout.split("\n")
    assert lines[0].startswith("[where] input 'x' must be a Tensor in Graph mode, got the number 1.0 (Float32)")
    assert lines[0].endswith("pass ms.Tensor(1.0, dtype), its dtypes: bfloat16, bool, float16, float32, float64, "
                             "int32, int64"), r.stdout
    assert lines[1].startswith("[take_along_axis] input 'indices' must be a Tensor in Graph mode, got the number 0")
    assert lines[1].endswith("its dtypes: int64"), r.stdout
    assert lines[2].startswith("[add] input 'x' must be a Tensor in Graph mode, got (mindspore.tensor"), r.stdout
    assert lines[3] == "[1.0, 0.0]", r.stdout + r.stderr[-3000:]


def test_import_error_without_mindspore() -> None:
    code = ("import sys; sys.modules['mindspore'] = None\n"
            "try:\n    import opforge.mindspore\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert 'pip install mindspore==2.10.0 "numpy<2"' in out.stdout, out.stderr


def test_aot_op_with_a_missing_library_names_path_and_symbol() -> None:
    op = om._formulas.OPS["leaky_relu_ext"]._replace(aot_kernel=("libnot_there.so", "leaky_relu_ext"))
    with pytest.raises(RuntimeError, match=r"\[leaky_relu_ext\] AOT library 'libnot_there.so' not found "
                                           r"\(symbol 'leaky_relu_ext'\); looked for .*libnot_there.so"):
        om.Primitive(op, (True,), ())
    # in the namespace of default primitives it raises that error when used (the import succeeds)
    with pytest.raises(RuntimeError, match=r"AOT library 'libnot_there.so' not found"):
        om._default(op)(Tensor(np.ones(2, np.float32)))
    op = om._formulas.OPS["leaky_relu_ext"]._replace(aot_kernel=("libleaky_relu_ext.so", "missing_fn"))
    with pytest.raises(RuntimeError, match=r"symbol 'missing_fn' not found in AOT library .*libleaky_relu_ext.so"):
        om.Primitive(op, (True,), ())


def test_example_script_prints_the_seeds_results() -> None:
    from conftest import ROOT

    r = subprocess.run([sys.executable, str(ROOT / "examples" / "mindspore_seeds.py")], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines.count("seed 000  out: 12.0  grads[0]: [6.0, 4.0]  grads[1]: [6.0]") == 2
    assert lines.count("seed 002  square dx: [ 2.  8. 18.]") == 2
    for op in ("leaky_relu", "leaky_relu_ext"):
        assert lines.count(f"seed 004  {op}: [[0.0, -0.001], [-0.002, 1.0]]") == 2


# ---------------------------------------------------------------------------- op modules

_MODULE_SPECS = {
    "ms_softplus": """
ms_softplus:
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
""",
    "ms_rowscale": """
ms_rowscale:
  doc: x times the sum of its last axis (a composite op whose gradient flows through its parts).
  inputs:
    x: float64
  outputs:
    out: {dtype: float64, shape: same(x)}
  impl:
    composite: x * sum(x, axis=-1, keepdims=True)
""",
}


def test_module_ops_as_mindspore_primitives(tmp_path, mode) -> None:
    """An opforge.load module's ops through register_module: its own AOT entry points (with
    InferShape: dynamic shapes in Graph mode), bprops from its formulas calling opforge's ops."""
    for name, text in _MODULE_SPECS.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    m = opforge.load("ms_mod", sorted(tmp_path.glob("*.yaml")), build_dir=tmp_path / "cache")
    s = om.register_module(m)
    assert om.register_module(m) is s
    assert s.primitive("ms_softplus", beta=2.0).func == f"{m.__file__}:opforge_ms_softplus"
    x = np.array([[-2.0, 0.5, 3.0], [1.0, -1.0, 0.0]])

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.sp = s.primitive("ms_softplus", beta=2.0)
            self.rowscale = s.ops.ms_rowscale
            self.exp = om.ops.exp

        def construct(self, a: Any) -> Any:
            return self.exp(self.rowscale(self.sp(a))).sum()

    net = Net()
    if mode == "graph":
        net.set_inputs(Tensor(shape=[None, None], dtype=ms.float64))
    sp = np.log1p(np.exp(2.0 * x)) / 2.0
    r = sp * sp.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), np.exp(r).sum(), rtol=1e-12)
    # d/dx: through exp, rowscale (composite: its parts' bprops) and softplus (its bprop over opforge's sigmoid)
    g_r = np.exp(r)
    g_sp = g_r * sp.sum(axis=-1, keepdims=True) + (g_r * sp).sum(axis=-1, keepdims=True)
    want = g_sp / (1 + np.exp(-2.0 * x))
    np.testing.assert_allclose(ms.grad(net)(Tensor(x)).asnumpy(), want, rtol=1e-10)
    # rows are independent: one row alone (another shape: in Graph mode the same compiled graph)
    np.testing.assert_allclose(ms.grad(net)(Tensor(x[:1])).asnumpy(), want[:1], rtol=1e-10)
    with pytest.raises(TypeError, match=r"is not an opforge op module"):
        om.register_module(np)
    with pytest.raises(ValueError, match=r"\[opforge.mindspore: ms_mod\] unknown op 'exp'"):
        s.primitive("exp")


def test_a_module_op_takes_its_own_dtype_rows_beside_another_modules_of_its_name(tmp_path) -> None:
    """Two modules with an op of one name: each module's primitives are registered with that
    module's dtype rows (they took the name's latest registration's: a float64 call of the first
    ran in float32, silently, once the second was loaded)."""
    spec = """
ms_halfsq:
  doc: x * x / 2.
  inputs:
    x: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [DTYPES]
  impl:
    expr: x * x * 0.5
"""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "ms_halfsq.yaml").write_text(spec.replace("DTYPES", "float32, float64"))
    (tmp_path / "b" / "ms_halfsq.yaml").write_text(spec.replace("DTYPES", "float32"))
    a = opforge.load("ms_dup_a", [tmp_path / "a"], build_dir=tmp_path / "cache")
    b = opforge.load("ms_dup_b", [tmp_path / "b"], build_dir=tmp_path / "cache")
    sa, sb = om.register_module(a), om.register_module(b)
    x = np.array([1.0 + 1e-7, 3.0 + 1e-9])
    got = sa.ops.ms_halfsq(Tensor(x))
    assert got.dtype == ms.float64
    np.testing.assert_array_equal(got.asnumpy(), x * x * 0.5)
    np.testing.assert_array_equal(sb.ops.ms_halfsq(Tensor(x.astype(np.float32))).asnumpy(),
                                  (x.astype(np.float32) ** 2 * np.float32(0.5)))


_EXT_KERNEL = r"""
// An external AOT kernel with attrs, read as MindSpore's custom-op documents show (AotExtra's
// Attr<T>), knowing nothing of opforge. Built with the old std::string ABI, as MindSpore requires.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

class AotKernelData {
 public:
  virtual ~AotKernelData() = default;
};

class AotExtra {
 public:
  virtual ~AotExtra() = default;
  virtual bool HasAttr(std::string name) = 0;
  template <typename T>
  T Attr(std::string name);

 private:
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
  virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;
  virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;
  std::vector<size_t> workspace_;
  AotKernelData* kernel_data_{nullptr};
};
template <> bool AotExtra::Attr<bool>(std::string name) { return GetAttrBool(name); }
template <> int64_t AotExtra::Attr<int64_t>(std::string name) { return GetAttrInt(name); }
template <> float AotExtra::Attr<float>(std::string name) { return GetAttrFloat(name); }
template <> std::string AotExtra::Attr<std::string>(std::string name) { return GetAttrStr(name); }
template <> std::vector<int64_t> AotExtra::Attr<std::vector<int64_t>>(std::string name) { return GetAttrIntVec(name); }

// out = sign * alpha * x + shift + offsets[i % len], sign -1 when flip; mode "abs" takes |x| first
extern "C" int affine_ext(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                          void* stream, void* extra) {
  if (nparam != 2 || !extra || std::strcmp(dtypes[0], "float32") != 0) return 1;
  auto* ex = static_cast<AotExtra*>(extra);
  const float alpha = ex->Attr<float>("alpha");
  const int64_t shift = ex->Attr<int64_t>("shift");
  const bool flip = ex->Attr<bool>("flip");
  const std::string mode = ex->Attr<std::string>("mode");
  const std::vector<int64_t> offsets = ex->Attr<std::vector<int64_t>>("offsets");
  if (ex->HasAttr("missing")) return 2;
  if (ex->HasAttr("strict")) (void)ex->Attr<std::vector<int64_t>>("strict");  // the wrong type: raises
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) {
    float v = mode == "abs" ? (x[i] < 0 ? -x[i] : x[i]) : x[i];
    y[i] = (flip ? -alpha : alpha) * v + float(shift) + float(offsets.empty() ? 0 : offsets[i % offsets.size()]);
  }
  return 0;
}
"""

_EXT_SPEC = """
affine_ext:
  doc: sign * alpha * x + shift + offsets, by the external kernel affine_ext (attrs through AotExtra).
  inputs:
    x: float32
  attrs:
    alpha: {type: float, default: 1.0}
    shift: {type: int, default: 0}
    flip: {type: bool, default: false}
    mode: {type: str, default: plain, choices: [plain, abs]}
    offsets: {type: "list[int]", default: []}
    strict: {type: float, required: false}
  outputs:
    out: {dtype: float32, shape: same(x)}
  impl:
    aot: {library: LIBRARY, symbol: affine_ext}
  bprop:
    x: where(flip, -alpha * dout, alpha * dout)
"""


@pytest.mark.slow
def test_aot_op_with_attrs_from_opforge_and_from_mindspore(tmp_path, mode) -> None:
    """An external kernel reads its attrs from extra: opforge's own AotExtra when opforge calls it,
    MindSpore's (prim attrs with MindSpore's types) when MindSpore does."""
    src = tmp_path / "affine_ext.cpp"
    src.write_text(_EXT_KERNEL)
    lib = tmp_path / "libaffine_ext.so"
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O1", "-D_GLIBCXX_USE_CXX11_ABI=0", str(src), "-o", str(lib)],
                   check=True)
    (tmp_path / "affine_ext.yaml").write_text(_EXT_SPEC.replace("LIBRARY", str(lib)))
    m = opforge.load("ms_affine", [tmp_path / "affine_ext.yaml"], build_dir=tmp_path / "cache")
    x = np.array([-2.0, 0.5, 3.0, -1.0], np.float32)
    attrs = {"alpha": 0.3, "shift": 2, "flip": True, "mode": "abs", "offsets": [10, 20]}
    want = -np.float32(0.3) * np.abs(x) + 2 + np.array([10, 20, 10, 20], np.float32)
    np.testing.assert_array_equal(m.affine_ext(x, **attrs).numpy(), want)  # opforge's AotExtra
    np.testing.assert_array_equal(m.affine_ext(x).numpy(), x)  # defaults
    with pytest.raises(RuntimeError, match=r"\[affine_ext\] AOT kernel affine_ext in .*libaffine_ext.so failed: "
                                           r"the kernel asked for attr 'strict' as a list of int, a type it is not"):
        m.affine_ext(x, strict=1.0)
    s = om.register_module(m)
    prim = s.primitive("affine_ext", **attrs)
    assert prim.func == f"{lib}:affine_ext"  # MindSpore calls the library itself, with its own extra
    np.testing.assert_array_equal(prim(Tensor(x)).asnumpy(), want)

    def fn(t: Any) -> Any:
        return prim(t)

    np.testing.assert_array_equal(ms.grad(fn)(Tensor(x)).asnumpy(), np.full(4, -np.float32(0.3)))
