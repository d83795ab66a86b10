"""GPU figures of the cuda wheel (issue 14 item 11, issue 15 item 5), in one process, medians:

    python benchmarks/cuda.py --out benchmarks/results/cuda.md

- elementwise `mul` and `gelu` on 2^28 float32 against torch.mul / torch.nn.functional.gelu and
  against a device-to-device copy of the same bytes (torch's `copy_`): targets >= 0.9x torch's
  throughput and >= 85% of the copy's bandwidth (bytes read + written per second);
- `sum` over 2^28 float32 (CUB's device-wide reduction) against torch.sum: target >= 0.9x torch's
  throughput (bytes read per second), with its share of the copy's bandwidth;
- a 1-element op's wall time per call, standalone opforge and through opforge.torch (the torch
  operator's CUDA kernel) against torch's built-in; and a chain of 64 small muls run eagerly and
  replayed from a CUDA graph (opforge.cuda.CUDAGraph against torch.cuda.CUDAGraph): what a graph
  saves of the per-call cost;
- matrix products through cuBLAS (`--gemm N`, default 8192): `matmul` N x N x N and `linear` (an
  N x N input by an N x N weight, with a bias) in bfloat16 and float32 (no TF32, torch's default),
  forward and forward+backward (opforge.gradients against torch.autograd.grad: the input's, the
  weight's and the bias's gradients), as TFLOP/s against torch's: target >= 0.95x torch;
- row ops (issue 15): softmax, log_softmax, layer_norm, rms_norm on (8192, 8192) and (65536, 1024),
  float32 and bfloat16, forward and forward+backward, against torch's time (target <= 1.0x) with the
  achieved bandwidth as a share of the same-process copy's; cross_entropy (8192 x 32,000) and
  embedding (50,000 x 1024, 65,536 indices) forward+backward (target <= 1.0x); training steps of
  examples/torch_mlp.py's MLP and examples/torch_transformer.py's block through opforge.torch
  against the same models from torch's built-ins (target <= 1.1x); cross_entropy, embedding and
  the MLP step once more with opforge's CUDA index checks off (no host wait per call; reported).
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


def graph_figures(tsync: Callable[[], None], osync: Callable[[], None]) -> tuple[float, ...]:
    """Seconds per chain of 64 muls of 1024 floats: opforge eager, opforge replayed from a CUDA graph,
    torch eager, torch replayed from torch.cuda.graph."""
    links = 64
    ot = opforge.tensor(np.full(1024, 1.0001, np.float32), device="cuda")
    tt = torch.full((1024,), 1.0001, device="cuda")

    def o_chain() -> Any:
        y = ot
        for _ in range(links):
            y = ops.mul(y, ot)
        return y

    def t_chain() -> Any:
        y = tt
        for _ in range(links):
            y = torch.mul(y, tt)
        return y

    o_eager, t_eager = timed(o_chain, osync, 20), timed(t_chain, tsync, 20)
    og = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(og):
        o_out = o_chain()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        t_chain()
    torch.cuda.current_stream().wait_stream(s)
    tg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tg):
        t_out = t_chain()
    o_replay, t_replay = timed(og.replay, osync, 200), timed(tg.replay, tsync, 200)
    np.testing.assert_allclose(torch.from_dlpack(o_out).cpu().numpy(), t_out.cpu().numpy(), rtol=1e-5)
    og.reset()
    return o_eager, o_replay, t_eager, t_replay


def gemm_figures(n: int, tsync: Callable[[], None], osync: Callable[[], None]) -> list[tuple]:
    """matmul and linear (with a bias) of N x N operands, forward and forward+backward, bfloat16 and
    float32: (name, opforge ms, torch ms, opforge TFLOP/s, torch TFLOP/s, opforge / torch)."""
    rows = []
    flops = 2.0 * n ** 3  # one product
    torch.backends.cuda.matmul.allow_tf32 = False  # (torch's default, said once more)
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).replace("torch.", "")
        a = torch.randn(n, n, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, n, device="cuda", dtype=dtype, requires_grad=True)
        bias = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn(n, n, device="cuda", dtype=dtype)
        a0, b0, bias0 = a.detach(), b.detach(), bias.detach()
        x0, w0, c0 = (opforge.from_dlpack(t) for t in (a0, b0, bias0))  # the same memory
        x, w, c = (opforge.from_dlpack(t) for t in (a0, b0, bias0))  # (leaves of opforge's autograd)
        dy = opforge.from_dlpack(dout)
        for t in (x, w, c):
            t.requires_grad = True
        # checks first: the products agree with torch's (and so does the fused bias)
        want = torch.nn.functional.linear(a0, b0, bias0).float()
        got = torch.from_dlpack(ops.linear(x0, w0, c0)).float()
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * n ** 0.5), (got - want).abs().max().item()

        def fwd_bwd(y: Any, leaves: list[Any]) -> None:
            opforge.gradients([y], leaves, [dy])

        cases = [
            ("matmul", 1, lambda: ops.matmul(x0, w0), lambda: torch.matmul(a0, b0)),
            ("linear + bias", 1, lambda: ops.linear(x0, w0, c0),
             lambda: torch.nn.functional.linear(a0, b0, bias0)),
            ("matmul fwd+bwd", 3, lambda: fwd_bwd(ops.matmul(x, w), [x, w]),
             lambda: torch.autograd.grad(torch.matmul(a, b), [a, b], dout)),
            ("linear + bias fwd+bwd", 3, lambda: fwd_bwd(ops.linear(x, w, c), [x, w, c]),
             lambda: torch.autograd.grad(torch.nn.functional.linear(a, b, bias), [a, b, bias], dout)),
        ]
        for label, products, mine_fn, theirs_fn in cases:
            reps = 3 if dtype == torch.float32 else 10
            mine = timed(mine_fn, osync, reps)
            theirs = timed(theirs_fn, tsync, reps)
            work = products * flops
            rows.append((f"{label} {n}^3 {name}", mine * 1e3, theirs * 1e3, work / mine / 1e12, work / theirs / 1e12,
                         theirs / mine))
        del a, b, bias, dout, a0, b0, bias0, x0, w0, c0, x, w, c, dy
        torch.cuda.empty_cache()
        opforge.cuda.empty_cache()
    return rows


def row_figures(tsync: Callable[[], None], osync: Callable[[], None], copy_tbs: float) -> list[tuple[Any, ...]]:
    """softmax, log_softmax, layer_norm, rms_norm on (8192, 8192) and (65536, 1024), float32 and
    bfloat16: forward (standalone opforge against torch's op) and forward+backward (through
    opforge.torch, torch.autograd.grad of the input's gradient (and weight's and bias's for the
    norms) against the built-in's), with the achieved bandwidth (the bytes each must move at
    least: forward reads x and writes y; the backward reads the gradient and x or y and writes dx,
    the norms' weight gradients read dy and x again) as a share of the same-process copy's."""
    import opforge.torch as ot

    F = torch.nn.functional
    rows = []
    for shape in [(8192, 8192), (65536, 1024)]:
        d = shape[-1]
        for dtype, name in [(torch.float32, "float32"), (torch.bfloat16, "bfloat16")]:
            a = torch.randn(*shape, device="cuda", dtype=dtype)
            g = torch.randn(*shape, device="cuda", dtype=dtype)
            w = torch.randn(d, device="cuda", dtype=dtype)
            bias = torch.randn(d, device="cuda", dtype=dtype)
            x, ow, ob = (opforge.from_dlpack(t) for t in (a, w, bias))
            ag, wg, bg = (t.detach().requires_grad_() for t in (a, w, bias))
            nbytes = a.numel() * a.element_size()

            def grad(out: Any, wrt: list[torch.Tensor]) -> Any:
                return torch.autograd.grad(out[0] if isinstance(out, tuple) else out, wrt, g)

            cases = [
                ("softmax", 2, 5, lambda: ops.softmax(x), lambda: torch.softmax(a, -1),
                 lambda: grad(ot.ops.softmax(ag), [ag]), lambda: grad(torch.softmax(ag, -1), [ag])),
                ("log_softmax", 2, 5, lambda: ops.log_softmax(x), lambda: torch.log_softmax(a, -1),
                 lambda: grad(ot.ops.log_softmax(ag), [ag]), lambda: grad(torch.log_softmax(ag, -1), [ag])),
                ("layer_norm", 2, 7, lambda: ops.layer_norm(x, ow, ob), lambda: F.layer_norm(a, (d,), w, bias),
                 lambda: grad(ot.ops.layer_norm(ag, wg, bg), [ag, wg, bg]),
                 lambda: grad(F.layer_norm(ag, (d,), wg, bg), [ag, wg, bg])),
                ("rms_norm", 2, 7, lambda: ops.rms_norm(x, ow), lambda: F.rms_norm(a, (d,), w, 1e-6),
                 lambda: grad(ot.ops.rms_norm(ag, wg), [ag, wg]), lambda: grad(F.rms_norm(ag, (d,), wg, 1e-6), [ag, wg])),
            ]
            for label, fwd_passes, both_passes, mine_f, theirs_f, mine_b, theirs_b in cases:
                for kind, passes, mine_fn, theirs_fn, sync in (("", fwd_passes, mine_f, theirs_f, osync),
                                                               (" fwd+bwd", both_passes, mine_b, theirs_b, tsync)):
                    mine, theirs = timed(mine_fn, sync, 10), timed(theirs_fn, tsync, 10)
                    moved = passes * nbytes
                    rows.append((f"{label}{kind} {shape[0]}x{shape[1]} {name}", mine * 1e3, theirs * 1e3,
                                 mine / theirs, moved / mine / 1e12, moved / mine / 1e12 / copy_tbs))
            # frozen parameters: x's gradient alone (the bprop's if_needs: no fused parameter sums)
            frozen = [("layer_norm", lambda: grad(ot.ops.layer_norm(ag, w, bias), [ag]),
                       lambda: grad(F.layer_norm(ag, (d,), w, bias), [ag])),
                      ("rms_norm", lambda: grad(ot.ops.rms_norm(ag, w), [ag]),
                       lambda: grad(F.rms_norm(ag, (d,), w, 1e-6), [ag]))]
            for label, mine_fn, theirs_fn in frozen:
                mine, theirs = timed(mine_fn, tsync, 10), timed(theirs_fn, tsync, 10)
                moved = 5 * nbytes  # (x read, y written; dy and x read, dx written)
                rows.append((f"{label} fwd+bwd, parameters frozen {shape[0]}x{shape[1]} {name}", mine * 1e3,
                             theirs * 1e3, mine / theirs, moved / mine / 1e12, moved / mine / 1e12 / copy_tbs))
            del a, g, w, bias, x, ow, ob, ag, wg, bg
    torch.cuda.empty_cache()
    opforge.cuda.empty_cache()
    return rows


def loss_figures(tsync: Callable[[], None]) -> list[tuple[Any, ...]]:
    """cross_entropy (8192 rows, 32,000 classes) and embedding (50,000 x 1024 table, 65,536
    indices) forward+backward through opforge.torch against the built-ins, float32."""
    import opforge.torch as ot

    F = torch.nn.functional
    rows = []
    logits = torch.randn(8192, 32000, device="cuda", requires_grad=True)
    labels = torch.randint(0, 32000, (8192,), device="cuda")
    cases = [("cross_entropy fwd+bwd 8192x32000 float32",
              lambda: torch.autograd.grad(ot.ops.cross_entropy(logits, labels), [logits]),
              lambda: torch.autograd.grad(F.cross_entropy(logits, labels), [logits]))]
    table = torch.randn(50000, 1024, device="cuda", requires_grad=True)
    idx = torch.randint(0, 50000, (65536,), device="cuda")
    dout = torch.randn(65536, 1024, device="cuda")
    cases.append(("embedding fwd+bwd 50000x1024, 65536 indices, float32",
                   lambda: torch.autograd.grad(ot.ops.embedding(idx, table), [table], dout),
                   lambda: torch.autograd.grad(F.embedding(idx, table), [table], dout)))
    for label, mine_fn, theirs_fn in cases:
        mine, theirs = timed(mine_fn, tsync, 10), timed(theirs_fn, tsync, 10)
        rows.append((label, mine * 1e3, theirs * 1e3, mine / theirs))
        # the same without the host wait of the label/index check (what that wait costs)
        mine = timed(unchecked(mine_fn), tsync, 10)
        rows.append((f"{label}, {UNCHECKED}", mine * 1e3, theirs * 1e3, mine / theirs))
    return rows


UNCHECKED = "index checks off (`opforge.cuda.set_index_checks(False)`: no host wait)"


def unchecked(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn with opforge's CUDA index checks off: no host wait per index-taking call (and no
    IndexError; the inputs here are in range)."""
    def run() -> Any:
        before = opforge.cuda.set_index_checks(False)
        try:
            return fn()
        finally:
            opforge.cuda.set_index_checks(before)
    return run


