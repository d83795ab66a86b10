"""opforge.foreach: an op whose spec declares `foreach: true` (sgd_step, adam_step) over lists of
tensors in one call, equal to the per-tensor calls; shared (non-list) inputs; out= lists written in
place; every mismatch refused, naming the op, before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

import opforge
from opforge import ops

SGD = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True, first=False)


def tensors(seed: int, shapes: list[tuple[int, ...]]) -> list[opforge.Tensor]:
    rng = np.random.default_rng(seed)
    return [opforge.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


SHAPES = [(3, 4), (7,), (), (2, 0), (5, 1, 2)]


def test_foreach_equals_the_per_tensor_calls_in_place() -> None:
    params, grads, bufs = tensors(0, SHAPES), tensors(1, SHAPES), tensors(2, SHAPES)
    want_p, want_b = [p.numpy().copy() for p in params], [b.numpy().copy() for b in bufs]
    for k in range(len(SHAPES)):  # the same step one tensor at a time, on copies
        p, b = opforge.tensor(want_p[k]), opforge.tensor(want_b[k])
        ops.sgd_step(p, grads[k], b, **SGD, out=(p, b))
        want_p[k], want_b[k] = p.numpy(), b.numpy()
    ids = [id(p) for p in params]
    result = opforge.foreach(ops.sgd_step, params, grads, bufs, **SGD, out=(params, bufs))
    assert [id(p) for p in params] == ids  # written in place
    assert [tuple(id(t) for t in r) for r in result] == [(id(p), id(b)) for p, b in zip(params, bufs)]
    for k in range(len(SHAPES)):
        np.testing.assert_array_equal(params[k].numpy(), want_p[k])
        np.testing.assert_array_equal(bufs[k].numpy(), want_b[k])


def test_a_shared_input_and_results_without_out() -> None:
    params, bufs = tensors(3, [(4,), (4,)]), tensors(4, [(4,), (4,)])
    (g,) = tensors(5, [(4,)])
    results = opforge.foreach(ops.sgd_step, params, g, bufs, **SGD)  # one gradient for both
    assert len(results) == 2
    for p, b, (p_new, b_new) in zip(params, bufs, results):
        want = ops.sgd_step(p, g, b, **SGD)
        np.testing.assert_array_equal(p_new.numpy(), want[0].numpy())
        np.testing.assert_array_equal(b_new.numpy(), want[1].numpy())


def test_a_shared_number_takes_each_positions_dtype() -> None:
    """An input given as one Python number (the lr) is made a tensor once per dtype and device and
    shared by the positions of that dtype (one fill per step on a device, not one per parameter)."""
    params = [opforge.tensor(np.ones(3, np.float32)), opforge.tensor(np.ones(2, np.float64)),
              opforge.tensor(np.ones(4, np.float32))]
    grads = [opforge.tensor(np.full(p.shape, 2.0, p.dtype)) for p in params]
    bufs = [opforge.tensor(np.zeros(p.shape, p.dtype)) for p in params]
    opforge.foreach(ops.sgd_step, params, grads, bufs, 0.25, out=(params, bufs))
    for p in params:
        np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 0.5, p.dtype))
    # numbers in a list are each position's own
    out = opforge.foreach(ops.sgd_step, params[:2], grads[:2], bufs[:2], [0.5, 0.25])
    np.testing.assert_array_equal(out[0][0].numpy(), np.full(3, -0.5, np.float32))
    np.testing.assert_array_equal(out[1][0].numpy(), np.full(2, 0.0))
    assert [o[0].dtype for o in out] == ["float32", "float64"]


def test_adam_step_over_a_list() -> None:
    params, grads = tensors(6, SHAPES), tensors(7, SHAPES)
    m1 = [opforge.tensor(np.zeros(s, np.float32)) for s in SHAPES]
    m2 = [opforge.tensor(np.zeros(s, np.float32)) for s in SHAPES]
    attrs = dict(step_size=0.01, bias_correction2_sqrt=0.5, exp_avg_weight=0.1, beta2=0.999, exp_avg_sq_weight=0.001,
                 eps=1e-8, weight_decay=0.0, param_scale=1.0)
    before = [p.numpy().copy() for p in params]
    opforge.foreach(ops.adam_step, params, grads, m1, m2, **attrs, out=(params, m1, m2))
    for k in range(len(SHAPES)):
        want = ops.adam_step(opforge.tensor(before[k]), grads[k], opforge.tensor(np.zeros(SHAPES[k], np.float32)),
                             opforge.tensor(np.zeros(SHAPES[k], np.float32)), **attrs)
        for got, w in zip((params[k], m1[k], m2[k]), want):
            np.testing.assert_array_equal(got.numpy(), w.numpy())


def test_mismatches_are_refused_before_anything_is_written() -> None:
    params, grads, bufs = tensors(8, [(3,), (3,)]), tensors(9, [(3,), (3,), (3,)]), tensors(10, [(3,), (3,)])
    before = [p.numpy().copy() for p in params]
    with pytest.raises(ValueError, match=r"\[sgd_step\] foreach: input 'grad' has 3 values, 'param' has 2"):
        opforge.foreach(ops.sgd_step, params, grads, bufs, **SGD, out=(params, bufs))
    with pytest.raises(ValueError, match=r"\[sgd_step\] foreach: out list 1 must hold 2 tensors, like input 'param'"):
        opforge.foreach(ops.sgd_step, params, grads[:2], bufs, **SGD, out=(params, bufs[:1]))
    with pytest.raises(TypeError, match=r"\[sgd_step\] foreach: out= needs 2 lists, one per output; got 1"):
        opforge.foreach(ops.sgd_step, params, grads[:2], bufs, **SGD, out=(params,))
    with pytest.raises(TypeError, match=r"\[sgd_step\] foreach: give at least one input as a list of tensors"):
        opforge.foreach(ops.sgd_step, params[0], grads[0], bufs[0], **SGD)
    with pytest.raises(TypeError, match=r"\[mul\] has no foreach form: its spec does not declare `foreach: true`"):
        opforge.foreach(ops.mul, params, grads[:2])
    with pytest.raises(TypeError, match=r"\[foreach\] takes an op function \(opforge.ops.<op>\), got function"):
        opforge.foreach(lambda x: x, params)
    with pytest.raises(TypeError, match=r"\[sgd_step\] unexpected keyword 'lrr'"):
        opforge.foreach(ops.sgd_step, params, grads[:2], bufs, lrr=0.1)
    # a position's own error (a shape that does not broadcast, an out tensor of another shape) names
    # the op, as the per-tensor call would, and comes before position 0 is written
    with pytest.raises(ValueError, match=r"\[sgd_step\]"):
        opforge.foreach(ops.sgd_step, params, tensors(11, [(3,), (4,)]), bufs, **SGD, out=(params, bufs))
    with pytest.raises(ValueError, match=r"\[sgd_step\] out is float32 of shape \(2,\)"):
        opforge.foreach(ops.sgd_step, params, grads[:2], bufs, **SGD, out=(params, [bufs[0], tensors(12, [(2,)])[0]]))
    # the call's own checks too: out tensors sharing memory, inputs that require grad, tangents
    with pytest.raises(ValueError, match=r"\[sgd_step\] out tensors 0 and 1 share memory"):
        opforge.foreach(ops.sgd_step, params, grads[:2], bufs, **SGD, out=(params, [bufs[0], params[1]]))
    traced = [grads[0], opforge.tensor(grads[1].numpy(), requires_grad=True)]
    with pytest.raises(RuntimeError, match=r"\[sgd_step\] out= does not record gradients, but an input requires grad"):
        opforge.foreach(ops.sgd_step, params, traced, bufs, **SGD, out=(params, bufs))
    with pytest.raises(RuntimeError, match=r"\[sgd_step\] out= does not carry forward-mode tangents"):
        opforge.jvp(lambda g: opforge.foreach(ops.sgd_step, params, [grads[0], g], bufs, **SGD, out=(params, bufs)),
                    (grads[1],), (np.ones(3, np.float32),))
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)
