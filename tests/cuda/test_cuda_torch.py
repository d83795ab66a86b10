"""opforge.torch on CUDA: ops with cuda rows registered for torch's CUDA dispatch key, checked by
PyTorch's own tools on torch.cuda tensors (forward against the spec's reference, ``opcheck``,
``gradcheck``/``gradgradcheck``, ``torch.compile(fullgraph=True)``) and run on torch's current
stream. Skipped without a CUDA device for opforge or torch."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge  # noqa: E402
import opforge.cuda  # noqa: E402
from opforge import _formulas  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))
from cases import Case, all_specs, make_data, reference, tolerance, widest_cases  # noqa: E402
from torch_cases import differentiable_fn, overload, torch_inputs  # noqa: E402

pytestmark = pytest.mark.skipif(not (opforge.cuda.is_available() and torch.cuda.is_available()),
                                reason="no CUDA device for opforge and torch: "
                                       f"{opforge.cuda.unavailable_reason() or 'torch has no CUDA'}")

import opforge.torch as ot  # noqa: E402

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
NO_CUDA = {o.name for o in all_specs() if o.target("cuda") is None}


def runs_on_cuda(case: Case) -> bool:
    op = _formulas.OPS.get(case.op.name)
    if op is None or "cuda" not in op.runs or op.impl == "composite":
        return False
    rows = case.op.target("cuda").rows()
    return any(case.dtype in [str(d) for d in b.values()] for b, _ in rows) or not case.op.typevars


def backward_runs(case: Case) -> bool:
    texts = [f.text for _, f in case.op.bprop.lets + case.op.bprop.grads] if case.op.bprop else []
    return not any(re.search(rf"\b{n}\(", t) for n in NO_CUDA for t in texts)


CASES = [c for c in widest_cases() if runs_on_cuda(c)] if opforge.cuda.is_available() else []
GRAD_CASES = [c for c in CASES if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)
              and backward_runs(c)]


def cuda_inputs(case: Case, data: list[Any], requires_grad: bool = False) -> list[Any]:
    return torch_inputs(case, data, requires_grad, device="cuda")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_on_cuda_matches_reference(case: Case, rng) -> None:  # type: ignore[no-untyped-def]
    data = make_data(case.op, case.dtype, case.shapes, rng)
    outs = overload(case)(*cuda_inputs(case, data), **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = reference(case.op, data, case.attrs)
    rtol, atol = tolerance(case.op, case.dtype)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        assert o.device.type == "cuda", spec.name
        r = np.asarray(r)
        assert tuple(o.shape) == r.shape, spec.name
        if o.dtype.is_floating_point:
            np.testing.assert_allclose(o.double().cpu().numpy(), r, rtol=rtol, atol=atol, err_msg=spec.name)
        else:
            np.testing.assert_array_equal(o.cpu().numpy(), r.astype(o.cpu().numpy().dtype), err_msg=spec.name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_opcheck_on_cuda(case: Case, rng) -> None:  # type: ignore[no-untyped-def]
    data = make_data(case.op, case.dtype, case.shapes, rng)
    args = cuda_inputs(case, data, requires_grad=backward_runs(case))
    result = torch.library.opcheck(overload(case), tuple(args), dict(case.attrs), test_utils=OPCHECK_TESTS)
    assert result == {t: "SUCCESS" for t in OPCHECK_TESTS}


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradcheck_and_gradgradcheck_on_cuda(case: Case, rng) -> None:  # type: ignore[no-untyped-def]
    data = make_data(case.op, case.dtype, case.shapes, rng)
    fn, inputs = differentiable_fn(case, cuda_inputs(case, data, requires_grad=True))
    rtol, atol = case.op.tests.grad_tolerance or (1e-3, 1e-5)
    assert torch.autograd.gradcheck(fn, inputs, rtol=rtol, atol=atol)
    assert torch.autograd.gradgradcheck(fn, inputs, rtol=rtol, atol=atol)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's import
def test_compile_fullgraph_with_cuda_inputs() -> None:
    torch._dynamo.reset()

    def f(x: Any, y: Any) -> Any:
        return ot.ops.sum(ot.ops.gelu(ot.ops.mul(x, y)), axis=[1])

    x, y = torch.randn(64, 128, device="cuda"), torch.randn(64, 128, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    want = torch.nn.functional.gelu(x * y).sum(1)
    torch.testing.assert_close(compiled(x, y), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(compiled(x * 2, y), torch.nn.functional.gelu(2 * x * y).sum(1), rtol=1e-5, atol=1e-4)


def test_runs_on_torchs_current_stream() -> None:
    s = torch.cuda.Stream()
    x = torch.randn(1 << 22, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        y = x * 3  # queued on s
        z = ot.ops.mul(y, y)  # must see y: runs on s, after it
        w = z + 1  # must see z
    s.synchronize()
    torch.testing.assert_close(w, (x * 3) ** 2 + 1)
    assert opforge.cuda.current_stream().cuda_stream == 0  # opforge's own stream is restored


def test_op_without_a_cuda_kernel_says_so() -> None:
    x = torch.ones(2, 2, device="cuda")
    with pytest.raises(NotImplementedError, match=r"opforge::leaky_relu_ext.*CUDA"):
        ot.ops.leaky_relu_ext(x)  # (its kernel is a host library's: no cuda rows)


def test_training_step_on_cuda_matches_torch() -> None:
    torch.manual_seed(0)
    w = torch.randn(32, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    x = torch.randn(8, 32, device="cuda", dtype=torch.float64)
    h = ot.ops.tanh(ot.ops.mul(x.unsqueeze(-1), w).sum(1))
    loss = ot.ops.logsumexp(h, axis=[1]).sum()
    loss.backward()
    w2 = w.detach().clone().requires_grad_(True)
    ref = torch.logsumexp(torch.tanh((x.unsqueeze(-1) * w2).sum(1)), dim=1).sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(w.grad, w2.grad)
