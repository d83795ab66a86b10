"""AOT both ways: every op's exported entry point with MindSpore's AOT C ABI (called here through
ctypes, as MindSpore calls it), and ops of impl kind ``aot`` whose kernel is a function of an
external shared library: the shipped one, one this test builds from a small C++ file, and one
built against PyTorch's ATen with torch's C++ extension tooling (seed 004's example)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import opforge
from opforge import _C, _formulas

LIB = ctypes.CDLL(opforge.LIBRARY)
X0 = np.array([[0.0, -0.1], [-0.2, 1.0]], np.float32)
EXPECTED = [[0.0, -0.001], [-0.002, 1.0]]


def call_entry(symbol: str, ins: list[np.ndarray], outs: list[np.ndarray], lib: Any = LIB) -> int:
    """Calls an AOT entry point the way MindSpore does (extra NULL: attrs at their defaults)."""
    arrs = ins + outs
    n = len(arrs)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrs])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrs])
    keep = [(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrs]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in keep])
    dtypes = (ctypes.c_char_p * n)(*[a.dtype.name.encode() for a in arrs])
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    return fn(n, params, ndims, shapes, dtypes, None, None)


def test_every_op_exports_its_entry_points() -> None:
    for op in _formulas.OPS.values():
        assert op.aot_symbols, op.name
        for _, symbol in op.aot_symbols:
            assert hasattr(LIB, symbol), symbol
    assert _formulas.OPS["layer_norm"].aot_symbol((True, False, False)) == "opforge_layer_norm__without__weight__bias"


def test_entry_point_computes_like_the_op(capfd) -> None:
    out = np.empty_like(X0)
    assert call_entry("opforge_leaky_relu", [X0], [out]) == 0
    np.testing.assert_allclose(out, EXPECTED, rtol=1e-6)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    y, mean, rstd = np.empty_like(x), np.empty((3, 1)), np.empty((3, 1))
    assert call_entry("opforge_layer_norm__without__weight__bias", [x], [y, mean, rstd]) == 0
    for got, want in zip((y, mean, rstd), opforge.ops.layer_norm(x)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12)
    a, b = rng.normal(size=(2, 1, 3)), rng.normal(size=(4, 1))
    z = np.empty((2, 4, 3))
    assert call_entry("opforge_mul", [a, b], [z]) == 0  # broadcasting
    np.testing.assert_array_equal(z, a * b)


def test_entry_point_failures_return_codes_and_say_why(capfd) -> None:
    out = np.empty((2, 2), np.float32)
    assert call_entry("opforge_exp", [np.ones((2, 2), np.int32)], [out]) == 1  # TypeError
    assert "[exp] dtype int32 is not supported on target cpu" in capfd.readouterr().err
    assert call_entry("opforge_exp", [np.ones((3,), np.float32)], [out]) == 2  # ValueError: host shape
    assert "output 'out': the host allocated shape (2, 2) but the op gives (3,)" in capfd.readouterr().err
    assert call_entry("opforge_mul", [X0], [out]) == 2  # one input short
    assert "[mul] AOT entry point: expected 3 parameters (2 inputs, 1 outputs), got 2" in capfd.readouterr().err
    bad = np.ones(2, np.complex64)
    assert call_entry("opforge_exp", [bad], [bad.copy()]) == 1
    assert "input 'x': unsupported dtype 'complex64'" in capfd.readouterr().err


def test_aot_op_runs_its_external_kernel() -> None:
    path = _C._aot_library("leaky_relu_ext", "libleaky_relu_ext.so", "leaky_relu_ext")
    assert Path(path).parent.resolve() == Path(_C.__file__).parent.resolve()
    np.testing.assert_allclose(opforge.ops.leaky_relu_ext(X0).numpy(), EXPECTED, rtol=1e-6)
    x = opforge.tensor(X0.astype(np.float64), requires_grad=True)
    opforge.ops.leaky_relu_ext(x).sum().backward()  # the spec's bprop
    np.testing.assert_array_equal(x.grad.numpy(), [[0.01, 0.01], [0.01, 1.0]])
    with pytest.raises(TypeError, match=r"\[leaky_relu_ext\] dtype float16 is not supported"):
        opforge.ops.leaky_relu_ext(X0.astype(np.float16))


def test_missing_library_or_symbol_names_them() -> None:
    with pytest.raises(RuntimeError, match=r"\[op\] AOT library 'libnope.so' not found \(symbol 'f'\); looked for "
                                           r".*libnope.so.*OPFORGE_AOT_PATH"):
        _C._aot_library("op", "libnope.so", "f")
    shipped = _C._aot_library("leaky_relu_ext", "libleaky_relu_ext.so", "leaky_relu_ext")
    with pytest.raises(RuntimeError, match=r"\[op\] symbol 'no_such' not found in AOT library .*libleaky_relu_ext.so"):
        _C._aot_library("op", shipped, "no_such")
    with pytest.raises(RuntimeError, match=r"\[op\] AOT library '/nonexistent/lib.so' not found"):
        _C._aot_library("op", "/nonexistent/lib.so", "f")


# ---------------------------------------------------------------------------- replacement libraries

CHECK = """
import os, sys
import numpy as np
{preamble}
import opforge
from opforge import _C
x0 = np.array([[0.0, -0.1], [-0.2, 1.0]], np.float32)
path = _C._aot_library("leaky_relu_ext", "libleaky_relu_ext.so", "leaky_relu_ext")
assert path.startswith(os.environ["OPFORGE_AOT_PATH"]), path
np.testing.assert_allclose(opforge.ops.leaky_relu_ext(x0).numpy(), {expected!r}, rtol=1e-6)
x = opforge.tensor(x0, requires_grad=True)
opforge.ops.leaky_relu_ext(x).sum().backward()
np.testing.assert_allclose(x.grad.numpy(), [[0.01, 0.01], [0.01, 1.0]], rtol=1e-6)
try:
    import mindspore as ms
