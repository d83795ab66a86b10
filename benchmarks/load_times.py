"""The op author's loop, timed as whole processes (medians): opforge.load of a new one-op expr
spec (in an empty cache root; in a warm one, holding other modules; first ever, with the
installation's cache emptied too), of a new 6-op module (5 expr ops, 1 cpp kernel) on 2 cores,
cached (warm) loads, the same op with torch.utils.cpp_extension.load (--peers), a rebuild of the
full op_specs/ package after editing one spec and (--clean) a clean build of it (--package).

    PYTHONPATH=build/python python benchmarks/load_times.py [--reps 5] [--peers] [--package [--clean]] [--out FILE]

Run it against a dev build (tools/dev.sh build): the package rows use tools/dev.sh. The "first
ever" row empties the installation's cache (opforge.jit._installation_cache(), where the
precompiled header is kept): run it where nobody else is loading modules from this opforge.
Each row records the load average (1 min) before and after it: the figures are only as good as
the machine was quiet.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPEC = """\
{name}:
  doc: Softplus log(1 + exp(x)) elementwise.
  inputs:
    x: T
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {{}}
  impl:
    expr: {expr}
  bprop:
    x: {bprop}
"""

# the 6-op module: five expr ops and a cpp one (its kernel below)
EXPRS = [("log(1 + exp(x))", "dout * sigmoid(x)"), ("x / (1 + exp(-x))", "dout * (sigmoid(x) * (1 + x * (1 - sigmoid(x))))"),
         ("x * x * x", "dout * 3 * x * x"), ("exp(-x * x)", "dout * -2 * x * exp(-x * x)"),
         ("tanh(x) * x", "dout * (tanh(x) + x * (1 - tanh(x) * tanh(x)))")]

ROWS_SPEC = """\
{name}:
  doc: Each row of x times its weight w[i] (a cpp kernel).
  inputs:
    x: T
    w: T
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32, float64]
  targets:
    cpu: {{}}
  impl:
    cpp: {{}}
  bprop:
    x: {name}(dout, w)
    w: sum(dout * x, axis=[1])
"""

ROWS_KERNEL = """\
#include "{name}.h"

namespace opforge::kernels::cpu {{

template <typename T>
void {name}(const TensorPtr& x, const TensorPtr& w, const TensorPtr& out, const {camel}Attrs& attrs) {{
  if (x->dim() != 2 || w->dim() != 1 || w->shape()[0] != x->shape()[0])
    fail<ValueError>("{name}", "x must be 2-D and w 1-D with one weight per row");
  const int64_t rows = x->shape()[0], cols = x->shape()[1];
  const T* px = x->data<T>();
  const T* pw = w->data<T>();
  T* po = out->data<T>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) po[i * cols + j] = px[i * cols + j] * pw[i];
}}

}}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_{upper}_CPU
"""

# The same op for PyTorch: forward and backward, one C++ file, as cpp_extension.load builds it.
TORCH_SOURCE = """\
#include <torch/extension.h>

torch::Tensor softplus_forward(torch::Tensor x) { return torch::log1p(torch::exp(x)); }
torch::Tensor softplus_backward(torch::Tensor dout, torch::Tensor x) { return dout * torch::sigmoid(x); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &softplus_forward);
  m.def("backward", &softplus_backward);
}
"""


def two_cores() -> None:
    """(in the child) at most 2 of the cores this process may use: the 2-core figures."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:2])


CPU: list[float] = []  # the CPU seconds (user + sys, the process and what it waited for) of each timed run


