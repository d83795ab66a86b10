"""opforge.torch's contract beyond the per-op checks: schemas, memory exchange, errors, import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge  # noqa: E402
import opforge.torch as ot  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cases import Case, make_data, widest_cases  # noqa: E402
from torch_cases import torch_inputs  # noqa: E402

ops = ot.ops


def test_schemas_come_from_the_specs() -> None:
    table = ot._formulas.OPS
    assert ot.schema(table["layer_norm"]) == (
        "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, int[] axis=[-1], float eps=1e-05)"
        " -> (Tensor, Tensor, Tensor)")
    assert ot.schema(table["sum"]) == "sum(Tensor x, int[]? axis=None, bool keepdims=False) -> Tensor"
    assert ot.schema(table["gelu"]) == 'gelu(Tensor x, str approximate="none") -> Tensor'
    assert ot.schema(table["clamp"]) == "clamp(Tensor x, float? min=None, float? max=None) -> Tensor"
    assert str(torch.ops.opforge.leaky_relu.default._schema) == (
        "opforge::leaky_relu(Tensor x, float alpha=0.01) -> Tensor")


def test_python_numbers_as_operands_like_torchs_scalar_overloads() -> None:
    table = ot._formulas.OPS
    assert ot.scalar_slots(table["add"]) == [(0, 1), (1, 0)]
    assert ot.scalar_slots(table["where"]) == [(1, 2), (2, 1)]  # (not the bool condition)
    assert ot.scalar_slots(table["exp"]) == [] and ot.scalar_slots(table["layer_norm"]) == []
    assert str(torch.ops.opforge.add.scalar_y._schema) == "opforge::add.scalar_y(Tensor x, Scalar y) -> Tensor"
    t = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float16, requires_grad=True)
    out = ops.add(t, 1.0)  # torch's overload resolution picks add.scalar_y
    assert out.dtype == torch.float16  # the number takes the tensor's dtype
    torch.testing.assert_close(out, torch.add(t, 1.0))
    torch.testing.assert_close(ops.pow(2.0, t.detach()), torch.pow(2.0, t.detach()))
    torch.testing.assert_close(ops.where(t.detach() > 0, t.detach(), 0.0), torch.where(t > 0, t, 0.0).detach())
    torch.testing.assert_close(ops.greater(t.detach(), 0), t.detach() > 0)
    out.sum().backward()  # autograd through the op the overload calls
    torch.testing.assert_close(t.grad, torch.ones_like(t))
    with FakeTensorMode() as mode:  # fake tensors: the composite overload sees the op's fake kernel
        fake = ops.mul(mode.from_tensor(torch.ones(2, 3)), 2.0)
        assert fake.shape == (2, 3) and fake.dtype == torch.float32
    torch._dynamo.reset()
    f = torch.compile(lambda x: ops.mul(ops.add(x, 1.0), 0.5), backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 5)
    torch.testing.assert_close(f(x), (x + 1.0) * 0.5)
    with pytest.raises(TypeError, match=r"\[add\] input 'y': complex numbers are not supported"):
        ops.add(torch.ones(2), 1j)


def test_python_numbers_are_checked_as_opforges_own_api_checks_them() -> None:
    """(a float for an integer tensor was truncated (1.5 -> 1), an int out of range raised torch's
    RuntimeError without the op, a float past float32's range too, where NumPy gives inf)"""
    ints = torch.tensor([1, 2])
    for bad in (1.5, float("nan")):
        with pytest.raises(TypeError, match=r"\[add\] input 'y': a Python float cannot be int64 \(bound by input "
                                            r"'x'\); pass a tensor of the intended dtype"):
            ops.add(ints, bad)
    with pytest.raises(TypeError, match=r"\[where\] input 'y': a Python float cannot be int64"):
        ops.where(torch.tensor([True, False]), ints, 2.7)
    with pytest.raises(ValueError, match=r"\[add\] input 'y': the Python int 1000 is out of range for int8"):
        ops.add(ints.to(torch.int8), 1000)
    with pytest.raises(ValueError, match=r"\[add\] input 'y': the Python int 2 is out of range for bool"):
        ops.add(torch.tensor([True]), 2)
    for array in (np.ones(2, np.float32), np.array([1, 2])):  # (opforge's own API, the same messages)
        for number in (1.5, 1000):
            try:
                want: object = opforge.ops.add(array.astype(np.int8) if number == 1000 else array, number).numpy()
            except (TypeError, ValueError) as e:
                want = (type(e), str(e).replace("an array", "a tensor"))
            try:
                got: object = ops.add(torch.from_numpy(array.astype(np.int8) if number == 1000 else array),
                                      number).numpy()
            except (TypeError, ValueError) as e:
                got = (type(e), str(e))
            if isinstance(want, tuple):
                assert got == want
            else:
                np.testing.assert_array_equal(got, want)
    big = ops.add(torch.ones(2), 1e300)  # (past float32's range: inf, as opforge's own API and NumPy give)
    assert big.dtype == torch.float32 and torch.isinf(big).all()
    np.testing.assert_array_equal(big.numpy(), opforge.ops.add(np.ones(2, np.float32), 1e300).numpy())
    assert ops.add(ints, True).tolist() == [2, 3] and ops.mul(torch.ones(2, dtype=torch.float16), 3).tolist() == [3, 3]


def test_python_numbers_under_torch_func_transforms() -> None:
    """(jvp and jacfwd of a call with a number raised NotImplementedError from functorch; vmap ran
    the batched fallback, with its warning)"""
    from torch.func import jacfwd, jvp, vmap
    x = torch.tensor([-0.5, 2.0, -3.0], dtype=torch.float64)  # (pow at x < 0: see test_forward_mode.py)
    _, tangent = jvp(lambda a: ops.add(a, 1.0), (x,), (torch.ones_like(x),))
    torch.testing.assert_close(tangent, torch.ones_like(x))
    torch.testing.assert_close(jacfwd(lambda a: ops.pow(a, 2.0))(x), torch.diag(2 * x))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(vmap(lambda a: ops.mul(a, 2.0))(x[None]), 2 * x[None])
    from torch.func import hessian  # (forward over reverse: the backward's formulas under jvp)
    torch.testing.assert_close(hessian(lambda a: ops.sum(ops.pow(a, 3.0)))(x), torch.diag(6 * x))
    import torch.autograd.forward_ad as fwAD  # (torch's own forward AD, no functorch)
    with fwAD.dual_level():
        out = ops.pow(fwAD.make_dual(x, torch.ones_like(x)), torch.tensor(2.0, dtype=torch.float64))
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, 2 * x)


