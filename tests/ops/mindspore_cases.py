"""MindSpore test helpers shared by the MindSpore tests: a case's inputs as MindSpore tensors and
the check of a MindSpore op's outputs against the spec's reference."""

from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import Tensor

import opforge
from cases import Case, to_inputs, tolerance


def ms_inputs(case: Case, data: list[Any]) -> list[Any]:
    """The case's inputs as MindSpore tensors (None for absent optional ones)."""
    return [None if a is None else Tensor(np.array(a, order="C")) for a in to_inputs(case.op, case.dtype, data)]


def check_outputs(case: Case, outs: Any, refs: tuple) -> None:
    """The op's outputs (a tensor or a tuple) equal the reference's within the case's tolerance."""
    outs = outs if isinstance(outs, tuple) else (outs,)
    rtol, atol = tolerance(case.op, case.dtype)
    assert len(outs) == len(refs)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        assert isinstance(o, Tensor), spec.name
        got, r = o.asnumpy(), np.asarray(r)
        assert got.shape == r.shape, spec.name
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got.astype(np.float64), r, rtol=rtol, atol=atol, err_msg=spec.name)
        else:
            np.testing.assert_array_equal(got, r.astype(got.dtype), err_msg=spec.name)


def opforge_grads(case: Case, data: list[Any], weights: list[np.ndarray],
                  create_graph: bool = False) -> tuple[list[Any], list[int], tuple[Any, ...]]:
    """Gradients of sum(out_k * w_k) over the differentiable outputs, by opforge's own autograd:
    (the opforge inputs, the indices of the differentiable present ones, their gradients)."""
    op = case.op
    inputs = [None if a is None else opforge.tensor(a, requires_grad=spec.differentiable)
              for spec, a in zip(op.inputs, to_inputs(op, case.dtype, data))]
    outs = getattr(opforge.ops, op.name)(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    diff = [k for k, o in enumerate(op.outputs) if o.differentiable]
    wanted = [k for k, t in enumerate(inputs) if t is not None and op.inputs[k].differentiable]
    grads = opforge.gradients([outs[k] for k in diff], [inputs[k] for k in wanted],
                              [opforge.tensor(w) for w in weights], create_graph=create_graph, allow_unused=True)
    return inputs, wanted, grads
