"""Building the wheels: the file name carries the backend, the wheel holds the whole package; the
cuda wheel builds with nvcc from PyPI and runs CPU ops where there is no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.slow
def test_wheel_name_says_its_backend(tmp_path: Path) -> None:
    """The cpu wheel's name and contents: the wheel under test when the test command built it
    (noxfile.py's sessions install it and name it in $OPFORGE_WHEEL: no second build of the same
    sources), else one built here by `opforge build`."""
    given = os.environ.get("OPFORGE_WHEEL")
    if given:
        wheel = Path(given)
    else:
        r = subprocess.run([sys.executable, "-m", "opforge", "build", "--specs", str(ROOT / "op_specs"), "--backend",
                            "cpu", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "] Linking target libopforge.so" in r.stdout  # opforge build shows the compiler's progress
        (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith("opforge-0.1.0+cpu-cp311"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {f"opforge/{p.name.removesuffix('.in')}" for p in (ROOT / "pkg" / "opforge").iterdir()
               if p.name != "__pycache__"}
    generated = {"opforge/ops.pyi", "opforge/_formulas.py", "opforge/libopforge.so", "opforge/_build_info.py"}
    # what op modules compile against: the runtime's and the AOT face's headers, the pyfunc kernel's
    # declaration and every op's generated header (not the Python face's pybind11 header)
    generated |= {f"opforge/include/runtime/{p.name}" for p in (ROOT / "src" / "runtime").glob("*.h")}
    generated |= {f"opforge/include/aot/{p.name}" for p in (ROOT / "src" / "aot").glob("*.h")}
    generated |= {"opforge/include/python/pyfunc.h"}
    assert "opforge/include/python/python.h" not in names
    generated |= {f"opforge/include/ops/{p.stem}.h" for p in (ROOT / "op_specs").glob("*.yaml")}
    # the framework adapters' native sources, compiled on first use against the installed framework
    generated |= {"opforge/include/torch_native/torch_native.cpp", "opforge/include/jax_native/jax_native.cpp"}
    generated |= {f"opforge/codegen/templates/{p.name}" for p in (ROOT / "codegen" / "templates").iterdir()}
    generated |= {f"opforge/codegen/{p.relative_to(ROOT / 'codegen').as_posix()}"
                  for p in (ROOT / "codegen").rglob("*.py")}
    # aot ops' external libraries, built from src/kernels/aot/<op>.cpp
    generated |= {f"opforge/lib{p.stem}.so" for p in (ROOT / "src" / "kernels" / "aot").glob("*.cpp")}
    assert package | generated <= names, sorted((package | generated) - names)


def test_meson_installs_every_python_source() -> None:
    # meson lists sources by name: a module added to pkg/ or codegen/ but not to meson.build is missing
    # from the wheel (the slow test above sees it; this catches it in the fast set)
    listed = (ROOT / "meson.build").read_text()
    sources = [p for p in (ROOT / "pkg" / "opforge").iterdir() if p.name != "__pycache__"]
    sources += list((ROOT / "codegen").rglob("*.py")) + list((ROOT / "codegen" / "templates").iterdir())
    missing = [str(p.relative_to(ROOT)) for p in sources if f"'{p.relative_to(ROOT).as_posix()}'" not in listed]
    assert not missing, f"not installed by meson.build: {missing}"


def test_meson_without_nvcc_says_how_to_give_it(tmp_path: Path) -> None:
    # meson reads a CUDA compiler from PATH or a native file only; pip's builds write the native file
    meson = Path(sys.executable).parent / "meson"
    cmd = [str(meson) if meson.exists() else "meson", "setup", str(tmp_path / "b"), str(ROOT), "-Dops_backend=cuda"]
    path = [Path(sys.executable).parent] + [Path(p) for p in os.environ["PATH"].split(os.pathsep) if p]
    env = {**os.environ, "PATH": os.pathsep.join(str(p) for p in path if not (p / "nvcc").exists())}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode != 0
    assert "ops_backend=cuda needs nvcc 13.x given to meson" in r.stdout + r.stderr
    assert "--native-file from `python pkg/opforge/_cuda_toolkit.py --native-file FILE`" in r.stdout + r.stderr


@pytest.mark.slow
def test_cuda_wheel_builds_from_pypi_and_runs_cpu_ops_without_a_gpu(tmp_path: Path) -> None:
    # the command, in pip's isolated build environment: nvcc, the runtime's headers and
    # CCCL come from the cuda-toolkit wheels the build backend asks for (one architecture, no
    # optimization of host code and none in ptxas, the CUDA sources 8 to a translation unit: the
    # build is most of CI's time, and this wheel runs a few cpu ops and no kernel). cicc keeps its
    # optimizer: its unoptimized PTX of CUB's reductions took ptxas minutes (max.cu 240 s, 37 s with
    # ptxas -O0 alone). (The GPU suite's build compiles each CUDA file alone, as the default.)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(tmp_path / "dist"),
                        "-Csetup-args=-Dops_backend=cuda", "-Csetup-args=-Dops_cuda_arch=9.0",
                        "-Csetup-args=-Dbuildtype=plain", "-Csetup-args=-Dcuda_args=-Xptxas -O0",
                        "-Csetup-args=-Dops_cuda_unity=8"],
                       capture_output=True, text=True, timeout=2400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("opforge-0.1.0+cu130-cp311"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("opforge-0.1.0+cu130.dist-info/METADATA").decode()
        record = z.read("opforge-0.1.0+cu130.dist-info/RECORD").decode()
    assert "Requires-Dist: nvidia-cuda-runtime~=13.0" in meta.split("\n\n")[0]
    assert "Requires-Dist: nvidia-cublas~=13.0" in meta.split("\n\n")[0]  # (matmul and linear on cuda)
    assert "opforge-0.1.0+cu130.dist-info/METADATA,sha256=" in record
    # installed apart, with the CUDA runtime and cuBLAS from PyPI (no driver and no GPU on this machine)
    site = tmp_path / "site"
    # (and nvcc, as a user of opforge.load with CUDA kernels installs it: the same PyPI packages)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel),
                        "nvidia-cuda-runtime~=13.0", "nvidia-cublas~=13.0", "cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]==13.0.2"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    check = """
