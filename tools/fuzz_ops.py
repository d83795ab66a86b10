"""Long op fuzzing: ``python tools/fuzz_ops.py --calls 100000 [--start 0] [--batch 5000]``.

Runs tests/fuzz/opfuzz.py's seeded calls in batches, each in a subprocess so that a crash
(a signal) is caught: the crashing batch is re-run one seed per process to find the seed, and
its reproducer (opfuzz.describe) is printed. Wrong errors and wrong results are printed too.
Exit status 1 if anything was found.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

FUZZ = Path(__file__).resolve().parent.parent / "tests" / "fuzz"
CHILD = """
import sys, collections
sys.path.insert(0, {fuzz!r})
import opfuzz
c = collections.Counter()
for s in range({a}, {b}):
    try:
        c[opfuzz.check_call(s)] += 1
    except AssertionError as e:
        c['fail'] += 1
        print('FAIL', s, str(e).splitlines()[0][:500], flush=True)
print('COUNTS', dict(c), flush=True)
"""


def run(a: int, b: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD.format(fuzz=str(FUZZ), a=a, b=b)],
                          capture_output=True, text=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--batch", type=int, default=5000)
    args = p.parse_args()
    t0 = time.time()
    totals: dict[str, int] = {}
    crashes, fails = [], 0
    for a in range(args.start, args.start + args.calls, args.batch):
        b = min(a + args.batch, args.start + args.calls)
        r = run(a, b)
        for line in r.stdout.splitlines():
            if line.startswith("FAIL"):
                fails += 1
                print(line)
                seed = int(line.split()[1])
                print(subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(FUZZ)!r}); "
                                      f"import opfuzz; print(opfuzz.describe({seed}))"],
                                     capture_output=True, text=True).stdout)
            elif line.startswith("COUNTS"):
                for k, v in eval(line[7:]).items():
                    totals[k] = totals.get(k, 0) + v
        if r.returncode != 0:
            print(f"batch {a}..{b} died (status {r.returncode}); finding the seed", flush=True)
            for s in range(a, b):
                one = run(s, s + 1)
                if one.returncode != 0:
                    crashes.append(s)
                    print(f"CRASH seed {s} status {one.returncode}\n{one.stderr[-2000:]}")
                    print(subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(FUZZ)!r}); "
                                          f"import opfuzz; print(opfuzz.describe({s}))"],
                                         capture_output=True, text=True).stdout)
                elif not one.stdout.strip().startswith("COUNTS") and "FAIL" not in one.stdout:
                    pass
        print(f"{b - args.start} calls, {time.time() - t0:.0f}s, {totals}", flush=True)
    print(f"done: {args.calls} calls ({totals}), {fails} wrong errors/results, {len(crashes)} crashes "
          f"{crashes}, {time.time() - t0:.0f}s")
    return 1 if fails or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
