"""Test cases built from each spec's ``tests`` section: shapes, attrs, data and references."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import opforge
from opforge import _formulas  # (opforge's own ops: list_ops() also has ops that tests load)
from opforge.codegen.model import DType, OpSpec

FLOATS = ("float16", "bfloat16", "float32", "float64")
# (rtol, atol) of forward results per dtype, unless the spec says otherwise
DEFAULT_TOL = {"float16": (5e-3, 1e-3), "bfloat16": (2e-2, 1e-2), "float32": (2e-5, 1e-6),
               "float64": (1e-10, 1e-12)}


def all_specs() -> list[OpSpec]:
    return [opforge.spec(n) for n in sorted(_formulas.OPS)]


def tested_specs() -> list[OpSpec]:
    return [s for s in all_specs() if s.tests is not None]


def cpu_dtypes(op: OpSpec) -> list[str]:
    """The dtypes of the op's first type variable registered for cpu."""
    target = op.target("cpu")
    if not target:
        return []
    return list(target.dtypes[0][1]) if target.dtypes else ["none"]  # "none": only concrete dtypes


def default_shapes(op: OpSpec) -> list[tuple[Optional[tuple[int, ...]], ...]]:
    if op.tests and op.tests.shapes:
        return [tuple(s) for s in op.tests.shapes]
    kind = op.outputs[0].shape.kind
    n = len(op.inputs)
    if kind == "broadcast":
        rows = [((3, 4),) * n, ((2, 3, 4), (4,), (3, 1))[:n], ((3, 1), (1, 4), (3, 4))[:n]]
        return rows
    if kind == "reduce":
        return [((2, 3, 4),)]
    return [((3, 4),) * n]


def attr_sets(op: OpSpec) -> list[dict[str, Any]]:
    sets = [dict(a) for a in op.tests.attrs] if op.tests and op.tests.attrs else [{}]
    return [{k: list(v) if isinstance(v, tuple) else v for k, v in s.items()} for s in sets]


def full_attrs(op: OpSpec, given: dict[str, Any]) -> dict[str, Any]:
    """Attr values as the reference sees them: defaults filled in."""
    out = {}
    for a in op.attrs:
        if a.name in given:
            out[a.name] = given[a.name]
        elif a.has_default:
            out[a.name] = list(a.default) if isinstance(a.default, tuple) else a.default
        else:
            out[a.name] = None
    return out


def input_dtype(op: OpSpec, name: str, dtype: str) -> str:
    d = op.input(name).dtype
    return dtype if d in dict(op.typevars) else d


@dataclass
class Case:
    op: OpSpec
    dtype: str
    shapes: tuple
    attrs: dict[str, Any]

    @property
    def id(self) -> str:
        shapes = "_".join("none" if s is None else "x".join(map(str, s)) or "0d" for s in self.shapes)
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{self.op.name}-{self.dtype}-{shapes}" + (f"-{attrs}" if attrs else "")


def make_data(op: OpSpec, dtype: str, shapes: tuple, rng: np.random.Generator,
              contiguous: bool = True) -> list[Optional[np.ndarray]]:
    """Float64/int/bool NumPy inputs within the spec's domains (exact in dtype)."""
    domain = dict(op.tests.domain) if op.tests else {}
    # comparisons (bool results of inputs without gradients): integers, to make ties likely
    integral = not any(i.differentiable for i in op.inputs) and all(o.dtype == DType.BOOL for o in op.outputs)
    out: list[Optional[np.ndarray]] = []
    for inp, shape in zip(op.inputs, shapes):
        if shape is None:
            out.append(None)
            continue
        d = input_dtype(op, inp.name, dtype)
        if d == "bool":
            a = rng.random(shape) > 0.5
        elif d in FLOATS and not integral:
            lo, hi = domain.get(inp.name, (-2.0, 2.0))
            a = rng.uniform(lo, hi, shape)
        else:
            lo, hi = domain.get(inp.name, (-3, 3))
            a = rng.integers(int(lo), int(hi) + 1, shape).astype(np.float64 if d in FLOATS else d)
        if d in FLOATS:
            # round to the dtype so the reference sees exactly what the op sees
            a = opforge.tensor(a).astype(d).astype("float64").numpy()
        if not contiguous and any(n > 1 for n in a.shape):
            # every other row of an array twice as long along the first axis longer than 1
            axis = next(k for k, n in enumerate(a.shape) if n > 1)
            a = np.repeat(a, 2, axis=axis)[(slice(None),) * axis + (slice(None, None, 2),)]
        out.append(a)
    return out


