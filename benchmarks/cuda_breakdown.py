"""Where the time of the figures that miss their targets in benchmarks/results/cuda.md goes: each
case run through opforge.torch and through torch's built-ins, one step at a time under
torch.profiler (CUPTI sees every kernel of the process, opforge's own included), as

- the wall time of a step (host clock, the device synchronized around each step) and the device's
  busy time in it (the union of its kernels, copies and fills, over steps run back to back); the
  difference is what the device waited for the host: launch overhead, host synchronizations such
  as an index check's, and the synchronization around each timed step (a few microseconds);
- the host's synchronizing CUDA calls per step (cudaStreamSynchronize, cudaDeviceSynchronize,
  cudaMemcpy, cudaEventSynchronize);
- each kernel's device time per step, largest first, beside the other side's.

    python benchmarks/cuda_breakdown.py [--cases mlp,cross_entropy,...] [--out breakdown.md]
    python benchmarks/cuda_breakdown.py --device cpu --small   # the same tables on the CPU (ops' self time)

On the CPU (no kernels to trace) the tables list each op's self time instead: a check of this
script and of the op sequence, not a GPU figure. tools/gpu_run.sh's `breakdown` step runs it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import opforge.torch as ot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

F = torch.nn.functional
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")
Step = Callable[[], None]
MARK = "cuda_breakdown.step"


def grad_step(f: Callable[[], torch.Tensor], wrt: list[torch.Tensor], g: torch.Tensor | None = None) -> Step:
    """Forward and backward: f's gradients with respect to wrt (against g)."""
    def run() -> None:
        torch.autograd.grad(f(), wrt, g)
    return run


