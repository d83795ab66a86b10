"""Instructions per PyNative call of opforge.mindspore's primitives, the hand-written aot Custom ops
of benchmarks/ms_peers.py and MindSpore's built-ins, counted by valgrind's callgrind.

    python benchmarks/ms_instructions.py             # the table, in markdown, on stdout
    python benchmarks/ms_instructions.py --calls 20 --jobs 2

The timed rows of cpu-mindspore.md (`benchmarks/run.py`, group mindspore_ops) differ by a few
percent where this machine's timings drift by tens of percent between runs; the instructions one
call executes, every thread counted, do not drift. Each primitive runs in a process of its own under
callgrind with collection off until warm-up is done (20 calls), on for `--calls` calls, then off
(callgrind's client requests, through a helper compiled here with the system compiler); the figure
is the collected count divided by the calls. Instructions are not time (MindSpore's PyNative call
also waits for its own threads), but a primitive that executes fewer of them does less work in
the same places. Only the 8-element rows: at 65536 elements the kernels' vector code counts
differently from their time. Needs valgrind (with its headers, valgrind/callgrind.h), MindSpore
and a C compiler; about 3 minutes per process (MindSpore's import under valgrind).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
SIDES = ("opforge", "hand", "builtin")
CASES = ("mul", "leaky_relu", "grad_mul")
NAMES = {"mul": "mul forward, 8 elements", "leaky_relu": "leaky_relu forward, 8 elements",
         "grad_mul": "mul forward+backward (ms.grad), 8 elements"}
HELPER = r"""
#include <valgrind/callgrind.h>
void opforge_cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void opforge_cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("opforge_calls"); }
"""


def helper(directory: Path) -> Path:
    src, lib = directory / "cg.c", directory / "libopforge_cg.so"
    src.write_text(HELPER)
    subprocess.run([os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def child(case: str, side: str, calls: int, lib: str) -> None:
    """Runs inside callgrind: warm-up, then `calls` calls with collection on."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    import mindspore as ms
    from mindspore import Tensor
    from mindspore import ops as msops

    ms.set_device(device_target="CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    import ms_peers as peer

    import opforge.mindspore as om

    x = Tensor(np.random.default_rng(0).standard_normal(8).astype(np.float32))
    y = Tensor(np.random.default_rng(1).standard_normal(8).astype(np.float32))
    fn: Callable[[], object]
    if case == "grad_mul":
        mul = {"opforge": om.ops.mul, "hand": peer.mul, "builtin": msops.mul}[side]
        grad = ms.grad(lambda a, b: mul(a, b).sum(), grad_position=(0, 1))
        fn = lambda: grad(x, y)  # noqa: E731
    elif case == "mul":
        mul = {"opforge": om.ops.mul, "hand": peer.mul, "builtin": msops.mul}[side]
        fn = lambda: mul(x, y)  # noqa: E731
    else:
        relu = {"opforge": om.ops.leaky_relu, "hand": peer.leaky_relu,
                "builtin": lambda t: msops.leaky_relu(t, 0.01)}[side]
        fn = lambda: relu(x)  # noqa: E731
    cg = ctypes.CDLL(lib)
    for _ in range(20):
        fn()
    cg.opforge_cg_start()
    for _ in range(calls):
        fn()
    cg.opforge_cg_stop()


def count(case: str, side: str, calls: int, lib: Path, directory: Path) -> float:
    out = directory / f"cg.{case}.{side}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                    sys.executable, __file__, "--child", case, side, str(calls), str(lib)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # (one dump per client request: the one named opforge_calls holds the calls)
    for dump in sorted(directory.glob(f"cg.{case}.{side}*")):
        text = dump.read_text(errors="replace")
        if "opforge_calls" in text:
            m = re.search(r"^totals:\s*(\d+)", text, re.M)
            if m:
                return int(m.group(1)) / calls
    raise RuntimeError(f"no callgrind dump of the calls for {case} {side} in {directory}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2, help="callgrind processes at once (each is one thread)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, side, calls, lib = args.child
        child(case, side, int(calls), lib)
        return
    if not shutil.which("valgrind"):
        sys.exit("ms_instructions: valgrind is not installed (Debian: apt install valgrind)")
    with tempfile.TemporaryDirectory(prefix="opforge_cg_") as tmp:
        directory = Path(tmp)
        lib = helper(directory)
        jobs = [(c, s) for c in CASES for s in SIDES]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {job: pool.submit(count, *job, args.calls, lib, directory) for job in jobs}
            per_call = {job: f.result() for job, f in futures.items()}
    print(f"Instructions per PyNative call (callgrind, {args.calls} calls after 20 of warm-up, every thread):\n")
    print("| benchmark | opforge.mindspore | aot Custom by hand | MindSpore built-in | opforge/aot Custom | opforge/built-in |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in CASES:
        ours, hand, builtin = (per_call[(c, s)] for s in SIDES)
        print(f"| {NAMES[c]} | {ours:,.0f} | {hand:,.0f} | {builtin:,.0f} | {ours / hand:.3f} | {ours / builtin:.3f} |")


if __name__ == "__main__":
    main()
