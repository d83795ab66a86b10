"""The target table: one row per target an op may register kernels for, and what each build
compiles. Everything that differs between targets (where kernels live and how they are named, the
compiler, the names frameworks give the device) is read from here, by codegen, by the build
(tools/version.py, meson through ``python -m codegen``) and, through the generated op table
(``_formulas.py``'s ``TARGETS``), by the Python package and its adapters.

Pure data (standard library only): tools/version.py loads this file on its own, before meson can
read options.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping


class Backend(StrEnum):
    """A target an op may register kernels for (a key of a spec's ``targets``)."""

    CPU = "cpu"
    CUDA = "cuda"
    ASCEND = "ascend"


@dataclass(frozen=True)
class TargetRow:
    name: Backend
    compiled: bool              # this project can build kernels for it (ascend: registration rows only)
    kernel_dir: str             # hand-written kernels of cpp ops: <kernel_dir>/<op><kernel_suffix>
    kernel_suffix: str
    namespace: str              # C++ namespace of its kernels, under opforge::
    macro_suffix: str           # OPFORGE_INSTANTIATE_<OP>_<macro_suffix>
    compiler: str               # meson language of its sources
    device_type: str            # Tensor.device's prefix and torch's device type
    torch_dispatch_key: str
    mindspore_target: str       # MindSpore's name of the device (CustomRegOp.target, op_info)
    dlpack_device_type: int     # DLPack's DLDeviceType (kDLCPU 1, kDLCUDA 2, kDLExtDev 12)

    def kernel_path(self, op: str) -> str:
        """The kernel file of a cpp op, relative to its project's root."""
        return f"{self.kernel_dir}/{op}{self.kernel_suffix}"


TARGETS: Mapping[Backend, TargetRow] = {
    Backend.CPU: TargetRow(Backend.CPU, True, "src/kernels/cpu", ".cpp", "kernels::cpu", "CPU", "cpp",
                           "cpu", "CPU", "CPU", 1),
    Backend.CUDA: TargetRow(Backend.CUDA, True, "src/kernels/cuda", ".cu", "kernels::cuda", "CUDA", "cuda",
                            "cuda", "CUDA", "GPU", 2),
    Backend.ASCEND: TargetRow(Backend.ASCEND, False, "src/kernels/ascend", ".cpp", "kernels::ascend", "ASCEND",
                              "cpp", "npu", "PrivateUse1", "Ascend", 12),
}


# The target every build compiles, and the rows of a spec without ``targets``.
HOST = Backend.CPU


@dataclass(frozen=True)
class Build:
    """What a wheel of one backend (meson's ``ops_backend``) compiles, and what it needs from PyPI."""

    backend: str
    wheel_label: str                 # the local version label: opforge-0.1.0+<label>
    targets: tuple[Backend, ...]     # targets whose kernels it contains (HOST first)
    available: bool                  # this project can build it today
    build_requires: tuple[str, ...] = ()    # added to the wheel build's requirements (tools/opforge_build.py)
    runtime_requires: tuple[str, ...] = ()  # added to the wheel's Requires-Dist
    runtime_libs: tuple[str, ...] = ()      # "package:path" of the shared libraries of those packages
                                            # that the extension links (opforge/__init__.py preloads
                                            # them from the package's folders, as torch does)
    device_kernels: bool = True             # its device targets' kernels are compiled (op modules
                                            # built against it compile host kernels only: their aot
                                            # and composite ops still run on its devices)


# The CUDA 13.0 toolkit as NVIDIA publishes it on PyPI (all install into site-packages/nvidia/cu13/):
# the meta package pins each component to 13.0.2's, the way torch's cu130 wheels depend on it
# (cublas: nvidia-cublas 13.1.0.3, whose wheel carries cublas_v2.h/cublasLt.h and the libraries).
# The runtime and cuBLAS are pinned to the CUDA major only, so torch's exact pins satisfy them.
# (libcublasLt before libcublas, which needs it.)
BUILDS: Mapping[str, Build] = {
    "cpu": Build("cpu", "cpu", (Backend.CPU,), True),
    "cuda": Build("cuda", "cu130", (Backend.CPU, Backend.CUDA), True,
                  build_requires=("cuda-toolkit[nvcc,crt,nvvm,cudart,cccl,cublas]==13.0.2",),
                  runtime_requires=("nvidia-cuda-runtime~=13.0", "nvidia-cublas~=13.0"),
                  runtime_libs=("nvidia.cu13:lib/libcudart.so.13", "nvidia.cu13:lib/libcublasLt.so.13",
                                "nvidia.cu13:lib/libcublas.so.13")),
}
