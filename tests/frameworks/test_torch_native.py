"""opforge.torch's native kernels (opforge/_torch_native.py, src/torch_native/torch_native.cpp):
built against the installed torch and serving torch.ops.opforge's CPU and Autograd keys in C++;
the Python kernels when they cannot be built or are switched off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge.torch as ot  # noqa: E402
from opforge import _torch_native  # noqa: E402

ops = ot.ops
HERE = Path(__file__).parent


def _kernel_file(op: str, key: str) -> str:
    for line in torch._C._dispatch_dump(f"opforge::{op}").splitlines():
        if line.startswith(f"{key}: registered at ") or line.startswith(f"{key}[alias]: registered at "):
            return line.split("registered at ", 1)[1]
    raise AssertionError(f"no {key} kernel for opforge::{op}")


def test_the_native_kernels_serve_cpu_and_autograd() -> None:
    """In this environment (a compiler, torch's headers) the native module builds: the CPU and
    Autograd kernels come from torch_native.cpp; fake, autocast and torch.func's stay in Python."""
    assert os.environ.get("OPFORGE_TORCH_NATIVE") != "0", "the suite runs with the native kernels"
    assert _torch_native.load() is not None
    for op in ("mul", "layer_norm", "max", "cross_entropy"):
        assert "torch_native.cpp" in _kernel_file(op, "CPU")
        assert "torch_native.cpp" in _kernel_file(op, "Autograd")
        assert "torch.py" in _kernel_file(op, "FuncTorchDynamicLayerFrontMode")


def test_the_graph_node_is_a_cpp_node_running_the_specs_bprop() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=gen, requires_grad=True)
    b = torch.randn(4, generator=gen, requires_grad=True)  # broadcast: the bprop reduces its gradient
    out = ops.mul(a, b)
    assert out.grad_fn.name() == "opforge::mul.backward"
    g = torch.randn(3, 4, generator=gen)
    da, db = torch.autograd.grad(out, (a, b), g)
    torch.testing.assert_close(da, g * b)
    torch.testing.assert_close(db, (g * a).sum(0))
    # only the inputs asked for: torch.autograd.grad(inputs=...) reaches the node's need flags
    (only_b,) = torch.autograd.grad(ops.mul(a, b), (b,), g)
    torch.testing.assert_close(only_b, (g * a).sum(0))


def test_the_norms_fuse_parameter_gradients_only_when_they_are_asked_for() -> None:
    # layer_norm's bprop: if_needs(weight/bias, the fused dx-dweight-dbias op, dx alone); the node's
    # need flags are torch's (trained parameters, the inputs torch.autograd.grad asks for)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    g = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    dx, dw, _ = torch.autograd.grad(ops.layer_norm(x, w, b)[0], (x, w, b), g, create_graph=True)
    assert dx.grad_fn.name() == "opforge::layer_norm_affine_backward.backward"
    (only_x,) = torch.autograd.grad(ops.layer_norm(x, w, b)[0], (x,), g, create_graph=True)
    assert only_x.grad_fn.name() == "opforge::layer_norm_backward.backward"
    frozen = ops.layer_norm(x, w.detach(), b.detach())[0]
    (frozen_x,) = torch.autograd.grad(frozen, (x,), g, create_graph=True)
    assert frozen_x.grad_fn.name() == "opforge::layer_norm_backward.backward"
    torch.testing.assert_close(only_x, dx)
    torch.testing.assert_close(frozen_x, dx)
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x, (8,), w, b), (x, w), g)
    torch.testing.assert_close((dx, dw), want)


def test_gradients_of_gradients_through_native_nodes() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ops.gelu(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    xt = x.detach().requires_grad_(True)
    (gt,) = torch.autograd.grad(torch.nn.functional.gelu(xt).sum(), xt, create_graph=True)
    (ggt,) = torch.autograd.grad(gt.sum(), xt)
    torch.testing.assert_close(g, gt)
    torch.testing.assert_close(gg, ggt)
    assert torch.autograd.gradcheck(lambda t: ops.softmax(t, axis=-1), (torch.randn(2, 3, dtype=torch.float64,
                                                                                       requires_grad=True),))
    assert torch.autograd.gradgradcheck(lambda t, w: ops.mul(t, w),
                                        (torch.randn(3, dtype=torch.float64, requires_grad=True),
                                         torch.randn(3, dtype=torch.float64, requires_grad=True)))


def test_a_saved_tensor_modified_in_place_fails_backward_as_in_torch() -> None:
    a = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True) * 1.0  # (a non-leaf: it may change in place)
    out = ops.mul(a, w)
    w.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_an_output_backward_does_not_reach_gets_zeros_and_indices_get_no_gradient() -> None:
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    sin, cos = ops.sincos(x)
    sin.sum().backward()  # (cos unused: its gradient is zeros to the bprop)
    torch.testing.assert_close(x.grad, torch.cos(x.detach()))
    values, indices = ops.max(x.detach().reshape(2, 2).requires_grad_(True), axis=1)
    assert values.requires_grad and not indices.requires_grad and indices.dtype == torch.int64


