"""The 16-bit float conversions of CUDA kernels against the CPU's (src/runtime/dtype.h): device code
converts with the hardware's instructions (through cuda_fp16.h / cuda_bf16.h), host code with bit
manipulation; the two must give the same bits for every input (NaN payloads aside), or a cuda
kernel would round differently from the same op's cpu kernel. Without a GPU: compiles
tests/fixtures/cuda_conversions/check.cu with the CUDA toolkit the cuda wheel builds with (the
headers' host versions of the intrinsics compute what the instructions do) and checks every float
and every half. With one: casts on the device against casts on the cpu."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge
import opforge.cuda

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


def _floats(rng: np.random.Generator, low_bits: int, n: int = 1 << 21) -> np.ndarray:
    """float32s of every kind: random bit patterns (NaNs, infinities, subnormals among them),
    exact halfway cases of the narrowing (the dropped low bits exactly half an ulp, both parities of
    the kept ones) and the edges: zeros, infinities, float16's largest, its overflow boundary and
    its subnormals' halfway points."""
    random = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    ties = (random & ~np.uint32((1 << low_bits) - 1)) | np.uint32(1 << (low_bits - 1))
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.996, 65520.0, -65520.0, 2.0 ** -24, 2.0 ** -25,
                      3 * 2.0 ** -26, 2.0 ** -14, np.nan, -np.nan], np.float32).view(np.uint32)
    return np.concatenate([random, ties, ties ^ np.uint32(1 << low_bits), edges]).view(np.float32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = got.view(np.uint32 if got.dtype == np.float32 else np.uint16)
    ref = want.view(bits.dtype)
    bad = np.flatnonzero((bits != ref) & ~nan)
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[:5]}: {got[bad[:5]]} != {want[bad[:5]]}"


cuda_only = pytest.mark.skipif(not opforge.cuda.is_available(),
                               reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")


@cuda_only
@pytest.mark.parametrize("dtype,low_bits", [("float16", 13), ("bfloat16", 16)])
def test_device_casts_give_the_cpus_bits(dtype: str, low_bits: int) -> None:
    # narrowing on each device, then widening (exact) back to float32 on the cpu: the same bits
    x = _floats(np.random.default_rng(0), low_bits)
    want = opforge.tensor(x).astype(dtype).astype("float32").numpy()
    got = opforge.tensor(x, device="cuda").astype(dtype).cpu().astype("float32").numpy()
    _same_bits(got, want)


@cuda_only
def test_device_widens_every_half_as_the_cpu() -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    want = opforge.tensor(h).astype("float32").numpy()
    got = opforge.tensor(h, device="cuda").astype("float32").cpu().numpy()
    _same_bits(got, want)
    np.testing.assert_array_equal(np.isnan(want), np.isnan(h))
    np.testing.assert_array_equal(want[~np.isnan(h)], h[~np.isnan(h)].astype(np.float32))  # (the cpu: exact)


@cuda_only
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("dst", ["uint8", "int8", "int16", "int32", "int64"])
def test_device_float_to_integer_gives_the_cpus_values(src: str, dst: str) -> None:
    # truncated, saturated at the integer's bounds, NaN 0 on both (runtime/dtype.h's saturate_cast;
    # the device's conversion instructions saturate by themselves); tests/runtime/test_tensor.py
    # checks the cpu's against Python's int()
    edges = [0.0, -0.0, 2.9, -2.9, -0.9, 127.9, 128.0, -129.0, 255.9, 256.0, 300.7, 32768.0, 65504.0,
             2.0**31, -(2.0**31) - 256, 2.0**40, 2.0**63, -(2.0**63), 1e30, -1e30, np.inf, -np.inf, np.nan]
    x = np.concatenate([edges, np.random.default_rng(1).standard_normal(4099) * 1e6])
    host = opforge.tensor(x).astype(src)
    want = host.astype(dst).numpy()
    got = host.to("cuda").astype(dst).cpu().numpy()
    np.testing.assert_array_equal(got, want)
