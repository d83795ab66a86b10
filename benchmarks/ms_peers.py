"""The peers of opforge.mindspore in the benchmark: hand-written aot ``ops.Custom`` ops
(kernels in benchmarks/ms_peers.cpp, compiled here with g++), each with its reg_info and bprop
written by hand, as MindSpore's custom-operator documents show."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

from mindspore import ops
from mindspore.ops import CustomRegOp, DataType

SOURCE = Path(__file__).with_name("ms_peers.cpp")


def build() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    lib = Path(tempfile.gettempdir()) / f"opforge_ms_peers_{digest}.so"
    if not lib.exists():
        tmp = lib.with_suffix(".tmp.so")
        subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=0",
                        "-o", str(tmp), str(SOURCE)], check=True)
        tmp.replace(lib)
    return lib


LIB = build()

_mul_reg = (CustomRegOp().input(0, "x").input(1, "y").output(0, "z")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .target("CPU").get_op_info())
_mul_raw = ops.Custom(f"{LIB}:mul_f32", out_shape=lambda x, y: x, out_dtype=lambda x, y: x, func_type="aot",
                      reg_info=_mul_reg)


def _mul_bprop(x, y, out, dout):
    return _mul_raw(dout, y), _mul_raw(dout, x)


def _make_mul() -> ops.Custom:
    return ops.Custom(f"{LIB}:mul_f32", out_shape=lambda x, y: x, out_dtype=lambda x, y: x, func_type="aot",
                      reg_info=_mul_reg, bprop=_mul_bprop)


mul = _make_mul()

_lrelu_reg = (CustomRegOp().input(0, "x").output(0, "y")
              .dtype_format(DataType.F32_Default, DataType.F32_Default).target("CPU").get_op_info())


def _lrelu_bprop(x, out, dout):
    return (ops.where(x > 0, dout, dout * 0.01),)


def _make_leaky_relu() -> ops.Custom:
    return ops.Custom(f"{LIB}:leaky_relu_f32", out_shape=lambda x: x, out_dtype=lambda x: x, func_type="aot",
                      reg_info=_lrelu_reg, bprop=_lrelu_bprop)


leaky_relu = _make_leaky_relu()

# Second instances of the same hand-written ops: the A/A control of the benchmark (timed in the
# same rounds as the first, their ratio shows how far two identical primitives' times differ in
# one run: the noise floor of the opforge/aot Custom ratios).
mul_twin = _make_mul()
leaky_relu_twin = _make_leaky_relu()
