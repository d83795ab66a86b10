"""opforge.mindspore in Graph mode with dynamic shapes, and second derivatives.

A Cell whose inputs are declared with ``set_inputs`` and ``None`` dimensions (or no shape at all)
compiles once; MindSpore then asks each op's C++ ``<symbol>InferShape`` entry point (generated
from the spec's shape rules) for its output shapes: with ``-1`` for dimensions unknown while it
compiles, and with the real dimensions before each launch. Every op runs that way on two of its
cases against the spec's NumPy reference; an MLP trains under ``ms.grad`` with changing batch
sizes. ``ms.grad`` of ``ms.grad`` (the bprop formulas are opforge primitives, differentiable in
turn) matches opforge's own double backward, in PyNative and Graph mode.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason='MindSpore is not installed (pip install mindspore==2.10.0 "numpy<2"')

from mindspore import Tensor, nn  # noqa: E402

import opforge  # noqa: E402
import opforge._C as _C  # noqa: E402
import opforge.mindspore as om  # noqa: E402
from cases import Case, make_data, reference, widest_cases  # noqa: E402
from mindspore_cases import check_outputs, ms_inputs, opforge_grads  # noqa: E402

ms.set_device(device_target="CPU")


@pytest.fixture
def graph() -> Any:
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=old)


def _groups() -> list[list[Case]]:
    """Per op, the cases of one attr set and one pattern of present inputs, with the input ranks
    of the first: up to two, so that one compiled graph runs two shapes where the op has them."""
    by_op: dict[str, list[Case]] = {}
    for c in widest_cases():
        by_op.setdefault(c.op.name, []).append(c)
    out = []
    for cases in by_op.values():
        first = cases[0]
        ranks = [None if s is None else len(s) for s in first.shapes]
        same = [c for c in cases if c.attrs == first.attrs
                and [None if s is None else len(s) for s in c.shapes] == ranks]
        distinct = list({c.shapes: c for c in same}.values())
        out.append(distinct[:2])
    return out


# (aot ops take static shapes only: their external library has no InferShape; tested below)
GROUPS = [g for g in _groups() if g[0].op.impl.kind != "aot"]


def _prim(case: Case) -> Any:
    without = tuple(i.name for i, s in zip(case.op.inputs, case.shapes) if s is None)
    return om.primitive(case.op.name, without=without, **case.attrs)


class _OpCell(nn.Cell):
    def __init__(self, prim: Any) -> None:
        super().__init__()
        self.op = prim

    def construct(self, *xs: Any) -> Any:
        return self.op(*xs)


def _dynamic(case: Case, rank: bool) -> list[Any]:
    """The inputs' declarations: every dimension unknown (rank known), or the whole shape."""
    decl = []
    for spec, t in zip(case.op.inputs, ms_inputs(case, make_data(case.op, case.dtype, case.shapes,
                                                                  np.random.default_rng(0)))):
        if t is None:
            continue
        decl.append(Tensor(shape=[None] * t.ndim if rank else None, dtype=t.dtype))
    return decl


@pytest.mark.parametrize("unknown", ["dims", "rank"])
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g[0].op.name)
def test_every_op_compiles_once_for_dynamic_shapes(group: list[Case], unknown: str, graph, rng) -> None:
    case = group[0]
    prim = _prim(case)
    cell = _OpCell(prim)
    cell.set_inputs(*_dynamic(case, rank=unknown == "dims"))
    infer = getattr(prim, "infer", None)  # (a composite op is a Cell over primitives)
    if infer is not None:
        infer.cache.clear()
    for c in group:
        data = make_data(c.op, c.dtype, c.shapes, rng)
        present = [t for t in ms_inputs(c, data) if t is not None]
        check_outputs(c, cell(*present), reference(c.op, data, c.attrs))
    if infer is not None:
        # Python inferred dtypes once, while the graph compiled with unknown dimensions; each
        # launch's shapes came from C++
        assert infer.cache and all(any(d < 0 for s, _ in key for d in s) for key in infer.cache), infer.cache


