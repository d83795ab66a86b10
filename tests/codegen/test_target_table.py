"""The target table (codegen/targets.py) is the one place targets differ: the build's labels and
availability (tools/version.py, which meson.build runs), kernel paths and namespaces in generated
code, the registration rows' MindSpore names and the op table's TARGETS all come from it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from codegen import SpecErrors, load_specs
from codegen.gen import render_all
from codegen.targets import BUILDS, TARGETS, Backend

ROOT = Path(__file__).resolve().parents[2]

CPP_OP = """\
twice:
  doc: Twice x (a cpp kernel).
  inputs:
    x: {dtype: T, differentiable: false}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float32]
  targets:
    cpu: {}
    cuda: {}
  impl:
    cpp: {}
"""


def test_every_target_key_has_a_row() -> None:
    assert set(TARGETS) == set(Backend) and all(TARGETS[b].name == b for b in Backend)
    assert {t for build in BUILDS.values() for t in build.targets} <= set(TARGETS)


def test_version_script_reads_the_builds() -> None:
    for name, build in BUILDS.items():
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "version.py"), "--build", name],
                           capture_output=True, text=True, check=True)
        assert r.stdout.split() == [build.wheel_label, "available" if build.available else "unavailable",
                                    ",".join(build.targets)]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "version.py"), "--build", "tpu"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown backend 'tpu'; one of: cpu, cuda" in r.stderr


def test_generated_code_takes_paths_namespaces_and_names_from_the_table(tmp_path: Path) -> None:
    cpu = TARGETS[Backend.CPU]
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "twice.yaml").write_text(textwrap.dedent(CPP_OP))
    kernel = tmp_path / cpu.kernel_path("twice")
    kernel.parent.mkdir(parents=True)
    kernel.write_text("")
    ops = load_specs([tmp_path / "specs"], kernel_root=tmp_path)
    out = {r.name: r.text for r in render_all(ops, {"twice": "specs/twice.yaml"})}
    assert f"namespace {cpu.namespace} {{" in out["twice.h"] and f"Implement in {cpu.kernel_path('twice')}." in out["twice.h"]
    assert f"OPFORGE_INSTANTIATE_TWICE_{cpu.macro_suffix}" in out["twice.h"]
    assert f"{cpu.namespace}::twice<float>" in out["twice.cpp"]
    # registration rows name each target as MindSpore does (op_info's "target")
    for b in (Backend.CPU, Backend.CUDA):
        assert f'TargetInfo{{"{b}", "{TARGETS[b].mindspore_target}", {{' in out["twice.cpp"]
    # the op table carries the table for the Python package and its adapters
    ns: dict = {}
    exec(compile(out["_formulas.py"], "_formulas.py", "exec"), ns)
    assert {k: tuple(v) for k, v in ns["TARGETS"].items()} == {
        str(b): (str(b), r.device_type, r.torch_dispatch_key, r.mindspore_target, r.dlpack_device_type)
        for b, r in TARGETS.items()}
    assert {k: tuple(v) for k, v in ns["BUILDS"].items()} == {
        name: (b.backend, b.wheel_label, tuple(str(t) for t in b.targets), b.available, b.runtime_requires,
               b.runtime_libs) for name, b in BUILDS.items()}
    assert ns["BUILT_TARGETS"] == tuple(str(t) for t in BUILDS["cpu"].targets)


def test_the_cuda_build_declares_cuda_kernels_and_wants_their_files(tmp_path: Path) -> None:
    cpu, cuda = TARGETS[Backend.CPU], TARGETS[Backend.CUDA]
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "twice.yaml").write_text(textwrap.dedent(CPP_OP))
    for row in (cpu, cuda):
        (tmp_path / row.kernel_path("twice")).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / cpu.kernel_path("twice")).write_text("")
    # the cpu build needs only the cpu kernel; the cuda build also src/kernels/cuda/twice.cu
    load_specs([tmp_path / "specs"], kernel_root=tmp_path, build=BUILDS["cpu"])
    with pytest.raises(SpecErrors) as e:
        load_specs([tmp_path / "specs"], kernel_root=tmp_path, build=BUILDS["cuda"])
    assert f"missing kernel file {tmp_path / cuda.kernel_path('twice')} for target cuda" in str(e.value)
    assert "twice.yaml:13:10: impl.cpp: " in str(e.value)  # located at the impl key
    (tmp_path / cuda.kernel_path("twice")).write_text("")
    ops = load_specs([tmp_path / "specs"], kernel_root=tmp_path, build=BUILDS["cuda"])
    out = {r.name: r.text for r in render_all(ops, {"twice": "specs/twice.yaml"}, BUILDS["cuda"])}
    for row in (cpu, cuda):
        assert f"namespace {row.namespace} {{" in out["twice.h"]
        assert f"OPFORGE_INSTANTIATE_TWICE_{row.macro_suffix}" in out["twice.h"]
    assert "BUILT_TARGETS = ('cpu', 'cuda',)" in out["_formulas.py"]
    # the same specs in the cpu build: no cuda declaration
    cpu_out = {r.name: r.text for r in render_all(ops, {"twice": "specs/twice.yaml"}, BUILDS["cpu"])}
    assert f"namespace {cuda.namespace} {{" not in cpu_out["twice.h"]


EXPR_OP = """\
halve:
  doc: Half of x.
  inputs:
    x: {dtype: T, differentiable: false}
  outputs:
    out: {dtype: T, shape: same(x)}
  dtypes:
    T: [float16, float32, float64]
  targets:
    cpu: {}
    cuda: {dtypes: {T: [float16, float32]}}
  impl:
    expr: x * 0.5