def mlp_case(device: str, small: bool) -> tuple[Step, Step]:
    from torch_mlp import MLP, loss_fn

    batch, features, hidden, classes = (256, 128, 512, 100) if small else (4096, 1024, 4096, 1000)
    x = torch.randn(batch, features, device=device)
    labels = torch.randint(0, classes, (batch,), device=device)
    model = MLP(features, hidden, classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def builtin(m: Any, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.layer_norm(F.linear(x, m.w1, m.b1), (m.b1.shape[0],), m.norm_weight, m.norm_bias, 1e-5))
        return F.cross_entropy(F.linear(h, m.w2, m.b2), labels)

    def step(fn: Callable[..., torch.Tensor]) -> Step:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            fn(model, x, labels).backward()
            opt.step()
        return run

    return step(loss_fn), step(builtin)


def cross_entropy_case(device: str, small: bool) -> tuple[Step, Step]:
    rows, classes = (512, 2000) if small else (8192, 32000)
    logits = torch.randn(rows, classes, device=device, requires_grad=True)
    labels = torch.randint(0, classes, (rows,), device=device)
    return (grad_step(lambda: ot.ops.cross_entropy(logits, labels), [logits]),
            grad_step(lambda: F.cross_entropy(logits, labels), [logits]))


def row_case(op: str, shape: tuple[int, int], dtype: torch.dtype) -> Callable[[str, bool], tuple[Step, Step]]:
    def make(device: str, small: bool) -> tuple[Step, Step]:
        n = shape[1] if not small else min(shape[1], 1024)
        x = torch.randn(256 if small else shape[0], n, device=device, dtype=dtype, requires_grad=True)
        g = torch.randn_like(x)
        if op == "layer_norm":
            w = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
            b = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
            wrt = [x, w, b]
            ours = lambda: ot.ops.layer_norm(x, w, b)[0]  # noqa: E731
            theirs = lambda: F.layer_norm(x, (n,), w, b)  # noqa: E731
        else:
            wrt = [x]
            ours = lambda: getattr(ot.ops, op)(x, axis=-1)  # noqa: E731
            theirs = lambda: getattr(torch, op)(x, dim=-1)  # noqa: E731
        return grad_step(ours, wrt, g), grad_step(theirs, wrt, g)
    return make


def transformer_case(device: str, small: bool) -> tuple[Step, Step]:
    from torch_transformer import BUILTIN, OPFORGE, Block, sequences

    vocab, width, hidden, seqs = (1000, 128, 512, 2) if small else (32000, 1024, 4096, 8)
    tokens = sequences(seqs, 129 if small else 513, vocab).to(device)
    steps = []
    for impl in (OPFORGE, BUILTIN):
        torch.manual_seed(0)
        block = Block(vocab, width, hidden, impl).to(device)
        opt = torch.optim.SGD(block.parameters(), lr=1e-3)

        def run(block: Any = block, opt: Any = opt) -> None:
            opt.zero_grad(set_to_none=True)
            block.loss(tokens).backward()
            opt.step()
        steps.append(run)
    return steps[0], steps[1]


CASES: dict[str, Callable[[str, bool], tuple[Step, Step]]] = {
    "mlp": mlp_case,
    "cross_entropy": cross_entropy_case,
    "layer_norm_bf16_8192x8192": row_case("layer_norm", (8192, 8192), torch.bfloat16),
    "log_softmax_bf16_65536x1024": row_case("log_softmax", (65536, 1024), torch.bfloat16),
    "softmax_f32_65536x1024": row_case("softmax", (65536, 1024), torch.float32),
    "transformer": transformer_case,
}


def union_us(spans: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of [start, end) spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def short(name: str, width: int = 96) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[:width - 3] + "..."


def measure(step: Step, sync: Callable[[], None], cuda: bool, steps: int) -> dict[str, Any]:
    """Wall ms per step (median), device busy ms per step, syncs per step, {name: (calls, us)} per step.

    The profiled steps run back to back, each in a `record_function` range: synchronizing calls
    count only inside those ranges (the profiler's own device synchronization at its end, and the
    one before it, are not the step's); user annotations (those ranges' and the optimizer's
    `Optimizer.step#...`, which the profiler mirrors on the device) are not kernels."""
    for _ in range(3):
        step()
    sync()
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(MARK):
                step()
        sync()
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    events = prof.events()
    marks = [(e.time_range.start, e.time_range.end) for e in events
             if e.name == MARK and e.device_type == torch.autograd.DeviceType.CPU]
    spans, syncs = [], 0
    for e in events:
        if getattr(e, "is_user_annotation", False) or e.name == MARK:
            continue
        on_device = e.device_type != torch.autograd.DeviceType.CPU
        if cuda and on_device:
            spans.append((e.time_range.start, e.time_range.end))
            per[e.name][0] += 1
            per[e.name][1] += e.time_range.elapsed_us()
        elif not on_device:
            if e.name in SYNCS:
                syncs += any(a <= e.time_range.start < b for a, b in marks)
            elif not cuda and e.name.startswith(("aten::", "opforge::")):
                per[e.name][0] += 1
                per[e.name][1] += e.self_cpu_time_total
    if cuda and not spans:  # (an empty table would read as a device never busy)
        raise RuntimeError("the profiler recorded no device events: is CUPTI available to torch.profiler here?")
    return {"wall": statistics.median(walls), "busy": union_us(spans) / 1e3 / steps, "syncs": syncs / steps,
            "kernels": {k: (v[0] / steps, v[1] / steps) for k, v in per.items()}}


def report(name: str, mine: dict[str, Any], theirs: dict[str, Any], cuda: bool, top: int) -> list[str]:
    what = "kernel" if cuda else "op (CPU self time)"
    lines = [f"### {name}", "",
             "| | wall ms / step | device busy ms | wall - busy ms | synchronizing calls / step |",
             "|---|---:|---:|---:|---:|"]
    for label, m in (("opforge", mine), ("torch", theirs)):
        busy = m["busy"] if cuda else float("nan")
        lines.append(f"| {label} | {m['wall']:.3f} | {busy:.3f} | {m['wall'] - busy:.3f} | {m['syncs']:g} |")
    for label, m in (("opforge", mine), ("torch", theirs)):
        total = sum(us for _, us in m["kernels"].values()) or 1.0
        lines += ["", f"{label}: each {what}, per step, largest first", "",
                  f"| {what} | calls | us | share |", "|---|---:|---:|---:|"]
        ranked = sorted(m["kernels"].items(), key=lambda kv: -kv[1][1])
        for k, (calls, us) in ranked[:top]:
            lines.append(f"| {short(k)} | {calls:g} | {us:.1f} | {us / total:.0%} |")
        if len(ranked) > top:
            rest = sum(us for _, (_, us) in ranked[top:])
            lines.append(f"| ({len(ranked) - top} more) | | {rest:.1f} | {rest / total:.0%} |")
    return lines + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--small", action="store_true", help="small shapes (a check of the script)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per case and side")
    p.add_argument("--top", type=int, default=12, help="kernels listed per side")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    head = [f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name(0)}" if cuda else ", CPU"), ""]
    out = list(head)
    names = a.cases.split(",")
    for name in names:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r}; the cases are {', '.join(CASES)}")
    for name in names:
        ours, theirs = CASES[name](a.device, a.small)
        lines = report(name, measure(ours, sync, cuda, a.steps), measure(theirs, sync, cuda, a.steps), cuda, a.top)
        print("\n".join(lines), flush=True)
        out += lines
        if a.out:  # (after each case: a run cut short keeps what it measured)
            a.out.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
