"""The runtime checks shapes at its trust boundaries: an input that does not broadcast to the
output, a gradient of the wrong shape (index arrays written by another thread while a kernel runs:
test_index_races.py). Each case here read or wrote out of bounds before it was checked (heap
contents as values or gradients, `free(): invalid pointer`, segfaults); now each is a Python
exception naming the op."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops

# A careless cpp kernel: it runs the broadcasting loop over x and y into an output shaped like x
# (what an expr op with `shape: same(x)` did before the spec check refused it).
TB_SAME = """\
tb_same:
  doc: x times y into an output shaped like x (a careless kernel).
  inputs:
    x: T
    y: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float64]
  targets:
    cpu: {}
  impl:
    cpp: {}
  bprop:
    x: dout * y
    y: dout * x
"""
TB_SAME_KERNEL = """\
#include "tb_same.h"

#include "runtime/elementwise.h"

namespace opforge::kernels::cpu {
template <typename T>
void tb_same(const TensorPtr& x, const TensorPtr& y, const TensorPtr& out, const TbSameAttrs&) {
  elementwise<T, T, T>(*out, [](auto a, auto b) { return a * b; }, {x.get(), y.get()});
}
}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_TB_SAME_CPU
"""
# A bprop formula returning a gradient of the wrong shape for y: x's, which y need not broadcast to.
TB_BADGRAD = """\
tb_badgrad:
  doc: x + y with a wrong gradient formula for y.
  inputs:
    x: T
    y: T
  outputs:
    out: {dtype: T, shape: "broadcast(x, y)"}
  dtypes:
    T: [float64]
  targets:
    cpu: {}
  impl:
    expr: x + y
  bprop:
    x: dout
    y: x
"""
# expand_reduced of a tensor that is not a reduction of x (y's shape is not x's with axis 0 kept).
TB_EXPAND = """\
tb_expand:
  doc: x + sum(y) with a gradient formula expanding dout over the wrong tensor.
  inputs:
    x: T
    y: T
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float64]
  targets:
    cpu: {}
  impl:
    cpp: {}
  bprop:
    x: expand_reduced(y, x, [0], true)
    y: zeros_like(y)
"""
TB_EXPAND_KERNEL = """\
#include "tb_expand.h"

namespace opforge::kernels::cpu {
template <typename T>
void tb_expand(const TensorPtr& x, const TensorPtr& y, const TensorPtr& out, const TbExpandAttrs&) {
  T total = T(0);
  for (int64_t i = 0; i < y->numel(); ++i) total += y->data<T>()[i];
  for (int64_t i = 0; i < x->numel(); ++i) out->data<T>()[i] = x->data<T>()[i] + total;
}
}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_TB_EXPAND_CPU
"""


@pytest.fixture(scope="module")
def careless(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("careless")
    specs, sources = [], []
    for name, text in [("tb_same", TB_SAME), ("tb_badgrad", TB_BADGRAD), ("tb_expand", TB_EXPAND)]:
        (d / f"{name}.yaml").write_text(text)
        specs.append(d / f"{name}.yaml")
    for name, text in [("tb_same", TB_SAME_KERNEL), ("tb_expand", TB_EXPAND_KERNEL)]:
        (d / f"{name}.cpp").write_text(text)
        sources.append(d / f"{name}.cpp")
    return opforge.load("careless_ops", specs=specs, sources=sources, build_dir=d / "cache")


# ---------------------------------------------------------------- inputs broadcast to the output

@pytest.mark.slow
def test_input_longer_than_the_output_is_refused(careless) -> None:
    big = np.arange(1000.0)
    # was: values read past y's view (y's two elements, then big[2], big[3])
    with pytest.raises(ValueError, match=re.escape(
            "[tb_same] input 1 of shape (2,) does not broadcast to the output shape (4,)")):
        careless.tb_same(np.ones(4), big[:2])


@pytest.mark.slow
def test_input_with_more_dims_than_the_output_is_refused(careless) -> None:
    # was: broadcast_strides wrote before its vector (`free(): invalid pointer`, the process aborted)
    with pytest.raises(ValueError, match=re.escape(
            "[tb_same] input 1 of shape (1, 2) does not broadcast to the output shape (4,)")):
        careless.tb_same(np.ones(4), np.ones((1, 2)))


@pytest.mark.slow
def test_large_output_over_a_tiny_input_is_refused(careless) -> None:
    # was: a segfault, reading millions of elements past a 2-element array
    with pytest.raises(ValueError, match=re.escape(
            "[tb_same] input 1 of shape (2,) does not broadcast to the output shape (5000000,)")):
        careless.tb_same(np.ones(5_000_000), np.ones(2))


@pytest.mark.slow
def test_inputs_that_do_broadcast_still_work(careless) -> None:
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(careless.tb_same(x, np.array([1.0, 2.0, 3.0])).numpy(), x * [1, 2, 3])
    np.testing.assert_array_equal(careless.tb_same(x, np.array(2.0)).numpy(), x * 2)


# ---------------------------------------------------------------- gradients of the input's shape

@pytest.mark.slow
def test_gradient_of_the_wrong_shape_is_refused(careless) -> None:
    x = opforge.tensor(np.ones(1), requires_grad=True)
    y = opforge.tensor(np.arange(4.0), requires_grad=True)
    out = ops.sum(careless.tb_badgrad(x, y))
    # was: y.grad held heap contents (1.4e-311, 3.4e-321, ...), or a segfault for a large y
    with pytest.raises(RuntimeError, match=re.escape(
            "[tb_badgrad] the gradient for input 1 has shape (1,), which is not the input's shape (4,) "
            "nor a broadcast of it (check the op's bprop formula)")):
        out.backward()
    assert y.grad is None


@pytest.mark.slow
def test_broadcast_gradients_are_still_reduced(careless) -> None:
    x = opforge.tensor(np.ones((3, 4)), requires_grad=True)
    y = opforge.tensor(np.ones(4), requires_grad=True)
    ops.sum(careless.tb_badgrad(x, y)).backward()  # y's formula gives x's shape (3, 4): reducible
    np.testing.assert_array_equal(y.grad.numpy(), np.full(4, 3.0))
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((3, 4)))


@pytest.mark.slow
def test_expand_reduced_of_a_tensor_that_is_no_reduction_is_refused(careless) -> None:
    x = opforge.tensor(np.ones((3, 4)), requires_grad=True)
    y = opforge.tensor(np.ones(7), requires_grad=True)
    out = ops.sum(careless.tb_expand(x, y))
    # was: broadcast_to read y's 7 elements as a (1, 4) row, then past them for larger shapes
    with pytest.raises(ValueError, match=re.escape(
            "[broadcast_to] an input of shape (7,) does not broadcast to the output shape (3, 4)")):
        out.backward()