"""


def test_the_cuda_build_generates_device_kernels_of_expr_ops(tmp_path: Path) -> None:
    from codegen.gen import device_files, output_names

    (tmp_path / "halve.yaml").write_text(EXPR_OP)
    ops = load_specs([tmp_path])
    cuda = {r.name: r.text for r in render_all(ops, {"halve": "halve.yaml"}, BUILDS["cuda"])}
    # one functor for host and device, in the header; the device TU runs it per cuda row
    assert "OPFORGE_HD OPFORGE_INLINE auto operator()" in cuda["halve.h"]
    assert "namespace kernels::cuda {\n" in cuda["halve.h"] and "void halve(const CallInfo& call" in cuda["halve.h"]
    kernel = cuda["halve.cu"]
    assert "::opforge::cuda::elementwise<Half, Half>(*v_out, HalveExpr<compute_t<Half>>{a}" in kernel
    assert "elementwise<float, float>" in kernel and "double" not in kernel  # (only the cuda rows)
    # Forward dispatches on the call's device first; the cuda row runs in this build
    assert "if (call.device.type == DeviceType::CUDA) {\n      kernels::cuda::halve(call, expr_args(attrs), v_out, v_x);" in cuda["halve.cpp"]
    assert 'TargetInfo{"cuda", "GPU", {' in cuda["halve.cpp"] and '}, true},\n    },\n    "",\n    false,\n};' in cuda["halve.cpp"]
    assert device_files(ops, BUILDS["cuda"]) == ["halve.cu"] and "halve.cu" in output_names(["halve"], ["halve.cu"])
    # the cpu build: no device TU, no device branch, the cuda row registered but not run
    cpu = {r.name: r.text for r in render_all(ops, {"halve": "halve.yaml"}, BUILDS["cpu"])}
    assert "halve.cu" not in cpu and "DeviceType::CUDA" not in cpu["halve.cpp"] and device_files(ops, BUILDS["cpu"]) == []
    assert 'TargetInfo{"cuda", "GPU", {' in cpu["halve.cpp"] and '}, false},\n    },\n    "",\n    false,\n};' in cpu["halve.cpp"]
    # op modules compile host code only (for now): no device TU in the cuda wheel either
    from codegen.gen import render_module
    module = {r.name for r in render_module(ops, {"halve": "halve.yaml"}, "m", build=BUILDS["cuda"])}
    assert "halve.cu" not in module
