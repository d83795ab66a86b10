"""The 16-bit float conversions of CUDA kernels against the CPU's (src/runtime/dtype.h): device code
converts with the hardware's instructions (through cuda_fp16.h / cuda_bf16.h), host code with bit
manipulation; the two must give the same bits for every input, or a cuda kernel would round
differently from the same op's cpu kernel. Compiles tests/fixtures/cuda_conversions/check.cu with
the CUDA toolkit the cuda wheel builds with (no GPU needed: the headers' host versions of the
intrinsics compute what the instructions do) and checks every float and every half."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _nvcc() -> Path:
    spec = importlib.util.spec_from_file_location("_opforge_cuda_toolkit_conv", ROOT / "pkg" / "opforge" / "_cuda_toolkit.py")
    assert spec is not None and spec.loader is not None
    toolkit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = toolkit
    spec.loader.exec_module(toolkit)
    try:
        return Path(toolkit.find().nvcc)
    except toolkit.ToolkitError as e:  # (its message says where it looked)
        pytest.skip(f"no CUDA toolkit to compile the conversion check: {e}")


@pytest.mark.slow
def test_host_and_device_conversions_agree_on_every_input(tmp_path: Path) -> None:
    nvcc = _nvcc()
    exe = tmp_path / "check"
    build = subprocess.run([str(nvcc), "-O2", "-std=c++17", f"-I{ROOT / 'src'}", "-o", str(exe),
                            str(ROOT / "tests" / "fixtures" / "cuda_conversions" / "check.cu")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout
    assert "mismatches: float to half 0, float to bfloat16 0, half to float 0" in run.stdout
