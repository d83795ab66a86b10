"""pyfunc ops (impl: {pyfunc: "module:function"}): a NumPy function as an op's CPU kernel, built by
opforge.load (compiles C++: marked slow), checked and differentiated like any op, in opforge and
in PyTorch; the contract's mistakes raise errors naming the op."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import opforge

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "codegen" / "fixtures" / "np_softplus.yaml"
sys.path.insert(0, str(HERE))  # pyfunc_helpers, the module the specs name

from pyfunc_helpers import np_ops  # noqa: E402

pytestmark = pytest.mark.slow

TWO = """\
{name}:
  doc: Sum and row products.
  inputs:
    x: T
    y: T
  outputs:
    s: {{dtype: T, shape: same(x)}}
    p: {{dtype: T, shape: "reduce(x, axis, true)"}}
  attrs:
    axis: {{type: "list[int]", default: [-1]}}
  dtypes:
    T: [float64]
  impl:
    pyfunc: {target}
  bprop:
    x: ds + expand_reduced(dp, x, axis, true) * y
    y: ds + expand_reduced(dp, x, axis, true) * x
"""


def _variant(d: Path, name: str, function: str) -> Path:
    text = FIXTURE.read_text().replace("np_softplus:", f"{name}:", 1)
    text = text.replace("pyfunc_helpers.np_ops:softplus", function)
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def m(tmp_path_factory: pytest.TempPathFactory) -> object:
    d = tmp_path_factory.mktemp("specs")
    specs = [FIXTURE]
    for name, fn in [("pf_wrong_dtype", "wrong_dtype"), ("pf_wrong_shape", "wrong_shape"), ("pf_raises", "raises"),
                     ("pf_not_array", "not_an_array"), ("pf_keeps", "keeps"),
                     ("pf_no_module", "pyfunc_helpers.nope:f"), ("pf_no_function", "missing")]:
        specs.append(_variant(d, name, fn if ":" in fn else f"pyfunc_helpers.np_ops:{fn}"))
    (d / "pf_two.yaml").write_text(TWO.format(name="pf_two", target="pyfunc_helpers.np_ops:split"))
    specs.append(d / "pf_two.yaml")
    return opforge.load("pyfunc_test", specs=specs, build_dir=tmp_path_factory.mktemp("cache"))


def softplus(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    return np.log1p(np.exp(beta * x)) / beta


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_forward_matches_numpy(m: object, dtype: str) -> None:
    x = np.linspace(-2, 2, 12).reshape(3, 4).astype(dtype)
    np_ops.CALLS.clear()
    y = m.np_softplus(x, beta=2.0).numpy()
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(y, softplus(x.astype(np.float64), 2.0), rtol=2e-3 if dtype == "float16" else 1e-6)
    assert np_ops.CALLS == [{"writeable": False, "beta": 2.0, "type": float}]


def test_non_contiguous_input_and_registration_rows(m: object) -> None:
    x = np.linspace(-2, 2, 24).reshape(4, 6)[:, ::2]
    np.testing.assert_allclose(m.np_softplus(x).numpy(), softplus(x))
    rows = opforge.op_info("np_softplus")
    assert rows and all(r["op_name"] == "np_softplus" for r in rows)
    with pytest.raises(TypeError, match=r"\[np_softplus\] dtype int64 is not supported on target cpu"):
        m.np_softplus(np.arange(3))
    with pytest.raises(ValueError, match=r"\[np_softplus\] attr 'beta' must be >= 0"):
        m.np_softplus(x, beta=-1.0)


def test_backward_matches_finite_differences(m: object) -> None:
    x0 = np.linspace(-1.5, 1.5, 6)
    x = opforge.tensor(x0, requires_grad=True)
    opforge.ops.sum(m.np_softplus(x, beta=1.5)).backward()
    eps = 1e-6
    numeric = (softplus(x0 + eps, 1.5) - softplus(x0 - eps, 1.5)) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), numeric, rtol=1e-6)


def test_several_outputs_and_their_gradients(m: object) -> None:
    x0, y0 = np.random.default_rng(0).normal(size=(2, 3, 4))
    x, y = opforge.tensor(x0, requires_grad=True), opforge.tensor(y0, requires_grad=True)
    s, p = m.pf_two(x, y)
    np.testing.assert_allclose(s.numpy(), x0 + y0)
    np.testing.assert_allclose(p.numpy(), (x0 * y0).sum(-1, keepdims=True))
    opforge.ops.add(opforge.ops.sum(s), opforge.ops.sum(p)).backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 + y0)
    np.testing.assert_allclose(y.grad.numpy(), 1 + x0)


def test_wrong_dtype_wrong_shape_and_not_an_array(m: object) -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match=r"^\[pf_wrong_dtype\] pyfunc 'pyfunc_helpers\.np_ops:wrong_dtype' returned "
                       r"output 'out' of dtype float64; expected float32"):
        m.pf_wrong_dtype(x)
    with pytest.raises(ValueError, match=r"^\[pf_wrong_shape\] pyfunc 'pyfunc_helpers\.np_ops:wrong_shape' returned "
                       r"output 'out' of shape \(1,\); expected \(2, 3\)$"):
        m.pf_wrong_shape(x)
    with pytest.raises(TypeError, match=r"^\[pf_not_array\] .* must return a NumPy array for output 'out', got float"):
        m.pf_not_array(x)


def test_the_functions_exception_names_the_op(m: object) -> None:
    with pytest.raises(ZeroDivisionError, match=r"^\[pf_raises\] pyfunc 'pyfunc_helpers\.np_ops:raises': "
                       r"beta is too small$") as info:
        m.pf_raises(np.ones(3))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_missing_module_or_function(m: object) -> None:
    with pytest.raises(ImportError, match=r"^\[pf_no_module\] pyfunc 'pyfunc_helpers\.nope:f': No module named"):
        m.pf_no_module(np.ones(3))
    with pytest.raises(AttributeError, match=r"^\[pf_no_function\] pyfunc 'pyfunc_helpers\.np_ops:missing': .*missing"):
        m.pf_no_function(np.ones(3))


def test_a_kept_input_array_stays_valid(m: object) -> None:
    np_ops.KEPT.clear()
    x = np.arange(100000, dtype=np.float64)
    m.pf_keeps(opforge.tensor(x))  # (the tensor is freed after the call; the kept array holds it)
    import gc
    gc.collect()
    np.testing.assert_array_equal(np_ops.KEPT[0], x)
    assert not np_ops.KEPT[0].flags.writeable


def test_threads_and_large_inputs_do_not_deadlock(m: object) -> None:
    # large inputs make the binding release the GIL before the kernel, which takes it back
    x = np.linspace(-1, 1, 50000)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                t = opforge.tensor(x, requires_grad=True)
                opforge.ops.sum(m.np_softplus(t)).backward()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and not errors


def test_in_torch(m: object) -> None:
    torch = pytest.importorskip("torch")
    import opforge.torch as ot

    ot.register_module(m)
    x = torch.linspace(-2, 2, 8, dtype=torch.float64, requires_grad=True)
    y = torch.ops.pyfunc_test.np_softplus(x, 1.5)
    np.testing.assert_allclose(y.detach().numpy(), softplus(x.detach().numpy(), 1.5))
    (g,) = torch.autograd.grad(y.sum(), x)
    np.testing.assert_allclose(g.numpy(), 1 / (1 + np.exp(-1.5 * x.detach().numpy())), rtol=1e-6)
    torch.autograd.gradcheck(lambda t: torch.ops.pyfunc_test.np_softplus(t, 1.5), (x,))
