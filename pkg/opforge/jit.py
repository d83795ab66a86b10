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

The cache root is ``build_dir``, else ``$OPFORGE_CACHE_DIR``, else ``~/.cache/opforge/jit``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import keyword
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional, Sequence, Union

from opforge import _build_info, _native
from opforge._native import BuildError

__all__ = ["load", "BuildError", "default_cache_dir"]

PathLike = Union[str, "os.PathLike[str]"]
CPP_SUFFIXES = (".cpp", ".cc", ".cxx")
HEADER_SUFFIXES = (".h", ".hpp", ".inc")

_loaded: dict[Path, ModuleType] = {}


def default_cache_dir() -> Path:
    """``$OPFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opforge/jit`` (``~/.cache/opforge/jit``)."""
    env = os.environ.get("OPFORGE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opforge" / "jit"


def load(name: str, specs: Sequence[PathLike], sources: Sequence[PathLike] = (), backend: str = "cpu",
         build_dir: Optional[PathLike] = None, verbose: bool = False,
         extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = ()) -> ModuleType:
    """Generate, compile (if not cached) and import a module of ops; returns the module.

    Args:
        name: the module's name (a Python identifier); its ops are ``module.<op>``.
        specs: spec files (``<op>.yaml``) or directories of them.
        sources: C++ files: each ``cpp`` op's kernel, ``<op>.cpp`` (it includes ``"<op>.h"``,
            generated), and any helpers; headers listed here are not compiled but are part of
            the cache key, and their directories are on the include path.
        backend: the target to build for; must be the one this opforge was built for.
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
    if backend not in ("cpu", "cuda"):
        raise ValueError(f"[load] unknown backend {backend!r}; one of: cpu, cuda")
    if backend != _build_info.BACKEND:
        raise ValueError(f"[load] backend {backend!r} is not available: this opforge was built for "
                         f"{_build_info.BACKEND!r} (its ops run there)")
    spec_files = _files("specs", specs, expand=True)
    if not spec_files:
        raise ValueError(f"[load] no spec files in specs={list(map(str, specs))!r}")
    source_files = _files("sources", sources)
    seen: dict[tuple[str, str], Path] = {}
    for p in spec_files + [s for s in source_files if s.suffix in CPP_SUFFIXES]:
        kind = "spec" if p.suffix in (".yaml", ".yml") else "source"
        if (kind, p.stem) in seen:
            raise ValueError(f"[load] two {kind}s named {p.stem!r}: {seen[(kind, p.stem)]} and {p}")
        seen[(kind, p.stem)] = p
    cxx = tuple(_native.compiler())
    includes = sorted({str(s.parent) for s in source_files})
    cflags = [*_native.cflags(), *(f"-I{d}" for d in includes), *extra_cflags]
    ldflags = [*_native.ldflags(), *extra_ldflags]
    key = _cache_key(name, backend, spec_files, source_files, cxx, cflags, ldflags)

    root = Path(build_dir) if build_dir is not None else default_cache_dir()
    home = root / name
    target = home / key / (name + _native.extension_suffix())
    info = {"key": key, "path": str(target), "built": False, "compiled": [], "seconds": 0.0}
    if not target.is_file():
        home.mkdir(parents=True, exist_ok=True)
        with _locked(home / ".lock", f"module '{name}'", verbose):
            if not target.is_file():  # another process may have built it while we waited
                info["compiled"] = _build(name, spec_files, source_files, cxx, cflags, ldflags, root, home,
                                          target, verbose)
                info["built"] = True
    module = _import(name, target)
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
            if what == "sources" and p.suffix not in CPP_SUFFIXES + HEADER_SUFFIXES:
                raise ValueError(f"[load] {p}: a source must be C++ ({', '.join(CPP_SUFFIXES + HEADER_SUFFIXES)})")
            out.append(p)
        else:
            raise FileNotFoundError(f"[load] {what}: {p}: no such file" + (" or directory" if expand else ""))
    return out


def _codegen_digest() -> str:
    """The codegen's own files (its output depends on them as much as on the specs)."""
    h = hashlib.sha256()
    base = _native.PACKAGE_DIR / "codegen"
    for p in sorted([*base.glob("*.py"), *(base / "templates").glob("*.j2")]):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _library_id() -> str:
    """libopforge.so's identity (size and mtime): a rebuilt opforge invalidates what was built on it."""
    st = (_native.PACKAGE_DIR / "libopforge.so").stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def _cache_key(name: str, backend: str, spec_files: list[Path], source_files: list[Path],
               cxx: tuple[str, ...], cflags: list[str], ldflags: list[str]) -> str:
    h = hashlib.sha256()
    for part in (name, backend, _build_info.VERSION, _library_id(), _codegen_digest(),
                 " ".join(cxx), _native.compiler_version(cxx), "\0".join(cflags), "\0".join(ldflags)):
        h.update(part.encode() + b"\0\0")
    for kind, files in (("spec", spec_files), ("source", source_files)):
        for p in sorted(files, key=lambda p: p.name):
            h.update(f"{kind}:{p.name}\0".encode() + p.read_bytes() + b"\0\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path, what: str, verbose: bool) -> Iterator[None]:
    """An exclusive lock between processes (released if the holder dies)."""
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if verbose:
                print(f"[opforge.load] waiting for another process building {what}", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------- build


def _known_specs(root: Path) -> list:
    """opforge's own specs (formulas may call those ops), parsed once per cache root: a pickle
    keyed by the specs' and the codegen's content."""
    import pickle

    import opforge

    spec_dir = _native.PACKAGE_DIR / "op_specs"
    h = hashlib.sha256(_codegen_digest().encode())
    for p in sorted(spec_dir.glob("*.yaml")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    path = root / "_known" / f"{h.hexdigest()[:16]}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass
    known = list(opforge._specs().values())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(known))
    os.replace(tmp, path)
    return known


def _build(name: str, spec_files: list[Path], source_files: list[Path], cxx: tuple[str, ...],
           cflags: list[str], ldflags: list[str], root: Path, home: Path, target: Path,
           verbose: bool) -> list[str]:
    """Generate, compile and link the module into target; returns the TUs compiled."""
    from opforge.codegen import SpecError, load_specs
    from opforge.codegen.emit import render_module, write_if_changed

    known = _known_specs(root)
    ops = load_specs(spec_files, known=known)  # SpecErrors: before any compiler runs
    kernels = {p.stem for p in source_files if p.suffix in CPP_SUFFIXES}
    for op in ops:
        if op.impl.kind == "cpp" and op.name not in kernels:
            raise SpecError(op.impl.loc, "impl", f"op '{op.name}' has a cpp impl: pass its kernel file "
                            f"{op.name}.cpp in sources=[...]")
    _native.check_toolchain(cxx)
    if verbose:
        print(f"[opforge.load] {name}: building {len(ops)} op{'s' if len(ops) != 1 else ''} into {target.parent}",
              flush=True)

    build = home / "build"
    gen = build / "gen"
    gen.mkdir(parents=True, exist_ok=True)
    # (no AOT entry points: MindSpore's ops.Custom is served by opforge's own library and packages)
    rendered = render_module(ops, {o.name: f"{o.name}.yaml" for o in ops}, name, known, aot_entry_points=False)
    for r in rendered:
        write_if_changed(gen / r.name, r.text)
    keep = {r.name for r in rendered}
    for stale in gen.iterdir():
        if stale.name not in keep:
            stale.unlink()
    tus = [gen / f"{o.name}.cpp" for o in ops]
    tus += [p.resolve() for p in source_files if p.suffix in CPP_SUFFIXES]
    lib = build / (name + _native.extension_suffix())
    header, gch = _pch_paths(root, cxx, cflags)
    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {_ninja_cmd(cxx)}",
        f"cflags = -I{_q(gen)} {_ninja_cmd(cflags)}",
        f"ldflags = {_ninja_cmd(ldflags)}",
        "rule cxx",  # op TUs and kernels: with the precompiled header when there is one (gcc
        # reads <header>.gch if it is valid, else the header's text: the same command either way)
        f"  command = $cxx -MMD -MF $out.d $cflags -include {_q(header)} -Winvalid-pch -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $in",
        "rule cxx_module",  # the module's PyInit: plain Python C API
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $in",
        "rule link",
        "  command = $cxx $in -o $out $ldflags",
        "  description = link $out",
    ]
    objects = []
    for tu in tus:
        obj = f"obj/{'gen' if tu.parent == gen else 'src'}/{tu.stem}.o"
        objects.append(obj)
        lines.append(f"build {obj}: cxx {_q(tu)}")
    objects.append(f"obj/gen/{name}.module.o")
    lines.append(f"build {objects[-1]}: cxx_module {_q(gen / f'{name}.cpp')}")
    lines.append(f"build {_q(lib.name)}: link {' '.join(objects)}")
    lines.append(f"default {_q(lib.name)}")
    write_if_changed(build / "build.ninja", "\n".join(lines) + "\n")

    with _precompiling(header, gch, cxx, cflags, verbose):
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
    compiled = [line.split("compile ", 1)[1].strip() for line in output if "] compile " in line]

    # into the cache: a finished module appears at once, or not at all
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(lib, tmp)
    shutil.copyfile(gen / "ops.pyi", target.parent / f"{name}.pyi")
    shutil.copyfile(gen / "_formulas.py", target.parent / f"{name}_formulas.py")
    os.replace(tmp, target)
    return compiled


def _pch_paths(root: Path, cxx: tuple[str, ...], cflags: list[str]) -> tuple[Path, Path]:
    """The precompiled header (pybind11 and the runtime) for these flags: one per cache root,
    shared by every module; it saves the parsing of each op TU. Returns (header, its .gch); the
    header's text is always there (the .gch may not be yet)."""
    h = hashlib.sha256()
    for part in (_native.PCH_TEXT, _build_info.VERSION, _library_id(),
                 _native.compiler_version(cxx), "\0".join(cflags)):
        h.update(part.encode() + b"\0\0")
    d = root / "_pch" / h.hexdigest()[:16]
    header = d / "opforge_module_pch.h"
    if not header.is_file():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{header.name}.{os.getpid()}.tmp"
        tmp.write_text(_native.PCH_TEXT)
        os.replace(tmp, header)
    return header, d / (header.name + ".gch")


@contextlib.contextmanager
def _precompiling(header: Path, gch: Path, cxx: tuple[str, ...], cflags: list[str],
                  verbose: bool) -> Iterator[None]:
    """Builds the .gch beside the module's TUs (which parse the header's text meanwhile) when it
    is missing and no other process is building it; it is in place for the next build."""
    if gch.is_file():
        yield
        return
    with open(header.parent / ".lock", "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process is on it
            yield
            return
        tmp = gch.with_name(f".{gch.name}.{os.getpid()}.tmp")
        if verbose:
            print(f"[opforge.load] precompiling the runtime header into {gch.parent}", flush=True)
        proc = subprocess.Popen([*cxx, *cflags, "-x", "c++-header", str(header), "-o", str(tmp)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            yield
        finally:
            _, err = proc.communicate()
            if proc.returncode == 0 and not gch.is_file():
                os.replace(tmp, gch)
            else:
                tmp.unlink(missing_ok=True)
                if proc.returncode != 0 and verbose:
                    print(f"[opforge.load] precompiling failed (builds go on without it):\n"
                          f"{err.decode(errors='replace')[-2000:]}", flush=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package's binary

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise BuildError("[load] ninja is not installed: pip install ninja") from None


def _q(p: PathLike) -> str:
    """A path for build.ninja ($ and spaces escaped)."""
    return str(p).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_cmd(args: Sequence[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a).replace("$", "$$") for a in args)


# ---------------------------------------------------------------------------- import


def _import(name: str, path: Path) -> ModuleType:
    module = _loaded.get(path)
    if module is not None:
        return module
    import opforge  # noqa: F401  (libopforge.so and opforge's Python types first)

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # its op table, for framework adapters (opforge.torch.register_module)
    fspec = importlib.util.spec_from_file_location(f"{name}_formulas", path.with_name(f"{name}_formulas.py"))
    assert fspec is not None and fspec.loader is not None
    formulas = importlib.util.module_from_spec(fspec)
    fspec.loader.exec_module(formulas)
    module.__opforge_formulas__ = formulas.OPS  # type: ignore[attr-defined]
    previous = sys.modules.get(name)
    if previous is None or previous in _loaded.values():  # never shadows an unrelated module
        sys.modules[name] = module
    _loaded[path] = module
    return module