def model_figures(tsync: Callable[[], None]) -> list[tuple[Any, ...]]:
    """Training steps (forward, backward, SGD step) through opforge.torch against the same models
    from torch's built-ins, float32: examples/torch_mlp.py's MLP (1024 features, hidden 4096, 1000
    classes, batch 4096) and examples/torch_transformer.py's block (vocabulary 32,000, width 1024,
    hidden 4096, 8 sequences of 512 tokens)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from torch_mlp import MLP, loss_fn
    from torch_transformer import BUILTIN, OPFORGE, Block, sequences

    F = torch.nn.functional
    rows = []

    def builtin_mlp(model: Any, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.layer_norm(F.linear(x, model.w1, model.b1), (model.b1.shape[0],), model.norm_weight,
                                model.norm_bias, 1e-5))
        return F.cross_entropy(F.linear(h, model.w2, model.b2), labels)

    x = torch.randn(4096, 1024, device="cuda")
    labels = torch.randint(0, 1000, (4096,), device="cuda")
    mlp = MLP(1024, 4096, 1000).cuda()
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)

    def mlp_step(fn: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            fn(mlp, x, labels).backward()
            opt.step()
        return step

    mine, theirs = timed(mlp_step(loss_fn), tsync, 10), timed(mlp_step(builtin_mlp), tsync, 10)
    rows.append(("MLP training step (batch 4096, 1024-4096-1000)", mine * 1e3, theirs * 1e3, mine / theirs))
    mine = timed(unchecked(mlp_step(loss_fn)), tsync, 10)
    rows.append((f"MLP training step, {UNCHECKED}", mine * 1e3, theirs * 1e3, mine / theirs))
    tokens = sequences(8, 513, 32000).cuda()
    steps = []
    for impl in (OPFORGE, BUILTIN):
        torch.manual_seed(0)
        block = Block(32000, 1024, 4096, impl).cuda()
        opt_b = torch.optim.SGD(block.parameters(), lr=1e-3)

        def block_step(block: Any = block, opt_b: Any = opt_b) -> None:
            opt_b.zero_grad(set_to_none=True)
            block.loss(tokens).backward()
            opt_b.step()

        steps.append(timed(block_step, tsync, 5))
    rows.append(("transformer block training step (8 x 512 tokens, width 1024, vocabulary 32000)",
                 steps[0] * 1e3, steps[1] * 1e3, steps[0] / steps[1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--gemm", type=int, default=8192, help="size of the matrix-product rows (0: none)")
    parser.add_argument("--no-rows", dest="rows", action="store_false", help="skip the row ops and losses")
    parser.add_argument("--no-models", dest="models", action="store_false", help="skip the training steps")
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
    graphs = "CUDA graph figures: not measured (the run ended before them)."
    gemm_rows: list[tuple[Any, ...]] = []
    norm_rows: list[tuple[Any, ...]] = []
    loss_rows: list[tuple[Any, ...]] = []
    model_rows: list[tuple[Any, ...]] = []
    driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()

    def render() -> str:
        return "\n".join(report_lines(args, driver, rows, call, graphs, copy_2, n, gemm_rows, norm_rows,
                                       loss_rows, model_rows))

    def publish() -> None:  # (after each part: a run cut short by its time limit keeps what it measured)
        if args.out:
            args.out.write_text(render())

    publish()
    if args.gemm:
        gemm_rows = gemm_figures(args.gemm, tsync, osync)
        publish()
    copy_tbs = 8 * n / copy_2 / 1e12
    if args.rows:
        norm_rows = row_figures(tsync, osync, copy_tbs)
        publish()
        loss_rows = loss_figures(tsync)
        publish()
    if args.models:
        model_rows = model_figures(tsync)
        publish()
    try:  # (last: captures, never run on a GPU before, cannot cost the other figures)
        graphs = "64 muls of 1024 floats in a chain, per chain: opforge eager {:.1f} µs, replayed from an " \
                 "opforge.cuda.CUDAGraph {:.1f} µs; torch eager {:.1f} µs, replayed from torch.cuda.graph {:.1f} µs." \
                 .format(*(t * 1e6 for t in graph_figures(tsync, osync)))
    except Exception as e:  # (a failure here leaves the other figures standing; the GPU tests say why)
        graphs = f"CUDA graph figures failed: {type(e).__name__}: {e}"
    publish()
    print(render())


def report_lines(args: argparse.Namespace, driver: str, rows: list[tuple[Any, ...]], call: tuple[float, ...],
                 graphs: str, copy_2: float, n: int, gemm_rows: list[tuple[Any, ...]],
                 norm_rows: list[tuple[Any, ...]], loss_rows: list[tuple[Any, ...]],
                 model_rows: list[tuple[Any, ...]]) -> list[str]:
    """The markdown of the figures measured so far."""
    lines = [
        "# opforge on CUDA (issues 14 and 15)",
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
                  f"({call[4]:.2f}x torch.mul).", "", graphs, "",
              f"Copy anchor: device-to-device `copy_` of 2 x 2^{args.log2n} floats {copy_2 * 1e3:.3f} ms "
              f"({8 * n / copy_2 / 1e12:.2f} TB/s read + write).", ""]
    if gemm_rows:
        lines += ["Matrix products (cuBLAS; float32 without TF32 in both, torch's default; target >= 0.95x torch):", "",
                  "| product | opforge ms | torch ms | opforge TFLOP/s | torch TFLOP/s | opforge / torch throughput |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.2f} |" for r in gemm_rows]
        lines += [""]
    if norm_rows:
        lines += ["Row ops (forward: standalone opforge against torch's op; fwd+bwd: through opforge.torch, "
                  "torch.autograd.grad against the built-in's; target <= 1.0x torch's time; bandwidth: the bytes "
                  "each must move at least, as a share of the copy's):", "",
                  "| op | opforge ms | torch ms | opforge / torch time | opforge TB/s | share of copy bandwidth |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.0%} |" for r in norm_rows]
        lines += [""]
    if loss_rows or model_rows:
        lines += ["Losses, embedding and training steps through opforge.torch against the built-ins (float32; "
                  "targets: losses and embedding <= 1.0x, training steps <= 1.1x):", "",
                  "| figure | opforge ms | torch ms | opforge / torch time |", "|---|---:|---:|---:|"]
        lines += [f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.2f} |" for r in loss_rows + model_rows]
        lines += [""]
    return lines


if __name__ == "__main__":
    main()
