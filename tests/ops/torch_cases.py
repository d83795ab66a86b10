"""The op cases (cases.py) as torch tensors, for the torch tests on the CPU (tests/frameworks)
and on CUDA (tests/cuda): inputs from a case's data, and the op as a function of its
differentiable inputs (for gradcheck)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

import opforge.torch as ot
from cases import Case


def torch_inputs(case: Case, data: list[Any], requires_grad: bool = False, device: str = "cpu") -> list[Any]:
    """The case's inputs as contiguous torch tensors on device (None for absent optional ones)."""
    out = []
    for inp, a in zip(case.op.inputs, data):
        if a is None:
            out.append(None)
            continue
        dtype = case.dtype if inp.dtype in dict(case.op.typevars) else inp.dtype
        t = torch.from_numpy(np.asarray(a, dtype=dtype)).clone(memory_format=torch.contiguous_format).to(device)
        if requires_grad and inp.differentiable:
            t.requires_grad_(True)
        out.append(t)
    return out


def overload(case: Case) -> Any:
    return getattr(ot.ops, case.op.name).default


def differentiable_fn(case: Case, args: list[Any]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The op as a function of its present differentiable inputs (the others fixed to args), and
    those inputs; integer outputs (indices) are left out of its results."""
    slots = [k for k, (inp, a) in enumerate(zip(case.op.inputs, args)) if inp.differentiable and a is not None]
    op = overload(case)

    def fn(*diff: Any) -> Any:
        full = list(args)
        for k, t in zip(slots, diff):
            full[k] = t
        out = op(*full, **case.attrs)
        if isinstance(out, tuple):
            return tuple(o for o in out if o.dtype.is_floating_point)
        return out

    return fn, tuple(args[k] for k in slots)
