"""benchmarks/tune_summary.py: tools/gpu_run.sh tune's CSV as a table (today's launch shape against
the fastest tried, the base tree beside; failed builds and the copy anchor left out)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSV = """tree,op,dtype,shape,group,threads,min_blocks,registers,blocks_per_sm,ms,GB/s,share_of_copy
here,copy,float32,65536x1024,,,,,,0.1300,4120.0,1.00
here,softmax,float32,65536x1024,32,128,1,164,3,0.1500,3590.000,0.87
here,softmax,float32,65536x1024,32,128,4,128,4,0.1200,4470.000,1.08
here,col_sums,bfloat16,8192x8192,2,256,1,30,8,0.0800,1700.000,0.41
here,col_sums,bfloat16,8192x8192,4,256,0,30,8,0.0900,1500.000,0.37
base,softmax,float32,65536x1024,32,128,1,164,3,0.1600,3360.000,0.82
here,build of op 3 failed: x.cu(1): error: boom
"""


def test_table_of_today_fastest_and_base(tmp_path: Path) -> None:
    (tmp_path / "tune.csv").write_text(CSV)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_summary.py"), str(tmp_path / "tune.csv")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.stdout  # header, rule, one row per (op, dtype, shape)
    assert lines[2] == ("| softmax | float32 | 65536x1024 | 0.1500 (0.87) | 32/128/4 (128 regs, 4 blocks/SM) "
                        "| 0.1200 (1.08) | 1.25 | 0.1600 |")
    assert lines[3] == "| col_sums | bfloat16 | 8192x8192 | 0.0800 (0.41) | 2 chunks | 0.0800 (0.41) | 1.00 |  |"


def test_the_harness_marks_today_s_launch_shape(tmp_path: Path) -> None:
    # (a tree with rows::RowMinBlocks: 16-bit warp rows run 4 blocks per SM; the old rule would pick 32/128/1)
    (tmp_path / "tune.csv").write_text(
        "tree,op,dtype,shape,group,threads,min_blocks,registers,blocks_per_sm,ms,GB/s,share_of_copy,today\n"
        "here,softmax,bfloat16,65536x1024,32,128,1,140,3,0.1345,1995.862,0.51,0\n"
        "here,softmax,bfloat16,65536x1024,32,128,4,127,4,0.1170,2294.477,0.59,1\n"
        "base,softmax,bfloat16,65536x1024,32,128,1,96,5,0.1225,2191.954,0.56,\n")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_summary.py"), str(tmp_path / "tune.csv")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2] == ("| softmax | bfloat16 | 65536x1024 | 0.1170 (0.59) | 32/128/4 (127 regs, "
                                        "4 blocks/SM) | 0.1170 (0.59) | 1.00 | 0.1225 |")
