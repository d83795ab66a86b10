"""opforge.torch's native kernels: ``include/torch_native/torch_native.cpp`` compiled against the
installed torch on first use, cached, and imported.

A torch operator's kernels run behind torch's C++ dispatcher; a Python kernel there costs a
Python call (and the DLPack exchange) per op call. This module builds a small extension that
registers opforge's ops as C++ kernels (the CPU kernel calls the op's opforge entry directly, the
Autograd kernel records a C++ graph node whose backward evaluates the spec's bprop formula). C++
has no stable ABI across torch releases, and the kernels use torch's C++ API (autograd nodes and
saved variables are not in the stable ABI, ``torch/csrc/stable``): the extension is built for the
torch it runs with, cached under opforge's JIT cache (``opforge.jit.default_cache_dir()``, with its
checks: a private directory, a lock between processes, a manifest of digests) and keyed by torch's
version and location, opforge's library, the compiler and the source. The first import of
opforge.torch on a machine compiles it (about 30 s); later imports load it.

If it cannot be built or loaded (no compiler, a torch without its headers, a C++ ABI that differs
from opforge's), ``load()`` returns None after one warning, and opforge.torch registers its Python
kernels instead (same results, more time per call). ``OPFORGE_TORCH_NATIVE=0`` asks for the
Python kernels without trying.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

from opforge import _native
from opforge._native_ext import Extension

__all__ = ["load", "SOURCE", "MODULE"]

MODULE = "opforge_torch_native"
SOURCE = _native.PACKAGE_DIR / "include" / "torch_native" / "torch_native.cpp"
_EXTENSION = Extension(MODULE, SOURCE, ".torch_native", "opforge.torch's native kernels")
_module: Optional[ModuleType] = None
_tried = False


def _torch_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for torch's C++ API (torch's headers ask for C++20)."""
    import torch
    from torch.utils import cpp_extension

    lib = cpp_extension.library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cflags = ["-std=c++20", "-O2", "-fPIC", "-DNDEBUG", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
              "-w", *(f"-isystem{d}" for d in cpp_extension.include_paths()),
              *(f"-I{d}" for d in _native.include_dirs())]
    ldflags = ["-shared", f"-L{lib}", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10", f"-Wl,-rpath,{lib}",
               f"-L{_native.library_dir()}", "-l:libopforge.so", f"-Wl,-rpath,{_native.library_dir()}"]
    return cflags, ldflags


def _load() -> ModuleType:
    import torch

    if int(torch._C._GLIBCXX_USE_CXX11_ABI) != 1:
        raise _native.BuildError("this torch uses the pre-C++11 string ABI; opforge's library uses the C++11 one")
    cflags, ldflags = _torch_flags()
    return _EXTENSION.load(cflags, ldflags, (torch.__version__, str(Path(torch.__file__).parent)))


def load() -> Optional[ModuleType]:
    """The native kernels' module (built on first use), or None, after one warning, when it cannot
    be built or loaded, or when ``OPFORGE_TORCH_NATIVE=0``."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("OPFORGE_TORCH_NATIVE", "1") == "0":
        return None
    try:
        _module = _load()
    except Exception as exc:  # (BuildError, OSError, ImportError: the Python kernels still work)
        warnings.warn(f"opforge.torch: native kernels unavailable ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                      "using the Python kernels (slower per call). Set OPFORGE_TORCH_NATIVE=0 to skip the attempt.",
                      RuntimeWarning, stacklevel=3)
    return _module
