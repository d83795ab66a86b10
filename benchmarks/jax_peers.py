"""The peer of opforge.jax in the benchmark: a hand-written ``jax.ffi`` op (its handler in
benchmarks/jax_peers.cpp, compiled here with g++ against the installed jaxlib's FFI headers and
opforge's library) calling opforge's mul kernel, as a JAX user would write one op by hand."""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jax

from opforge import _build_info, _native

SOURCE = Path(__file__).with_name("jax_peers.cpp")


def build() -> Path:
    flags = [f"-std={_build_info.CXX_STD}", "-O2", "-shared", "-fPIC", f"-isystem{jax.ffi.include_dir()}",
             *(f"-I{d}" for d in _native.include_dirs()), f"-L{_native.library_dir()}", "-l:libopforge.so",
             f"-Wl,-rpath,{_native.library_dir()}"]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    lib = Path(tempfile.gettempdir()) / f"opforge_jax_peers_{digest}.so"
    if not lib.exists():
        tmp = lib.with_suffix(".tmp.so")
        subprocess.run(["g++", str(SOURCE), "-o", str(tmp), *flags], check=True)
        tmp.replace(lib)
    return lib


_LIB = ctypes.cdll.LoadLibrary(str(build()))
jax.ffi.register_ffi_target("opforge_peer_mul", jax.ffi.pycapsule(_LIB.PeerMulF32), platform="cpu")


def mul(x: Any, y: Any) -> Any:
    return jax.ffi.ffi_call("opforge_peer_mul", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
