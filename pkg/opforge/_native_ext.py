"""A framework adapter's native extension: one C++ file of the wheel compiled on first use against
the framework installed beside opforge, cached, and imported (opforge.torch's kernels,
``_torch_native``; opforge.jax's FFI handler, ``_jax_native``).

The build is cached under opforge's JIT cache (``opforge.jit.default_cache_dir()``, with its
checks: a private directory, a lock between processes, a manifest of digests), in
``.<home>/<key>`` where the key digests everything the binary depends on (the framework's version
and location, opforge's library, the compiler, the flags and the source). A build that failed is
remembered as ``<key>.failed`` so that every process does not try it again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

from opforge import _build_info, _native, jit


class Extension:
    """One adapter's extension: its module name, source, and what the framework adds to the key."""

    def __init__(self, module: str, source: Path, home: str, what: str) -> None:
        self.module = module
        self.source = source
        self.home = home    # the cache's subdirectory (.torch_native)
        self.what = what    # for lock messages: "opforge.torch's native kernels"
        self.file = module + _native.extension_suffix()

    def key(self, cxx: tuple[str, ...], cflags: Sequence[str], ldflags: Sequence[str], parts: Sequence[str]) -> str:
        h = hashlib.sha256()
        for part in ("1", *parts, sys.version, _build_info.VERSION, jit._library_id(), " ".join(cxx),
                     _native.compiler_version(cxx), "\0".join(cflags), "\0".join(ldflags)):
            h.update(part.encode() + b"\0\0")
        h.update(self.source.read_bytes())
        return h.hexdigest()[:16]

    def _build(self, cxx: tuple[str, ...], cflags: Sequence[str], ldflags: Sequence[str], home: Path,
               entry: Path) -> None:
        build = jit._private_dir(home / "build")
        out = build / self.file
        r = subprocess.run([*cxx, *cflags, str(self.source), "-o", str(out), *ldflags], capture_output=True,
                           text=True, check=False)
        if r.returncode != 0:
            log = build / "build.log"
            log.write_text(r.stdout + r.stderr)
            raise _native.BuildError(f"compiling {self.source.name} failed (the compiler's output: {log})")
        jit._write_entry(entry, {self.file: out})

    def _import(self, path: Path) -> ModuleType:
        spec = importlib.util.spec_from_file_location(self.module, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def load(self, cflags: Sequence[str], ldflags: Sequence[str], parts: Sequence[str]) -> ModuleType:
        """The extension built with these flags (cached by a key over them and ``parts``, the
        framework's identity), imported; BuildError / ImportError when it cannot be."""
        cxx = tuple(_native.compiler())
        _native.check_toolchain(cxx)
        root = jit.default_cache_dir()
        jit._private_dir(root)
        home = jit._private_dir(root / self.home)
        key = self.key(cxx, cflags, ldflags, parts)
        entry, failed = home / key, home / f"{key}.failed"
        target = entry / self.file
        if failed.exists():  # (this framework, compiler and source failed before: not tried in every process)
            raise _native.BuildError(f"{failed.read_text().strip()} (remove {failed} to try again)")
        built = False
        if jit._entry_problem(entry, target) is not None:
            with jit._locked(home / ".lock", self.what, False):
                problem = jit._manifest_problem(entry / jit._MANIFEST, [self.file]) if entry.exists() else jit._MISSING
                if problem is not None:
                    jit._clean(home)
                    if entry.exists():
                        jit._remove(home, entry)
                    try:
                        self._build(cxx, cflags, ldflags, home, entry)
                    except _native.BuildError as exc:
                        jit._replace_text(failed, str(exc) + "\n")
                        raise
                    built = True
        try:
            return self._import(target)
        except ImportError as exc:
            with jit._locked(home / ".lock", self.what, False):
                if entry.exists():
                    jit._remove(home, entry)
                if built:  # (a cached one that does not import is built again by the next process)
                    jit._replace_text(failed, f"the module built does not import: {exc}\n")
            raise