except ImportError:
    print("no mindspore")
else:
    from mindspore import Tensor, nn
    ms.set_device(device_target="CPU")
    ms.runtime.launch_blocking()
    import opforge.mindspore as om
    assert om.ops.leaky_relu_ext.func == path + ":leaky_relu_ext"

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.leaky_relu = om.ops.leaky_relu_ext

        def construct(self, x):
            return self.leaky_relu(x)

    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        np.testing.assert_allclose(Net()(Tensor(x0)).asnumpy(), {expected!r}, rtol=1e-6)
        np.testing.assert_allclose(ms.grad(Net())(Tensor(x0)).asnumpy(), [[0.01, 0.01], [0.01, 1.0]], rtol=1e-6)
    print("mindspore ok")
print({marker!r})
"""


def run_check(lib_dir: Path, preamble: str = "", marker: str = "ok") -> str:
    script = lib_dir / "check.py"  # a file: MindSpore's Graph mode compiles from source files
    script.write_text(CHECK.format(preamble=preamble, expected=EXPECTED, marker=marker))
    env = {**os.environ, "OPFORGE_AOT_PATH": str(lib_dir), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                       cwd=lib_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker in r.stdout
    return r.stdout


SMALL_KERNEL = r"""
#include <cstdint>
#include <cstring>
#include <cstdio>
extern "C" int leaky_relu_ext(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                              void* stream, void* extra) {
  if (nparam != 2 || std::strcmp(dtypes[0], "float32") != 0) return 1;
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.01f * x[i];
  std::printf("small kernel called\n");
  std::fflush(stdout);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_library_built_from_a_small_cpp_file(tmp_path: Path) -> None:
    src = tmp_path / "leaky_relu_ext.cpp"
    src.write_text(SMALL_KERNEL)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "libleaky_relu_ext.so"), str(src)],
                   check=True)
    out = run_check(tmp_path)
    assert "small kernel called" in out
    if importlib.util.find_spec("mindspore") is not None:
        assert "mindspore ok" in out


