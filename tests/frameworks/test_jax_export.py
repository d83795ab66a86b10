"""opforge.jax under jax.export: a program exported in one process runs in another.

The custom calls name their op (``mul``, ``<module>.<op>``) and a digest of its interface beside
this process's op number, so a deserialized program runs the ops it was lowered with wherever
they are registered, and fails naming the op where one is missing or has another interface. Each
test runs the deserialized program in a fresh Python process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed (pip install "opforge[jax]"; `nox -s jax` runs these)')

import jax.numpy as jnp  # noqa: E402

import opforge  # noqa: E402
import opforge.jax as oj  # noqa: E402

CPU = jax.devices("cpu")[0]

# A fresh process: registers what `setup` says, deserializes argv[1], calls it on argv[2]'s
# arrays (an .npz, in order) and saves the results to argv[3].
CHILD = """
import sys, numpy as np, jax
jax.config.update("jax_enable_x64", {x64})
import opforge, opforge.jax as oj
{setup}
with jax.default_device(jax.devices("cpu")[0]):
    exported = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    given = np.load(sys.argv[2])
    out = exported.call(*[given[f"arg{{k}}"] for k in range(len(given.files))])
    np.savez(sys.argv[3], *jax.tree_util.tree_leaves(out))
"""


def run_elsewhere(tmp_path: Path, exported: Any, args: tuple[Any, ...], setup: str = "") -> subprocess.CompletedProcess:
    blob, given, got = tmp_path / "program.bin", tmp_path / "args.npz", tmp_path / "out.npz"
    blob.write_bytes(exported.serialize())
    np.savez(given, **{f"arg{k}": np.asarray(a) for k, a in enumerate(args)})
    got.unlink(missing_ok=True)
    code = CHILD.format(x64=jax.config.jax_enable_x64, setup=textwrap.dedent(setup))
    return subprocess.run([sys.executable, "-c", code, str(blob), str(given), str(got)],
                          capture_output=True, text=True, timeout=600)


def outputs(tmp_path: Path) -> list[np.ndarray]:
    with np.load(tmp_path / "out.npz") as f:
        return [f[f"arr_{k}"] for k in range(len(f.files))]


def test_a_training_step_of_opforges_ops_runs_in_another_process(tmp_path: Path) -> None:
    """Forward and reverse mode of built-in ops, attrs of every kind the step uses (str, float,
    list[int]), an optional input left out, int labels: the results of the deserialized program in
    a fresh process equal this process's."""
    def loss(x: Any, w: Any, b: Any, labels: Any) -> Any:
        h = oj.ops.gelu(oj.ops.linear(x, w, b), approximate="tanh")
        y, _, _ = oj.ops.layer_norm(h, axis=[-1], eps=1e-3)  # (weight and bias left out)
        return oj.ops.cross_entropy(oj.ops.linear(y, w), labels, reduction="sum")

    step = jax.jit(jax.value_and_grad(loss, argnums=(1, 2)))
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32), np.array([0, 3, 1, 2, 3, 0], np.int64 if jax.config.jax_enable_x64 else np.int32))
    with jax.default_device(CPU):
        exported = oj.export(step)(*args)
        want = [np.asarray(a) for a in jax.tree_util.tree_leaves(step(*args))]
    text = exported.mlir_module()
    for name in ("linear", "gelu", "layer_norm", "cross_entropy", "cross_entropy_backward"):
        assert f'opforge.name = "{name}"' in text
    r = run_elsewhere(tmp_path, exported, args)
    assert r.returncode == 0, r.stderr[-3000:]
    got = outputs(tmp_path)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)  # (the same kernels on the same inputs)


def test_jax_refuses_opforges_target_without_export(tmp_path: Path) -> None:
    """Plain jax.export.export refuses the opforge target (JAX's own safety check, which
    oj.export lifts); with it lifted by hand the program is the same."""
    f = jax.jit(lambda x: oj.ops.mul(x, x))
    x = np.arange(3.0, dtype=np.float32)
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility guarantees"):
        jax.export.export(f)(x)
    by_hand = jax.export.export(f, disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(oj.TARGET)])(x)
    assert by_hand.mlir_module() == oj.export(f)(x).mlir_module()


