"""AOT entry points on CUDA (seed 004's GPU form): MindSpore's AOT C ABI called with device
buffers and a stream, as MindSpore's GPU build calls it; and an op of impl kind ``aot`` whose
external kernel is a CUDA function (built here with nvcc) run on CUDA tensors. Skipped without a
CUDA device for opforge and torch (torch.cuda provides the host's buffers and stream)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge  # noqa: E402
import opforge.cuda  # noqa: E402

pytestmark = pytest.mark.skipif(not (opforge.cuda.is_available() and torch.cuda.is_available()),
                                reason="no CUDA device for opforge and torch: "
                                       f"{opforge.cuda.unavailable_reason() or 'torch has no CUDA'}")

LIB = ctypes.CDLL(opforge.LIBRARY)
_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64", torch.float16: "float16"}


def call_entry(symbol: str, tensors: list[Any], stream: int) -> int:
    """Calls an entry point with the tensors' buffers (inputs, then outputs) and a stream."""
    n = len(tensors)
    params = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
    ndims = (ctypes.c_int * n)(*[t.dim() for t in tensors])
    keep = [(ctypes.c_int64 * max(t.dim(), 1))(*t.shape) for t in tensors]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in keep])
    dtypes = (ctypes.c_char_p * n)(*[_NAMES[t.dtype].encode() for t in tensors])
    fn = getattr(LIB, symbol)
    fn.restype = ctypes.c_int
    return fn(n, params, ndims, shapes, dtypes, ctypes.c_void_p(stream or None), None)


def test_entry_points_take_device_buffers_and_queue_on_the_stream() -> None:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.randn(1 << 20, device="cuda")
        b = torch.randn(1 << 20, device="cuda")
        out = torch.empty_like(a)
        assert call_entry("opforge_mul", [a, b, out], s.cuda_stream) == 0
        total = out.sum()  # queued after the op on s: sees its result without a host wait
    s.synchronize()
    torch.testing.assert_close(out, a * b)
    torch.testing.assert_close(total, (a * b).sum())
    x = torch.randn(8, 33, device="cuda", dtype=torch.float64)
    values, indices = torch.empty(8, device="cuda", dtype=torch.float64), torch.empty(8, device="cuda",
                                                                                      dtype=torch.int64)
    assert call_entry("opforge_max", [x, values, indices], 0) == 0  # the legacy default stream
    torch.cuda.synchronize()
    want = x.max(dim=1)
    torch.testing.assert_close(values, want.values)
    torch.testing.assert_close(indices, want.indices)


def test_entry_point_errors_on_device(capfd) -> None:  # type: ignore[no-untyped-def]
    a = torch.ones(4, device="cuda")
    assert call_entry("opforge_mul", [a, torch.ones(4), torch.empty(4, device="cuda")], 0) == 2
    assert "buffers must all be on one device" in capfd.readouterr().err
    m = torch.ones(2, 2, device="cuda")  # (leaky_relu_ext's kernel is a host library's: no cuda rows)
    assert call_entry("opforge_leaky_relu_ext", [m, torch.empty(2, 2, device="cuda")], 0) == 4  # RuntimeError
    assert "[leaky_relu_ext] has no kernel for target cuda" in capfd.readouterr().err


CUDA_KERNEL = r"""
#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>

__global__ void leaky(const float* x, float* y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.01f * x[i];
}

extern "C" __attribute__((visibility("default"))) int leaky_relu_ext(int nparam, void** params, int* ndims,
    int64_t** shapes, const char** dtypes, void* stream, void* extra) {
  if (nparam != 2 || std::strcmp(dtypes[0], "float32") != 0) return 2;
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  if (n) leaky<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(params[0]), static_cast<float*>(params[1]), n);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""


def test_aot_op_with_a_cuda_kernel_runs_on_cuda_tensors(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("no nvcc to build the external CUDA kernel")
    src = tmp_path / "leaky.cu"
    src.write_text(CUDA_KERNEL)
    lib = tmp_path / "libleaky_cuda.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(src)], check=True)
    spec = tmp_path / "leaky_relu_cuda.yaml"
    spec.write_text(f"""leaky_relu_cuda:
  doc: LeakyRelu (slope 0.01) by an external CUDA kernel.
  inputs:
    x: T
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32]
  targets:
    cuda: {{}}
  impl:
    aot: {{library: {lib}, symbol: leaky_relu_ext}}
  bprop:
    x: where(x > 0, dout, 0.01 * dout)
""")
    mod = opforge.load("leaky_relu_cuda_mod", [spec], build_dir=tmp_path / "cache")
    x = torch.randn(1000, device="cuda")
    got = mod.leaky_relu_cuda(opforge.from_dlpack(x))
    assert got.device == "cuda:0"
    torch.testing.assert_close(torch.from_dlpack(got), torch.nn.functional.leaky_relu(x, 0.01))
    xo = opforge.from_dlpack(x.clone())
    xo.requires_grad = True
    opforge.ops.sum(mod.leaky_relu_cuda(xo)).backward()  # the spec's bprop, on the device
    torch.testing.assert_close(torch.from_dlpack(xo.grad), torch.where(x > 0, 1.0, 0.01))
