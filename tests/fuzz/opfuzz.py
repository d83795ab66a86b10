"""Random calls of every op from its spec, reproducible from one integer seed.

``check_call(seed)`` draws one call and checks it: in a *valid* call (half of them) the inputs are
one of the spec's test cases (declared dtype, shapes and attrs, data inside the spec's domain)
passed as contiguous, transposed, negative-stride or zero-stride (np.broadcast_to) views, and the
result must match the spec's NumPy reference within the spec's tolerance. In a *hostile* call the
inputs are arrays of any dtype and shape (0-d to 6-d, empty, size 1, views), Python scalars, None,
strings, lists, dicts or an uninitialized ``Tensor.__new__(Tensor)``, with attrs inside and outside
their constraints; the call must return or raise TypeError/ValueError/IndexError/MemoryError whose
message names the op as ``[op]``. ``describe(seed)`` prints the call as a reproducer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))

import opforge  # noqa: E402
from opforge import _formulas, ops  # noqa: E402  (_formulas: opforge's own ops)

import cases as _cases  # noqa: E402

ALLOWED = (TypeError, ValueError, IndexError, MemoryError)
DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "bfloat16")
CASES = _cases.cases()
OP_NAMES = sorted({c.op.name for c in CASES})
SPECS = {n: opforge.spec(n) for n in sorted(_formulas.OPS)}


def _view(a: np.ndarray, kind: str) -> np.ndarray:
    """The same values as ``a`` (or, for "zero", its first entry along axis 0 repeated) in a
    different memory layout."""
    if a.ndim == 0 or a.size == 0 or kind == "contiguous":
        return a
    if kind == "transposed":
        return np.ascontiguousarray(a.T).T
    if kind == "negative":
        return np.ascontiguousarray(a[::-1])[::-1]
    if kind == "sliced":
        return np.repeat(a, 2, axis=-1)[..., ::2]
    return np.broadcast_to(a[:1], a.shape)  # zero stride along axis 0


def _valid(rng: np.random.Generator) -> tuple[str, list, dict, Any]:
    case = CASES[rng.integers(len(CASES))]
    data = _cases.make_data(case.op, case.dtype, case.shapes, rng)
    kind = ("contiguous", "transposed", "negative", "sliced", "zero")[rng.integers(5)]
    data = [None if a is None else _view(a, kind) for a in data]
    return case.op.name, data, dict(case.attrs), case


def _shape(rng: np.random.Generator) -> tuple[int, ...]:
    nd = int(rng.integers(0, 7))
    return tuple(int(rng.choice([0, 1, 1, 2, 3, 4])) for _ in range(nd))


def _array(rng: np.random.Generator) -> Any:
    dt = DTYPES[rng.integers(len(DTYPES))]
    shape = _shape(rng)
    a = (rng.standard_normal(shape) * 3).astype(np.float64)
    if dt == "bfloat16":
        return opforge.tensor(a).astype("bfloat16")
    a = a.astype(dt)
    kind = ("contiguous", "transposed", "negative", "sliced", "zero")[rng.integers(5)]
    return _view(a, kind)


def _hostile_value(rng: np.random.Generator) -> Any:
    k = rng.integers(12)
    if k < 6:
        return _array(rng)
    return [1.5, 2, True, None, "x", [1, 2], {"a": 1}][k - 6] if k < 12 else None


def _attr_value(rng: np.random.Generator, attr: Any) -> Any:
    k = rng.integers(14)
    vals = [0, 1, -1, 2, 7, -7, 2**31, -(2**63), 0.5, -1e300, float("nan"), True, [0], [0, -1, 5]]
    v = vals[k]
    if rng.random() < 0.1:
        v = ["s", None, {"k": 1}, [1.5], (), 10**30][rng.integers(6)]
    return v


def _uninit() -> Any:
    try:  # refused by builds that fix issue 12's uninitialized-Tensor crash
        return opforge.Tensor.__new__(opforge.Tensor)
    except TypeError:
        return object()


def _hostile(rng: np.random.Generator) -> tuple[str, list, dict, None]:
    name = OP_NAMES[rng.integers(len(OP_NAMES))]
    spec = SPECS[name]
    n = len(spec.inputs) + int(rng.integers(-1, 2)) if rng.random() < 0.1 else len(spec.inputs)
    # broadcasting: one base shape, per input either that shape, a suffix, or 1s
    base = _shape(rng)
    args: list[Any] = []
    for _ in range(max(n, 0)):
        r = rng.random()
        if r < 0.5:
            dt = DTYPES[rng.integers(len(DTYPES))]
            sub = base[int(rng.integers(0, len(base) + 1)):]
            sub = tuple(1 if rng.random() < 0.2 else d for d in sub)
            a = (rng.standard_normal(sub) * 3)
            args.append(opforge.tensor(a).astype("bfloat16") if dt == "bfloat16" else
                        _view(a.astype(dt), ("contiguous", "transposed", "negative", "zero")[rng.integers(4)]))
        elif r < 0.93:
            args.append(_hostile_value(rng))
        else:
            args.append(_uninit())
    attrs = {}
    for a in spec.attrs:
        if rng.random() < 0.6:
            attrs[a.name] = _attr_value(rng, a)
    if rng.random() < 0.05:
        attrs["no_such_attr"] = 1
    return name, args, attrs, None


def draw(seed: int) -> tuple[str, list, dict, Any]:
    rng = np.random.default_rng(seed)
    return _valid(rng) if rng.random() < 0.5 else _hostile(rng)


def _fmt(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return (f"np.lib.stride_tricks.as_strided(np.array({v.tolist()!r}, dtype={str(v.dtype)!r}), "
                f"shape={v.shape}) # strides {v.strides}")
    if isinstance(v, opforge.Tensor):
        try:
            return f"opforge.tensor({v.astype('float64').numpy().tolist()!r}).astype({v.dtype!r})"
        except Exception:
            return "opforge.Tensor.__new__(opforge.Tensor)"
    return repr(v)


def describe(seed: int) -> str:
    name, args, attrs, _ = draw(seed)
    parts = [_fmt(a) for a in args] + [f"{k}={_fmt(v)}" for k, v in attrs.items()]
    return f"# opforge op fuzz seed {seed}\nops.{name}({', '.join(parts)})"


def _atol(op: Any, ref: np.ndarray, rtol: float, atol: float) -> float:
    """The absolute tolerance of a valid call's output. An elementwise op's error is relative to
    each element; another op's outputs (reductions, normalizations, their gradients) are sums whose
    rounding error is relative to the terms summed, and the fuzzer's inputs need not be consistent
    (layer_norm_affine_backward's mean and rstd are any values, not x's), so terms of size 20 may
    cancel to 0.01: there the error is measured against the output's scale, its largest magnitude."""
    finite = np.abs(ref[np.isfinite(ref)])
    if op.impl.kind == "expr" or finite.size == 0:
        return atol
    return max(atol, rtol * float(finite.max()))