def test_inputs_on_different_devices_are_refused_by_the_meta_kernel_too() -> None:
    """The fake kernel is the Meta kernel too: a cpu tensor beside a meta one got an uninitialized
    cpu result (torch refuses the call, as opforge's real kernels do)."""
    cpu, meta = torch.ones(3), torch.empty(3, device="meta")
    for call in (lambda: ops.add(cpu, meta), lambda: ops.add(meta, cpu),
                 lambda: ops.matmul(torch.ones(2, 3), torch.empty(3, 2, device="meta")),
                 lambda: ops.layer_norm(torch.ones(2, 3), torch.empty(3, device="meta"))):
        with pytest.raises(RuntimeError, match=r"\[(add|matmul|layer_norm)\] inputs are on different devices: "
                                               r"'\w+' on (cpu|meta), '\w+' on (cpu|meta)"):
            call()
    assert ops.add(meta, meta).device.type == "meta"
    # (an axis is checked against the input it is of, not against indices without it)
    got = ops.take_along_axis(torch.ones(2, 3, device="meta"), torch.zeros(2, dtype=torch.int64, device="meta"),
                              axis=1, keepdims=False)
    assert got.shape == (2,)
    torch._dynamo.reset()
    x = torch.arange(6.0).reshape(2, 3).requires_grad_()
    torch.compile(lambda x: ops.max(x, axis=1)[0].sum(), backend="aot_eager")(x).backward()
    assert x.grad.tolist() == [[0, 0, 1], [0, 0, 1]]


def test_an_out_of_memory_names_the_op() -> None:
    """(it raised a RuntimeError without the op; now torch.OutOfMemoryError, as torch's allocators
    raise, and MemoryError from opforge's own API, both naming the op)"""
    with pytest.raises(torch.OutOfMemoryError, match=r"\[relu\] out of memory allocating \d+ bytes"):
        ops.relu(torch.zeros(1).expand(2**45))
    with pytest.raises(MemoryError, match=r"\[relu\] out of memory allocating \d+ bytes"):
        opforge.ops.relu(np.broadcast_to(np.zeros(1, np.float32), (2**45,)))