def to_inputs(op: OpSpec, dtype: str, data: list[Optional[np.ndarray]]) -> list[Any]:
    """The op's inputs in its dtype: zero-copy arrays where NumPy has the dtype."""
    out = []
    for inp, a in zip(op.inputs, data):
        if a is None:
            out.append(None)
            continue
        d = input_dtype(op, inp.name, dtype)
        if d == "bfloat16":
            out.append(opforge.tensor(a).astype("bfloat16"))
        else:
            out.append(a.astype(d, copy=False) if a.dtype != np.dtype(d) else a)
    return out


def reference(op: OpSpec, data: list[Optional[np.ndarray]], attrs: dict[str, Any]) -> tuple:
    env: dict[str, Any] = {i.name: a for i, a in zip(op.inputs, data)}
    env.update(full_attrs(op, attrs))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = eval(op.tests.reference, {"np": np, **env})  # the spec's NumPy oracle
    return result if isinstance(result, tuple) else (result,)


def as_numpy(t: opforge.Tensor) -> np.ndarray:
    if t.dtype in ("float16", "bfloat16", "float32"):
        return t.astype("float64").numpy()
    return t.numpy()


def tolerance(op: OpSpec, dtype: str) -> tuple[float, float]:
    spec_tol = dict(op.tests.tolerance) if op.tests else {}
    return spec_tol.get(dtype, DEFAULT_TOL.get(dtype, (0.0, 0.0)))


def assert_outputs(case: Case, outs: tuple, refs: tuple) -> None:
    """The op's host outputs against the reference's: dtype (the case's for type-variable outputs),
    shape, and values (exact for bool/integer outputs, within the spec's tolerance otherwise)."""
    assert len(outs) == len(refs) == len(case.op.outputs)
    rtol, atol = tolerance(case.op, case.dtype)
    for o, r, spec in zip(outs, refs, case.op.outputs):
        expected_dtype = case.dtype if spec.dtype in dict(case.op.typevars) else spec.dtype
        assert o.dtype == expected_dtype, spec.name
        r = np.asarray(r)
        assert o.shape == r.shape, spec.name
        if o.dtype in ("bool",) or o.dtype.startswith(("int", "uint")):
            np.testing.assert_array_equal(o.numpy(), r.astype(o.dtype), err_msg=spec.name)
        else:
            np.testing.assert_allclose(as_numpy(o), r, rtol=rtol, atol=atol, err_msg=spec.name)


def cases() -> list[Case]:
    out = []
    for op in tested_specs():
        for dtype in cpu_dtypes(op):
            for shapes in default_shapes(op):
                for attrs in attr_sets(op):
                    out.append(Case(op, dtype, shapes, attrs))
    return out


def widest_cases() -> list[Case]:
    """Per op, its float64 cases, or its cases in the widest dtype it has when float64 is not one:
    what the framework integration tests run."""
    by_op: dict[str, list[Case]] = {}
    for c in cases():
        by_op.setdefault(c.op.name, []).append(c)
    out = []
    for cs in by_op.values():
        dtypes = [c.dtype for c in cs]
        pick = "float64" if "float64" in dtypes else dtypes[-1]
        out += [c for c in cs if c.dtype == pick]
    return out


def grad_cases() -> list[Case]:
    """float64 cases of ops with a differentiable input."""
    return [c for c in cases() if c.dtype == "float64" and any(i.differentiable for i in c.op.inputs)]