ATEN_KERNEL = r"""
// Seed 004's leaky_relu.cpp: MindSpore's (or opforge's) buffers as ATen tensors, ATen's kernel.
#include <ATen/ATen.h>
#include <cstring>
#include <vector>

extern "C" int leaky_relu_ext(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                              void* stream, void* extra) {
  if (nparam != 2) return 1;
  at::ScalarType type;
  if (std::strcmp(dtypes[0], "float32") == 0) type = at::kFloat;
  else if (std::strcmp(dtypes[0], "float64") == 0) type = at::kDouble;
  else return 2;
  std::vector<int64_t> shape(shapes[0], shapes[0] + ndims[0]);
  at::Tensor x = at::from_blob(params[0], shape, at::TensorOptions().dtype(type));
  at::Tensor y = at::from_blob(params[1], shape, at::TensorOptions().dtype(type));
  at::leaky_relu_out(y, x);  // slope 0.01
  return 0;
}
"""


@pytest.mark.slow
def test_a_library_built_against_aten(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
    from torch.utils import cpp_extension

    src = tmp_path / "leaky_relu_ext.cpp"
    src.write_text(ATEN_KERNEL)
    build = tmp_path / "build"
    build.mkdir()
    cpp_extension.load(name="libleaky_relu_ext", sources=[str(src)], build_directory=str(build),
                       is_python_module=False, verbose=False)
    assert (build / "libleaky_relu_ext.so").is_file()
    assert torch is not None
    # torch first: the library needs libtorch, which importing torch loads
    run_check(build, preamble="import torch", marker="aten ok")


# ---------------------------------------------------------------------------- hardening


def test_outputs_that_overlap_are_refused(capfd) -> None:
    x = np.random.default_rng(1).normal(size=(3, 4))
    y = np.empty_like(x)
    stats = np.empty(6)
    for mean, rstd in ((stats[:3].reshape(3, 1), stats[:3].reshape(3, 1)),   # one buffer twice
                       (stats[:3].reshape(3, 1), stats[2:5].reshape(3, 1))):  # sharing one element
        assert call_entry("opforge_layer_norm__without__weight__bias", [x], [y, mean, rstd]) == 2
        assert ("[layer_norm] AOT entry point: outputs 'mean' and 'rstd' overlap in memory; give each output its "
                "own buffer") in capfd.readouterr().err
    assert call_entry("opforge_layer_norm__without__weight__bias", [x], [y, stats[:3].reshape(3, 1),
                                                                          stats[3:].reshape(3, 1)]) == 0
    for got, want in zip((y, stats[:3], stats[3:]), opforge.ops.layer_norm(x)):
        np.testing.assert_allclose(got.ravel(), want.numpy().ravel(), rtol=1e-12)
    # an output over an input is a host computing in place: allowed
    z = np.array([0.5, -1.0, 2.0])
    want = np.exp(z)
    assert call_entry("opforge_exp", [z], [z]) == 0
    np.testing.assert_allclose(z, want, rtol=1e-15)


def test_relative_library_paths_never_depend_on_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    shipped = _C._aot_library("leaky_relu_ext", "libleaky_relu_ext.so", "leaky_relu_ext")
    (tmp_path / "sub").mkdir()
    shutil.copy(shipped, tmp_path / "sub" / "librel_probe.so")
    monkeypatch.chdir(tmp_path)
    for library in ("sub/librel_probe.so", "./sub/librel_probe.so"):
        with pytest.raises(RuntimeError, match=re.escape(
                f"[op] AOT library '{library}' (symbol 'leaky_relu_ext') must be an absolute path or a file name "
                "looked up in OPFORGE_AOT_PATH and the package's directory; a relative path would depend on the "
                "current directory")):
            _C._aot_library("op", library, "leaky_relu_ext")
    monkeypatch.setenv("OPFORGE_AOT_PATH", "sub")
    with pytest.raises(RuntimeError, match=re.escape(
            "[op] OPFORGE_AOT_PATH holds the relative directory 'sub'; give absolute directories (a relative one "
            "would depend on the current directory)")):
        _C._aot_library("op", "librel_probe.so", "leaky_relu_ext")
    monkeypatch.setenv("OPFORGE_AOT_PATH", str(tmp_path / "sub"))
    assert _C._aot_library("op", "librel_probe.so", "leaky_relu_ext") == str(tmp_path / "sub" / "librel_probe.so")


def test_attr_text_is_read_whole_and_locale_free() -> None:
    for text, value in (("0.5", 0.5), (" 2.5 ", 2.5), ("+1.5", 1.5), ("1e-05", 1e-05), ("-inf", -np.inf),
                        ("0.1", 0.1), (repr(1 / 3), 1 / 3)):
        assert _C._aot_attr_value("float", text) == value, text
    assert np.isnan(_C._aot_attr_value("float", "nan"))
    for text, value in (("12", 12), (" -3 ", -3), ("+4", 4), ("9223372036854775807", 2**63 - 1)):
        assert _C._aot_attr_value("int", text) == value, text
    for kind, text in (("float", "0.5x"), ("float", "0,5"), ("float", ""), ("float", " "), ("float", "1e999"),
                       ("float", "+-1"), ("float", "0.5 1"), ("int", "1.0"), ("int", "12abc"),
                       ("int", "9223372036854775808"), ("int", "")):
        with pytest.raises(TypeError, match=re.escape(f"[aot] attr 'attr': expected {kind}, got the text '{text}'")):
            _C._aot_attr_value(kind, text)


COMMA_LOCALE = """LC_CTYPE
copy "POSIX"
END LC_CTYPE
LC_NUMERIC
decimal_point "<U002C>"
thousands_sep "<U002E>"
grouping 3;3
END LC_NUMERIC
"""


@pytest.fixture()
def comma_decimal_locale(tmp_path: Path, monkeypatch) -> Iterator[None]:
    """LC_NUMERIC set to a locale whose decimal point is a comma (as a host such as a German
    desktop application may run), compiled with localedef when none is installed."""
    import locale

    before = locale.setlocale(locale.LC_NUMERIC)
    for name in ("de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"):
        try:
            locale.setlocale(locale.LC_NUMERIC, name)
            break
        except locale.Error:
            pass
    else:
        if shutil.which("localedef") is None:
            pytest.skip("no comma-decimal locale installed and no localedef to make one")
        (tmp_path / "comma").write_text(COMMA_LOCALE)
        subprocess.run(["localedef", "-c", "-i", str(tmp_path / "comma"), "-f", "ANSI_X3.4-1968",
                        str(tmp_path / "xx_XX")], capture_output=True)
        monkeypatch.setenv("LOCPATH", str(tmp_path))
        locale.setlocale(locale.LC_NUMERIC, "xx_XX")
    try:
        assert locale.localeconv()["decimal_point"] == ","
        yield
    finally:
        locale.setlocale(locale.LC_NUMERIC, before)


def test_float_attrs_read_the_same_under_a_comma_decimal_locale(comma_decimal_locale, capfd) -> None:
    assert _C._aot_attr_value("float", "0.25") == 0.25
    with pytest.raises(TypeError, match=re.escape("[aot] attr 'attr': expected float, got the text '0,25'")):
        _C._aot_attr_value("float", "0,25")
    out = np.empty_like(X0)  # alpha comes from the spec's default, the text "0.01"
    assert call_entry("opforge_leaky_relu", [X0], [out]) == 0, capfd.readouterr().err
    np.testing.assert_allclose(out, EXPECTED, rtol=1e-6)
