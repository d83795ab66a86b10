"""opforge benchmark suite: opforge vs NumPy vs PyTorch, side by side in the same processes.

    python benchmarks/run.py                 # all groups; writes benchmarks/results/cpu.md
    python benchmarks/run.py --groups call,mul --out /tmp/b.md

Every group runs in its own Python process (so allocator and thread-pool state of one group
cannot favour another); within a group the frameworks alternate in the same process. Threads are
set equal: OMP_NUM_THREADS (opforge, NumPy's BLAS) and torch.set_num_threads use --threads
(default: all cores). Figures are medians of repeated timings, the frameworks of a row timed in
turn (A B C A B C ...: groups.paired), so that a drift of the machine's speed moves them alike;
ratios are opforge / other, so below 1.0 means opforge is faster. Needs numpy and torch==2.13.0;
the jax_ops group needs JAX instead (a NumPy 2 environment, without torch or MindSpore).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
GROUPS = ["call", "autograd", "mul", "vector_math", "norms", "matmul", "mlp", "torch_ops", "mindspore_ops"]
# (needs JAX, so NumPy 2, not MindSpore: run alone, --groups jax_ops --out benchmarks/results/cpu-jax.md)
OTHER_GROUPS = ["jax_ops"]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import importlib.util
    import numpy

    import opforge

    # (torch for every group but jax_ops; JAX only in a NumPy 2 environment)
    versions = "".join(f", {label} {__import__(module).__version__}"
                       for module, label in (("torch", "torch"), ("jax", "JAX"))
                       if importlib.util.find_spec(module) is not None)
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, NumPy {numpy.__version__}{versions}, "
            f"opforge {getattr(opforge, '__version__', '?')} ({opforge.backend})")


def run_group(name: str, threads: int) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OPFORGE_BENCH_THREADS=str(threads))
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import groups, json; " \
           f"print(json.dumps(groups.run({name!r})))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return [{"group": name, "name": f"{name} (failed)", "note": r.stderr.strip().splitlines()[-1:]}]
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt_time(us: float | None) -> str:
    if us is None:
        return "n/a"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.2f} µs"


def _framework_table(rows: list[dict], title: str, intro: str, heads: tuple[str, str, str, str]) -> list[str]:
    """An opforge-inside-a-framework table: ours, the hand-written peer, the built-in."""
    if not rows:
        return []
    ours, peer, builtin, short = heads
    lines = ["", title, "", intro, "",
             f"| benchmark | {ours} | {peer} | {builtin} | opforge/{short} | opforge/built-in | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    controls = []
    for r in rows:
        o, c, b = r["opforge"], r["custom_op"], r["builtin"]
        met = "" if r.get("met") is None else ("yes" if r["met"] else "**no**")
        vs_peer = f"{o / c:.2f}" if c else ""
        lines.append(f"| {r['name']} | {fmt_time(o)} | {fmt_time(c) if c else ''} | {fmt_time(b)} | {vs_peer} | "
                     f"{o / b:.2f} | {r['target']} | {met} |")
        if r.get("control") and c:
            controls.append(f"{r['name']}: {r['control'] / c:.2f}")
    if controls:
        lines += ["", "A/A control (a second instance of the hand-written op, timed in the same rounds, against "
                  "the first: two identical primitives, so its distance from 1.00 is this run's noise in the "
                  f"opforge/{short} column): " + "; ".join(controls) + "."]
    return lines


def render(rows: list[dict], threads: int) -> str:
    lines = ["# opforge benchmarks (cpu)", "",
             f"Run {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} with `python benchmarks/run.py` "
             f"({threads} threads for every framework).", "", f"Machine: {machine()}"]
    notes = []
    torch_rows = [r for r in rows if r.get("table") == "torch"]
    ms_rows = [r for r in rows if r.get("table") == "mindspore"]
    jax_rows = [r for r in rows if r.get("table") == "jax"]
    rows = [r for r in rows if r.get("table") not in ("torch", "mindspore", "jax")]
    if rows:  # (the main table: none when only framework groups ran)
        lines += ["", "| group | benchmark | opforge | NumPy | PyTorch | opforge/NumPy | opforge/PyTorch | target | met |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "opforge" not in r:
            lines.append(f"| {r['group']} | {r['name']} | n/a | | | | | | |")
            notes.append(f"- {r['name']}: {r.get('note')}")
            continue
        o, n, t = r.get("opforge"), r.get("numpy"), r.get("torch")
        unit = r.get("unit", "time")
        show = (lambda v: "n/a" if v is None else f"{v:.1f} {unit}") if unit != "time" else fmt_time
        rn = f"{o / n:.2f}" if o and n else ""
        rt = f"{o / t:.2f}" if o and t else ""
        if unit != "time":  # higher is better: ratio of rates
            rn = f"{o / n:.2f}" if o and n else ""
            rt = f"{o / t:.2f}" if o and t else ""
        met = "" if r.get("met") is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['group']} | {r['name']} | {show(o)} | {show(n)} | {show(t)} | {rn} | {rt} | "
                     f"{r.get('target', '')} | {met} |")
        if r.get("note"):
            notes.append(f"- {r['name']}: {r['note']}")
    if notes:
        lines += ["", "Notes:", ""] + notes
    lines += _framework_table(
        torch_rows, "## opforge ops inside PyTorch (opforge.torch)",
        "opforge.torch's `torch.ops.opforge.*` against a hand-written `torch.library.custom_op` + "
        "`register_fake` + `register_autograd` running the same opforge kernels through DLPack "
        "(`benchmarks/torch_peers.py`), and against torch's built-in op; same process.",
        ("opforge.torch", "custom_op by hand", "torch built-in", "custom_op"))
    lines += _framework_table(
        ms_rows, "## opforge ops inside MindSpore (opforge.mindspore)",
        "opforge.mindspore's primitives (aot `ops.Custom` on the wheel's entry points, reg_info, "
        "infer and bprop generated) against a hand-written aot `ops.Custom` with its own reg_info, "
        "bprop and float32-only kernel (`benchmarks/ms_peers.py`), and against MindSpore's built-in "
        "op; PyNative mode with `ms.runtime.launch_blocking()`, same process.",
        ("opforge.mindspore", "aot Custom by hand", "MindSpore built-in", "aot Custom"))
    lines += _framework_table(
        jax_rows, "## opforge ops inside JAX (opforge.jax)",
        "opforge.jax's ops (a primitive per op lowering to the generic `opforge` XLA FFI target) "
        "against a hand-written typed `jax.ffi` handler for float32 mul calling the same opforge "
        "kernel (`benchmarks/jax_peers.py`), and against jax.numpy; each call under `jax.jit` and "
        "waited for (`block_until_ready`); the training step is examples/jax_mlp.py's against the "
        "same model in jax.numpy (`jnp_loss`), same process.",
        ("opforge.jax", "jax.ffi by hand", "jax.numpy", "jax.ffi"))
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS + OTHER_GROUPS)}")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "cpu.md")
    args = p.parse_args()
    rows: list[dict] = []
    for g in args.groups.split(","):
        print(f"running {g} ...", file=sys.stderr)
        rows.extend(run_group(g, args.threads))
    text = render(rows, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
