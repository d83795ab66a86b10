"""The op author's loop, timed as whole processes (medians): opforge.load of a new one-op expr
spec (cold: a new spec, the cache root's precompiled header present; first ever: an empty cache
root), the same op with torch.utils.cpp_extension.load, a warm (cached) opforge.load, a rebuild
of the full op_specs/ package after editing one spec, and (--clean) a clean build of it.

    PYTHONPATH=build/python python benchmarks/load_times.py [--reps 3] [--clean] [--out FILE]

Run it against a dev build (tools/dev.sh build): the rebuild and clean-build rows use tools/dev.sh.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    expr: log(1 + exp(x))
  bprop:
    x: dout * sigmoid(x)
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


def timed(code: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    return time.perf_counter() - start


def opforge_load(tmp: Path, name: str, cache: Path) -> float:
    spec = tmp / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name))
    return timed(f"import opforge, numpy as np; m = opforge.load('m_{name}', specs=[{str(spec)!r}], "
                 f"build_dir={str(cache)!r}); m.{name}(np.ones(3))")


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clean", action="store_true", help="also time a clean build of op_specs/ (minutes)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu-load.md")
    args = ap.parse_args()
    rows: list[tuple[str, list[float], str]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        first = [opforge_load(tmp, f"softplus_first_{k}", tmp / f"fresh_{k}") for k in range(args.reps)]
        cache = tmp / "cache"
        opforge_load(tmp, "softplus_warmup", cache)  # the cache root's precompiled header
        cold = [opforge_load(tmp, f"softplus_{k}", cache) for k in range(args.reps)]
        spec = tmp / "softplus_0.yaml"
        warm_code = (f"import opforge, numpy as np; m = opforge.load('m_softplus_0', specs=[{str(spec)!r}], "
                     f"build_dir={str(cache)!r}); assert not m.__opforge_build__['built']; m.softplus_0(np.ones(3))")
        warm = [timed(warm_code) for _ in range(max(5, args.reps))]
        torch_times = [torch_load(tmp, k) for k in range(args.reps)]
        rows.append(("opforge.load, new one-op expr spec, cold (cache root's precompiled header present)", cold,
                     "<= 5 s and <= 0.35x cpp_extension.load"))
        rows.append(("opforge.load, new one-op expr spec, first ever (empty cache root)", first, "reported"))
        rows.append(("torch.utils.cpp_extension.load, the same op (forward + backward), new build dir",
                     torch_times, "peer"))
        rows.append(("opforge.load, cached (warm)", warm, "<= 0.3 s"))

    env = {**os.environ, "OPFORGE_BUILD_DIR": str(ROOT / "build")}
    dev_build(env)  # up to date first
    spec = ROOT / "op_specs" / "silu.yaml"
    text = spec.read_text()
    rebuild = []
    try:
        for k in range(args.reps):
            spec.write_text(text.replace("elementwise.", f"elementwise (edit {k})."))
            rebuild.append(dev_build(env))
    finally:
        spec.write_text(text)
        dev_build(env)
    rows.append(("full op_specs/ package: rebuild after editing one spec (silu.yaml's doc)", rebuild, "<= 15 s"))
    if args.clean:
        with tempfile.TemporaryDirectory() as d:
            rows.append(("full op_specs/ package: clean build (64 specs, tools/dev.sh)",
                         [dev_build({**os.environ, "OPFORGE_BUILD_DIR": d})], "reported"))

    cold_med, torch_med = statistics.median(cold), statistics.median(torch_times)
    lines = [
        "# The op author's loop: load and build times (cpu)",
        "",
        f"`python benchmarks/load_times.py{' --clean' if args.clean else ''}` on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. Whole processes (`python -c ...`: interpreter start, "
        f"imports, the load and one call), medians of {args.reps} (warm: {max(5, args.reps)}).",
        "",
        "| what | median s | runs (s) | target |",
        "|---|---:|---|---|",
    ]
    for what, ts, target in rows:
        lines.append(f"| {what} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} | {target} |")
    lines += ["", f"Cold opforge.load / cpp_extension.load: **{cold_med / torch_med:.2f}x** "
              f"({cold_med:.2f} s vs {torch_med:.2f} s)."]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
