"""benchmarks/cuda_breakdown.py (tools/gpu_run.sh breakdown): the busy-time arithmetic, and a run on
the CPU, where its tables list the ops each side calls per step (the GPU run lists kernels)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cuda_breakdown.py"

pytest.importorskip("torch", reason="benchmarks/cuda_breakdown.py profiles through torch (not installed)")


def load() -> Any:
    spec = importlib.util.spec_from_file_location("cuda_breakdown", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_union_of_spans() -> None:
    mod = load()
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
    # layer_norm's backward: dx, the weight's and the bias's gradients in one op, called by the autograd
    # node opforge::layer_norm.backward (its own row where the native kernel runs)
    for op in ("layer_norm", "layer_norm_affine_backward"):
        assert f"| opforge::{op} |" in ln, ln
    for op in ("layer_norm_backward", "norm_affine_grad", "norm_weight_grad", "sum_to_like"):
        assert f"opforge::{op} " not in ln, ln
    assert "| opforge | " in ln and "| torch | " in ln
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "nope"], check=True,
                       capture_output=True, text=True, timeout=300)


def test_gpu_events_give_busy_time_syncs_and_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU branch on events as torch.profiler gives them with CUPTI (no GPU here): kernels on the
    # device, runtime calls on the host, the step's range on both sides, the optimizer's annotation
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    mod = load()
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        FunctionEvent(1, mod.MARK, 1, 0, 100, device_type=cpu, is_user_annotation=True),
        FunctionEvent(2, mod.MARK, 1, 5, 95, device_type=gpu, is_user_annotation=True),
        FunctionEvent(3, "cudaLaunchKernel", 1, 10, 12, device_type=cpu),
        FunctionEvent(4, "cudaStreamSynchronize", 1, 50, 60, device_type=cpu),   # inside the step
        FunctionEvent(5, "cudaDeviceSynchronize", 1, 150, 160, device_type=cpu),  # the profiler's, after it
        FunctionEvent(6, "k1", 7, 20, 40, device_type=gpu),
        FunctionEvent(7, "k2", 7, 30, 50, device_type=gpu),                        # overlaps k1: busy 30 us
        FunctionEvent(8, "Optimizer.step#SGD.step", 7, 20, 90, device_type=gpu, is_user_annotation=True),
    ]

    class Profile:
        def __init__(self, **kw: Any) -> None:
            pass

        def __enter__(self) -> Profile:
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

        def events(self) -> list[Any]:
            return events

    monkeypatch.setattr(mod, "profile", Profile)
    r = mod.measure(lambda: None, lambda: None, True, 1)
    assert r["syncs"] == 1 and r["busy"] == pytest.approx(0.030)
    assert r["kernels"] == {"k1": (1, 20.0), "k2": (1, 20.0)}
    lines = "\n".join(mod.report("case", r, r, True, 12))
    assert "| k1 | 1 | 20.0 | 50% |" in lines
    events[:] = [e for e in events if e.device_type == cpu]  # no device events: an error, not empty tables
    with pytest.raises(RuntimeError, match="no device events"):
        mod.measure(lambda: None, lambda: None, True, 1)
