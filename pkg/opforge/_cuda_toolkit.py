"""Finds the CUDA toolkit that builds opforge's cuda wheel and op modules: nvcc, its version, the
CUDA runtime's headers and the folder holding ``libcudart.so.<major>``; and cuBLAS, which the wheel's
matrix products link (``cublas_v2.h``/``cublasLt.h`` and ``libcublas.so.<major>``/``libcublasLt.so.<major>``).

Where it looks, first match wins:
1. ``$OPFORGE_NVCC`` (the compiler itself), then ``$CUDA_HOME`` and ``$CUDA_PATH`` (``<dir>/bin/nvcc``);
2. the build requirement's wheels: every folder of the ``nvidia.cu13`` namespace package that has
   ``bin/nvcc`` (``pip install`` of the cuda wheel puts ``cuda-toolkit[nvcc,...]`` there, so a build
   needs nothing but PyPI);
3. ``nvcc`` on PATH, then ``/usr/local/cuda/bin/nvcc``.
Where the toolkit is, nvcc says itself (``nvcc --dryrun`` prints its ``TOP``): wrappers and symlinks
on PATH resolve to the real folders. cuBLAS is looked for beside nvcc, then in the ``nvidia.cu13``
folders (PyPI's ``nvidia-cublas``: headers and libraries, installed by the build requirement
``cuda-toolkit[...,cublas]`` and, at run time, by the wheel's dependency or torch's).

Used by tools/opforge_build.py (the PEP 517 backend writes meson's native file from it), by
tools/dev.sh, by meson.build (``--meson``: one fact per line) and by ``opforge.load``. Standard
library only: it runs in pip's isolated build environment before meson does.

    python _cuda_toolkit.py                      what was found, as key: value lines
    python _cuda_toolkit.py --native-file FILE   writes meson's native file ([binaries] cuda)
    python _cuda_toolkit.py --meson [--nvcc P]   nvcc, version, include dir, lib dir (for meson.build)
    python _cuda_toolkit.py --cublas [--nvcc P]  cuBLAS's include dir and lib dir (for meson.build)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MAJOR = 13  # the CUDA major of the cu130 wheel (codegen/targets.py BUILDS['cuda'])


class ToolkitError(RuntimeError):
    """No usable CUDA toolkit: the message says what was tried and how to get one."""


@dataclass(frozen=True)
class Toolkit:
    nvcc: Path          # the compiler (as found: a wrapper stays a wrapper)
    version: str        # nvcc's: 13.0.88
    root: Path          # the toolkit's top folder (nvcc's TOP)
    include_dir: Path   # cuda_runtime_api.h, cuda_fp16.h, ...
    lib_dir: Path       # libcudart.so.<MAJOR>

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


def _wheel_roots() -> list[Path]:
    """The folders of the nvidia.cu<MAJOR> namespace package (PyPI's CUDA wheels)."""
    try:
        import importlib

        module = importlib.import_module(f"nvidia.cu{MAJOR}")
    except ImportError:
        return []
    return [Path(p) for p in getattr(module, "__path__", [])]


def _candidates() -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    if os.environ.get("OPFORGE_NVCC"):
        out.append(("$OPFORGE_NVCC", Path(os.environ["OPFORGE_NVCC"])))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append((f"${var}", Path(os.environ[var]) / "bin" / "nvcc"))
    out += [(f"nvidia.cu{MAJOR} (the cuda-toolkit wheels)", root / "bin" / "nvcc") for root in _wheel_roots()]
    on_path = shutil.which("nvcc")
    if on_path:
        out.append(("PATH", Path(on_path)))
    out.append(("/usr/local/cuda", Path("/usr/local/cuda/bin/nvcc")))
    return out


def _run(nvcc: Path, *args: str) -> str:
    r = subprocess.run([str(nvcc), *args], capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def _first_dir(dirs: list[Path], member: str) -> Path | None:
    return next((d for d in dirs if (d / member).exists()), None)


def describe(nvcc: Path) -> Toolkit:
    """What nvcc says of itself; ToolkitError when it does not run or lacks the runtime's files."""
    try:
        text = _run(nvcc, "--version")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolkitError(f"{nvcc} does not run: {exc}") from None
    m = re.search(r"\bV(\d+\.\d+\.\d+)", text)
    if not m:
        raise ToolkitError(f"{nvcc} --version does not name a version:\n{text.strip()}")
    version = m.group(1)
    dry = _run(nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull)
    top = re.search(r"^#\$ TOP=(.*)$", dry, re.M)
    root = Path(top.group(1).strip()).resolve() if top else nvcc.resolve().parent.parent
    roots = [root] + [r for r in _wheel_roots() if r.resolve() != root]
    target = f"targets/{os.uname().machine}-linux"
    include = _first_dir([r / d for r in roots for d in ("include", f"{target}/include")], "cuda_runtime_api.h")
    runtime = f"libcudart.so.{version.split('.')[0]}"
    lib = _first_dir([r / d for r in roots for d in ("lib", "lib64", f"{target}/lib")], runtime)
    if include is None or lib is None:
        missing = "cuda_runtime_api.h" if include is None else runtime
        raise ToolkitError(f"{nvcc} (CUDA {version}, in {root}) has no {missing} beside it: "
                           f"pip install 'nvidia-cuda-runtime~={version.split('.')[0]}.0'")
    return Toolkit(nvcc, version, root, include, lib)


def find() -> Toolkit:
    """The first toolkit of CUDA major MAJOR (module docstring); ToolkitError saying what was tried."""
    tried = []
    for where, nvcc in _candidates():
        if not nvcc.is_file():
            tried.append(f"{where}: no {nvcc}")
            continue
        try:
            kit = describe(nvcc)
        except ToolkitError as exc:
            tried.append(f"{where}: {exc}")
            continue
        if kit.major != MAJOR:
            tried.append(f"{where}: {nvcc} is CUDA {kit.version}, not {MAJOR}.x")
            continue
        return kit
    raise ToolkitError(f"no CUDA {MAJOR} toolkit found (the cuda wheel needs nvcc {MAJOR}.x):\n  "
                       + "\n  ".join(tried)
                       + f"\nInstall one from PyPI: pip install 'cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]=={MAJOR}.0.2', "
                       "or point $OPFORGE_NVCC at an nvcc.")


@dataclass(frozen=True)
class Cublas:
    include_dir: Path   # cublas_v2.h, cublasLt.h
    lib_dir: Path       # libcublas.so.<MAJOR>, libcublasLt.so.<MAJOR>


def find_cublas(kit: Toolkit) -> Cublas:
    """cuBLAS of the toolkit's CUDA major: beside nvcc (a classic toolkit), else in the nvidia.cu<major>
    folders (PyPI's nvidia-cublas); ToolkitError naming the package when either half is missing."""
    roots = [kit.root] + [r for r in _wheel_roots() if r.resolve() != kit.root]
    target = f"targets/{os.uname().machine}-linux"
    headers = ("cublas_v2.h", "cublasLt.h")
    libs = (f"libcublas.so.{kit.major}", f"libcublasLt.so.{kit.major}")
    include = next((d for r in roots for d in (r / "include", r / target / "include")
                    if all((d / h).is_file() for h in headers)), None)
    lib = next((d for r in roots for d in (r / "lib", r / "lib64", r / target / "lib")
                if all((d / name).exists() for name in libs)), None)
    if include is None or lib is None:
        missing = " and ".join(headers if include is None else libs)
        where = ", ".join(str(r) for r in roots)
        raise ToolkitError(f"no cuBLAS {kit.major} ({missing}) beside {kit.nvcc} or in nvidia.cu{kit.major} "
                           f"(looked in {where}): pip install 'nvidia-cublas~={kit.major}.0'")
    return Cublas(include, lib)


def native_file(kit: Toolkit) -> str:
    """meson's native file naming nvcc. The -L lets meson's sanity check link its test program
    (nvcc links the runtime statically and looks in <top>/lib64, which the PyPI layout lacks)."""
    def q(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"[binaries]\ncuda = [{q(str(kit.nvcc))}, {q('-L' + str(kit.lib_dir))}]\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvcc", type=Path, help="describe this nvcc instead of searching")
    parser.add_argument("--native-file", type=Path, help="write meson's native file here")
    parser.add_argument("--meson", action="store_true", help="nvcc, version, include dir, lib dir: one per line")
    parser.add_argument("--cublas", action="store_true", help="cuBLAS's include dir and lib dir: one per line")
    args = parser.parse_args(argv)
    try:
        kit = describe(args.nvcc) if args.nvcc else find()
        cublas = find_cublas(kit) if args.cublas else None
    except ToolkitError as exc:
        print(exc, file=sys.stderr)
        return 1
    if cublas is not None:
        print(cublas.include_dir, cublas.lib_dir, sep="\n")
        return 0
    if args.native_file:
        args.native_file.write_text(native_file(kit))
    if args.meson:
        print(kit.nvcc, kit.version, kit.include_dir, kit.lib_dir, sep="\n")
    elif not args.native_file:
        for k, v in vars(kit).items():
            print(f"{k}: {v}")
        try:
            found = find_cublas(kit)
            print(f"cublas_include_dir: {found.include_dir}\ncublas_lib_dir: {found.lib_dir}")
        except ToolkitError as exc:
            print(f"cublas: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
