"""First GPU figures of the cuda wheel (issue 14 item 11), in one process, medians:

    python benchmarks/cuda.py --out benchmarks/results/cuda.md

- elementwise `mul` and `gelu` on 2^28 float32 against torch.mul / torch.nn.functional.gelu and
  against a device-to-device copy of the same bytes (torch's `copy_`): targets >= 0.9x torch's
  throughput and >= 85% of the copy's bandwidth (bytes read + written per second);
- `sum` over 2^28 float32 (CUB's device-wide reduction) against torch.sum: target >= 0.9x torch's
  throughput (bytes read per second), with its share of the copy's bandwidth;
- a 1-element op's wall time per call, standalone opforge and through opforge.torch (the torch
  operator's CUDA kernel) against torch's built-in.
Both frameworks are timed alike: host clock around `reps` calls, the device synchronized before
and after (torch.cuda.synchronize / opforge.cuda.synchronize). Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import opforge
import opforge.cuda
from opforge import ops


def timed(fn: Callable[[], Any], sync: Callable[[], None], reps: int, rounds: int = 7) -> float:
    """Median seconds per call over rounds of reps calls."""
    fn()
    sync()
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    n = 1 << args.log2n
    tsync, osync = torch.cuda.synchronize, opforge.cuda.synchronize
    a = torch.rand(n, device="cuda") * 4 - 2
    b = torch.rand(n, device="cuda")
    x, y = opforge.from_dlpack(a), opforge.from_dlpack(b)  # the same memory, zero copy
    dst = torch.empty_like(a)
    rows = []

    def row(name: str, bytes_moved: int, mine: float, theirs: float, copy: float) -> None:
        rows.append((name, mine * 1e3, theirs * 1e3, mine / theirs, bytes_moved / mine / 1e12,
                     (bytes_moved / mine) / (bytes_moved / copy) if copy else float("nan")))

    copy_2 = timed(lambda: dst.copy_(a), tsync, 5)  # 2 arrays' bytes: read + write
    mine = timed(lambda: ops.mul(x, y), osync, 5)
    theirs = timed(lambda: torch.mul(a, b), tsync, 5)
    c3 = torch.empty(n + n // 2, device="cuda")  # a copy of 3 arrays' bytes (read 1.5, write 1.5)
    d3 = torch.empty_like(c3)
    copy_3 = timed(lambda: d3.copy_(c3), tsync, 5)
    row(f"mul 2^{args.log2n} float32", 12 * n, mine, theirs, copy_3)
    mine = timed(lambda: ops.gelu(x), osync, 5)
    theirs = timed(lambda: torch.nn.functional.gelu(a), tsync, 5)
    row(f"gelu 2^{args.log2n} float32", 8 * n, mine, theirs, copy_2)
    np.testing.assert_allclose(torch.from_dlpack(ops.gelu(x))[:1000].cpu().numpy(),
                               torch.nn.functional.gelu(a)[:1000].cpu().numpy(), rtol=1e-5, atol=1e-6)
    mine = timed(lambda: ops.sum(x), osync, 5)
    theirs = timed(lambda: torch.sum(a), tsync, 5)
    row(f"sum 2^{args.log2n} float32", 4 * n, mine, theirs, copy_2 / 2)  # (reads only: half a copy's time)
    got, want = torch.from_dlpack(ops.sum(x)).item(), torch.sum(a.double()).item()
    assert abs(got - want) <= 1e-5 * abs(want) + 1.0, (got, want)
    import opforge.torch as ot

    one_t = torch.ones(1, device="cuda")
    one_o = opforge.from_dlpack(one_t)
    mine = timed(lambda: ops.mul(one_o, one_o), osync, 2000)
    through_torch = timed(lambda: ot.ops.mul(one_t, one_t), tsync, 2000)
    theirs = timed(lambda: torch.mul(one_t, one_t), tsync, 2000)
    call = (mine * 1e6, theirs * 1e6, mine / theirs, through_torch * 1e6, through_torch / theirs)

    driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    lines = [
        "# opforge on CUDA: first figures (issue 14)",
        "",
        f"{datetime.date.today()}, `python benchmarks/cuda.py`, one process, medians of 7 rounds; device: {driver}; "
        f"{opforge.cuda.runtime_version()}; torch {torch.__version__}; opforge {opforge.__version__} "
        f"(built for {opforge._build_info.CUDA_ARCH}).",
        "",
        "| op | opforge ms | torch ms | opforge / torch time | opforge TB/s | share of copy bandwidth |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.0%} |" for r in rows]
    lines += ["", f"1-element `mul` per call: opforge {call[0]:.1f} µs, torch {call[1]:.1f} µs "
                  f"(opforge / torch {call[2]:.2f}); `torch.ops.opforge.mul` {call[3]:.1f} µs "
                  f"({call[4]:.2f}x torch.mul).", "",
              f"Copy anchor: device-to-device `copy_` of 2 x 2^{args.log2n} floats {copy_2 * 1e3:.3f} ms "
              f"({8 * n / copy_2 / 1e12:.2f} TB/s read + write).", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
