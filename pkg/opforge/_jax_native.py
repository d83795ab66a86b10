"""opforge.jax's XLA FFI handler: ``include/jax_native/jax_native.cpp`` compiled on first use
against the installed jaxlib's FFI headers, cached, and imported.

XLA calls a custom call's handler through its typed FFI, a versioned C ABI whose headers jaxlib
ships (``jax.ffi.include_dir()``); the handler links no part of jaxlib, only libopforge.so. The
headers are used from the installed jaxlib, never copied into opforge, so the build happens on
the user's machine: cached under opforge's JIT cache (``_native_ext``), keyed by jaxlib's version
and location, opforge's library, the compiler and the source. The first use of opforge.jax on a
machine compiles it (a few seconds); later imports load it. Unlike opforge.torch, opforge.jax has
no Python fallback: a failed build raises ImportError naming the compiler's log.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from opforge import _build_info, _formulas, _native
from opforge._native_ext import Extension

__all__ = ["load", "SOURCE", "MODULE"]

MODULE = "opforge_jax_native"
SOURCE = _native.PACKAGE_DIR / "include" / "jax_native" / "jax_native.cpp"
_EXTENSION = Extension(MODULE, SOURCE, ".jax_native", "opforge.jax's FFI handler")


def _flags() -> tuple[list[str], list[str]]:
    """Compile and link flags: XLA's FFI headers as system headers (under -Wall they warn about
    themselves), opforge's and Python's headers, libopforge.so."""
    import jax

    cflags = [f"-std={_build_info.CXX_STD}", "-O2", "-fPIC", "-DNDEBUG", "-fvisibility=hidden",
              "-Wall", "-Wextra", f"-isystem{jax.ffi.include_dir()}", *(f"-I{d}" for d in _native.include_dirs())]
    if "cuda" in _formulas.BUILT_TARGETS:  # (the cu130 wheel: a handler on XLA's CUDA stream too)
        cflags.append("-DOPFORGE_JAX_CUDA")
    lib = _native.library_dir()
    ldflags = ["-shared", f"-L{lib}", "-l:libopforge.so", f"-Wl,-rpath,{lib}"]
    return cflags, ldflags


def load() -> ModuleType:
    """The handler's module (built on first use); BuildError or ImportError when it cannot be."""
    import importlib.metadata

    import jaxlib

    cflags, ldflags = _flags()
    return _EXTENSION.load(cflags, ldflags, (importlib.metadata.version("jaxlib"), str(Path(jaxlib.__file__).parent)))