def test_a_product_of_too_many_elements_is_refused_by_its_shape_rule() -> None:
    meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    with pytest.raises(ValueError, match=r"\[matmul\] shape \(1099511627776, 1099511627776\) has too many"):
        ops.matmul(meta(2**40, 2), meta(2, 2**40))
    with pytest.raises(ValueError, match=r"\[matmul\] shape .* has too many elements"):
        ops.matmul(meta(2**31, 1, 2, 2), meta(1, 2**31, 2, 2))


def test_an_empty_axis_list_reduces_every_axis_under_dynamic_shapes() -> None:
    """axis=[] is every axis, as the runtime takes it: the fake kernel's symbolic shape kept every
    dim, and a graph adding the sum to a vector failed to compile."""
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: ops.sum(x, axis=[]) + y, dynamic=True, fullgraph=True, backend="aot_eager")
    for n, m in ((2, 5), (4, 7)):
        x, y = torch.randn(n, 3), torch.randn(m)
        torch.testing.assert_close(f(x, y), x.sum() + y)


def test_data_dependent_sizes_under_compile() -> None:
    """x[x > 0] has a size known only when it runs (an unbacked SymInt): its checks take a stand-in
    (it raised 'data-dependent sizes are not supported', which eager does not)."""
    torch._dynamo.reset()
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        f = torch.compile(lambda x: ops.mul(ops.exp(x[x > 0]), 2.0), backend="aot_eager", fullgraph=True)
        x = torch.randn(10)
        torch.testing.assert_close(f(x), x[x > 0].exp() * 2)
        g = torch.compile(lambda x: ops.sum(ops.softmax(x[x > 0].reshape(-1, 1), axis=0)), backend="aot_eager",
                          fullgraph=True)
        torch.testing.assert_close(g(x), torch.tensor(1.0))
        # the spec checks' broadcasts(), broadcast() and matmul() on data-dependent sizes: constraints,
        # never guards (bool(u0 == 1) raised GuardOnDataDependentSymNode)
        w = torch.randn(4, 5, requires_grad=True)

        def rows(x: torch.Tensor) -> torch.Tensor:
            y = x[x > 0]
            return y[: (y.shape[0] // 12) * 12].reshape(-1, 3, 4)

        def batched(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            y = rows(x)
            return ops.matmul(y, w.expand(y.shape[0], 4, 5)).square().sum()

        def norms(x: torch.Tensor) -> torch.Tensor:
            y = rows(x).reshape(-1, 4)
            rstd = y[:, :1].abs() + 1
            dw, db = ops.norm_affine_grad(y, y, rstd, torch.ones(4), torch.ones(4), mean=rstd)
            return ops.norm_weight_grad(y, y, rstd, torch.ones(4)) + dw + db + ops.sum_to_like(y, y).sum(0)

        x = torch.randn(64)
        torch.compile(batched, backend="aot_eager", fullgraph=True)(x, w).backward()
        got, w.grad = w.grad, None
        batched(x, w).backward()
        torch.testing.assert_close(got, w.grad)
        torch.testing.assert_close(torch.compile(norms, backend="aot_eager", fullgraph=True)(x), norms(x))
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False
        torch._dynamo.reset()


def test_optimizer_steps_take_tensor_learning_rates_under_compile() -> None:
    """sgd_step's lr and adam_step's per-step scalars are inputs: under torch.compile a tensor lr
    (a schedule's, or the step's bias corrections) is one graph for every value, where an attr
    was a constant the graph guarded on (a recompile per step)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    p, g, buf = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    f = torch.compile(lambda p, g, buf, lr: ops.sgd_step(p, g, buf, lr, momentum=0.9), backend=counter,
                      fullgraph=True)
    for lr in (0.1, 0.05, 0.01):
        new_p, new_buf = f(p, g, buf, torch.tensor(lr))
        torch.testing.assert_close(new_buf, 0.9 * buf + g)
        torch.testing.assert_close(new_p, p - lr * (0.9 * buf + g))
    assert counter.frame_count == 1
    adam = torch.compile(lambda p, g, m, v, t: ops.adam_step(p, g, m, v, 0.01 / (1 - 0.9 ** t), torch.sqrt(1 - 0.999 ** t),
                                                             torch.ones(())), backend=counter, fullgraph=True)
    for t in (1.0, 2.0):
        got = adam(p, g, torch.zeros(3, 4), torch.zeros(3, 4), torch.tensor(t))
        want = ops.adam_step(p, g, torch.zeros(3, 4), torch.zeros(3, 4), torch.tensor(0.01 / (1 - 0.9 ** t)),
                             torch.tensor((1 - 0.999 ** t) ** 0.5), torch.tensor(1.0))
        torch.testing.assert_close(got, want)
    assert counter.frame_count == 2


def test_an_op_named_as_an_attribute_of_torchs_namespaces_is_refused(tmp_path: Path) -> None:
    """torch.ops.<ns>.name is the namespace's name: an op named so could not be found (AttributeError
    from inside torch, the module's other ops left unregistered)"""
    (tmp_path / "name.yaml").write_text(
        "name:\n  doc: x plus one.\n  inputs:\n    x: T\n  outputs:\n    out: {dtype: T, shape: same(x)}\n"
        "  dtypes:\n    T: [float32]\n  impl:\n    expr: x + 1\n  tests:\n    reference: x + 1\n")
    m = opforge.load("tnamens", specs=[str(tmp_path / "name.yaml")], sources=[], build_dir=str(tmp_path / "build"))
    with pytest.raises(ValueError, match=r"\[name\] cannot be registered with torch: torch.ops.tnamens.name is an "
                                         r"attribute of torch's op namespaces, not an op; rename the op"):
        ot.register_module(m)


def test_threads_registering_one_module_at_once_share_its_namespace(tmp_path: Path) -> None:
    """(all but one raised torch's 'Only a single TORCH_LIBRARY can be used to register the
    namespace': a check-then-register race)"""
    import threading

    (tmp_path / "plus_one.yaml").write_text(
        "plus_one:\n  doc: x plus one.\n  inputs:\n    x: T\n  outputs:\n    out: {dtype: T, shape: same(x)}\n"
        "  dtypes:\n    T: [float32]\n  impl:\n    expr: x + 1\n  tests:\n    reference: x + 1\n")
    m = opforge.load("tthreads", specs=[str(tmp_path / "plus_one.yaml")], sources=[], build_dir=str(tmp_path / "build"))
    barrier, got = threading.Barrier(4), []

    def register() -> None:
        barrier.wait()
        try:
            got.append(ot.register_module(m))
        except Exception as e:  # noqa: BLE001  (what the assertion shows)
            got.append(e)

    threads = [threading.Thread(target=register) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [torch.ops.tthreads] * 4, got
    torch.testing.assert_close(torch.ops.tthreads.plus_one(torch.ones(2)), torch.full((2,), 2.0))


def test_str_defaults_with_control_characters_reach_the_schema(tmp_path: Path) -> None:
    """(a default with a line break was written into the schema as it is: torch's parser refused
    it, and no op of the module was registered)"""
    (tmp_path / "tagged.yaml").write_text(
        "tagged:\n  doc: x plus one.\n  inputs:\n    x: T\n  attrs:\n"
        "    tag: {type: str, default: \"a\\nb\\t\\\"c\\\\d\\e\\r\"}\n"
        "  outputs:\n    out: {dtype: T, shape: same(x)}\n"
        "  dtypes:\n    T: [float32]\n  impl:\n    expr: x + 1\n  tests:\n    reference: x + 1\n")
    m = opforge.load("ttagged", specs=[str(tmp_path / "tagged.yaml")], sources=[], build_dir=str(tmp_path / "build"))
    ot.register_module(m)
    (tag,) = [a for a in torch.ops.ttagged.tagged.default._schema.arguments if a.name == "tag"]
    assert tag.default_value == 'a\nb\t"c\\d\x1b\r'
    torch.testing.assert_close(torch.ops.ttagged.tagged(torch.ones(2)), torch.full((2,), 2.0))


def test_numbers_in_gradient_formulas_are_computed_in_float32_beside_16_bit_tensors() -> None:
    # mean's gradient scales by 1/n: rounded to float16 first it was 1.3% off at n = 1e6 and 0
    # past 2^25 (torch's own mean: exact to rounding); now the number is a float32 and dout widened
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.ones(1_000_000, dtype=dtype, requires_grad=True)
        (g,) = torch.autograd.grad(ops.mean(x), [x], torch.tensor(1024.0, dtype=dtype))
        (ref,) = torch.autograd.grad(torch.mean(x), [x], torch.tensor(1024.0, dtype=dtype))
        assert g.dtype == dtype and torch.equal(g, ref), (dtype, g[0].item(), ref[0].item())


def test_the_gradient_of_a_mean_over_an_empty_axis_is_empty() -> None:
    """(mean's bprop scales by numel(out) / numel(x): Python's division by 0 raised ZeroDivisionError,
    where opforge's own backward gives an empty gradient)"""
    for shape in ((0, 3), (3, 0)):
        x = torch.zeros(shape, requires_grad=True)
        ops.mean(x, axis=[0]).sum().backward()
        assert x.grad is not None and x.grad.shape == shape


def test_the_gradient_of_a_mean_gradient_over_an_empty_axis_is_zero() -> None:
    """(the scale numel(out) / numel(x) was NaN (Python) or inf (C++) there, and the gradient of
    the gradient with respect to dout NaN where torch's is 0; found by a torch.func hunt)"""
    for x, axis in ((torch.zeros(3, 0, dtype=torch.float64), [1]), (torch.zeros(0, dtype=torch.float64), None)):
        x.requires_grad_()
        for mean in (lambda t: ops.mean(t, axis=axis), lambda t: torch.mean(t, dim=axis)):
            y = mean(x)
            gy = torch.ones_like(y, requires_grad=True)
            (gx,) = torch.autograd.grad(y, x, gy, create_graph=True)
            (ggy,) = torch.autograd.grad(gx.sum(), gy, allow_unused=True, materialize_grads=True)
            assert not ggy.isnan().any() and not ggy.any()
        assert torch.autograd.gradgradcheck(lambda t: ops.mean(t, axis=axis), (x,))


def test_compiled_mean_gradients_of_empty_and_data_dependent_sizes() -> None:
    """(under torch.compile numel is a symbolic size: mean's numel(out) / numel(x) divided by 0 in
    Python, ZeroDivisionError, for an empty input or an empty data-dependent selection; found by a
    dynamic-shapes hunt)"""
    def f(x):  # type: ignore[no-untyped-def]
        return ops.mean(x, axis=[1], keepdims=True).sum()

    cf = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    x = torch.randn(3, 0, 2, requires_grad=True)
    cf(x).backward()
    assert x.grad is not None and x.grad.shape == (3, 0, 2)

    def g(x):  # type: ignore[no-untyped-def]
        return ops.mean(x[x > 0.5], axis=[0], keepdims=True).sum()

    import torch._dynamo.config as dynamo_config
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):  # (x[x > 0.5]: an unbacked size)
        cg = torch.compile(g, backend="aot_eager", fullgraph=True)
        for values, want_out, want_grad in (([0.9, 0.1, 0.7], 0.8, [0.5, 0.0, 0.5]),
                                            ([0.1, 0.2, 0.3], None, [0.0, 0.0, 0.0])):
            x = torch.tensor(values, requires_grad=True)
            out = cg(x)
            out.backward()
            assert torch.isnan(out).item() if want_out is None else out.item() == pytest.approx(want_out)
            assert x.grad is not None and x.grad.tolist() == pytest.approx(want_grad)


def test_checks_comparing_two_data_dependent_sizes_compile() -> None:
    """(a check's shape(a) == shape(b) compared lists, which asked for a yes or no of each size:
    torch's GuardOnDataDependentSymNode for cross_entropy(x[m], labels[m2]); found by a
    dynamic-shapes hunt. Now one SymBool, a constraint torch checks at run time)"""
    import torch._dynamo.config as dynamo_config

    def f(x, labels, m, m2):  # type: ignore[no-untyped-def]
        return ops.cross_entropy(x[m], labels[m2]), ops.take_along_axis(x[m], labels[m2].unsqueeze(1), axis=1)

    x, labels = torch.randn(6, 4), torch.randint(0, 4, (6,))
    m = torch.tensor([1, 1, 0, 1, 0, 1], dtype=torch.bool)
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):
        cf = torch.compile(f, backend="aot_eager", fullgraph=True)
        for got, want in zip(cf(x, labels, m, m), f(x, labels, m, m)):
            assert torch.equal(got, want)
        other = torch.tensor([1, 1, 0, 1, 0, 0], dtype=torch.bool)
        with pytest.raises(ValueError, match=r"\[cross_entropy\] labels must have shape \(N,\)"):
            f(x, labels, m, other)
        with pytest.raises(RuntimeError, match=r"Runtime assertion failed"):  # (torch's words, not the op's)
            cf(x, labels, m, other)


def test_importing_opforge_torch_again_reuses_its_ops() -> None:
    """(importlib.reload, or an import after removing the module from sys.modules, raised torch's
    'Only a single TORCH_LIBRARY can be used to register the namespace opforge')"""
    code = ("import sys, importlib, torch, opforge.torch as a\n"
            "b = importlib.reload(a)\n"
            "del sys.modules['opforge.torch']\n"
            "import opforge.torch as c\n"
            "x = torch.tensor([1.0, -2.0], requires_grad=True)\n"
            "c.ops.sum(c.ops.mul(x, x)).backward()\n"
            "assert b.ops.relu(x).tolist() == [1.0, 0.0] and x.grad.tolist() == [2.0, -4.0]\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_a_negative_view_through_dlpack_keeps_its_sign() -> None:
    """torch exports a tensor with its negative bit set without the negation: opforge.ops read
    [1, 2, 3] for -[1, 2, 3]"""
    n = torch._neg_view(torch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(opforge.ops.relu(n).numpy(), [0, 0, 0])
    np.testing.assert_array_equal(opforge.ops.neg(n).numpy(), [1, 2, 3])


def test_attrs_take_spec_defaults_and_keywords() -> None:
    x = torch.tensor([-2.0, 3.0])
    torch.testing.assert_close(ops.leaky_relu(x), torch.tensor([-0.02, 3.0]))
    torch.testing.assert_close(ops.leaky_relu(x, alpha=0.5), torch.tensor([-1.0, 3.0]))
    torch.testing.assert_close(ops.sum(torch.ones(2, 3), axis=[1], keepdims=True), torch.full((2, 1), 3.0))


def test_inputs_are_shared_not_copied() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = opforge.from_dlpack(torch.utils.dlpack.to_dlpack(t))  # what the CPU kernel does
    assert view.numpy().ctypes.data == t.data_ptr()
    t[0, 0] = 42.0
    assert view.numpy()[0, 0] == 42.0


def test_outputs_are_runtime_memory_handed_over() -> None:
    out = opforge.ops.mul(opforge.tensor(np.ones(4, np.float32)), 2.0)
    t = torch.utils.dlpack.from_dlpack(out.__dlpack__())
    assert t.data_ptr() == out.numpy().ctypes.data


def test_non_contiguous_inputs() -> None:
    x = torch.randn(4, 6, dtype=torch.float64)
    y = torch.randn(6, 4, dtype=torch.float64).t()  # strides (1, 4)
    torch.testing.assert_close(ops.add(x, y), x + y)
    w = torch.randn(3, 5, dtype=torch.float64).t()  # (5, 3), column-major
    torch.testing.assert_close(ops.linear(x[:, ::2], w), torch.nn.functional.linear(x[:, ::2], w))


def test_non_differentiable_outputs_and_inputs() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    values, indices = ops.max(x, axis=1)
    assert values.requires_grad and not indices.requires_grad
    assert indices.dtype == torch.int64
    values.sum().backward()
    assert x.grad.sum().item() == 3.0
    logits = torch.randn(4, 5, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3])
    ops.cross_entropy(logits, labels).backward()
    assert logits.grad is not None and labels.grad is None
    assert not ops.greater(x, x).requires_grad


def test_double_backward() -> None:
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ops.tanh(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    t = torch.tanh(x.detach())
    torch.testing.assert_close(gg, -2 * t * (1 - t * t))


@pytest.mark.parametrize("mode", ["eager", "fake"])
def test_registration_table_violations_name_the_op(mode: str) -> None:
    def call(fn, *args, **kwargs):
        if mode == "fake":
            with FakeTensorMode() as m:
                return fn(*[m.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        return fn(*args, **kwargs)

    f32, i32 = torch.ones(3), torch.ones(3, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"\[mul\] inputs 'x' \(float32\) and 'y' \(int32\) must have the same dtype"):
        call(ops.mul, f32, i32)
    with pytest.raises(TypeError, match=r"\[exp\] dtype int32 is not supported on target cpu; supported \(T\): float16; bfloat16; float32; float64"):
        call(ops.exp, i32)
    with pytest.raises(TypeError, match=r"\[exp\] .*unsupported DLPack dtype|\[exp\] .*complex"):
        call(ops.exp, torch.ones(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"\[gelu\] attr 'approximate' must be one of: none, tanh; got bad"):
        call(ops.gelu, f32, approximate="bad")
    with pytest.raises(ValueError, match=r"\[linear\] x's last dimension 3 differs"):
        call(ops.linear, f32, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[add\] .*broadcast"):
        call(ops.add, torch.ones(3), torch.ones(4))
    with pytest.raises(IndexError, match=r"\[sum\] axis 5 is out of range"):
        call(ops.sum, torch.ones(2, 3), axis=[5])


def test_bad_calls_are_python_exceptions() -> None:
    with pytest.raises(RuntimeError, match="opforge::mul.* missing value for argument 'y'"):
        ops.mul(torch.ones(2))  # torch's argument check against the schema
    with pytest.raises(RuntimeError, match="alpha"):
        ops.leaky_relu(torch.ones(2), alpha="x")
    with pytest.raises(NotImplementedError, match="opforge::mul"):
        ops.mul(torch.ones(2).to_sparse(), torch.ones(2))  # no kernel for that backend


def test_import_without_torch_says_how_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import opforge.torch\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "opforge.torch needs PyTorch" in r.stdout and "pip install torch==2.13.0" in r.stdout


def test_autocast_follows_each_ops_policy() -> None:
    """Under torch.autocast an op follows its spec's policy: matmul/linear compute in the autocast
    dtype, reductions, softmax-like ops, norms and losses in float32, binary elementwise ops
    promote to their widest input; ops without a policy run in their inputs' dtype."""
    ops = ot.ops
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=gen), torch.randn(3, 8, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.linear(x, w)
        expected = torch.nn.functional.linear(x, w)
        s = ops.softmax(y)
        z = ops.add(y, s)
        g = ops.gelu(y)
        loss = ops.cross_entropy(y, torch.tensor([0, 1, 2, 0]))
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected)
    assert s.dtype == torch.float32 and z.dtype == torch.float32 and loss.dtype == torch.float32
    assert g.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.float16):
        assert ops.matmul(x, w.t()).dtype == torch.float16
    # float64 is left alone but by promote, as torch's autocast leaves it (it was lowered)
    d = torch.full((1000,), 4000.000006, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.sum(d).dtype == torch.float64 and ops.sum(d).item() == pytest.approx(4000000.006, abs=1e-6)
        assert ops.matmul(x.double(), w.t().double()).dtype == torch.float64
        assert ops.softmax(d).dtype == torch.float64
        assert ops.add(d, x[0, 0].to(torch.bfloat16)).dtype == torch.float64


def test_autocast_training_step_and_compile() -> None:
    from torch_mlp import MLP, loss_fn, spirals

    torch.manual_seed(0)
    model = MLP(2, 16, 3)
    x, labels = spirals(8, classes=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(model, x, labels)
    loss.backward()
    assert loss.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    compiled = torch.compile(lambda a, b: loss_fn(model, a, b), backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = compiled(x, labels)
    torch.testing.assert_close(again, loss.detach(), rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------- memory formats

_EXPR_CASES = [c for c in widest_cases() if c.op.impl.kind == "expr" and c.dtype in ("float32", "float64")]
_EXPR_CASES = list({c.op.name: c for c in _EXPR_CASES}.values())


@pytest.mark.parametrize("case", _EXPR_CASES, ids=lambda c: c.op.name)
def test_elementwise_ops_keep_channels_last(case: Case) -> None:
    """As torch's pointwise ops: a channels_last input gives a channels_last result, equal to the
    contiguous call's (computed in NHWC order on zero-copy views), and the fake kernel agrees."""
    rng = np.random.default_rng(3)
    shapes = tuple(None if s is None else (2, 3, 4, 5) for s in case.shapes)
    data = make_data(case.op, case.dtype, shapes, rng)
    inputs = torch_inputs(Case(case.op, case.dtype, shapes, case.attrs), data)
    op = getattr(torch.ops.opforge, case.op.name).default
    want = op(*inputs, **case.attrs)
    cl = [None if t is None else t.contiguous(memory_format=torch.channels_last) for t in inputs]
    got = op(*cl, **case.attrs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous()
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    torch.library.opcheck(op, tuple(cl), dict(case.attrs), test_utils=("test_schema", "test_faketensor"))


def test_channels_last_broadcasts_lower_rank_inputs() -> None:
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    for other in (torch.randn(3, 1, 1, dtype=torch.float64), torch.randn(5, dtype=torch.float64),
                  torch.tensor(2.0, dtype=torch.float64)):
        y = ot.ops.mul(x, other)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, x * other, rtol=0, atol=0)
    # contiguous inputs stay contiguous; other ops (softmax's axis is a memory order) compute as before
    assert ot.ops.mul(x.contiguous(), x.contiguous()).is_contiguous()
    torch.testing.assert_close(ot.ops.softmax(x), torch.softmax(x, -1))
    # under torch.compile the compiled graph's strides agree
    f = torch.compile(lambda a: ot.ops.exp(ot.ops.mul(a, a)), backend="aot_eager", fullgraph=True)
    z = f(x)
    assert z.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(z, torch.exp(x * x))


def test_channels_last_runs_layout_ops_as_nhwc() -> None:
    """bias_add (a format attr): a channels_last x with format NCHW runs as NHWC on x's NHWC view
    (no copy into NCHW), its result channels_last; its gradient op too."""
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    b = torch.randn(3, dtype=torch.float64)
    y = ot.ops.bias_add(x, b)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, x + b[:, None, None], rtol=0, atol=0)
    torch.testing.assert_close(ot.ops.bias_add_grad(x), x.sum(dim=(0, 2, 3)))
    xg, bg = x.clone().requires_grad_(), b.clone().requires_grad_()
    ot.ops.bias_add(xg, bg).sum().backward()
    torch.testing.assert_close(bg.grad, torch.full((3,), 40.0, dtype=torch.float64))
    torch.library.opcheck(torch.ops.opforge.bias_add.default, (x, b), test_utils=("test_schema", "test_faketensor"))
    # NHWC given explicitly: x's last axis is its channel axis, as always
    torch.testing.assert_close(ot.ops.bias_add(x, torch.randn(5, dtype=torch.float64), format="NHWC").shape, x.shape)


@pytest.mark.parametrize("compiled", [False, True])
def test_cross_entropy_with_padding_labels_and_label_smoothing_matches_torch(compiled: bool) -> None:
    # a language model's loss: padded positions labelled -100, smoothed targets (F.cross_entropy's
    # ignore_index and label_smoothing), forward and gradient, eager and compiled
    torch.manual_seed(0)
    logits = torch.randn(12, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([3, 0, -100, 6, 2, -100, 1, 1, 5, -100, 4, 0])
    dy = torch.randn(12, dtype=torch.float64)

    def ours(x, y, reduction, smoothing):  # type: ignore[no-untyped-def]
        return ot.ops.cross_entropy(x, y, reduction=reduction, ignore_index=-100, label_smoothing=smoothing)

    run = torch.compile(ours, fullgraph=True, backend="aot_eager") if compiled else ours
    for reduction in ("mean", "sum", "none"):
        for smoothing in (0.0, 0.1):
            got = run(logits, labels, reduction, smoothing)
            want = torch.nn.functional.cross_entropy(logits, labels, reduction=reduction, label_smoothing=smoothing)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
            g = dy if reduction == "none" else dy[0]
            (ga,) = torch.autograd.grad(got, logits, g)
            (gb,) = torch.autograd.grad(want, logits, g)
            torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-14)
    # second order: the gradient's gradient, as torch's
    x = logits.detach().requires_grad_()
    for f in (ours, lambda x, y, r, s: torch.nn.functional.cross_entropy(x, y, reduction=r, label_smoothing=s)):
        (gx,) = torch.autograd.grad(f(x, labels, "mean", 0.1), x, create_graph=True)
        (h,) = torch.autograd.grad((gx * gx).sum(), x)
        if f is ours:
            ours_h = h
    torch.testing.assert_close(ours_h, h, rtol=1e-10, atol=1e-13)
