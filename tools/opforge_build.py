"""opforge's PEP 517 build backend: meson-python's hooks, plus what one wheel backend needs.

The backend of a build is ``-Dops_backend=NAME`` in the ``setup-args`` config setting (``pip wheel .
-Csetup-args=-Dops_backend=cuda``, ``opforge build --backend cuda``), else ``$OPFORGE_BACKEND``, else
cpu. Its row of the target table (codegen/targets.py ``BUILDS``) says what it adds:

- ``build_requires`` join meson-python's build requirements (the cuda wheel: NVIDIA's
  ``cuda-toolkit`` wheels from PyPI, with nvcc, the runtime's headers and CCCL);
- for a build with the cuda target, meson's native file naming nvcc (pkg/opforge/_cuda_toolkit.py
  finds it in those wheels; meson reads a CUDA compiler from nowhere else);
- ``runtime_requires`` become ``Requires-Dist`` lines of the wheel (meson-python makes the
  metadata from pyproject.toml, which cannot vary by backend).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import mesonpy
from mesonpy import build_sdist, get_requires_for_build_sdist  # noqa: F401  (hooks of this backend)

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["build_editable", "build_sdist", "build_wheel", "get_requires_for_build_editable",
           "get_requires_for_build_sdist", "get_requires_for_build_wheel"]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up while the class is made)
    spec.loader.exec_module(module)
    return module


def _setup_args(config_settings: Optional[dict[str, Any]]) -> list[str]:
    value = (config_settings or {}).get("setup-args", [])
    return [value] if isinstance(value, str) else list(value)


def _build(config_settings: Optional[dict[str, Any]]) -> Any:
    """The target table's row of this build's backend."""
    backend = os.environ.get("OPFORGE_BACKEND", "cpu")
    args = _setup_args(config_settings)
    for i, a in enumerate(args):
        m = re.fullmatch(r"-Dops_backend=(\w+)", a)
        if m:
            backend = m.group(1)
        elif a == "-D" and i + 1 < len(args) and args[i + 1].startswith("ops_backend="):
            backend = args[i + 1].split("=", 1)[1]
    builds = _load("_opforge_targets", ROOT / "codegen" / "targets.py").BUILDS
    if backend not in builds:
        raise SystemExit(f"opforge: unknown ops_backend {backend!r}; one of: {', '.join(builds)}")
    return builds[backend]


def get_requires_for_build_wheel(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return mesonpy.get_requires_for_build_wheel(config_settings) + list(_build(config_settings).build_requires)


def get_requires_for_build_editable(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return mesonpy.get_requires_for_build_editable(config_settings) + list(_build(config_settings).build_requires)


def _with_native_file(config_settings: Optional[dict[str, Any]], build: Any, folder: str) -> dict[str, Any]:
    settings = dict(config_settings or {})
    if "cuda" in build.targets:
        toolkit = _load("_opforge_cuda_toolkit", ROOT / "pkg" / "opforge" / "_cuda_toolkit.py")
        try:
            kit = toolkit.find()
        except toolkit.ToolkitError as exc:
            raise SystemExit(f"opforge: the {build.backend} wheel needs nvcc: {exc}") from None
        native = Path(folder) / "opforge-native.ini"
        native.write_text(toolkit.native_file(kit))
        print(f"opforge: {build.backend} build with {kit.nvcc} (CUDA {kit.version})", flush=True)
        settings["setup-args"] = _setup_args(config_settings) + [f"--native-file={native}"]
    return settings


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_requires(wheel: Path, requires: tuple[str, ...]) -> None:
    """Adds Requires-Dist lines to the wheel's METADATA and its RECORD entry (rewrites the zip)."""
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    meta_name = next(i.filename for i, _ in entries if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename))
    record_name = meta_name.rsplit("/", 1)[0] + "/RECORD"
    out = []
    for info, data in entries:
        if info.filename == meta_name:
            head, sep, body = data.decode("utf-8").partition("\n\n")
            head += "".join(f"\nRequires-Dist: {r}" for r in requires)
            data = (head + sep + body).encode("utf-8")
            new_meta = data
        out.append((info, data))
    lines = []
    for info, data in out:
        if info.filename == record_name:
            for line in data.decode("utf-8").splitlines():
                if line.startswith(meta_name + ","):
                    line = f"{meta_name},{_record_hash(new_meta)},{len(new_meta)}"
                lines.append(line)
    record = ("\n".join(lines) + "\n").encode("utf-8")
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for info, data in out:
            z.writestr(info, record if info.filename == record_name else data)
    tmp.replace(wheel)


def build_wheel(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    build = _build(config_settings)
    with tempfile.TemporaryDirectory(prefix="opforge-build-") as folder:
        name = mesonpy.build_wheel(wheel_directory, _with_native_file(config_settings, build, folder),
                                   metadata_directory)
    if build.runtime_requires:
        add_requires(Path(wheel_directory) / name, build.runtime_requires)
    return name


def build_editable(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    # (the native file must outlive the build: an editable install rebuilds on import)
    build = _build(config_settings)
    folder = ROOT / "build" / f"native-{build.backend}"
    folder.mkdir(parents=True, exist_ok=True)
    name = mesonpy.build_editable(wheel_directory, _with_native_file(config_settings, build, str(folder)),
                                  metadata_directory)
    if build.runtime_requires:
        add_requires(Path(wheel_directory) / name, build.runtime_requires)
    return name