import numpy as np, opforge, opforge.cuda, opforge._build_info as b
assert opforge.backend == "cuda" and opforge._C.built_targets == "cpu, cuda", opforge._C.built_targets
assert "nvidia/cu13/bin/nvcc" in b.NVCC and b.CUDA_VERSION.startswith("13.0.") and b.CUDA_ARCH == "9.0", vars(b)
np.testing.assert_allclose(opforge.ops.mul(np.arange(3.0), np.arange(3.0)).numpy(), [0.0, 1.0, 4.0])
assert not opforge.cuda.is_available() and opforge.cuda.device_count() == 0
assert opforge.cuda.runtime_version().startswith("CUDA runtime 13"), opforge.cuda.runtime_version()
try:
    opforge.tensor([1.0], device="cuda")
except RuntimeError as e:
    assert "[tensor] device 'cuda': no cuda device is available (cudaError" in str(e), e
else:
    raise AssertionError("no RuntimeError")
# opforge.load in the cu130 wheel: the generated CUDA kernel of an expr op and a cpp op's .cu
# kernel compiled by nvcc (from the cuda-toolkit wheels) into the module beside the host code
m = opforge.load("jitcu", [SPECS + "/twice.yaml", SPECS + "/rowsum.yaml"],
                 [SPECS + "/rowsum.cpp", SPECS + "/rowsum.cu"], build_dir="cache")
compiled = m.__opforge_build__["compiled"]
assert "gen/twice.cu" in compiled and any(c.endswith("rowsum.cu") for c in compiled), compiled
assert m.__opforge_formulas__["twice"].runs == ("cpu", "cuda") == m.__opforge_formulas__["rowsum"].runs
np.testing.assert_allclose(m.twice(np.arange(3.0)).numpy(), [0.0, 2.0, 4.0])
np.testing.assert_allclose(m.rowsum(np.ones((2, 3), np.float32)).numpy(), [3.0, 3.0])
from opforge.codegen import SpecError
try:  # a cpp op with cuda rows needs its .cu kernel: a located error before any compiler runs
    opforge.load("jitcu_missing", [SPECS + "/rowsum.yaml"], [SPECS + "/rowsum.cpp"], build_dir="cache")
except SpecError as e:
    assert "rowsum.yaml" in str(e) and "pass its CUDA kernel file rowsum.cu" in str(e), e
else:
    raise AssertionError("no SpecError")
print("ok", opforge.cuda.unavailable_reason())
""".replace("SPECS", repr(str(FIXTURES / "cuda_module")))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
