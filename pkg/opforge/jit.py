"""``opforge.load``: build a module of ops from spec files (and kernel sources) at run time.

The analogue of MindSpore's ``CustomOpBuilder(name, sources, backend).load()`` and PyTorch's
``cpp_extension.load``, for specs::

    m = opforge.load("myops", specs=["softplus.yaml"])
    y = m.softplus(x)          # an opforge Tensor; gradients flow through opforge's autograd

The module is built once and cached under ``<build_dir>/<name>/<key>/``, ``key`` being a hash of
the specs, the sources, opforge's version and library, the codegen, the compiler and the flags:

- unchanged inputs load from the cache without compiling (nor parsing a spec);
- a changed spec regenerates the module and recompiles only the translation units whose text
  (or included headers) changed: ninja, with the compiler's dependency files, decides;
- processes loading the same module at once take turns on a lock; each finished module is
  moved into place atomically, so nobody sees half of one;
- a failed build leaves nothing in the cache: the next load builds again;
- spec mistakes raise ``opforge.codegen.SpecError`` (``file:line:col: key: message``) before
  any compiler runs.

In the cu130 wheel (``backend="cuda"``) the ops' cuda rows run too: each ``expr`` op with cuda rows
gets its generated CUDA kernel and each ``cpp`` op with cuda rows takes its kernel file ``<op>.cu``
from ``sources``, compiled by nvcc (found as the wheel's build finds it, pkg/opforge/_cuda_toolkit.py:
``$OPFORGE_NVCC``, ``$CUDA_HOME``, the ``cuda-toolkit`` wheels, PATH) for the architectures of
``$OPFORGE_CUDA_ARCH``, else the wheel's own; nvcc's version and the architectures are part of the
key. Modules without cuda rows need no nvcc.

The cache root is ``build_dir``, else ``$OPFORGE_CACHE_DIR``, else ``~/.cache/opforge/jit``. What
every module shares, whatever its cache root (the runtime's precompiled header, opforge's parsed
specs), is kept once per installation, in ``opforge/_jit_cache/``, when this user can keep private
files there; else (a read-only or another user's installation) in the cache root.

Whoever can write the cache can run code in every process that loads from it, so the cache is
trusted only when it is private: each of its directories must belong to this user and be
writable by nobody else (new ones are made with mode 0o700), else ``PermissionError`` names the
directory and the fix. Each entry carries a manifest of its files' sizes and SHA-256 digests,
checked before anything is imported: an entry that does not match (a truncated or overwritten
module) or does not import is removed and built once more, with a ``RuntimeWarning``; if the new
one fails too, ``ImportError`` names it. Paths go into ``build.ninja`` escaped for ninja and, in
commands, quoted for the shell; a path with a line break is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import keyword
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union

from opforge import _build_info, _formulas, _native
from opforge._native import BuildError

__all__ = ["load", "BuildError", "default_cache_dir"]

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")
CPP_SUFFIXES = (".cpp", ".cc", ".cxx")
CUDA_SUFFIXES = (".cu",)
HEADER_SUFFIXES = (".h", ".hpp", ".inc", ".cuh")

_loaded: dict[Path, ModuleType] = {}


def default_cache_dir() -> Path:
    """``$OPFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opforge/jit`` (``~/.cache/opforge/jit``)."""
    env = os.environ.get("OPFORGE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opforge" / "jit"


def load(name: str, specs: Sequence[PathLike], sources: Sequence[PathLike] = (), backend: Optional[str] = None,
         build_dir: Optional[PathLike] = None, verbose: bool = False,
         extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = ()) -> ModuleType:
    """Generate, compile (if not cached) and import a module of ops; returns the module.

    Args:
        name: the module's name (a Python identifier); its ops are ``module.<op>``.
        specs: spec files (``<op>.yaml``) or directories of them.
        sources: C++ files: each ``cpp`` op's kernel, ``<op>.cpp`` (it includes ``"<op>.h"``,
            generated), and any helpers; with backend cuda, each cpp op with cuda rows's CUDA
            kernel ``<op>.cu`` too; headers listed here are not compiled but are part of the
            cache key, and their directories are on the include path.
        backend: the wheel backend to build for (default: this opforge's, ``opforge.backend``);
            must be the one this opforge was built for.
        build_dir: the cache root (default: ``default_cache_dir()``).
        verbose: print what is done, and the compiler's output as it runs.
        extra_cflags, extra_ldflags: more compiler and linker flags (part of the cache key).

    ``opforge.torch.register_module(module)`` makes its ops torch operators. The module's
    ``__opforge_formulas__`` is its op table; ``__opforge_build__`` says how it was obtained: ``key``, ``path``, ``built``
    (False: from the cache), ``compiled`` (the translation units compiled) and ``seconds``.
    """
    start = time.perf_counter()
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"[load] name must be a Python identifier (the module's name), got {name!r}")
    if backend is None:
        backend = _build_info.BACKEND
    if backend not in _formulas.BUILDS:
        raise ValueError(f"[load] unknown backend {backend!r}; one of: {', '.join(_formulas.BUILDS)}")
    if backend != _build_info.BACKEND:
        raise ValueError(f"[load] backend {backend!r} is not available: this opforge was built for "
                         f"{_build_info.BACKEND!r} (its ops run there)")
    spec_files = _files("specs", specs, expand=True)
    if not spec_files:
        raise ValueError(f"[load] no spec files in specs={list(map(str, specs))!r}")
    source_files = _files("sources", sources)
    seen: dict[tuple[str, str], Path] = {}
    for p in spec_files + [s for s in source_files if s.suffix in CPP_SUFFIXES + CUDA_SUFFIXES]:
        kind = "spec" if p.suffix in (".yaml", ".yml") else ("CUDA source" if p.suffix in CUDA_SUFFIXES else "source")
        if (kind, p.stem) in seen:
            raise ValueError(f"[load] two {kind}s named {p.stem!r}: {seen[(kind, p.stem)]} and {p}")
        seen[(kind, p.stem)] = p
    cxx = tuple(_native.compiler())
    includes = sorted({str(s.parent) for s in source_files})
    pch_cflags = [*_native.cflags(), *extra_cflags]
    cflags = [*_native.cflags(), *(f"-I{d}" for d in includes), *extra_cflags]
    ldflags = [*_native.ldflags(), *extra_ldflags]
    root = Path(build_dir) if build_dir is not None else default_cache_dir()
    for text in (str(root), *map(str, source_files), *cxx, *cflags, *ldflags):
        if "\n" in text or "\r" in text:
            raise ValueError(f"[load] {text!r} holds a line break: it cannot go into build.ninja (rename it)")
    cuda = _cuda_setup(backend)
    key = _cache_key(name, backend, spec_files, source_files, cxx, cflags, ldflags, cuda.key)

    home = root / name
    entry = home / key
    target = entry / (name + _native.extension_suffix())
    info: dict[str, Any] = {"key": key, "path": str(target), "built": False, "compiled": [], "seconds": 0.0}
    module = _loaded.get(target)
    if module is None:
        _private_dir(root)
        _private_dir(home)
        module = _cached_module(name, home, entry, target, info, verbose, lambda: _build(
            name, spec_files, source_files, cxx, cflags, pch_cflags, ldflags, cuda, root, home, entry, target,
            verbose))
    info["seconds"] = time.perf_counter() - start
    module.__opforge_build__ = info  # type: ignore[attr-defined]
    if verbose:
        how = f"built ({len(info['compiled'])} TU compiled)" if info["built"] else "loaded from the cache"
        print(f"[opforge.load] {name}: {how} in {info['seconds']:.2f} s: {target}", flush=True)
    return module


# ---------------------------------------------------------------------------- inputs and key


def _files(what: str, paths: Sequence[PathLike], expand: bool = False) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if expand and p.is_dir():
            out.extend(sorted(p.glob("*.yaml")))
        elif p.is_file():
            allowed = CPP_SUFFIXES + CUDA_SUFFIXES + HEADER_SUFFIXES
            if what == "sources" and p.suffix not in allowed:
                raise ValueError(f"[load] {p}: a source must be C++ or CUDA ({', '.join(allowed)})")
            out.append(p)
        else:
            raise FileNotFoundError(f"[load] {what}: {p}: no such file" + (" or directory" if expand else ""))
    return out


def _codegen_digest() -> str:
    """The codegen's own files (its output depends on them as much as on the specs)."""
    h = hashlib.sha256()
    base = _native.PACKAGE_DIR / "codegen"
    for p in sorted([*base.rglob("*.py"), *(base / "templates").glob("*.j2")]):
        h.update(p.relative_to(base).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _library_id() -> str:
    """libopforge.so's identity (size and mtime): a rebuilt opforge invalidates what was built on it."""
    st = (_native.PACKAGE_DIR / "libopforge.so").stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


class _Cuda:
    """How a module's CUDA TUs build in this backend: nvcc and its flags (``toolkit`` None: none
    found, or the backend has no cuda target; ``problem`` says which, for a module that needs it)."""

    def __init__(self, toolkit: Any, flags: list[str], ldflags: list[str], problem: str) -> None:
        self.toolkit, self.flags, self.ldflags, self.problem = toolkit, flags, ldflags, problem
        self.key = "\0".join([f"{toolkit.nvcc}:{toolkit.version}" if toolkit else problem, *flags, *ldflags])


def _cuda_setup(backend: str) -> _Cuda:
    if "cuda" not in _formulas.BUILDS[backend].targets:
        return _Cuda(None, [], [], f"the {backend} wheel has no cuda target")
    from opforge import _cuda_toolkit

    try:
        kit = _cuda_toolkit.find()
    except _cuda_toolkit.ToolkitError as exc:
        return _Cuda(None, [], [], str(exc))
    return _Cuda(kit, _native.cuda_flags(_native.cuda_arch()), _native.cuda_ldflags(str(kit.lib_dir), kit.major), "")


def _cache_key(name: str, backend: str, spec_files: list[Path], source_files: list[Path],
               cxx: tuple[str, ...], cflags: list[str], ldflags: list[str], cuda: str) -> str:
    h = hashlib.sha256()
    for part in (_FORMAT, name, backend, _build_info.VERSION, _library_id(), _codegen_digest(),
                 " ".join(cxx), _native.compiler_version(cxx), "\0".join(cflags), "\0".join(ldflags), cuda):
        h.update(part.encode() + b"\0\0")
    for kind, files in (("spec", spec_files), ("source", source_files)):
        for p in sorted(files, key=lambda p: p.name):
            h.update(f"{kind}:{p.name}\0".encode() + p.read_bytes() + b"\0\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- the cache: trust and integrity

_MISSING = "not built yet"
_MANIFEST = "manifest.json"  # an entry's files with their sizes and SHA-256 digests, written last
_FORMAT = "3"  # of the cache's layout (part of every key: entries of another layout are never read)


def _cached_module(name: str, home: Path, entry: Path, target: Path, info: dict[str, Any], verbose: bool,
                   build: Callable[[], list[str]]) -> ModuleType:
    """The module of the cache entry: built (under home's lock) if the entry is missing or
    damaged, and once more if the one found in the cache does not import. ImportError if the
    module built does not import either (it is removed: nothing that fails to import stays)."""
    broken: Optional[tuple[tuple[int, int], str]] = None  # the cached module that did not import, and why
    while True:
        if broken is not None or _entry_problem(entry, target) is not None:
            with _locked(home / ".lock", f"module '{name}'", verbose):
                problem = _entry_problem(entry, target)  # another process may have built it meanwhile
                if problem is None and broken is not None and _entry_id(target) == broken[0]:
                    problem = broken[1]  # (unless another process replaced it since)
                if problem is not None:
                    _clean(home)
                    if problem != _MISSING:
                        message = f"[opforge.load] {entry}: cache entry damaged ({problem}): removed; building it again"
                        if verbose:
                            print(message, flush=True)
                        warnings.warn(message, RuntimeWarning, stacklevel=3)
                        _remove(home, entry)
                    info["compiled"] = build()
                    info["built"] = True
        ident = _entry_id(target)
        try:
            return _import(name, target)
        except Exception as exc:  # dlopen's ImportError, or an error raised while the module initializes
            if not info["built"] and broken is None:
                broken = (ident, f"it does not import ({type(exc).__name__}: {exc})")
                continue
            with _locked(home / ".lock", f"module '{name}'", verbose):
                if _entry_id(target) == ident:
                    _remove(home, entry)
            how = "built just now" if broken is None else "built again"
            raise ImportError(f"[load] {target}: the module {how} does not import: {type(exc).__name__}: {exc}",
                              name=name, path=str(target)) from exc


def _private_dir(d: Path) -> Path:
    """d (made with mode 0o700 if missing) once it is known that only this user can write it:
    PermissionError, naming it and the fix, if it belongs to another user or group or others
    may write it (they could replace what this process then compiles or imports)."""
    try:
        d.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    _check_dir(d)
    return d


def _check_dir(d: Path) -> None:
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"[load] cache directory {d} is not a directory")
    _check_owner(d, st, "cache directory")


def _check_owner(p: Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.getuid():
        raise PermissionError(f"[load] {what} {p} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}): "
                              f"the cache must be your own; use another build_dir= (or $OPFORGE_CACHE_DIR)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"[load] {what} {p} is writable by other users (mode {stat.S_IMODE(st.st_mode):#o}): "
                              f"anyone who can write the cache can run code in this process; make it private "
                              f"(chmod go-w {shlex.quote(str(p))}) or use another build_dir=")


def _trusted_file(p: Path) -> os.stat_result:
    """p's lstat once it is known to be a regular file that only this user can write."""
    st = p.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise PermissionError(f"[load] cache file {p} is not a regular file (a link or a device?); remove it")
    _check_owner(p, st, "cache file")
    return st


def _sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _entry_files(target: Path) -> list[str]:
    name = target.name[: -len(_native.extension_suffix())]
    return [target.name, f"{name}_formulas.py", f"{name}.pyi"]


def _entry_problem(entry: Path, target: Path) -> Optional[str]:
    """None if the cache entry is complete and intact (its files are those its manifest lists,
    byte for byte), _MISSING if there is none, else what is wrong with it."""
    try:
        _check_dir(entry)
    except FileNotFoundError:
        return _MISSING
    return _manifest_problem(entry / _MANIFEST, _entry_files(target))


def _manifest_problem(manifest: Path, names: list[str]) -> Optional[str]:
    """None if the files named (beside manifest) are those it lists, byte for byte."""
    try:
        _trusted_file(manifest)
    except FileNotFoundError:
        return f"its {manifest.name} is missing"
    try:
        files = json.loads(manifest.read_bytes())["files"]
        if sorted(files) != sorted(names) or not all(isinstance(w, dict) for w in files.values()):
            raise ValueError("not the files expected")
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {manifest.name} is unreadable"
    for fname, want in files.items():
        p = manifest.with_name(fname)
        try:
            size = _trusted_file(p).st_size
            if size != want.get("size"):
                return f"{fname} has {size} bytes, not {want.get('size')}"
            if _sha256(p) != want.get("sha256"):
                return f"{fname}'s content changed (its SHA-256 is not the manifest's)"
        except FileNotFoundError:  # (also while another process replaces the entry)
            return f"{fname} is missing"
    return None


def _replace_text(path: Path, text: str) -> None:
    """Writes path whole (a temporary file renamed over it), writable by its owner only whatever
    the umask: the cache's checks refuse files others may write."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _write_manifest(manifest: Path, files: dict[str, Path]) -> None:
    """Writes manifest: each name with the size and digest of its file (the file, or the one that
    is about to be renamed to it)."""
    listed = {fname: {"size": p.stat().st_size, "sha256": _sha256(p)} for fname, p in files.items()}
    _replace_text(manifest, json.dumps({"format": _FORMAT, "files": listed}, indent=1, sort_keys=True) + "\n")


def _entry_id(target: Path) -> tuple[int, int]:
    try:
        st = target.stat()
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)


def _write_entry(entry: Path, files: dict[str, Path]) -> None:
    """Puts files (their names in the entry: their sources) into the cache entry, whole at once:
    a directory written beside it, with its manifest, then renamed into place."""
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    for fname, src in files.items():
        shutil.copyfile(src, tmp / fname)
        os.chmod(tmp / fname, 0o644)
    _write_manifest(tmp / _MANIFEST, {fname: tmp / fname for fname in files})
    os.rename(tmp, entry)


def _remove(home: Path, entry: Path) -> None:
    """Removes an entry (renamed away first: processes that use its module keep it) and the
    module's intermediate files, which may be damaged the same way (called with home's lock held)."""
    trash = entry.with_name(f".{entry.name}.{os.getpid()}.trash")
    os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(home / "build", ignore_errors=True)


def _clean(home: Path) -> None:
    """Removes what processes that died while building left (called with home's lock held:
    no other process is writing there)."""
    for p in [*home.glob(".*.tmp"), *home.glob(".*.trash")]:
        shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def _lock_file(path: Path) -> Iterator[int]:
    """A lock file's descriptor (never through a link; it must be this user's)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise PermissionError(f"[load] lock file {path} is a symbolic link; remove it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"[load] lock file {path} is not a regular file; remove it")
        _check_owner(path, st, "lock file")
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, what: str, verbose: bool) -> Iterator[None]:
    """An exclusive lock between processes (released if the holder dies)."""
    with _lock_file(path) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if verbose:
                print(f"[opforge.load] waiting for another process building {what}", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------- build


def _installation_cache() -> Path:
    """The cache of this opforge installation: what every module built on it shares, whatever
    its cache root (the precompiled header, opforge's parsed specs)."""
    return _native.PACKAGE_DIR / "_jit_cache"


def _shared_root(root: Path) -> Path:
    """Where what every module shares is kept (``_pch/``): the installation's cache,
    made once per opforge installation, where this user may keep private files (a virtual
    environment of their own); else the cache root, once per cache root (an installation that is
    read-only or another user's: it is never written, nor read, unless it passes the cache's checks)."""
    try:
        return _private_dir(_installation_cache())
    except OSError:  # (PermissionError: another user's, or writable by others; read-only; no such parent)
        return root


def _opforge_signatures() -> list[Any]:
    """The signatures of opforge's own ops (formulas may call them, specs may not take their
    names), from its generated op table: no YAML is parsed."""
    from opforge.codegen.api import record_signature

    return [record_signature(op) for op in _formulas.OPS.values()]


def _build(name: str, spec_files: list[Path], source_files: list[Path], cxx: tuple[str, ...],
           cflags: list[str], pch_cflags: list[str], ldflags: list[str], cuda: _Cuda, root: Path, home: Path,
           entry: Path, target: Path, verbose: bool) -> list[str]:
    """Generate, compile and link the module into the cache entry; returns the TUs compiled."""
    from opforge.codegen import SpecError, load_specs
    from opforge.codegen.api import generated_device_targets
    from opforge.codegen.gen import device_file, render_module, write_if_changed
    from opforge.codegen.targets import BUILDS, Backend

    shared = _shared_root(root)
    header, gch = _pch_paths(shared, cxx, pch_cflags)
    pch_problem = _in_background(_manifest_problem, gch.with_name("pch.json"), [gch.name])  # (a digest of
    # a hundred megabytes or more: taken while the specs are parsed and the code generated)
    known = _opforge_signatures()
    ops = load_specs(spec_files, known=known, build=BUILDS[_build_info.BACKEND])  # SpecErrors: before any compiler runs
    kernels = {p.stem for p in source_files if p.suffix in CPP_SUFFIXES}
    cuda_kernels = {p.stem for p in source_files if p.suffix in CUDA_SUFFIXES}
    build_row = BUILDS[_build_info.BACKEND]
    on_cuda = Backend.CUDA in build_row.targets
    for op in ops:
        if op.impl.kind == "cpp" and op.name not in kernels:
            raise SpecError(op.impl.loc, "impl", f"op '{op.name}' has a cpp impl: pass its kernel file "
                            f"{op.name}.cpp in sources=[...]")
        if on_cuda and op.impl.kind == "cpp" and op.target(Backend.CUDA) is not None and op.name not in cuda_kernels:
            raise SpecError(op.impl.loc, "impl", f"op '{op.name}' has cuda rows: pass its CUDA kernel file "
                            f"{op.name}.cu in sources=[...] (or leave cuda out of its targets)")
    device_tus = [device_file(op, t) for op in ops for t in generated_device_targets(op, build_row)]
    cuda_sources = [p.resolve() for p in source_files if p.suffix in CUDA_SUFFIXES]
    if (device_tus or cuda_sources) and cuda.toolkit is None:
        raise BuildError(f"[load] module '{name}' has CUDA code to compile, and no nvcc: {cuda.problem}")
    _native.check_toolchain(cxx)
    if verbose:
        print(f"[opforge.load] {name}: building {len(ops)} op{'s' if len(ops) != 1 else ''} into {entry}",
              flush=True)

    build = _private_dir(home / "build")
    gen = _private_dir(build / "gen")
    # (with AOT entry points and their InferShape: opforge.mindspore.register_module's primitives call them)
    rendered = render_module(ops, {o.name: f"{o.name}.yaml" for o in ops}, name, known,
                             build=build_row, device_kernels=on_cuda)
    for r in rendered:
        write_if_changed(gen / r.name, r.text)
    keep = {r.name for r in rendered}
    for stale in gen.iterdir():
        if stale.name not in keep:
            stale.unlink()
    # ninja runs in build/: the cache's own paths are relative to it (the cache root, which may be
    # any directory, appears neither in build.ninja nor in the compiler's dependency files)
    tus = [Path("gen", f"{o.name}.cpp") for o in ops] + [Path("gen", f) for f in device_tus]
    tus += [p.resolve() for p in source_files if p.suffix in CPP_SUFFIXES] + cuda_sources
    lib = name + _native.extension_suffix()
    lines = [
        "ninja_required_version = 1.3",
        "pipe = |",  # (no $-escape writes | in a path: _ninja_path writes it as $pipe)
        f"cxx = {_ninja_text(_shell(cxx))}",
        f"cflags = {_ninja_text(_shell(['-Igen', *cflags]))}",
        f"ldflags = {_ninja_text(_shell([*ldflags, *(cuda.ldflags if device_tus or cuda_sources else [])]))}",
        f"nvcc = {_ninja_text(_shell([str(cuda.toolkit.nvcc)] if cuda.toolkit else ['false']))}",
        f"cuflags = {_ninja_text(_shell(['-Igen', *cuda.flags, *(f for f in cflags if f.startswith('-I'))]))}",
        f"pch = {_ninja_text(_shell([os.path.relpath(header, build)]))}",
        "rule cxx",  # op TUs: with the precompiled header when there is one (gcc reads
        # <header>.gch if it is valid, else the header's text: the same command either way)
        "  command = $cxx -MMD -MF $out.d $cflags -include $pch -Winvalid-pch -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $in",
        "rule cxx_plain",  # the module's PyInit (plain Python C API) and the kernels (which include
        # what they use themselves)
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $in",
        "rule nvcc",  # device kernels: generated <op>.cu and the sources' .cu files
        "  command = $nvcc -MD -MF $out.d $cuflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $in",
        "rule link",
        "  command = $cxx $in -o $out $ldflags",
        "  description = link $out",
    ]
    objects = []
    for tu in tus:  # ($in and $out: ninja quotes them for the shell)
        cu = tu.suffix in CUDA_SUFFIXES
        rule = "nvcc" if cu else ("cxx_plain" if tu.is_absolute() else "cxx")
        objects.append(_ninja_path(f"obj/{'src' if tu.is_absolute() else 'gen'}/{tu.stem}{'.cu' if cu else ''}.o"))
        lines.append(f"build {objects[-1]}: {rule} {_ninja_path(tu)}")
    objects.append(_ninja_path(f"obj/gen/{name}.module.o"))
    lines.append(f"build {objects[-1]}: cxx_plain {_ninja_path(Path('gen', f'{name}.module.cpp'))}")
    lines.append(f"build {_ninja_path(lib)}: link {' '.join(objects)}")
    lines.append(f"default {_ninja_path(lib)}")
    write_if_changed(build / "build.ninja", "\n".join(lines) + "\n")

    # a missing precompiled header is made beside the TUs, which then parse its text, when there are
    # cores to spare; else first (the TUs then spend a fraction of the time)
    first = len(ops) >= len(os.sched_getaffinity(0))
    with _precompiling(header, gch, pch_problem(), cxx, pch_cflags, first, verbose):
        output = []
        with subprocess.Popen([_ninja(), "-C", str(build)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.append(line)
                if verbose:
                    print(line, end="", flush=True)
        if proc.returncode != 0:
            tail = "".join(output[-60:])
            raise BuildError(f"[load] building module '{name}' failed (nothing was cached; the next load "
                             f"builds again):\n{tail}")
    # (ninja quotes $in for the shell in descriptions too, when it must)
    compiled = [line.split("] compile ", 1)[1].strip() for line in output if "] compile " in line]
    compiled = [shlex.split(c)[0] if c.startswith("'") else c for c in compiled]
    # into the cache: a finished entry appears at once, or not at all
    _write_entry(entry, {target.name: build / lib, f"{name}.pyi": gen / "ops.pyi",
                         f"{name}_formulas.py": gen / "_formulas.py"})
    return compiled


def _pch_paths(root: Path, cxx: tuple[str, ...], cflags: list[str]) -> tuple[Path, Path]:
    """The precompiled header (the runtime's headers) for these flags (opforge's, and
    extra_cflags: not the sources' include directories, which do not change it), kept under root
    (the shared root) and shared by every module; it saves the parsing of each op TU. Returns
    (header, its .gch); the header's text is always there (the .gch may not be yet)."""
    h = hashlib.sha256()
    for part in (_native.PCH_TEXT, _build_info.VERSION, _library_id(),
                 _native.compiler_version(cxx), "\0".join(cflags)):
        h.update(part.encode() + b"\0\0")
    _private_dir(root / "_pch")
    d = _private_dir(root / "_pch" / h.hexdigest()[:16])
    header = d / "opforge_module_pch.h"
    try:
        _trusted_file(header)
        intact = header.read_bytes() == _native.PCH_TEXT.encode()
    except FileNotFoundError:
        intact = False
    if not intact:
        _replace_text(header, _native.PCH_TEXT)
    return header, d / (header.name + ".gch")


@contextlib.contextmanager
def _precompiling(header: Path, gch: Path, problem: Optional[str], cxx: tuple[str, ...], cflags: list[str],
                  first: bool, verbose: bool) -> Iterator[None]:
    """Builds the .gch when it is missing or damaged (problem: what _manifest_problem said of it
    just before) and no other process is building it: first (then the module's TUs use it) or,
    if not first, beside the module's TUs (which parse the header's text meanwhile; it is in
    place for the next build)."""
    manifest = gch.with_name("pch.json")
    if problem is None:
        yield
        return
    with _lock_file(header.parent / ".lock") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process is on it
            yield
            return
        try:
            for stale in gch.parent.glob(f".{gch.name}.*.tmp"):  # (of processes that died precompiling)
                stale.unlink()
            if gch.exists():  # (the manifest is written first, then the .gch renamed into place)
                problem = _manifest_problem(manifest, [gch.name])
                if problem is None:  # another process has just made it
                    yield
                    return
                message = (f"[opforge.load] {gch}: precompiled header damaged ({problem}): removed; precompiling "
                           "it again")
                if verbose:
                    print(message, flush=True)
                warnings.warn(message, RuntimeWarning, stacklevel=5)
                gch.unlink()
            tmp = gch.with_name(f".{gch.name}.{os.getpid()}.tmp")
            if verbose:
                print(f"[opforge.load] precompiling the runtime header into {gch.parent}", flush=True)
            proc = subprocess.Popen([*cxx, *cflags, "-x", "c++-header", str(header), "-o", str(tmp)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

            def finish() -> None:
                _, err = proc.communicate()
                if proc.returncode == 0 and not gch.exists():
                    os.chmod(tmp, 0o644)
                    _write_manifest(manifest, {gch.name: tmp})  # first: a .gch in place is one it lists
                    os.replace(tmp, gch)
                else:
                    tmp.unlink(missing_ok=True)
                    if proc.returncode != 0 and verbose:
                        print(f"[opforge.load] precompiling failed (builds go on without it):\n"
                              f"{err.decode(errors='replace')[-2000:]}", flush=True)

            if first:
                try:
                    finish()
                except BaseException:
                    proc.kill()
                    tmp.unlink(missing_ok=True)
                    raise
                yield
            else:
                try:
                    yield
                finally:
                    finish()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _in_background(fn: Callable[..., T], *args: object) -> Callable[[], T]:
    """fn(*args) run in a thread; the function returned waits for its result (or raises its exception)."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(fn(*args))
        except BaseException as exc:  # (handed to the caller)
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if errors:
            raise errors[0]
        return results[0]

    return result


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package's binary

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise BuildError("[load] ninja is not installed: pip install ninja") from None


def _ninja_text(text: str) -> str:
    """Text for build.ninja (a variable's value, a command): $ written $$. A line break would end
    the statement whatever precedes it: load refuses paths and flags that hold one."""
    if "\n" in text or "\r" in text:
        raise ValueError(f"[load] {text!r} holds a line break: it cannot go into build.ninja")
    return text.replace("$", "$$")


def _ninja_path(p: PathLike) -> str:
    """A path in a build statement: ninja text with its separators escaped (space, colon) and |,
    which has no $-escape, written as the variable $pipe (build.ninja sets it)."""
    return _ninja_text(str(p)).replace(" ", "$ ").replace(":", "$:").replace("|", "${pipe}")


def _shell(args: Sequence[str]) -> str:
    """A command line for the shell ninja runs commands with: each argument quoted."""
    return " ".join(shlex.quote(a) for a in args)


# ---------------------------------------------------------------------------- import


def _free_name(name: str, path: Path) -> bool:
    """Whether the op module at ``path`` may take ``name`` in sys.modules: no module has it, or an
    op module of this process does, and ``import name`` would find nothing else on sys.path (the
    module's own cache directory, a namespace package where the cache root is on sys.path, aside)."""
    previous = sys.modules.get(name)
    if previous is not None:
        return previous in _loaded.values()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return True
    if spec is None:
        return True
    if spec.origin is None:  # a namespace package: free where all its directories are in the cache
        root = path.resolve().parents[1]
        return all(Path(d).resolve().is_relative_to(root) for d in spec.submodule_search_locations or [])
    return False


def _import(name: str, path: Path) -> ModuleType:
    module = _loaded.get(path)
    if module is not None:
        return module
    import opforge  # noqa: F401  (libopforge.so and opforge's Python types first)

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    # never shadows an unrelated module, imported or not yet (opforge.load("torch", ...) made a
    # later `import torch` give the op module); decided before the import, which puts the module
    # in sys.modules itself
    previous, free = sys.modules.get(name), _free_name(name, path)
    free_formulas = _free_name(f"{name}_formulas", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # its op table, for framework adapters (opforge.torch.register_module)
    fspec = importlib.util.spec_from_file_location(f"{name}_formulas", path.with_name(f"{name}_formulas.py"))
    assert fspec is not None and fspec.loader is not None
    formulas = importlib.util.module_from_spec(fspec)
    fspec.loader.exec_module(formulas)
    module.__opforge_formulas__ = formulas.OPS  # type: ignore[attr-defined]
    module.__opforge_formulas_module__ = formulas  # type: ignore[attr-defined]
    if free:
        sys.modules[name] = module
    elif sys.modules.get(name) is module:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
    # importable by name too: MindSpore's Graph mode parses formula functions in their module
    previous = sys.modules.get(formulas.__name__)
    if free_formulas or any(getattr(m, "__opforge_formulas_module__", None) is previous for m in _loaded.values()):
        sys.modules[formulas.__name__] = formulas
    _loaded[path] = module
    return module
