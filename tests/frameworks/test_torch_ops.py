"""opforge.torch: every op checked by PyTorch's own tools, on inputs generated from its spec.

For each spec'd op and each of its test cases (shapes × attr sets, in float64 where the op takes
it): the torch op matches the spec's NumPy reference; ``torch.library.opcheck`` passes
test_schema, test_autograd_registration, test_faketensor and test_aot_dispatch_dynamic; and
``gradcheck`` and ``gradgradcheck`` pass for ops with differentiable inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge  # noqa: E402
from opforge import _formulas  # noqa: E402  (opforge's own ops: list_ops() also has ops that tests load)
import opforge.torch as ot  # noqa: E402
from cases import Case, make_data, reference, tolerance, widest_cases  # noqa: E402
from torch_cases import differentiable_fn, overload, torch_inputs  # noqa: E402

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


CASES = widest_cases()
GRAD_CASES = [c for c in CASES if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)]


def test_every_op_is_registered() -> None:
    names = set(_formulas.OPS)
    inplace = {s.inplace for s in (opforge.spec(n) for n in names) if s.inplace}  # (add_, mul_, ...: not in torch)
    assert names | inplace == {n for n in vars(opforge._C.ops) if not n.startswith("_")}  # (the built ops)
    assert names == set(ot._formulas.OPS)
    for name in names:
        assert hasattr(torch.ops.opforge, name), name
        assert ot.ops is torch.ops.opforge


def test_cases_cover_every_op() -> None:
    """Every op is checked below: one without a ``tests`` section in its spec fails here."""
    assert {c.op.name for c in CASES} == set(_formulas.OPS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_matches_reference(case: Case, rng) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    outs = overload(case)(*torch_inputs(case, data), **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = reference(case.op, data, case.attrs)
    rtol, atol = tolerance(case.op, case.dtype)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        assert isinstance(o, torch.Tensor)
        r = np.asarray(r)
        assert tuple(o.shape) == r.shape, spec.name
        if o.dtype.is_floating_point:
            np.testing.assert_allclose(o.double().numpy(), r, rtol=rtol, atol=atol, err_msg=spec.name)
        else:
            np.testing.assert_array_equal(o.numpy(), r.astype(o.numpy().dtype), err_msg=spec.name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_opcheck(case: Case, rng) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    args = torch_inputs(case, data, requires_grad=True)
    result = torch.library.opcheck(overload(case), tuple(args), dict(case.attrs), test_utils=OPCHECK_TESTS)
    assert result == {t: "SUCCESS" for t in OPCHECK_TESTS}


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradcheck_and_gradgradcheck(case: Case, rng) -> None:
    data = make_data(case.op, case.dtype, case.shapes, rng)
    fn, inputs = differentiable_fn(case, torch_inputs(case, data, requires_grad=True))
    rtol, atol = case.op.tests.grad_tolerance or (1e-3, 1e-5)
    assert torch.autograd.gradcheck(fn, inputs, rtol=rtol, atol=atol)
    assert torch.autograd.gradgradcheck(fn, inputs, rtol=rtol, atol=atol)