def timed(code: str, env: dict | None = None) -> float:
    """A new process's wall time (its CPU time goes to CPU)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, preexec_fn=two_cores)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if r.returncode != 0:
        raise SystemExit(f"failed: {code}\n{r.stderr}")
    return elapsed


def one_op(tmp: Path, name: str, cache: Path) -> str:
    """The code of a process loading a new one-op module (the spec is written now) and calling it."""
    spec = tmp / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, expr=EXPRS[0][0], bprop=EXPRS[0][1]))
    return (f"import opforge, numpy as np; m = opforge.load('m_{name}', specs=[{str(spec)!r}], "
            f"build_dir={str(cache)!r}); m.{name}(np.ones(3))")


def six_ops(tmp: Path, tag: str, cache: Path) -> str:
    """The code of a process loading a module of 5 expr ops and a cpp one (new names: nothing cached)."""
    d = tmp / f"six_{tag}"
    d.mkdir()
    for i, (expr, bprop) in enumerate(EXPRS):
        (d / f"e{i}_{tag}.yaml").write_text(SPEC.format(name=f"e{i}_{tag}", expr=expr, bprop=bprop))
    rows = f"rows_{tag}"
    (d / f"{rows}.yaml").write_text(ROWS_SPEC.format(name=rows))
    camel = "".join(w.title() for w in rows.split("_"))
    (d / f"{rows}.cpp").write_text(ROWS_KERNEL.format(name=rows, camel=camel, upper=rows.upper()))
    return (f"import opforge, numpy as np; m = opforge.load('six_{tag}', specs=[{str(d)!r}], "
            f"sources=[{str(d / f'{rows}.cpp')!r}], build_dir={str(cache)!r}); "
            f"m.e0_{tag}(np.ones(3)); m.{rows}(np.ones((2, 3)), np.ones(2))")


def installation_cache() -> Path | None:
    code = "from opforge import jit; print(jit._installation_cache() if hasattr(jit, '_installation_cache') else '')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return Path(out) if out else None


def torch_load(tmp: Path, k: int) -> float:
    src = tmp / f"softplus_torch_{k}.cpp"
    src.write_text(TORCH_SOURCE)
    build = tmp / f"torch_build_{k}"
    build.mkdir()
    return timed(f"import torch; from torch.utils.cpp_extension import load; "
                 f"m = load('softplus_torch_{k}', [{str(src)!r}], build_directory={str(build)!r}); "
                 f"m.forward(torch.ones(3))")


def dev_build(env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "tools" / "dev.sh"), "build"], check=True, env=env, capture_output=True)
    return time.perf_counter() - start


class Rows:
    """The table: each row's times, target and the load average before and after it."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, list[float], float, str, str]] = []

    def add(self, what: str, target: str, run) -> list[float]:
        before = os.getloadavg()[0]
        del CPU[:]
        times = run()
        cpu = statistics.median(CPU) if CPU else float("nan")
        self.rows.append((what, times, cpu, target, f"{before:.1f} / {os.getloadavg()[0]:.1f}"))
        print(f"{what}: {statistics.median(times):.2f} s (cpu {cpu:.2f} s) {times}", flush=True)
        return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peers", action="store_true", help="also time torch.utils.cpp_extension.load")
    ap.add_argument("--package", action="store_true", help="also time a rebuild of op_specs/ (tools/dev.sh)")
    ap.add_argument("--clean", action="store_true", help="with --package: a clean build of op_specs/ too (minutes)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu-load.md")
    args = ap.parse_args()
    reps = args.reps
    t = Rows()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shared = installation_cache()

        def first_ever() -> list[float]:
            times = []
            for k in range(reps):
                if shared is not None:
                    shutil.rmtree(shared, ignore_errors=True)
                times.append(timed(one_op(tmp, f"softplus_first_{k}", tmp / f"first_{k}")))
            return times

        t.add("one-op expr spec, first ever (empty cache root, the installation's cache emptied)", "reported",
              first_ever)
        timed(one_op(tmp, "softplus_setup", tmp / "setup"))  # the installation's precompiled header, if any
        t.add("one-op expr spec, empty cache root", "<= 5 s",
              lambda: [timed(one_op(tmp, f"softplus_empty_{k}", tmp / f"empty_{k}")) for k in range(reps)])
        cache = tmp / "cache"
        timed(one_op(tmp, "softplus_warmup", cache))  # the cache root holds another module
        t.add("one-op expr spec, new module in a warm cache root (it holds other modules)", "<= 3.5 s",
              lambda: [timed(one_op(tmp, f"softplus_{k}", cache)) for k in range(reps)])
        warm_one = one_op(tmp, "softplus_0", cache)
        t.add("one-op module, cached (warm: the same load again, a new process)", "<= 0.25 s",
              lambda: [timed(warm_one) for _ in range(max(5, reps))])
        t.add("6-op module (5 expr, 1 cpp kernel), empty cache root, 2 cores", "<= 15 s",
              lambda: [timed(six_ops(tmp, f"c{k}", tmp / f"six_{k}")) for k in range(reps)])
        warm_six = six_ops(tmp, "w", cache)
        timed(warm_six)
        t.add("6-op module, cached (warm: the same load again, a new process)", "<= 0.25 s",
              lambda: [timed(warm_six) for _ in range(max(5, reps))])
        if args.peers:
            t.add("torch.utils.cpp_extension.load, the one op (forward + backward), new build dir", "peer",
                  lambda: [torch_load(tmp, k) for k in range(reps)])

    if args.package:
        env = {**os.environ, "OPFORGE_BUILD_DIR": str(ROOT / "build")}
        dev_build(env)  # up to date first
        spec = ROOT / "op_specs" / "silu.yaml"
        text = spec.read_text()

        def rebuild() -> list[float]:
            times = []
            try:
                for k in range(reps):
                    spec.write_text(text.replace("elementwise.", f"elementwise (edit {k})."))
                    times.append(dev_build(env))
            finally:
                spec.write_text(text)
                dev_build(env)
            return times

        t.add("full op_specs/ package: rebuild after editing one spec (silu.yaml's doc)", "<= 15 s", rebuild)
        if args.clean:
            with tempfile.TemporaryDirectory() as d:
                t.add("full op_specs/ package: clean build (tools/dev.sh)", "reported",
                      lambda: [dev_build({**os.environ, "OPFORGE_BUILD_DIR": d})])

    flags = "".join(f" --{f}" for f in ("peers", "package", "clean") if getattr(args, f))
    lines = [
        "# The op author's loop: load and build times (cpu)",
        "",
        f"`python benchmarks/load_times.py --reps {reps}{flags}` on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}. Whole processes (`python -c ...`: interpreter "
        f"start, imports, the load and one call), at most 2 cores each, medians of {reps} (warm: {max(5, reps)}). "
        f"Load when it started: `{uptime}`; each row's load average (1 min) before / after it is in the last column. "
        f"CPU s: user + sys of the process and of what it ran (compilers), median; on a busy machine it grows "
        f"less than the wall time does (the package rows' is not measured).",
        "",
        "| what | median s | runs (s) | CPU s | target | load |",
        "|---|---:|---|---:|---|---|",
    ]
    for what, ts, cpu, target, load in t.rows:
        lines.append(f"| {what} | {statistics.median(ts):.2f} | {', '.join(f'{x:.2f}' for x in ts)} | {cpu:.2f} | "
                     f"{target} | {load} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
