"""The transcendental functions of elementwise kernels (libmvec's SIMD variants on x86-64 with
glibc >= 2.35, see src/runtime/elementwise.h): accuracy in ulps, special values, and results that
do not depend on an element's position, the call's length or the split over threads."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from opforge import ops

_spec = importlib.util.spec_from_file_location(
    "opforge_bench_ulp", Path(__file__).resolve().parents[2] / "benchmarks" / "ulp.py")
assert _spec is not None and _spec.loader is not None
ulp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ulp
_spec.loader.exec_module(ulp)

# libmvec documents at most 4 ulp for these functions; sigmoid's formula, 1 / (1 + exp(-x)), adds
# two roundings of its own to exp's error
MAX_ULP = {name: 5.0 if name == "sigmoid" else 4.0 for name in ulp.FUNCTIONS}


@pytest.mark.parametrize("name", list(ulp.FUNCTIONS))
def test_float32_error_in_ulps(name) -> None:
    errs = ulp.measure(name, "float32", 4099, seed=1)
    assert errs.max() <= MAX_ULP[name], f"{name}: {errs.max():.2f} ulp at worst"


@pytest.mark.parametrize("name", list(ulp.FUNCTIONS))
def test_float64_error_in_ulps(name) -> None:
    pytest.importorskip("mpmath", reason="mpmath (a test dependency) gives float64's exact values")
    errs = ulp.measure(name, "float64", 301, seed=2)
    assert errs.max() <= MAX_ULP[name], f"{name}: {errs.max():.2f} ulp at worst"


SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-40, 1e30, -1e30, 89.0, -104.0, 710.0, -750.0,
           1.0, -1.0, 0.5]
UNARY = {"exp": (ops.exp, np.exp), "log": (ops.log, np.log), "tanh": (ops.tanh, np.tanh),
         "erf": (ops.erf, np.vectorize(math.erf, otypes=[np.float64])),
         "sin": (lambda x: ops.sincos(x)[0], np.sin), "cos": (lambda x: ops.sincos(x)[1], np.cos)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(UNARY))
def test_special_values(name, dtype) -> None:
    """NaN, infinities, signed zeros, subnormals, overflow and underflow as libm gives them
    (sin/cos of +-inf are NaN; log of negatives NaN), in vector lanes of a 16-element block."""
    op, ref = UNARY[name]
    x = np.array(SPECIAL, dtype)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64)).astype(dtype)
    got = op(x).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    np.testing.assert_allclose(got[finite], want[finite], rtol=4 * np.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("n", [1, 5, 16, 37, 70_001])
def test_results_do_not_depend_on_position(n) -> None:
    """exp(x)[i] is exp(x[i]) computed alone: partial blocks run through the same vector code,
    and so do the chunks of threads (70001 elements are split over OpenMP threads)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-20, 20, n).astype(np.float32)
    whole = ops.gelu(x).numpy()
    for i in sorted(set(rng.integers(0, n, 40).tolist()) | {0, n - 1}):
        assert ops.gelu(x[i:i + 1]).numpy()[0] == whole[i], i
    # the same values in another order give the same results
    perm = rng.permutation(n)
    np.testing.assert_array_equal(ops.gelu(x[perm]).numpy(), whole[perm])