def step_loss(x: Any, w: Any, b: Any, labels: Any) -> Any:
    h = oj.ops.gelu(oj.ops.linear(x, w, b), approximate="tanh")
    y, _, _ = oj.ops.layer_norm(h, axis=[-1], eps=1e-3)
    return oj.ops.cross_entropy(oj.ops.linear(y, w), labels, reduction="mean")


def test_a_step_exported_for_any_batch_size_runs_each_in_another_process(tmp_path: Path) -> None:
    """jax.export's shape polymorphism: the batch a dim variable; the shapes come from the specs'
    shape rules on it (the meta rule checks the call at a stand-in size). One program, run in a
    fresh process at batch 1, 5 and 33, equals this process's jit at each."""
    step = jax.jit(jax.value_and_grad(step_loss, argnums=(0, 1, 2)))
    labels_dtype = np.int64 if jax.config.jax_enable_x64 else np.int32
    (b,) = jax.export.symbolic_shape("b")
    specs = [jax.ShapeDtypeStruct((b, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32),
             jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((b,), labels_dtype)]
    with jax.default_device(CPU):
        exported = oj.export(step)(*specs)
    assert [str(a) for a in jax.tree_util.tree_leaves(exported.out_avals)] == [
        "float32[]", "float32[b,4]", "float32[4,4]", "float32[4]"]
    rng = np.random.default_rng(0)
    w, bias = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    for n in (1, 5, 33):
        args = (rng.standard_normal((n, 4)).astype(np.float32), w, bias, rng.integers(0, 4, n).astype(labels_dtype))
        with jax.default_device(CPU):
            want = [np.asarray(a) for a in jax.tree_util.tree_leaves(step(*args))]
        r = run_elsewhere(tmp_path, exported, args)
        assert r.returncode == 0, r.stderr[-3000:]
        got = outputs(tmp_path)
        assert [g.shape for g in got] == [v.shape for v in want] and want[1].shape == (n, 4)
        for g, v in zip(got, want):
            np.testing.assert_allclose(g, v, rtol=1e-6, atol=1e-6)


def test_an_empty_axis_list_reduces_every_axis_on_symbolic_shapes() -> None:
    """axis=[] is every axis, as the runtime takes it (the symbolic shape rule kept every dim)."""
    b, c = jax.export.symbolic_shape("b, c")
    with jax.default_device(CPU):
        exported = oj.export(jax.jit(lambda x: oj.ops.sum(x, axis=[])))(jax.ShapeDtypeStruct((b, c), jnp.float32))
        assert [str(a) for a in exported.out_avals] == ["float32[]"]
        x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
        assert float(exported.call(x)) == 15.0


def test_symbolic_shapes_the_op_refuses_raise_naming_it_and_the_dims() -> None:
    b, c = jax.export.symbolic_shape("b, c")
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    with pytest.raises(ValueError, match=r"\[mul\] shapes cannot be broadcast together: x \(b, 3\), y \(c, 3\) "
                                         r"\(symbolic dims checked at stand-in sizes b=1009, c=1013\)"):
        oj.export(jax.jit(oj.ops.mul))(spec(b, 3), spec(c, 3))
    with pytest.raises(ValueError, match=r"\[linear\] x's last dimension 4 differs from weight's in_features c"):
        oj.export(jax.jit(oj.ops.linear))(spec(b, 4), spec(3, c))
    # (a constant dim broadcast against a symbolic one)
    exported = oj.export(jax.jit(oj.ops.mul))(spec(b, 3), spec(3))
    assert str(exported.out_avals[0]) == "float32[b,3]"
    # a call valid at one size of a dim variable and not another: refused, not left to fail at run time
    with pytest.raises(ValueError, match=r"\[matmul\] the call is valid for some sizes of its dim variables and "
                                         r"not others \(checked at b=1009, then at b=1201"):
        oj.export(jax.jit(oj.ops.matmul))(spec(2, b), spec(1009, 3))


def test_symbolic_shapes_honour_the_dim_variables_constraints() -> None:
    """The stand-in sizes the meta rule checks the call at lie within the scope's constraints."""
    (d,) = jax.export.symbolic_shape("d", constraints=("d >= 2000",))
    exported = oj.export(jax.jit(lambda x: oj.ops.mul(x, x)))(jax.ShapeDtypeStruct((d - 1990, 3), jnp.float32))
    x = np.arange(33.0, dtype=np.float32).reshape(11, 3)
    np.testing.assert_array_equal(np.asarray(exported.call(x)), x * x)


def test_element_counts_of_symbolic_shapes_do_not_wrap() -> None:
    """H.numel (the bprops of mean and the norms divide by it) past 2**31 elements: a float, as
    for concrete shapes, not int32 arithmetic that wraps (it read -1/1024 at b=2)."""
    from types import SimpleNamespace

    (b,) = jax.export.symbolic_shape("b")

    def ratio(x: Any) -> Any:
        n = x.shape[0]
        return oj.H.numel(SimpleNamespace(shape=(n, 2**20))) / oj.H.numel(SimpleNamespace(shape=(n, 2**20, 2**10)))

    exported = jax.export.export(jax.jit(ratio))(jax.ShapeDtypeStruct((b,), jnp.float32))
    assert [float(exported.call(np.ones(n, np.float32))) for n in (1, 2, 4)] == [2.0**-10] * 3


def write_module_spec(folder: Path, op: str, expr: str, extra_attr: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    attrs = "    k: {type: float, default: 2.0}\n" + ("    j: {type: float, default: 0.0}\n" if extra_attr else "")
    (folder / f"{op}.yaml").write_text(f"""
{op}:
  doc: An op module's op for the export tests ({expr}).
  inputs:
    x: T
  attrs:
{attrs.rstrip()}
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32, float64]
  impl:
    expr: {expr}{" + j" if extra_attr else ""}
  bprop:
    x: dout * k
""")
    return folder / f"{op}.yaml"


@pytest.mark.slow
def test_an_op_modules_ops_are_found_by_name_in_another_process(tmp_path: Path) -> None:
    """Two modules registered in one order here and in the other order in the child: the numbers
    differ, the names do not, and the program runs the op it was lowered with. A child without the
    module, or whose module of that name has another interface for the op, fails the call naming
    the op; it does not run another op in its place. A child that loaded the module twice (an older
    version first, the same interface, its ops at the same places in the registrations as here)
    runs the latest one: a call goes by its name's latest registration."""
    cache = tmp_path / "cache"
    spec_a = write_module_spec(tmp_path / "a", "ex_scale_a", "k * x - 100")
    spec_b = write_module_spec(tmp_path / "b", "ex_scale_b", "k * x")
    oj.register_module(opforge.load("ex_mod_a", [spec_a], build_dir=cache))
    b = oj.register_module(opforge.load("ex_mod_b", [spec_b], build_dir=cache))
    f = jax.jit(jax.value_and_grad(lambda x: oj.ops.sum(b.ops.ex_scale_b(x, k=3.0))))
    x = np.arange(4.0, dtype=np.float32)
    with jax.default_device(CPU):
        exported = oj.export(f)(x)
        want = [np.asarray(v) for v in jax.tree_util.tree_leaves(f(x))]
    assert 'opforge.name = "ex_mod_b.ex_scale_b"' in exported.mlir_module()
    load = "oj.register_module(opforge.load({name!r}, [{spec!r}], build_dir={cache!r}))\n"
    load_a = load.format(name="ex_mod_a", spec=str(spec_a), cache=str(cache))
    load_b = load.format(name="ex_mod_b", spec=str(spec_b), cache=str(cache))

    r = run_elsewhere(tmp_path, exported, (x,), setup=load_b + load_a)  # (b's op takes a's number here)
    assert r.returncode == 0, r.stderr[-3000:]
    got = outputs(tmp_path)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert float(got[0]) == 18.0

    r = run_elsewhere(tmp_path, exported, (x,), setup=load_a)
    assert r.returncode != 0 and not (tmp_path / "out.npz").exists()
    assert ("NOT_FOUND: [ex_mod_b.ex_scale_b] is not an op of this process's opforge.jax: a program exported with "
            "it runs where `import opforge.jax` has registered opforge's ops and opforge.jax.register_module() the "
            "op module that defines it") in r.stderr, r.stderr[-3000:]

    other = write_module_spec(tmp_path / "b2", "ex_scale_b", "k * x", extra_attr=True)
    load_other = load.format(name="ex_mod_b", spec=str(other), cache=str(tmp_path / "cache2"))
    r = run_elsewhere(tmp_path, exported, (x,), setup=load_a + load_other)
    assert r.returncode != 0 and not (tmp_path / "out.npz").exists()
    assert ("FAILED_PRECONDITION: [ex_mod_b.ex_scale_b] was lowered for another interface of the op (inputs, attrs "
            "or outputs) than this process's") in r.stderr, r.stderr[-3000:]

    older = write_module_spec(tmp_path / "b0", "ex_scale_b", "k * x + 1000")  # (same interface, another kernel)
    load_older = load.format(name="ex_mod_b", spec=str(older), cache=str(tmp_path / "cache3"))
    r = run_elsewhere(tmp_path, exported, (x,), setup=load_a + load_older + load_b)
    assert r.returncode == 0, r.stderr[-3000:]
    got = outputs(tmp_path)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


CACHED_CHILD = """
import os, sys, numpy as np, jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import opforge.jax as oj
f = jax.jit(jax.value_and_grad(lambda x: oj.ops.sum(oj.ops.softmax(oj.ops.tanh(x), axis=-1) * x)))
value, grad = f(np.arange(12.0, dtype=np.float32).reshape(3, 4))
print(float(value), np.asarray(grad).tolist(), sorted(n for n in os.listdir(sys.argv[1]) if "lambda" in n))
"""


def test_programs_of_opforge_ops_hit_jaxs_persistent_compilation_cache(tmp_path: Path) -> None:
    """A program's HLO is the same in every process that registered the same ops in the same order
    (a call's opforge.process is a digest of the registrations up to its op, no longer a random
    token per process), so JAX's persistent compilation cache finds it there, and it runs."""
    runs = [subprocess.run([sys.executable, "-c", CACHED_CHILD, str(tmp_path)], capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    first, second = (r.stdout.strip().splitlines()[-1] for r in runs)
    assert first == second and "jit__lambda" in first, (first, second)  # (the entry the first run wrote, reused)


@pytest.mark.parametrize("names", ["b, c", "c, b"])
def test_symbolic_sizes_related_by_a_constraint_export_whatever_their_names(names: str) -> None:
    """(the meta rule's stand-in sizes took the variables in their names' order: with b >= c + 1,
    x[:b - c] was refused as 'no sizes ... give sizes of at least 1', and with the names swapped
    the same program exported; found by a dynamic-shapes hunt)"""
    first, second = names.split(", ")
    dims = dict(zip((first, second), jax.export.symbolic_shape(names, constraints=[f"{first} >= {second} + 1"])))

    def f(x: Any, y: Any) -> Any:
        return oj.ops.exp(x[: x.shape[0] - y.shape[0]])

    args = (jax.ShapeDtypeStruct((dims[first],), jnp.float32), jax.ShapeDtypeStruct((dims[second],), jnp.float32))
    exported = oj.export(jax.jit(f))(*args)
    np.testing.assert_allclose(exported.call(np.zeros(5, np.float32), np.ones(2, np.float32)), np.ones(3))
