"""Per-call time of small calls whose generated check_shapes runs spec checks (the backward ops of
the norms and of matmul), beside two ops whose checks did not change, for comparing two builds:

    PYTHONPATH=<build A>/python python benchmarks/percall_checks.py
    PYTHONPATH=<build B>/python python benchmarks/percall_checks.py

Best of 7 rounds of 20,000 calls each; run the builds in turn, twice, on a quiet machine."""

from __future__ import annotations

import timeit

import numpy as np

import opforge
from opforge import ops

rng = np.random.default_rng(0)


def t(*shape: int) -> opforge.Tensor:
    return opforge.tensor(rng.random(shape).astype(np.float32))


x, kept, w = t(8, 16), t(8, 1), t(16)
a, b, g = t(4, 5), t(5, 6), t(4, 6)
CASES = {
    "layer_norm_backward (8, 16)": lambda: ops.layer_norm_backward(x, x, kept, kept, kept, kept, w),
    "matmul_backward_a (4, 5) @ (5, 6)": lambda: ops.matmul_backward_a(g, b, a),
    "softmax (8, 16)": lambda: ops.softmax(x),
    "mul (8, 16)": lambda: ops.mul(x, x),
}

if __name__ == "__main__":
    for name, fn in CASES.items():
        best = min(timeit.repeat(fn, number=20_000, repeat=7)) / 20_000
        print(f"{name}: {best * 1e6:.2f} us")