def check_call(seed: int) -> str:
    """Draw and run one call; raise AssertionError on a wrong error or a wrong result.
    Returns "ok", "error" or "checked" (a valid call whose result was compared)."""
    name, args, attrs, case = draw(seed)
    fn = getattr(ops, name)
    if case is not None:
        inputs = _cases.to_inputs(case.op, case.dtype, args)
    else:
        inputs = args
    try:
        out = fn(*inputs, **attrs)
    except ALLOWED as e:
        assert f"[{name}]" in str(e), f"seed {seed}: {type(e).__name__} not naming [{name}]: {e}"
        assert case is None, f"seed {seed}: valid call raised {type(e).__name__}: {e}"
        return "error"
    except BaseException as e:  # noqa: BLE001 - any other exception is a finding
        raise AssertionError(f"seed {seed}: {name} raised {type(e).__name__}: {e}") from e
    if case is None:
        return "ok"
    outs = out if isinstance(out, tuple) else (out,)
    refs = _cases.reference(case.op, args, case.attrs)
    rtol, atol = _cases.tolerance(case.op, case.dtype)
    for o, r in zip(outs, refs):
        r = np.asarray(r)
        assert o.shape == r.shape, f"seed {seed}: {name} shape {o.shape} != {r.shape}"
        if o.dtype == "bool" or o.dtype.startswith(("int", "uint")):
            np.testing.assert_array_equal(o.numpy(), r.astype(o.dtype), err_msg=f"seed {seed} {name}")
        else:
            np.testing.assert_allclose(_cases.as_numpy(o), r, rtol=rtol, atol=_atol(case.op, r, rtol, atol),
                                       err_msg=f"seed {seed} {name}")
    return "checked"
