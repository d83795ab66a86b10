"""The autograd engine: accumulation, retain_graph, create_graph, no-grad, functional API."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import opforge
from opforge import ops


def leaf(values, dtype="float64"):
    return opforge.tensor(np.asarray(values, dtype=dtype), requires_grad=True)


def test_diamond_graph_accumulates_in_topological_order() -> None:
    x = leaf([1.0, 2.0, 3.0])
    y = ops.add(ops.mul(x, x), x)  # dy/dx = 2x + 1, x used by two paths
    ops.sum(y).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 5.0, 7.0])


def test_grad_accumulates_across_backward_calls_with_retain_graph() -> None:
    x = leaf([1.0, 2.0])
    y = ops.sum(ops.square(x))
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
    x.grad = None
    ops.sum(ops.square(x)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_create_graph_gives_differentiable_gradients() -> None:
    x = leaf([1.0, 2.0])
    y = ops.sum(ops.mul(ops.mul(x, x), x))
    (g,) = opforge.gradients(y, x, create_graph=True)
    np.testing.assert_array_equal(g.numpy(), [3.0, 12.0])
    assert g.requires_grad
    (gg,) = opforge.gradients(ops.sum(g), x)
    np.testing.assert_array_equal(gg.numpy(), [6.0, 12.0])


def test_backward_with_create_graph_then_backward_again() -> None:
    x = leaf([0.5])
    y = ops.tanh(x)
    (g,) = opforge.gradients(y, x, create_graph=True)
    g.backward()
    t = np.tanh(0.5)
    np.testing.assert_allclose(x.grad.numpy(), [-2 * t * (1 - t * t)])


def test_tensor_backward_with_create_graph_keeps_the_graph() -> None:
    x = leaf([1.0, 2.0])
    with pytest.warns(UserWarning, match=r"\[backward\] backward\(create_graph=True\) makes each leaf's \.grad"):
        ops.sum(ops.mul(ops.mul(x, x), x)).backward(create_graph=True)
    g = x.grad
    np.testing.assert_array_equal(g.numpy(), [3.0, 12.0])
    x.grad = None
    ops.sum(g).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 12.0])


def test_grads_never_share_memory() -> None:
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    ops.sum(ops.add(x, w)).backward()
    assert not np.shares_memory(x.grad.numpy(), w.grad.numpy())
    seed = np.ones(2)
    y = ops.add(x, 0.0)
    x.grad = None
    y.backward(seed)
    assert not np.shares_memory(x.grad.numpy(), seed)


def test_concurrent_backward_into_one_leaf() -> None:
    x = leaf(np.ones(64))

    def work() -> None:
        for _ in range(200):
            ops.sum(ops.mul(x, x)).backward()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(64, 2.0 * 800))


def test_no_grad_records_nothing() -> None:
    x = leaf([1.0])
    with opforge.no_grad():
        y = ops.mul(x, x)
    assert not y.requires_grad and y.grad_fn is None and opforge.is_grad_enabled()

    @opforge.no_grad()
    def f(t):
        return ops.exp(t)

    assert not f(x).requires_grad
    assert ops.exp(x).grad_fn == "exp"


def test_grad_mode_decorators_restore_the_mode_of_each_call() -> None:
    # (a decorated function's calls each get their own context: the mode to restore is not shared
    # by a recursive call, nor by two threads in the function at once)
    @opforge.no_grad()
    def down(n: int) -> None:
        assert not opforge.is_grad_enabled()
        if n:
            down(n - 1)

    down(2)
    assert opforge.is_grad_enabled()

    @opforge.enable_grad()
    def up() -> bool:
        return opforge.is_grad_enabled()

    with opforge.no_grad():
        assert up() and not opforge.is_grad_enabled()
    assert opforge.is_grad_enabled()

    inside, release, modes = threading.Event(), threading.Event(), {}

    @opforge.no_grad()
    def hold() -> None:
        inside.set()
        release.wait(10)

    def a() -> None:
        hold()
        modes["a"] = opforge.is_grad_enabled()

    def b() -> None:
        inside.wait(10)
        with opforge.no_grad():
            hold()
        modes["b"] = opforge.is_grad_enabled()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start()
    tb.start()
    release.set()
    ta.join()
    tb.join()
    assert modes == {"a": True, "b": True}
    ng = opforge.no_grad()  # (one instance's with blocks nest)
    with ng:
        with ng:
            pass
        assert not opforge.is_grad_enabled()
    assert opforge.is_grad_enabled()


def test_set_grad_enabled_is_a_call_and_a_context_manager() -> None:
    with opforge.set_grad_enabled(False):
        assert not opforge.is_grad_enabled()
    assert opforge.is_grad_enabled()
    opforge.set_grad_enabled(False)
    assert not opforge.is_grad_enabled()
    opforge.set_grad_enabled(True)
    with pytest.raises(TypeError, match=re.escape("[set_grad_enabled] mode must be a bool, got NoneType")):
        opforge.set_grad_enabled(None)  # type: ignore[arg-type]
    assert opforge.is_grad_enabled()
    t = opforge.tensor([1.0])
    with pytest.raises(TypeError, match=re.escape("[requires_grad] must be a bool, got None")):
        t.requires_grad = None
    t.requires_grad = np.bool_(True)
    assert t.requires_grad


def test_outputs_of_non_differentiable_ops_do_not_require_grad() -> None:
    x = leaf([1.0, -1.0])
    assert not ops.greater(x, 0.0).requires_grad
    w = ops.where(ops.greater(x, 0.0), x, ops.neg(x))
    ops.sum(w).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, -1.0])


def test_root_gradient_is_cast_and_checked() -> None:
    x = leaf([1.0, 2.0], "float32")
    y = ops.mul(x, 3.0)
    y.backward(grad=np.ones(2))  # float64 seed for a float32 output
    assert x.grad.dtype == "float32"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    with pytest.raises(ValueError, match=r"\[backward\] grad has shape \(3,\) but the tensor has shape \(2,\)"):
        ops.mul(x, 3.0).backward(grad=np.ones(3, np.float32))


def test_low_precision_gradients_keep_the_input_dtype() -> None:
    for dtype in ("float16", "bfloat16"):
        x = opforge.tensor(np.array([1.0, 2.0], np.float32)).astype(dtype)
        x.requires_grad = True
        ops.sum(ops.square(x)).backward()
        assert x.grad.dtype == dtype
        np.testing.assert_allclose(x.grad.astype("float32").numpy(), [2.0, 4.0])


def test_grad_and_value_and_grad() -> None:
    f = lambda a, b: ops.sum(ops.mul(a, b))  # noqa: E731
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    np.testing.assert_array_equal(opforge.grad(f)(a, b).numpy(), [3.0, 4.0])
    ga, gb = opforge.grad(f, argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(gb.numpy(), [1.0, 2.0])
    value, g = opforge.value_and_grad(f, grad_position=1)(a, b)
    assert value.item() == 11.0
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0])
    w = leaf([2.0, 2.0])
    value, gw = opforge.value_and_grad(lambda a: ops.sum(ops.mul(a, w)), grad_position=None, weights=[w])(a)
    np.testing.assert_array_equal(gw[0].numpy(), a)
    # a position given twice is one leaf, with its gradient twice
    g1, g2 = opforge.grad(f, argnums=(0, 0))(a, b)
    np.testing.assert_array_equal(g1.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(g2.numpy(), [3.0, 4.0])
    # an input the function ignores gets a zero gradient
    g0, g1 = opforge.grad(lambda a, b: ops.sum(a), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(g1.numpy(), [0.0, 0.0])


def test_value_and_grad_with_aux_and_errors() -> None:
    f = lambda a: (ops.sum(ops.square(a)), ops.neg(a))  # noqa: E731
    (value, aux), g = opforge.value_and_grad(f, has_aux=True)(np.array([3.0]))
    assert value.item() == 9.0 and aux.item() == -3.0 and g.item() == 6.0
    with pytest.raises(IndexError, match=r"\[value_and_grad\] grad_position 2 is out of range"):
        opforge.grad(lambda a: ops.sum(a), argnums=2)(np.ones(2))
    with pytest.raises(TypeError, match=r"\[grad\] can only differentiate with respect to floating-point"):
        opforge.grad(lambda a: ops.sum(a))(np.ones(2, np.int64))
    with pytest.raises(TypeError, match=r"\[value_and_grad\] weights must be opforge Tensors"):
        opforge.value_and_grad(lambda a: a, weights=[np.ones(2)])


def test_gradients_of_unused_inputs() -> None:
    x, y = leaf([1.0]), leaf([2.0])
    gx, gy = opforge.gradients(ops.sum(ops.exp(x)), [x, y], allow_unused=True)
    assert gy is None and gx.item() == pytest.approx(np.e)
    with pytest.raises(RuntimeError, match=r"\[grad\] input 1 was not used"):
        opforge.gradients(ops.sum(ops.exp(x)), [x, y])


def test_requires_grad_only_on_leaves() -> None:
    x = leaf([1.0])
    y = ops.exp(x)
    with pytest.raises(RuntimeError, match="requires_grad can only be changed on leaf tensors"):
        y.requires_grad = False
    d = y.detach()
    assert d.is_leaf and not d.requires_grad


def test_the_gradient_of_a_mean_gradient_over_an_empty_axis_is_zero() -> None:
    # (mean's scale numel(out) / numel(x) was inf there: the gradient with respect to dout 0 * inf;
    # numel_ratio gives 0, and torch's is 0)
    x = opforge.tensor(np.zeros((3, 0)), requires_grad=True)
    dout = opforge.tensor(np.ones(3), requires_grad=True)
    (gx,) = opforge.gradients(ops.mean(x, axis=[1]), [x], [dout], create_graph=True)
    assert gx.shape == (3, 0)
    (gd,) = opforge.gradients(ops.sum(gx), [dout])
    np.testing.assert_array_equal(gd.numpy(), np.zeros(3))
