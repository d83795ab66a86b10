"""Conformance with NumPy on special values (issue 16 item 2): for opforge ops with a NumPy ufunc
counterpart, every declared dtype NumPy has, on the values NumPy's own ufunc tests use: ±0, ±1,
±inf, NaN, the smallest subnormal, the smallest normal, the largest finite values, epsilon (for
floats) and the integer extremes (for integers); binary ops on every pair. Compared standalone
(``opforge.ops``) with NumPy's result: NaN positions, infinities and the sign of zeros exactly,
finite values within a few units in the last place (the spec's libm and NumPy's may round the
last bit differently). Differences NumPy's semantics and opforge's documented ones disagree on
are named in DIFFERENCES."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest

import opforge
from opforge import ops

UNARY: dict[str, Callable[[Any], Any]] = {
    "abs": np.abs, "exp": np.exp, "log": np.log, "neg": np.negative, "sign": np.sign, "sqrt": np.sqrt,
    "square": np.square, "tanh": np.tanh, "relu": lambda x: np.maximum(x, x.dtype.type(0)),
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "maximum": np.maximum,
    "minimum": np.minimum, "pow": np.power, "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal,
}
# (op, aspect) -> why opforge differs from NumPy there (documented in op_specs/README.md); aspects:
# "sign of zero", "NaN", "values"
DIFFERENCES: dict[tuple[str, str], str] = {
    ("relu", "sign of zero"): "relu(-0.0) is -0.0, as in PyTorch (x passes where it is not < 0); "
                              "numpy.maximum(-0.0, 0) gives +0.0",
    **{(op, "sign of zero"): "+0 and -0 compare equal: which one maximum/minimum returns follows NumPy's "
                             "float32 and float64 loops (the second operand) in every dtype; NumPy's "
                             "float16 loop returns the first" for op in ("maximum", "minimum")},
}
ULPS = {np.dtype(np.float16): 2, np.dtype(np.float32): 4, np.dtype(np.float64): 4}


def special_values(dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        fi = np.finfo(dtype)
        vals = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, fi.smallest_subnormal, -fi.smallest_subnormal,
                fi.tiny, -fi.tiny, fi.max, fi.min, fi.eps, 0.5, 2.0, 3.0]
        return np.array(vals, dtype=dtype)
    ii = np.iinfo(dtype)
    return np.array([0, 1, -1, 2, -2, ii.max, ii.min, ii.max - 1, ii.min + 1, 7], dtype=dtype)


def declared(op: str) -> list[np.dtype]:
    """The op's cpu dtypes (its first input's) that NumPy has."""
    info = next(t for t in opforge.op_info(op) if t["target"] == "CPU")
    names = sorted({row[0][0] for row in info["dtype_format"]})
    return [np.dtype(n) for n in names if n != "bfloat16" and n != "bool"]


def check(op: str, got: np.ndarray, want: np.ndarray, where: str, waived: set[str]) -> list[str]:
    """What differs from NumPy's want, but the aspects waived; records the aspects it needed."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return [f"{where}: shape {got.shape} vs NumPy's {want.shape}"]
    if want.dtype.kind != "f":
        bad = got.astype(want.dtype) != want
        return [f"{where}: {got[bad][:5]} vs NumPy's {want[bad][:5]}"] if bad.any() else []
    problems = []
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        problems.append(f"{where}: NaN at {np.argwhere(np.isnan(got) != nan)[:5].tolist()} differs")
    inf = np.isinf(want)
    if not np.array_equal(got[inf], want[inf]) or np.isinf(got[~inf & ~nan]).any():
        problems.append(f"{where}: infinities differ")
    zero = want == 0
    if not np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])):
        if (op, "sign of zero") in DIFFERENCES:
            waived.add("sign of zero")
        else:
            at = np.argwhere(zero & (np.signbit(got) != np.signbit(want)))[:5].tolist()
            problems.append(f"{where}: signs of zero differ at {at}")
    finite = np.isfinite(want) & ~zero
    with np.errstate(over="ignore"):  # (the largest finite value's spacing)
        ulp = np.spacing(np.abs(want[finite]).astype(want.dtype))
    err = np.abs(got[finite].astype(np.float64) - want[finite].astype(np.float64))
    tiny = np.finfo(want.dtype).tiny  # (subnormal results: absolute, by the smallest normal's ulp)
    bad = err > ULPS[want.dtype] * np.maximum(ulp.astype(np.float64), np.spacing(tiny))
    if bad.any():
        problems.append(f"{where}: {int(bad.sum())} values more than {ULPS[want.dtype]} ulp from NumPy's")
    return problems


def _run(op: str, fn: Callable[..., Any], arity: int) -> list[str]:
    failures: list[str] = []
    waived: set[str] = set()
    for dtype in declared(op):
        vals = special_values(dtype)
        if arity == 1:
            args = [vals]
        else:
            pairs = np.array(list(itertools.product(range(len(vals)), repeat=2)))
            args = [vals[pairs[:, 0]], vals[pairs[:, 1]]]
        with np.errstate(all="ignore"):
            if op == "pow" and dtype.kind == "i":  # NumPy refuses negative integer powers
                keep = args[1] >= 0
                args = [a[keep] for a in args]
            want = fn(*args)
        got = getattr(ops, op)(*args).numpy()
        failures += check(op, got, want, f"{dtype}", waived)
    stale = [aspect for (o, aspect) in DIFFERENCES if o == op and aspect not in waived]
    return failures + [f"documented difference '{a}' no value needs any more (remove it)" for a in stale]


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_special_values_match_numpy(op: str) -> None:
    failures = _run(op, UNARY[op], 1)
    assert not failures, f"[{op}] differs from NumPy:\n" + "\n".join(failures)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_special_values_match_numpy(op: str) -> None:
    failures = _run(op, BINARY[op], 2)
    assert not failures, f"[{op}] differs from NumPy:\n" + "\n".join(failures)
