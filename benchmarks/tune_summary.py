"""A markdown table from tools/gpu_run.sh tune's CSV (benchmarks/cuda_rows_tune.cu): per op, dtype and
shape, the time of the launch shape the library runs today, the fastest shape tried and how much
faster it is; with two trees (TUNE_BASE), the base tree's time at today's shape beside.

    python benchmarks/tune_summary.py tune.csv
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict

# the launch shape launch_rows() ran before the harness marked it (the `today` column): a warp per
# row, 4 rows to a block, no register cap; 256-thread blocks, two per SM (col_sums rows mark their
# own choice with min_blocks 1)
TODAY = {("32", "128", "1"), ("256", "256", "2")}


def today(row: dict[str, str]) -> bool:
    if row.get("today"):
        return row["today"] == "1"
    if row["op"] == "col_sums":
        return row["min_blocks"] == "1"
    return (row["group"], row["threads"], row["min_blocks"]) in TODAY


def shape_of(row: dict[str, str]) -> str:
    if row["op"] == "col_sums":
        return f"{row['group']} chunks"
    return f"{row['group']}/{row['threads']}/{row['min_blocks']} ({row['registers']} regs, {row['blocks_per_sm']} blocks/SM)"


def main(path: str) -> None:
    cases: dict[tuple[str, str, str], dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if not row.get("ms") or row["op"] == "copy":
                continue
            cases[(row["op"], row["dtype"], row["shape"])][row["tree"]].append(row)
    print("| op | dtype | shape | today ms (share of copy) | fastest shape tried | its ms (share) | today / fastest "
          "| base tree today ms |")
    print("|---|---|---|---:|---|---:|---:|---:|")
    for (op, dtype, shape), trees in cases.items():
        here = trees.get("here", [])
        now = next((r for r in here if today(r)), None)
        if now is None:
            continue
        best = min(here, key=lambda r: float(r["ms"]))
        base = next((r for r in trees.get("base", []) if today(r)), None)
        base_ms = f"{float(base['ms']):.4f}" if base else ""
        print(f"| {op} | {dtype} | {shape} | {float(now['ms']):.4f} ({now['share_of_copy']}) | {shape_of(best)} "
              f"| {float(best['ms']):.4f} ({best['share_of_copy']}) | {float(now['ms']) / float(best['ms']):.2f} "
              f"| {base_ms} |")

if __name__ == "__main__":
    main(sys.argv[1])
