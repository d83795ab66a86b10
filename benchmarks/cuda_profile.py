"""The row ops that miss their targets in benchmarks/results/cuda.md, each run a few times beside
torch's own op, for Nsight Compute (tools/gpu_run.sh profile):

    ncu --clock-control none --kernel-name regex:'<pattern>' ... python benchmarks/cuda_profile.py

Each case runs opforge's op (through opforge.torch, forward and backward) and torch's built-in on
the same tensors, twice each after one warm-up call, so the profile holds both kernels to compare.
"""

from __future__ import annotations

import argparse

import torch

import opforge.torch as ot

CASES = {
    "softmax_bf16_65536x1024": ("softmax", (65536, 1024), torch.bfloat16),
    "log_softmax_bf16_65536x1024": ("log_softmax", (65536, 1024), torch.bfloat16),
    "log_softmax_f32_65536x1024": ("log_softmax", (65536, 1024), torch.float32),
    "layer_norm_bf16_8192x8192": ("layer_norm", (8192, 8192), torch.bfloat16),
}


def run(name: str, op: str, shape: tuple[int, int], dtype: torch.dtype, calls: int) -> None:
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    if op == "layer_norm":
        w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
        ours = lambda: ot.ops.layer_norm(x, w, b)[0]  # noqa: E731
        theirs = lambda: torch.nn.functional.layer_norm(x, shape[-1:], w, b)  # noqa: E731
    else:
        ours = lambda: getattr(ot.ops, op)(x, axis=-1)  # noqa: E731
        theirs = lambda: getattr(torch, op)(x, dim=-1)  # noqa: E731
    for f in (ours, theirs):
        for _ in range(1 + calls):
            y = f()
            y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    print(name, "done")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--calls", type=int, default=2)
    a = p.parse_args()
    for name in a.cases.split(","):
        run(name, *CASES[name], a.calls)


if __name__ == "__main__":
    main()