def test_aot_op_takes_static_shapes_only(graph) -> None:
    cell = _OpCell(om.ops.leaky_relu_ext)
    cell.set_inputs(Tensor(shape=[None, 2], dtype=ms.float32))
    with pytest.raises(ValueError, match=r"\[leaky_relu_ext\] input 'x': dynamic shape \[-1, 2\] is not supported "
                                         r"for this op \(it is an aot op"):
        cell(Tensor(np.ones((3, 2), np.float32)))


class _MLP(nn.Cell):
    def __init__(self, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> None:
        super().__init__()
        self.w1, self.b1 = ms.Parameter(Tensor(w1), name="w1"), ms.Parameter(Tensor(b1), name="b1")
        self.w2, self.b2 = ms.Parameter(Tensor(w2), name="w2"), ms.Parameter(Tensor(b2), name="b2")
        self.ops = om.ops

    def construct(self, x: Any, labels: Any) -> Any:
        h = self.ops.gelu(self.ops.linear(x, self.w1, self.b1))
        return om.functional.cross_entropy(self.ops.linear(h, self.w2, self.b2), labels)


def test_mlp_trains_with_changing_batch_sizes(graph) -> None:
    """One graph for batch sizes 3, 8 and 5: loss and gradients equal opforge's own autograd."""
    rng = np.random.default_rng(1)
    params = [rng.normal(size=(16, 6)) * 0.4, np.zeros(16), rng.normal(size=(4, 16)) * 0.4, np.zeros(4)]
    net = _MLP(*params)
    net.set_inputs(Tensor(shape=[None, 6], dtype=ms.float64), Tensor(shape=[None], dtype=ms.int64))
    step = ms.value_and_grad(net, grad_position=None, weights=net.trainable_params())
    for n in (3, 8, 5):
        x, labels = rng.normal(size=(n, 6)), rng.integers(0, 4, size=n)
        loss, grads = step(Tensor(x), Tensor(labels))
        leaves = [opforge.tensor(p, requires_grad=True) for p in params]
        want = opforge.ops.cross_entropy(
            opforge.ops.linear(opforge.ops.gelu(opforge.ops.linear(opforge.tensor(x), leaves[0], leaves[1])),
                               leaves[2], leaves[3]), opforge.tensor(labels))
        expected = opforge.gradients(want, leaves)
        np.testing.assert_allclose(loss.asnumpy(), want.numpy(), rtol=1e-12)
        for g, e in zip(grads, expected):
            np.testing.assert_allclose(g.asnumpy(), e.numpy(), rtol=1e-10, atol=1e-14)


class _GradStep(nn.Cell):  # type: ignore[misc]
    """The loss and its gradients taken inside the cell's graph (as nn.TrainOneStepCell takes them)."""

    def __init__(self, net: Any) -> None:
        super().__init__()
        self.step = ms.value_and_grad(net, grad_position=None, weights=net.trainable_params())

    def construct(self, x: Any, labels: Any) -> Any:
        return self.step(x, labels)


def test_gradients_taken_inside_a_graph_take_changing_batch_sizes(graph) -> None:
    """A cell whose graph takes the gradients, with set_inputs: the sizes are unknown until it
    runs (every call failed, 'The pointer[seq_abs] is null', from the bprop's tuple arithmetic on
    shapes, so nn.TrainOneStepCell with set_inputs could not train; opforge's sum_to_like reduces
    there now)."""
    rng = np.random.default_rng(2)
    params = [rng.normal(size=(16, 6)) * 0.4, np.zeros(16) + 0.1, rng.normal(size=(4, 16)) * 0.4, np.zeros(4)]
    cell = _GradStep(_MLP(*params))
    cell.set_inputs(Tensor(shape=[None, 6], dtype=ms.float64), Tensor(shape=[None], dtype=ms.int64))
    leaves = [opforge.tensor(p, requires_grad=True) for p in params]
    for n in (3, 8, 5):
        x, labels = rng.normal(size=(n, 6)), rng.integers(0, 4, size=n)
        loss, grads = cell(Tensor(x), Tensor(labels))
        want = opforge.ops.cross_entropy(
            opforge.ops.linear(opforge.ops.gelu(opforge.ops.linear(opforge.tensor(x), leaves[0], leaves[1])),
                               leaves[2], leaves[3]), opforge.tensor(labels))
        np.testing.assert_allclose(loss.asnumpy(), want.numpy(), rtol=1e-12)
        for g, e in zip(grads, opforge.gradients(want, leaves)):
            np.testing.assert_allclose(g.asnumpy(), e.numpy(), rtol=1e-10, atol=1e-14)


class _MeanNet(nn.Cell):  # type: ignore[misc]
    def construct(self, x: Any) -> Any:
        return om.ops.mean(x)


class _SumNet(nn.Cell):  # type: ignore[misc]
    def construct(self, x: Any) -> Any:
        return om.ops.sum(x)


class _InputGrad(nn.Cell):  # type: ignore[misc]
    def __init__(self, net: Any) -> None:
        super().__init__()
        self.g = ms.grad(net)

    def construct(self, x: Any) -> Any:
        return self.g(x)


def test_reduction_gradients_inside_a_graph_take_unknown_sizes_and_empty_dims(graph) -> None:
    """(mean's 1/n from sizes known only when the graph runs was a tensor of a type known only then,
    and the opforge primitives after it failed at the launch, 'The prim is not a PrimitivePy',
    then MindSpore aborted at exit; MindSpore's BroadcastTo to a shape known only then refused
    1 -> 0: the gradient of a reduction over an input with an empty dimension raised; both found
    by a dynamic-shapes hunt)"""
    for net, scale in ((_MeanNet(), True), (_SumNet(), False)):
        cell = _InputGrad(net)
        cell.set_inputs(Tensor(shape=[None, None, None], dtype=ms.float32))
        for shape in ((2, 3, 4), (0, 3, 4), (3, 0, 2), (1, 5, 2)):
            got = cell(Tensor(np.ones(shape, np.float32))).asnumpy()
            want = np.full(shape, 1 / max(1, int(np.prod(shape))) if scale else 1.0, np.float32)
            assert got.shape == shape
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_gradient_of_a_reduction_of_unknown_rank_says_why_it_cannot_be_taken(graph) -> None:
    """(a bare NameError: name 'rank' is not defined)"""
    cell = _InputGrad(_SumNet())
    cell.set_inputs(Tensor(shape=None, dtype=ms.float32))
    with pytest.raises(ValueError, match=r"the gradient of a reduction without keepdims needs its input's rank"):
        cell(Tensor(np.ones((2, 3), np.float32)))


def test_a_launch_whose_shapes_do_not_fit_raises(graph, capfd) -> None:
    """Shapes that only the launch shows to be wrong: MindSpore reports the failed shape
    inference, opforge's message (on stderr, where MindSpore cannot carry it) names the op."""
    cell = _OpCell(om.ops.matmul)
    cell.set_inputs(Tensor(shape=[None, None], dtype=ms.float64), Tensor(shape=[None, None], dtype=ms.float64))
    np.testing.assert_allclose(cell(Tensor(np.ones((2, 3))), Tensor(np.ones((3, 4)))).asnumpy(), np.full((2, 4), 3.0))
    with pytest.raises(RuntimeError):
        cell(Tensor(np.ones((2, 3))), Tensor(np.ones((5, 4))))
    assert "[matmul] matmul inner dimensions differ: (2, 3) @ (5, 4)" in capfd.readouterr().err


# ---------------------------------------------------------------------------- InferShape itself


def _infer(symbol: str, *shapes: list[int]) -> list[list[int]]:
    return _C._aot_infer_shape(symbol, [list(s) for s in shapes])


def test_infer_shape_keeps_what_is_known() -> None:
    # broadcast: an unknown dimension against 1 stays unknown; against n it is n
    assert _infer("opforge_mul", [-1, 1, 3], [1, 5, 3]) == [[-1, 5, 3]]
    assert _infer("opforge_mul", [-1, -1], [4]) == [[-1, 4]]
    # matmul: batch dimensions broadcast, the inner one is not checked while unknown
    assert _infer("opforge_matmul", [-1, 2, -1], [-1, 7]) == [[-1, 2, 7]]
    # an expression rule, and a reduction
    assert _infer("opforge_embedding", [-1, 3], [10, -1]) == [[-1, 3, -1]]
    assert _infer("opforge_transpose", [2, -1, 5]) == [[2, 5, -1]]
    assert _infer("opforge_sum", [-1, 3]) == [[]]
    # optional inputs absent, several outputs
    assert _infer("opforge_linear__without__bias", [-1, 6], [16, 6]) == [[-1, 16]]
    assert _infer("opforge_layer_norm", [-1, 8], [8], [8]) == [[-1, 8], [-1, 1], [-1, 1]]


def test_infer_shape_gives_unknown_rank_when_it_must() -> None:
    assert _infer("opforge_exp", [-2]) == [[-2]]
    assert _infer("opforge_layer_norm", [-2], [8], [8]) == [[-2], [-2], [-2]]


def test_infer_shape_of_shapes_that_cannot_go_together(capfd) -> None:
    """No exception crosses into the host: unknown rank for every output, the reason on stderr."""
    assert _infer("opforge_mul", [2, 3], [4, 3]) == [[-2]]
    assert "[mul] shapes cannot be broadcast together: (2, 3), (4, 3)" in capfd.readouterr().err
    assert _infer("opforge_embedding", [3], [10]) == [[-2]]
    assert "[embedding] dimension 1 of weight is out of range" in capfd.readouterr().err


# ---------------------------------------------------------------------------- second derivatives


def _second_order_cases() -> list[Case]:
    out = {}
    for c in widest_cases():
        op = c.op
        if c.dtype != "float64" or not any(i.differentiable for i in op.inputs):
            continue
        if op.bprop is None and op.impl.kind != "composite":
            continue
        out.setdefault(op.name, c)
    return list(out.values())


SECOND = _second_order_cases()
# Graph mode compiles a graph of the op's bprop's bprop per op (seconds each): the fast set keeps three
_FAST_GRAPH = {"tanh", "linear", "softmax"}
SECOND_PARAMS = [pytest.param(c, m, id=f"{c.id}-{m}",
                              marks=() if m == "pynative" or c.op.name in _FAST_GRAPH else pytest.mark.slow)
                 for c in SECOND for m in ("pynative", "graph")]


def _double_backward(case: Case, data: list[Any], w: list[np.ndarray], v: list[np.ndarray]) -> list[np.ndarray]:
    """d/dx <v, d<w, f(x)>/dx> by opforge's autograd (create_graph)."""
    inputs, wanted, grads = opforge_grads(case, data, w, create_graph=True)
    h = None
    for g, vk in zip(grads, v):
        if g is None or not g.requires_grad:
            continue
        term = opforge.ops.sum(opforge.ops.mul(g, opforge.tensor(vk)))
        h = term if h is None else opforge.ops.add(h, term)
    if h is None:
        return [np.zeros(inputs[k].shape) for k in wanted]
    second = opforge.gradients(h, [inputs[k] for k in wanted], allow_unused=True)
    return [np.zeros(inputs[k].shape) if s is None else s.numpy() for k, s in zip(wanted, second)]


@pytest.mark.parametrize("case, mode", SECOND_PARAMS)
def test_grad_of_grad_matches_opforge(case: Case, mode: str, rng) -> None:
    op = case.op
    data = make_data(op, case.dtype, case.shapes, rng)
    inputs = ms_inputs(case, data)
    refs = reference(op, data, case.attrs)
    diff = [k for k, o in enumerate(op.outputs) if o.differentiable]
    w = [rng.uniform(-1, 1, np.shape(refs[k])) for k in diff]
    wanted = [k for k, t in enumerate(inputs) if t is not None and op.inputs[k].differentiable]
    v = [rng.standard_normal(inputs[k].shape) for k in wanted]
    call = _prim(case)
    slots = [k for k, t in enumerate(inputs) if t is not None]
    positions = tuple(slots.index(k) for k in wanted)
    ws, vs = [Tensor(x) for x in w], [Tensor(x) for x in v]

    class Loss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.op = call

        def construct(self, *xs: Any) -> Any:
            outs = self.op(*xs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            loss = 0
            for j in range(len(DIFF)):
                loss = loss + (outs[DIFF[j]] * ws[j]).sum()
            return loss

    class GradDotV(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.grad = ms.grad(Loss(), grad_position=positions)

        def construct(self, *xs: Any) -> Any:
            gs = self.grad(*xs)
            gs = gs if isinstance(gs, tuple) else (gs,)
            total = 0
            for j in range(len(vs)):
                total = total + (gs[j] * vs[j]).sum()
            return total

    DIFF = tuple(diff)  # noqa: N806
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        present = [t for t in inputs if t is not None]
        second = ms.grad(GradDotV(), grad_position=positions)(*present)
    finally:
        ms.set_context(mode=old)
    second = second if isinstance(second, tuple) else (second,)
    for k, got, want in zip(wanted, second, _double_backward(case, data, w, v)):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-8, atol=1e-11, err_msg=op.inputs[k].name)


def test_pynative_calls_take_python_shapes_and_graph_mode_keeps_the_cpp_infer_shape() -> None:
    """MindSpore resolves a C++ InferShape from the library on every PyNative call (a dlopen, ~60
    µs): PyNative calls go through a twin primitive without it, whose shapes come from __infer__;
    the primitive Graph mode compiles keeps it (dynamic shapes)."""
    prim = om.ops.mul
    assert prim.attrs.get("cpp_infer_shape") is True
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    old = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        np.testing.assert_array_equal(prim(x, x).asnumpy(), np.arange(6, dtype=np.float32).reshape(2, 3) ** 2)
        twin = prim._eager
        assert isinstance(twin, om.Primitive) and "cpp_infer_shape" not in twin.attrs
        assert prim(x, x) is not None and prim._eager is twin  # (made once)
        assert prim.attrs.get("cpp_infer_shape") is True
        with pytest.raises(ValueError, match=r"\[mul\]"):  # the twin's Python infer: the call's own errors
            prim(x, Tensor(np.ones((4,), np.float32)))
    finally:
        ms.set_context(mode=old)


def test_infer_shape_hook_checks_the_symbol_against_its_op() -> None:
    # the entry reads one shape per present input: a call with fewer read past the list given
    # (-2 from the heap as a dimension), a multi-output signature for a single-output op crashed
    with pytest.raises(ValueError, match=re.escape("[call_infer_shape] symbol 'opforge_mul' takes 2 input shapes; got 1")):
        _infer("opforge_mul", [2])
    with pytest.raises(ValueError, match=re.escape("symbol 'opforge_linear__without__bias' takes 2 input shapes; got 3")):
        _infer("opforge_linear__without__bias", [-1, 6], [16, 6], [16])
    with pytest.raises(ValueError, match=re.escape("symbol 'opforge_no_such_op' names no registered op")):
        _infer("opforge_no_such_op", [2])
    with pytest.raises(ValueError, match=re.escape("is not opforge_<op>[__without__<input>...]")):
        _infer("mul", [2], [2])
