"""How an op module is compiled against this opforge: include paths, flags and the check that
the compiler is the one libopforge.so was built with.

An op module (``opforge.load``, a package made by ``opforge init``) is a Python extension that
links libopforge.so and includes its headers (``opforge/include``): its ops share opforge's
Tensor, registry and autograd. C++ has no stable ABI, so the module must be compiled by the same
compiler family with the same standard. It needs no pybind11: its generated code exports plain
entries (``runtime/binding.h``) that libopforge.so's Python face binds, and its PyInit uses
Python's C API only.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import subprocess
import sysconfig
from pathlib import Path

from opforge import _build_info

PACKAGE_DIR = Path(__file__).absolute().parent  # (not resolved: a dev tree links files into it)

#: Compile flags of every op module TU (those of opforge's own ops: -O3, OpenMP, no errno).
CXXFLAGS = (
    f"-std={_build_info.CXX_STD}", "-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-DNDEBUG",
    "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall", "-Wno-unused-parameter", "-Wno-attributes",
)


class BuildError(RuntimeError):
    """Compiling or linking an op module failed (the compiler's output is in the message)."""


def compiler() -> list[str]:
    """The C++ compiler command: $CXX, else c++."""
    return shlex.split(os.environ.get("CXX", "c++"))


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: tuple[str, ...]) -> str:
    """The compiler's ``--version`` banner (part of every cache key); BuildError if it won't run."""
    try:
        r = subprocess.run([*cxx, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"cannot run the C++ compiler '{' '.join(cxx)}': {exc.strerror}; "
                         "install g++ or set CXX") from None
    if r.returncode != 0:
        raise BuildError(f"'{' '.join(cxx)} --version' failed: {r.stderr.strip()}")
    return r.stdout.strip()


def check_toolchain(cxx: tuple[str, ...]) -> None:
    """BuildError unless cxx is of the compiler family libopforge.so was built with."""
    banner = compiler_version(cxx).lower()
    # how each family's --version banner names it (GCC's may say only "c++ (Debian 12.2.0...)")
    marks = {"gcc": ("g++", "gcc", "free software foundation"), "clang": ("clang",)}
    if not any(m in banner for m in marks.get(_build_info.CXX_ID, (_build_info.CXX_ID,))):
        raise BuildError(f"opforge was built with {_build_info.CXX_ID} {_build_info.CXX_VERSION}; "
                         f"'{' '.join(cxx)}' is another compiler ({banner.splitlines()[0]}): set CXX to a "
                         f"{_build_info.CXX_ID} C++ compiler")


def include_dirs() -> list[str]:
    """Where an op module's headers come from: the runtime's and opforge's generated op headers
    (formulas may call any of opforge's ops) and Python's (for the module's PyInit)."""
    inc = PACKAGE_DIR / "include"
    return [str(inc), str(inc / "ops"), sysconfig.get_paths()["include"]]


def library_dir() -> str:
    return str(PACKAGE_DIR)


def ldflags() -> list[str]:
    """Link flags of an op module: libopforge.so (found by its soname once opforge is imported,
    and by rpath otherwise), OpenMP, and the module's own calls bound inside it."""
    lib = library_dir()
    return ["-shared", "-fopenmp", f"-L{lib}", "-l:libopforge.so", f"-Wl,-rpath,{lib}", "-Wl,-Bsymbolic-functions"]


def cflags() -> list[str]:
    return [*CXXFLAGS, f"-DOPFORGE_ABI_ID={abi_id()}", *(f"-I{d}" for d in include_dirs())]


# (what an op module's compiled code depends on in opforge: the headers it includes; not the
# framework faces opforge compiles on first use itself)
_ABI_DIRS = ("runtime", "aot", "python", "ops")
_HEADER_SUFFIXES = (".h", ".cuh", ".inc", ".hpp")


@functools.lru_cache(maxsize=None)
def abi_id() -> str:
    """This opforge's ABI as an op module sees it: a digest of the headers under opforge/include
    that op modules compile against (the runtime's classes and inline functions, the generated
    ops' declarations) and of the build facts (version, backend, compiler, C++ standard, CUDA).
    An op module carries the id it was compiled with (``-DOPFORGE_ABI_ID``, in ``cflags()``), and
    importing it where the id differs is an ImportError: a package built against another build of
    opforge, with another layout of Tensor, would crash at its first call."""
    h = hashlib.sha256()
    for fact in (_build_info.VERSION, _build_info.BACKEND, _build_info.CXX_ID, _build_info.CXX_VERSION,
                 _build_info.CXX_STD, _build_info.CUDA_VERSION):
        h.update(fact.encode() + b"\0")
    inc = PACKAGE_DIR / "include"
    for top in _ABI_DIRS:
        found = []
        for folder, _, names in os.walk(inc / top, followlinks=True):  # (a dev tree links its folders)
            found += [Path(folder) / n for n in names if n.endswith(_HEADER_SUFFIXES)]
        for path in sorted(found, key=lambda f: f.relative_to(inc).as_posix()):
            h.update(path.relative_to(inc).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return "abi_" + h.hexdigest()[:24]


# ---- CUDA TUs of op modules in the cu130 wheel (nvcc from _cuda_toolkit.find())


def cuda_arch() -> str:
    """The architectures op modules' device code is built for: ``$OPFORGE_CUDA_ARCH``, else the
    wheel's own (meson's ``ops_cuda_arch``: ``8.0 9.0+PTX``), in that syntax."""
    return os.environ.get("OPFORGE_CUDA_ARCH") or _build_info.CUDA_ARCH


def cuda_arch_flags(arch: str) -> list[str]:
    """nvcc's -gencode flags for an architecture list (``8.0 9.0+PTX``: sm_80 and sm_90 code, and
    compute_90 PTX); ValueError naming the bad item."""
    flags = []
    for item in arch.replace(",", " ").split():
        ptx = item.endswith("+PTX")
        number = item[:-4] if ptx else item
        if not re.fullmatch(r"\d+\.\d+[af]?", number):
            raise ValueError(f"[load] CUDA architecture {item!r} is not of the form 9.0 or 9.0+PTX "
                             f"(from {arch!r}; set OPFORGE_CUDA_ARCH)")
        sm = number.replace(".", "")
        codes = f"[sm_{sm},compute_{sm}]" if ptx else f"sm_{sm}"
        flags.append(f"-gencode=arch=compute_{sm},code={codes}")
    if not flags:
        raise ValueError(f"[load] no CUDA architecture in {arch!r} (set OPFORGE_CUDA_ARCH)")
    return flags


#: nvcc flags of every op module's CUDA TU (those of opforge's own device code, meson.build's)
NVCCFLAGS = (
    f"-std={_build_info.CXX_STD}", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC,-fno-math-errno,-fvisibility=hidden,-fvisibility-inlines-hidden",
)


def cuda_flags(arch: str) -> list[str]:
    return [*NVCCFLAGS, *cuda_arch_flags(arch), *(f"-I{d}" for d in include_dirs())]


def cuda_ldflags(lib_dir: str, major: int) -> list[str]:
    """The CUDA runtime the module's device code calls: the same soname libopforge.so links (the
    copy opforge's import loaded from nvidia-cuda-runtime serves both at run time)."""
    return [f"-L{lib_dir}", f"-l:libcudart.so.{major}"]


def extension_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


#: The precompiled header of op module TUs: what every generated op TU includes.
PCH_TEXT = """// Precompiled header of op modules built against opforge (see opforge/_native.py).
#include "aot/aot.h"
#include "runtime/binding.h"
#include "runtime/runtime.h"
"""
