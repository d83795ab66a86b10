"""benchmarks/cuda_breakdown.py (tools/gpu_run.sh breakdown): the busy-time arithmetic, and a run on
the CPU, where its tables list the ops each side calls per step (the GPU run lists kernels)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cuda_breakdown.py"

pytest.importorskip("torch", reason="benchmarks/cuda_breakdown.py profiles through torch (not installed)")


def test_union_of_spans() -> None:
    spec = importlib.util.spec_from_file_location("cuda_breakdown", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.union_us([]) == 0
    assert mod.union_us([(0, 10), (5, 15), (20, 25)]) == 20  # overlap counted once, the gap not at all
    assert mod.union_us([(20, 25), (0, 30), (1, 2)]) == 30   # spans inside another, any order


def test_cpu_tables_name_each_sides_ops(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.md"
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--steps", "1",
                        "--cases", "cross_entropy,layer_norm_bf16_8192x8192", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    ce, ln = text.split("### cross_entropy")[1].split("### layer_norm_bf16_8192x8192")
    # one forward and one backward op per step through opforge.torch, torch's own ops on the other side
    assert "| opforge::cross_entropy | 1 |" in ce and "| opforge::cross_entropy_backward | 1 |" in ce
    assert "aten::nll_loss" in ce and "opforge::" not in ce.split("torch: each op")[1]
    # layer_norm's backward: dx, the weight's and the bias's gradients (three ops, one pass each)
    for op in ("layer_norm", "layer_norm_backward", "norm_weight_grad", "sum_to_like"):
        assert f"| opforge::{op} |" in ln, ln
    assert "| opforge | " in ln and "| torch | " in ln
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "nope"], check=True,
                       capture_output=True, text=True, timeout=300)
