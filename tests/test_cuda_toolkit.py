"""The CUDA toolkit finder (pkg/opforge/_cuda_toolkit.py) that builds the cuda wheel: where it looks,
what it reads from nvcc, the errors when nothing fits, and meson's native file. Runs on toolkits
made of a script that answers as nvcc does, so it needs no CUDA here."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("_opforge_cuda_toolkit_test", ROOT / "pkg" / "opforge" / "_cuda_toolkit.py")
assert _spec is not None and _spec.loader is not None
toolkit = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = toolkit
_spec.loader.exec_module(toolkit)


def fake_toolkit(root: Path, version: str = "13.0.88", layout: str = "lib", runtime: bool = True) -> Path:
    """A toolkit folder whose bin/nvcc answers --version and --dryrun as nvcc does."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / layout).mkdir()
    if runtime:
        (root / "include" / "cuda_runtime_api.h").write_text("")
        (root / layout / f"libcudart.so.{version.split('.')[0]}").write_text("")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n"
                    f'case "$1" in --version) echo "Cuda compilation tools, release {version[:4]}, V{version}";;\n'
                    f'  --dryrun) echo "#\\$ TOP={root}/bin/..";; esac\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


@pytest.fixture
def no_toolkit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment where the finder's usual places hold nothing."""
    for var in ("OPFORGE_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [])
    monkeypatch.setattr(toolkit, "_candidates", _without_usr_local(toolkit._candidates))
    return tmp_path


def _without_usr_local(candidates):  # type: ignore[no-untyped-def]
    return lambda: [c for c in candidates() if c[0] != "/usr/local/cuda"]


def test_describe_reads_version_and_folders_from_nvcc(tmp_path: Path) -> None:
    nvcc = fake_toolkit(tmp_path / "cu13")
    kit = toolkit.describe(nvcc)
    assert (kit.version, kit.major, kit.root) == ("13.0.88", 13, (tmp_path / "cu13").resolve())
    assert kit.include_dir == (tmp_path / "cu13").resolve() / "include"
    assert kit.lib_dir == (tmp_path / "cu13").resolve() / "lib"


def test_a_classic_toolkit_keeps_its_runtime_in_lib64(tmp_path: Path) -> None:
    kit = toolkit.describe(fake_toolkit(tmp_path / "cuda-13.0", layout="lib64"))
    assert kit.lib_dir.name == "lib64"


def test_search_order_opforge_nvcc_then_cuda_home_then_wheels(no_toolkit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = fake_toolkit(no_toolkit / "site" / "nvidia" / "cu13")
    home = fake_toolkit(no_toolkit / "home")
    chosen = fake_toolkit(no_toolkit / "chosen")
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [wheel.parent.parent])
    assert toolkit.find().nvcc == wheel
    monkeypatch.setenv("CUDA_HOME", str(home.parent.parent))
    assert toolkit.find().nvcc == home
    monkeypatch.setenv("OPFORGE_NVCC", str(chosen))
    assert toolkit.find().nvcc == chosen


def test_another_cuda_major_is_passed_over_with_the_reason(no_toolkit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(no_toolkit / "cuda-12", version="12.8.93").parent.parent))
    with pytest.raises(toolkit.ToolkitError) as e:
        toolkit.find()
    text = str(e.value)
    assert "no CUDA 13 toolkit found" in text and "is CUDA 12.8.93, not 13.x" in text
    assert "pip install 'cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]==13.0.2'" in text and "$OPFORGE_NVCC" in text


def test_nothing_found_says_every_place_tried(no_toolkit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPFORGE_NVCC", str(no_toolkit / "nowhere" / "nvcc"))
    with pytest.raises(toolkit.ToolkitError) as e:
        toolkit.find()
    assert f"$OPFORGE_NVCC: no {no_toolkit / 'nowhere' / 'nvcc'}" in str(e.value)


def test_a_toolkit_without_the_runtime_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (nor in the nvidia.cu13 wheels: an environment with nvidia-cuda-runtime installed has them)
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [])
    with pytest.raises(toolkit.ToolkitError) as e:
        toolkit.describe(fake_toolkit(tmp_path / "bare", runtime=False))
    assert "has no cuda_runtime_api.h beside it: pip install 'nvidia-cuda-runtime~=13.0'" in str(e.value)


def test_an_nvcc_that_does_not_run_is_an_error_not_a_crash(tmp_path: Path) -> None:
    bad = tmp_path / "nvcc"
    bad.write_text("not a program")
    os.chmod(bad, 0o755)
    with pytest.raises(toolkit.ToolkitError, match="does not run|does not name a version"):
        toolkit.describe(bad)


def test_native_file_names_nvcc_and_the_runtime_folder_quoted(tmp_path: Path) -> None:
    kit = toolkit.describe(fake_toolkit(tmp_path / "it's here"))
    text = toolkit.native_file(kit)
    assert text.startswith("[binaries]\ncuda = [")
    assert "'" + str(kit.nvcc).replace("'", "\\'") + "'" in text
    assert "'-L" + str(kit.lib_dir).replace("'", "\\'") + "'" in text


def fake_cublas(root: Path, major: int = 13, headers: bool = True, libs: bool = True) -> Path:
    """cuBLAS's files as nvidia-cublas installs them (nvidia/cu13/{include,lib}), empty."""
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    if headers:
        for h in ("cublas_v2.h", "cublasLt.h"):
            (root / "include" / h).write_text("")
    if libs:
        for lib in (f"libcublas.so.{major}", f"libcublasLt.so.{major}"):
            (root / "lib" / lib).write_text("")
    return root


def test_cublas_beside_nvcc_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit = toolkit.describe(fake_toolkit(tmp_path / "cuda-13.0"))
    fake_cublas(tmp_path / "cuda-13.0")
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [fake_cublas(tmp_path / "site" / "nvidia" / "cu13")])
    found = toolkit.find_cublas(kit)
    assert (found.include_dir, found.lib_dir) == (kit.root / "include", kit.root / "lib")


def test_cublas_from_the_nvidia_cublas_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a system nvcc without cuBLAS (the device machines' and this one's), torch's nvidia-cublas in site-packages
    kit = toolkit.describe(fake_toolkit(tmp_path / "cuda-13.0"))
    wheel = fake_cublas(tmp_path / "site" / "nvidia" / "cu13")
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [wheel])
    found = toolkit.find_cublas(kit)
    assert (found.include_dir, found.lib_dir) == (wheel / "include", wheel / "lib")
    assert toolkit.main(["--nvcc", str(kit.nvcc), "--cublas"]) == 0


def test_cublas_missing_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    kit = toolkit.describe(fake_toolkit(tmp_path / "cuda-13.0"))
    # headers without the libraries (or the other major's libraries) are not cuBLAS 13
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [fake_cublas(tmp_path / "site" / "nvidia" / "cu13", major=12)])
    with pytest.raises(toolkit.ToolkitError) as e:
        toolkit.find_cublas(kit)
    text = str(e.value)
    assert "no cuBLAS 13 (libcublas.so.13 and libcublasLt.so.13) beside" in text
    assert "pip install 'nvidia-cublas~=13.0'" in text
    monkeypatch.setattr(toolkit, "_wheel_roots", lambda: [])
    assert toolkit.main(["--nvcc", str(kit.nvcc), "--cublas"]) == 1
    assert "no cuBLAS 13 (cublas_v2.h and cublasLt.h) beside" in capsys.readouterr().err
