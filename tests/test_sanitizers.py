"""The runtime, the kernels and every generated op built with AddressSanitizer and
UndefinedBehaviorSanitizer (meson's b_sanitize), running the fast op and runtime tests: any
out-of-bounds access, use after free or undefined behaviour fails the test with the sanitizer's
report. Slow (a second build of the package): `python -m pytest tests/test_sanitizers.py` runs it
alone; docs/reliability.md has the commands to run more of the suite under the sanitizers."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the part of the fast suite that runs here: every op's generated tests, the bad-input and runtime
# tests, the trust-boundary regressions, the op fuzzer's fast profile and the fast stress tests (the framework adapters load torch and MindSpore, whose
# own uninstrumented code is not what this checks)
# (tests/ops/test_formulas_py.py checks the Python formula table, not native code)
SUBSET = ["tests/ops/test_ops.py", "tests/ops/test_bad_input.py", "tests/ops/test_elem.py",
          "tests/ops/test_linalg.py", "tests/ops/test_norm.py", "tests/ops/test_softmax.py", "tests/runtime",
          "tests/fuzz/test_op_fuzz.py", "tests/stress"]


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed (pip install {name})")
    return path


@pytest.mark.slow
def test_fast_suite_is_clean_under_asan_and_ubsan(tmp_path_factory: pytest.TempPathFactory) -> None:
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    meson, _ = _tool("meson"), _tool("ninja")
    build = Path(os.environ.get("OPFORGE_SANITIZE_BUILD_DIR") or tmp_path_factory.mktemp("asan") / "build")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if not (build / "build.ninja").exists():
        subprocess.run(
            [meson, "setup", str(build), str(ROOT), "-Dops_backend=cpu", "-Db_sanitize=address,undefined",
             "-Db_lundef=false", "-Dbuildtype=plain", "-Db_ndebug=false",
             # -O0 builds in half -O1's time (the build is most of this test: CI's long pole), the
             # run taking longer instead; UB aborts instead of printing and going on;
             # float-cast-overflow (a float converted to an integer type that cannot hold it) is
             # not in GCC's "undefined" group
             "-Dcpp_args=-O0 -g1 -fno-omit-frame-pointer -fsanitize=float-cast-overflow "
             "-fno-sanitize-recover=undefined,float-cast-overflow"],
            check=True, env=env, capture_output=True, text=True)
    def library(name: str) -> str:
        return subprocess.run([cxx, f"-print-file-name={name}"], check=True, capture_output=True,
                              text=True).stdout.strip()
    env.update(
        OPFORGE_BUILD_DIR=str(build),
        # CPython is not instrumented: the sanitizer runtime is loaded first, and libstdc++ with it
        # (ASan intercepts __cxa_throw, which must be there when it starts); its leak checker
        # would report the interpreter's own allocations at exit
        LD_PRELOAD=f"{library('libasan.so')} {library('libstdc++.so')}",
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        # (tests/ops/test_ops.py: the gradient tests run the backward kernels, not the central
        # differences that would only call the same kernels again, hundreds of times per case)
        OPFORGE_SANITIZED="1",
    )
    env.pop("PYTHONPATH", None)
    # two workers when pytest-xdist is there (the test extra installs it): the instrumented run is
    # the longest test of the suite, and its tests are independent
    workers = ["-n", "2"] if importlib.util.find_spec("xdist") is not None else []
    run = subprocess.run(
        ["bash", str(ROOT / "tools" / "dev.sh"), "pytest", "-q", "-x", *workers, "-m", "not slow", *SUBSET],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    report = (run.stdout[-6000:] + "\n" + run.stderr[-12000:])
    assert run.returncode == 0, f"sanitized run failed (exit {run.returncode}):\n{report}"
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error:" not in run.stderr, report