def test_forward_mode_and_no_grad_calls() -> None:
    import torch.autograd.forward_ad as fwAD

    x, t, y = torch.randn(3), torch.randn(3), torch.randn(3)
    with fwAD.dual_level():  # (a tangent: the op's autograd.Function, its jvp formula)
        out = ops.mul(fwAD.make_dual(x, t), y)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, t * y)
    a = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out = ops.mul(a, y)
    assert out.grad_fn is None and not out.requires_grad


def test_errors_keep_their_python_types_and_messages() -> None:
    with pytest.raises(ValueError, match=r"\[mul\] shapes cannot be broadcast together"):
        ops.mul(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match=r"\[exp\] input 'x' has dtype torch.complex64, which opforge does not have"):
        ops.exp(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(IndexError, match=r"\[embedding\]"):
        ops.embedding(torch.tensor([0, 7]), torch.randn(4, 2))


def test_backward_in_several_threads_at_once() -> None:
    """Each thread's graph of native nodes, run concurrently (the nodes take the GIL only for the
    bprop formula): every thread gets its own gradients."""
    results: dict[int, bool] = {}

    def work(k: int) -> None:
        gen = torch.Generator().manual_seed(k)
        ok = True
        for _ in range(50):
            x = torch.randn(64, generator=gen, requires_grad=True)
            y = torch.randn(64, generator=gen)
            ops.mul(ops.gelu(x), y).sum().backward()
            xt = x.detach().requires_grad_(True)
            (torch.nn.functional.gelu(xt) * y).sum().backward()
            ok = ok and torch.allclose(x.grad, xt.grad, atol=1e-5)
        results[k] = ok

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True, 3: True}


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


_CHECK = """
    import warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import torch, opforge.torch as ot
    native = [w for w in caught if "native kernels" in str(w.message)]
    print(len(native), native[0].message if native else "")
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3)
    ot.ops.mul(x, y).sum().backward()
    assert torch.allclose(x.grad, y)
    print(torch._C._dispatch_dump("opforge::mul"))
"""


def test_without_a_compiler_one_warning_and_the_python_kernels(tmp_path: Path) -> None:
    r = _run(_CHECK, {"CXX": "false", "OPFORGE_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    first, dump = r.stdout.split("\n", 1)
    assert first.startswith("1 opforge.torch: native kernels unavailable (BuildError:"), first
    assert "using the Python kernels" in first
    assert "torch_native.cpp" not in dump and "CPU: registered at" in dump


def test_a_failed_build_is_remembered_until_its_marker_is_removed(tmp_path: Path) -> None:
    """A compile error is written beside the cache entry: later processes fall back at once
    (no 30-s rebuild per import) and say which file to remove to try again."""
    env = {"CXX": "g++ -include /nonexistent/opforge-test.h", "OPFORGE_CACHE_DIR": str(tmp_path)}
    r = _run(_CHECK, env)
    assert r.returncode == 0, r.stderr
    assert "compiling torch_native.cpp failed" in r.stdout
    markers = list((tmp_path / ".torch_native").glob("*.failed"))
    assert len(markers) == 1
    r = _run(_CHECK, env)
    assert r.returncode == 0 and f"remove {markers[0]} to try again" in r.stdout, r.stdout + r.stderr


def test_the_python_kernels_when_switched_off() -> None:
    """OPFORGE_TORCH_NATIVE=0: the Python kernels, checked by the adapter's own tests."""
    r = _run(_CHECK, {"OPFORGE_TORCH_NATIVE": "0"})
    assert r.returncode == 0 and r.stdout.startswith("0 "), r.stdout + r.stderr
    assert "torch_native.cpp" not in r.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-n", "0",
                        str(HERE / "test_torch_adapter.py")], capture_output=True, text=True,
                       env={**os.environ, "OPFORGE_TORCH_NATIVE": "0"}, timeout=600, cwd=HERE.parent.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
