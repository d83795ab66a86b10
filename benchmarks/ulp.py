"""Accuracy of the transcendental functions in opforge's elementwise (expr) kernels, in ulps.

    python benchmarks/ulp.py                 # writes benchmarks/results/ulp.md
    python benchmarks/ulp.py --points 20000 --out /tmp/ulp.md

On x86-64 with glibc >= 2.35 the CPU kernels call libmvec's SIMD variants of these functions
(src/runtime/elementwise.h); this measures what a user gets from each op. The error of one result
is |opforge - exact| / ulp(exact), ulp being the spacing of the result's dtype at the exact value:
float32 against float64 NumPy (math.erf for erf), float64 against mpmath at 40 digits.
float16/bfloat16 are computed in float32 and rounded once, so they are not listed.
tests/ops/test_vector_math.py bounds the same measurement on fewer points.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import opforge
from opforge import ops

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Function:
    op: Callable[[np.ndarray], np.ndarray]  # opforge's result as an ndarray
    exact: Callable[..., float]             # mpmath form of one element (float64's reference)
    domain: Callable[[np.random.Generator, int], np.ndarray]  # float64 arguments
    f64: Callable[[np.ndarray], np.ndarray]  # float64 NumPy reference (float32's reference)


def _mp():
    import mpmath

    mpmath.mp.dps = 40
    return mpmath


def _uniform(lo: float, hi: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: rng.uniform(lo, hi, n)


def _log_uniform(lo: float, hi: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: np.exp(rng.uniform(math.log(lo), math.log(hi), n))


_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _pow_op(x: np.ndarray) -> np.ndarray:
    return ops.pow(x, np.asarray(2.5, x.dtype)).numpy()


FUNCTIONS: dict[str, Function] = {
    "exp": Function(lambda x: ops.exp(x).numpy(), lambda m, v: m.exp(v), _uniform(-87.0, 88.0), np.exp),
    "log": Function(lambda x: ops.log(x).numpy(), lambda m, v: m.log(v), _log_uniform(1e-30, 1e30), np.log),
    "tanh": Function(lambda x: ops.tanh(x).numpy(), lambda m, v: m.tanh(v), _uniform(-10.0, 10.0), np.tanh),
    "sin": Function(lambda x: ops.sincos(x)[0].numpy(), lambda m, v: m.sin(v), _uniform(-100.0, 100.0), np.sin),
    "cos": Function(lambda x: ops.sincos(x)[1].numpy(), lambda m, v: m.cos(v), _uniform(-100.0, 100.0), np.cos),
    "erf": Function(lambda x: ops.erf(x).numpy(), lambda m, v: m.erf(v), _uniform(-5.0, 5.0), _erf64),
    "pow (x^2.5)": Function(_pow_op, lambda m, v: m.power(v, 2.5), _log_uniform(1e-3, 1e3),
                            lambda x: np.power(x, 2.5)),
    "sigmoid": Function(lambda x: ops.sigmoid(x).numpy(), lambda m, v: 1 / (1 + m.exp(-v)),
                        _uniform(-30.0, 30.0), lambda x: 1 / (1 + np.exp(-x))),
}


def ulps(got: np.ndarray, exact: np.ndarray, dtype: str) -> np.ndarray:
    """|got - exact| in units of the spacing of dtype at exact (exact in float64 or finer)."""
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def measure(name: str, dtype: str, points: int, seed: int = 0) -> np.ndarray:
    """Errors in ulps of `points` results of op `name` in dtype (float32 or float64)."""
    f = FUNCTIONS[name]
    x = f.domain(np.random.default_rng(seed), points).astype(dtype)
    got = f.op(x)
    if dtype == "float32":
        exact = f.f64(x.astype(np.float64))
        return ulps(got, exact, dtype)
    m = _mp()
    errs = np.empty(points)
    for i, (xi, gi) in enumerate(zip(x.tolist(), got.tolist())):
        e = f.exact(m, m.mpf(xi))
        errs[i] = float(abs(m.mpf(gi) - e) / m.mpf(float(np.spacing(abs(np.float64(float(e)))))))
    return errs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=200_000, help="float32 points per function (float64: 1/10)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "ulp.md")
    args = p.parse_args()
    lines = ["# Accuracy of opforge's elementwise transcendental functions (cpu)", "",
             f"Run {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} with `python benchmarks/ulp.py` "
             f"({args.points} float32 points per function, {args.points // 10} float64).", "",
             f"Machine: {platform.processor() or platform.machine()}, glibc {platform.libc_ver()[1]}, "
             f"opforge {opforge.__version__}; the CPU kernels use libmvec's AVX2 variants where the CPU "
             "has AVX2, its SSE variants otherwise.", "",
             "| function | domain (uniform, or log-uniform for log and pow) | float32 max ulp | float32 mean ulp "
             "| float64 max ulp | float64 mean ulp |", "|---|---|---|---|---|---|"]
    domains = {"exp": "[-87, 88]", "log": "[1e-30, 1e30]", "tanh": "[-10, 10]", "sin": "[-100, 100]",
               "cos": "[-100, 100]", "erf": "[-5, 5]", "pow (x^2.5)": "x in [1e-3, 1e3]",
               "sigmoid": "[-30, 30] (1 / (1 + exp(-x)): the op's formula, its roundings included)"}
    for name in FUNCTIONS:
        e32 = measure(name, "float32", args.points)
        e64 = measure(name, "float64", args.points // 10)
        lines.append(f"| {name} | {domains[name]} | {e32.max():.2f} | {e32.mean():.3f} | {e64.max():.2f} | "
                     f"{e64.mean():.3f} |")
        print(lines[-1], file=sys.stderr)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
