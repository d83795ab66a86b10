"""opforge.jax in sharded programs: a call whose leading dims are independent rows runs on each
device's rows (XLA's batch partitioner), any other call on gathered operands, and ops inside
``jax.shard_map`` run per shard; every result equals the same op on one device. A sharded
program exported with jax.export runs split in another process too.

The sharded programs run in a child process with two host devices
(``--xla_force_host_platform_device_count=2``, which must be set before JAX starts its CPU
client; this process's client is already up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed (pip install "opforge[jax]"; `nox -s jax` runs these)')

import opforge.jax as oj  # noqa: E402

OPS = oj._OWN._ops


def k(name: str, shapes_in: list[tuple[int, ...]], shapes_out: list[tuple[int, ...]], **attrs: Any) -> int:
    """The batch dims opforge.jax gives a call of the op (attrs by name, the rest their defaults)."""
    o = OPS[name]
    values = tuple(attrs.get(a.name, a.default) for a in o.op.attrs)
    present = tuple(True for _ in shapes_in) + (False,) * (len(o.op.inputs) - len(shapes_in))
    return o.batch_dims(shapes_in, shapes_out, values, present)


def test_the_batch_dims_of_a_call_follow_the_spec() -> None:
    # elementwise: every dim but one, when no operand broadcasts
    assert k("mul", [(8, 6), (8, 6)], [(8, 6)]) == 1
    assert k("where", [(8, 6, 5)] * 3, [(8, 6, 5)]) == 2
    assert k("mul", [(8, 6), (6,)], [(8, 6)]) == 0  # (an operand of lower rank)
    assert k("mul", [(8, 6), (1, 6)], [(8, 6)]) == 0  # (a dim broadcast)
    assert k("exp", [(8,)], [(8,)]) == 0  # (XLA's partitioner keeps one dim out of the batch)
    # axis attrs: the dims before the first axis named, when the axes index every present input
    assert k("softmax", [(8, 6)], [(8, 6)], axis=-1) == 1
    assert k("softmax", [(8, 6)], [(8, 6)], axis=0) == 0
    assert k("sum", [(4, 8, 6)], [(4, 8)], axis=2) == 2
    assert k("sum", [(4, 8, 6)], [()], axis=None) == 0
    assert k("take_along_axis", [(8, 6), (8, 2)], [(8, 2)], axis=1) == 1
    assert k("layer_norm", [(8, 6)], [(8, 6), (8, 1), (8, 1)]) == 1
    assert k("layer_norm", [(8, 6), (6,)], [(8, 6), (8, 1), (8, 1)]) == 0  # (its weight has no rows)
    # matmul: the batch dims before the matrices, when neither operand broadcasts them
    assert k("matmul", [(8, 3, 5), (8, 5, 2)], [(8, 3, 2)]) == 1
    assert k("matmul", [(8, 5), (5, 2)], [(8, 2)]) == 0
    assert k("matmul", [(8, 3, 5), (5, 2)], [(8, 3, 2)]) == 0
    # any other op
    assert k("linear", [(8, 5), (3, 5)], [(8, 3)]) == 0
    assert k("transpose", [(8, 8)], [(8, 8)]) == 0


CHILD = r'''
import json, os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import opforge.jax as oj

ops = oj.ops
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 6)).astype(np.float32)
w = rng.standard_normal((3, 6)).astype(np.float32)
a3, b3 = rng.standard_normal((8, 3, 5)).astype(np.float32), rng.standard_normal((8, 5, 2)).astype(np.float32)
idx = rng.integers(0, 6, (8, 2)).astype(np.int32)
CASES = {  # name: (function, its arguments, which arguments are split by rows)
    "mul": (lambda x: ops.mul(x, x), (x,), (True,)),
    "exp": (lambda x: ops.exp(x), (x,), (True,)),
    "softmax": (lambda x: ops.softmax(x, axis=-1), (x,), (True,)),
    "log_softmax": (lambda x: ops.log_softmax(x, axis=1), (x,), (True,)),
    "sum_rows": (lambda x: ops.sum(x, axis=1), (x,), (True,)),
    "layer_norm": (lambda x: ops.layer_norm(x), (x,), (True,)),
    "take_along_axis": (lambda x, i: ops.take_along_axis(x, i, axis=1), (x, idx), (True, True)),
    # (3 rows on 2 devices: XLA pads a shard, the pad holding rows the program sliced away, here
    # indices out of range; an op checking its indices is then not split, else it raises on one
    # device alone while the other waits for it: the process aborted)
    "take_along_axis_uneven": (lambda x, i: ops.take_along_axis(x[:3], i[:3], axis=1),
                               (x, np.concatenate([idx[:3], np.full((5, 2), 99, np.int32)])), (True, True)),
    "matmul_batched": (lambda a, b: ops.matmul(a, b), (a3, b3), (True, True)),
    "grad_log_softmax": (jax.grad(lambda x: ops.sum(ops.mul(ops.log_softmax(x, axis=-1), x))), (x,), (True,)),
    # (an elementwise call whose other operand broadcasts along rows: broadcast to the rows first)
    "add_bias": (lambda x, w: ops.add(x, w[0]), (x, w), (True, False)),
    "mul_scale_column": (lambda x, w: ops.mul(x, w[:, :1].T[:, :1]), (x, w), (True, False)),
    # (split along the last dim, or a vector's only one: an elementwise call is partitioned over
    # every dim of its results)
    "mul_columns": (lambda x: ops.mul(x, x), (x,), ("columns",)),
    "exp_vector": (lambda v: ops.exp(v), (x[:, 0],), (True,)),
    "grad_gelu_columns": (jax.grad(lambda x, b: ops.sum(ops.gelu(ops.add(ops.mul(x, x), b))), argnums=(0, 1)),
                          (x, x[0]), ("columns", True)),
    # whole: the call needs every row
    "softmax_axis0": (lambda x: ops.softmax(x, axis=0), (x,), (True,)),
    "sum_all": (lambda x: ops.sum(x), (x,), (True,)),
    "layer_norm_affine": (lambda x, w: ops.layer_norm(x, w[0], w[1]), (x, w), (True, False)),
    "linear": (lambda x, w: ops.linear(x, w), (x, w), (True, False)),
}

def calls(compiled):
    text = compiled.as_text()
    shapes = [line.split(" = ", 1)[1].split(" custom-call(", 1)[0].strip()
              for line in text.splitlines() if " custom-call(" in line and 'custom_call_target="opforge"' in line]
    return shapes, sum(" all-gather(" in line for line in text.splitlines())

def equal(got, want):
    return all(np.array_equal(np.asarray(g), np.asarray(v))
               for g, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))

report = {}
mesh = jax.make_mesh((2,), ("rows",), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,))
for name, (f, args, split) in CASES.items():
    one = jax.jit(f)(*args)  # (one device)
    put = [jax.device_put(a, NamedSharding(mesh, P(None, "rows") if s == "columns" else P("rows") if s else P()))
           for a, s in zip(args, split)]
    g = jax.jit(f)
    shapes, gathers = calls(g.lower(*put).compile())
    report[name] = {"calls": shapes, "gathers": gathers, "equal": equal(g(*put), one)}

# sharding in types (a mesh of explicit axes): the results' type says how they are split
explicit = jax.make_mesh((2,), ("rows",), devices=jax.devices("cpu"), axis_types=(AxisType.Explicit,))
with jax.set_mesh(explicit):
    xs = jax.device_put(x, P("rows"))
    typed = []
    g = jax.jit(lambda x: (typed.append(str(jax.typeof(ops.softmax(x, axis=-1)))), ops.softmax(x, axis=-1))[1])
    shapes, gathers = calls(g.lower(xs).compile())
    out = g(xs)
    report["explicit"] = {"calls": shapes, "gathers": gathers, "type": typed[-1], "spec": str(out.sharding.spec),
                          "equal": equal(out, jax.jit(lambda x: ops.softmax(x, axis=-1))(x))}

    # reverse mode: the cotangents have their primals' types (the bprop's broadcast is resharded)
    grad = jax.jit(jax.grad(lambda x: ops.sum(ops.exp(x))))
    got = grad(xs)
    report["explicit_grad"] = {"type": str(jax.typeof(got)),
                               "equal": bool(np.allclose(np.asarray(got), np.exp(x), rtol=1e-6))}

    # calls with whole operands (a weight, a table): run in shard_map on each device's rows
    b3 = rng.standard_normal(3).astype(np.float32)
    ln_w = rng.standard_normal(6).astype(np.float32)
    tokens = rng.integers(0, 3, (8, 4)).astype(np.int32)
    t3 = rng.standard_normal((8, 3, 5)).astype(np.float32)
    def step(x, w, b, g):  # (a layer: linear, layer_norm with its weight, both gradients)
        return ops.sum(ops.layer_norm(ops.linear(x, w, b), g[:3], g[3:])[0])
    EXPLICIT = {  # name: (function, its arguments, which are split by rows)
        "linear": (lambda x, w, b: ops.linear(x, w, b), (x, w, b3), (True, False, False)),
        "layer_norm_affine": (lambda x, g: ops.layer_norm(x, g, g)[0], (x, ln_w), (True, False)),
        "embedding": (lambda t, w: ops.embedding(t, w), (tokens, w), (True, False)),
        "transpose_rank3": (lambda t: ops.transpose(t), (t3,), (True,)),
        # (matmul by a matrix: a's dims before its last are rows)
        "matmul": (lambda x, w: ops.matmul(x, w), (x, w.T.copy()), (True, False)),
        "grad_matmul": (jax.grad(lambda x, w: ops.sum(ops.matmul(x, w)), argnums=(0, 1)), (x, w.T.copy()),
                        (True, False)),
        # (a b of 3 dims broadcasts a's rows into dim 1 of the result: left whole)
        "matmul_rank3_b": (lambda x, b: ops.matmul(x, b), (x, rng.standard_normal((2, 6, 3)).astype(np.float32)),
                           (True, False)),
        "grad_step": (jax.grad(step, argnums=(0, 1, 2, 3)), (x, w, b3, ln_w), (True, False, False, False)),
        # (vmap over the split axis: the batched call is one of the op's own, split alike)
        "vmap_linear": (jax.vmap(lambda r, w, b: ops.linear(r, w, b), in_axes=(0, None, None)), (x, w, b3),
                        (True, False, False)),
        "vmap_matmul": (jax.vmap(lambda r, w: ops.matmul(r, w), in_axes=(0, None)), (x, w.T.copy()), (True, False)),
        # elementwise with an operand broadcast along rows (a bias, a number): typed split too
        "add_bias": (lambda x, g: ops.gelu(ops.add(x, g)), (x, ln_w), (True, False)),
        "mul_number": (lambda x: ops.mul(x, 2.0), (x,), (True,)),
        # (the operand of lower rank split, by columns: 3 rows do not split over 2 devices)
        "add_split_bias": (lambda x, g: ops.add(x, g), (x[:3], ln_w), (False, True)),
        # (split by columns: the call and its gradient on each device's columns, nothing gathered)
        "grad_gelu_columns": CASES["grad_gelu_columns"],
        # (a weight typed reduced over the rows' axis, JAX's data-parallel form: left whole)
        "linear_reduced_weight": (lambda x, w: ops.linear(x, w), (x, w), (True, "reduced")),
        # whole: dim 0 of a matrix's transpose is not a row; a weight with rows of its own
        "transpose_rank2": (lambda t: ops.transpose(t), (x,), (True,)),
        "layer_norm_row_weight": (lambda x, g: ops.layer_norm(x, g, None)[0], (x, x), (True, False)),
    }
    for name, (f, args, split) in EXPLICIT.items():
        one = jax.jit(f)(*(jax.device_put(a, P()) for a in args))
        put = [jax.device_put(a, P(*(None,) * a.ndim, reduced={"rows"}) if s == "reduced" else
                              P(None, "rows") if s == "columns" else P("rows") if s else P())
               for a, s in zip(args, split)]
        g = jax.jit(f)
        shapes, gathers = calls(g.lower(*put).compile())
        got = g(*put)
        report["explicit_" + name] = {
            "calls": shapes, "gathers": gathers, "types": [str(jax.typeof(o)) for o in jax.tree_util.tree_leaves(got)],
            "close": all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
                         for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(one)))}

    # shard_map: a data-parallel training step, the weight the same on both devices (invariant)
    def loss(w, x):
        y = ops.linear(x, w)
        return jax.lax.psum(ops.sum(ops.mul(y, y)), "rows")
    step = jax.jit(jax.shard_map(jax.value_and_grad(loss), in_specs=(P(), P("rows")), out_specs=(P(), P())))
    value, grad = step(jax.device_put(w, P()), xs)
    want_value, want_grad = jax.value_and_grad(lambda w, x: jnp.sum((x @ w.T) ** 2))(w, x)
    report["shard_map"] = {"value": float(value), "want": float(want_value),
                           "grad_error": float(np.max(np.abs(np.asarray(grad) - np.asarray(want_grad))))}
print("REPORT" + json.dumps(report))
'''


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(line for line in r.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


ROWS = ["mul", "exp", "softmax", "log_softmax", "sum_rows", "layer_norm", "take_along_axis", "matmul_batched",
        "grad_log_softmax", "add_bias", "mul_scale_column"]
WHOLE = ["softmax_axis0", "sum_all", "layer_norm_affine", "linear", "take_along_axis_uneven"]


@pytest.mark.parametrize("name", ROWS)
def test_a_call_of_independent_rows_runs_on_each_devices_rows(report: dict[str, Any], name: str) -> None:
    got = report[name]
    assert got["equal"], f"{name}: the sharded program's results differ from one device's"
    assert got["gathers"] == 0, f"{name}: its operands were gathered: {got}"
    assert got["calls"] and all(shape.split("[", 1)[1].startswith(("4,", "4]")) for shape in got["calls"]), got


@pytest.mark.parametrize("name", WHOLE)
def test_a_call_that_needs_every_row_runs_on_gathered_operands(report: dict[str, Any], name: str) -> None:
    got = report[name]
    assert got["equal"], f"{name}: the sharded program's results differ from one device's"
    assert got["gathers"] >= 1 and not any(shape.split("[", 1)[1].startswith("4") for shape in got["calls"]), got


def test_under_explicit_axes_the_results_type_is_split_by_rows(report: dict[str, Any]) -> None:
    got = report["explicit"]
    assert got["equal"] and got["gathers"] == 0, got
    assert got["type"] == "float32[8@rows,6]" and got["spec"] == "P('rows', None)", got
    assert got["calls"] == ["f32[4,6]{1,0}"], got


def test_under_explicit_axes_gradients_have_their_primals_types(report: dict[str, Any]) -> None:
    assert report["explicit_grad"] == {"type": "float32[8@rows,6]", "equal": True}


@pytest.mark.parametrize("name, types", [
    ("linear", ["float32[8@rows,3]"]),
    ("layer_norm_affine", ["float32[8@rows,6]"]),
    ("transpose_rank3", ["float32[8@rows,5,3]"]),
    ("matmul", ["float32[8@rows,3]"]),
    ("grad_matmul", ["float32[8@rows,6]", "float32[6,3]"]),
    # (the gradients of x split as x; of the weights, summed over the devices, whole)
    ("grad_step", ["float32[8@rows,6]", "float32[3,6]", "float32[3]", "float32[6]"]),
    ("vmap_linear", ["float32[8@rows,3]"]),
    ("vmap_matmul", ["float32[8@rows,3]"]),  # (it looped in jax.lax.map, which refused the split rows)
    ("add_bias", ["float32[8@rows,6]"]),
    ("mul_number", ["float32[8@rows,6]"]),
])
def test_under_explicit_axes_a_call_with_whole_operands_runs_on_each_devices_rows(
        report: dict[str, Any], name: str, types: list[str]) -> None:
    """linear's weight, a norm's weight have no rows: XLA's batch partitioner would split them too,
    so under explicit axes the call runs in jax.shard_map, on each device's rows of the split
    operand (the rows by vmap's rules from the spec) and the whole weight. An elementwise call's
    operand broadcast along rows is broadcast to them (the lowering) and the result typed split
    (before, typed whole: an all-gather after each such call)."""
    got = report["explicit_" + name]
    assert got["close"], f"{name}: the split program's results differ from one device's"
    assert got["types"] == types, got
    assert got["gathers"] == 0, got
    # (no call sees the 8 rows; the weights' gradients are each device's sums, then all-reduced)
    assert any("[4," in shape for shape in got["calls"]) and not any("[8," in shape for shape in got["calls"]), got


# (embedding checks its indices: split in shard_map, a bad one would fail on one device alone)
@pytest.mark.parametrize("name", ["transpose_rank2", "layer_norm_row_weight", "embedding", "matmul_rank3_b"])
def test_under_explicit_axes_a_call_without_rows_runs_whole(report: dict[str, Any], name: str) -> None:
    got = report["explicit_" + name]
    assert got["close"], f"{name}: the sharded program's results differ from one device's"
    assert not any("@" in t for t in got["types"]), got
    assert not any(shape.split("[", 1)[1].startswith("4,") for shape in got["calls"]), got


def test_under_explicit_axes_an_elementwise_result_is_split_as_its_operands(report: dict[str, Any]) -> None:
    """(3, 6) + (6,) split over the devices: typed (3, 6) split by columns, as jax.numpy's; the
    lowering had typed the stretched bias split by rows, which 3 rows refused (ValueError)."""
    got = report["explicit_add_split_bias"]
    assert got["close"] and got["types"] == ["float32[3,6@rows]"], got


@pytest.mark.parametrize("name, calls", [
    ("mul_columns", {"f32[8,3,1]{2,1,0}"}),
    ("exp_vector", {"f32[4,1]{1,0}"}),
    # (the forward's calls and the bprop's, the bias broadcast to the columns first)
    ("grad_gelu_columns", {"f32[8,3,1]{2,1,0}"}),
])
def test_an_elementwise_call_split_along_its_last_dim_runs_on_each_devices_block(
        report: dict[str, Any], name: str, calls: set[str]) -> None:
    """XLA's batch partitioner keeps one dim of a call out of its batch dims: an elementwise call
    split along its last dim (or a vector) ran on gathered operands, and under explicit axes its
    result, typed split, was sliced again (4 all-gathers in grad_gelu_columns where 0 are
    needed). The call is lowered with a trailing unit dim, every dim of its results a batch dim."""
    got = report[name]
    assert got["equal"] and got["gathers"] == 0, got
    assert set(got["calls"]) == calls, got
    explicit = report["explicit_" + name] if "explicit_" + name in report else None
    if explicit is not None:
        assert explicit["close"] and explicit["gathers"] == 0, explicit
        assert explicit["types"] == ["float32[8,6@rows]", "float32[6@rows]"], explicit
        assert set(explicit["calls"]) == calls, explicit


def test_under_explicit_axes_a_weight_typed_reduced_is_left_whole(report: dict[str, Any]) -> None:
    """(it raised ValueError: the spec read as a tuple, which JAX refuses for reduced specs)"""
    got = report["explicit_linear_reduced_weight"]
    assert got["close"] and got["types"] == ["float32[8,3]"], got


def test_a_data_parallel_step_in_shard_map_matches_one_device(report: dict[str, Any]) -> None:
    got = report["shard_map"]
    assert got["value"] == pytest.approx(got["want"], rel=1e-5)
    assert got["grad_error"] < 1e-3 * max(1.0, abs(got["want"]))


EXPORT_CHILD = r'''
import os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import opforge.jax as oj

mesh = jax.make_mesh((2,), ("rows",), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,))
rows = NamedSharding(mesh, P("rows"))
x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
blob, out = sys.argv[2], sys.argv[3]
i = np.random.default_rng(1).integers(0, 6, (8, 2)).astype(np.int32)
if sys.argv[1] == "export":
    f = jax.jit(lambda x: oj.ops.softmax(oj.ops.mul(x, x), axis=-1), in_shardings=rows, out_shardings=rows)
    open(blob, "wb").write(oj.export(f)(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows)).serialize())
    np.save(out, np.asarray(f(x)))
    # (an op that checks its indices: its calls' deferred errors travel too)
    take = jax.jit(lambda x, i: oj.ops.take_along_axis(x, i, axis=1), in_shardings=(rows, rows))
    open(blob + ".take", "wb").write(oj.export(take)(*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rows)
                                                       for a in (x, i))).serialize())
else:
    take = jax.jit(jax.export.deserialize(bytearray(open(blob + ".take", "rb").read())).call)
    np.testing.assert_array_equal(np.asarray(take(*(jax.device_put(a, rows) for a in (x, i)))),
                                  np.take_along_axis(x, i, axis=1))
    bad = i.copy()
    bad[7, 0] = 6
    try:
        np.asarray(take(*(jax.device_put(a, rows) for a in (x, bad))))
        raise AssertionError("no error")
    except jax.errors.JaxRuntimeError as e:
        assert "OUT_OF_RANGE: [take_along_axis] index 6 is out of range" in str(e), e
    call = jax.jit(jax.export.deserialize(bytearray(open(blob, "rb").read())).call)
    xs = jax.device_put(x, rows)
    text = call.lower(xs).compile().as_text()
    assert text.count(" all-gather(") == 0, text
    shapes = [line.split(" = ", 1)[1].split(" custom-call(")[0] for line in text.splitlines()
              if 'custom_call_target="opforge"' in line]
    assert shapes == ["f32[4,6,1]{2,1,0}", "f32[4,6]{1,0}"], shapes  # (mul, every dim a batch dim; softmax)
    np.save(out, np.asarray(call(xs)))
'''


def test_a_sharded_program_exported_runs_split_in_another_process(tmp_path: Path) -> None:
    """The calls' batch dims and sharding rules travel in the serialized program: deserialized in
    a fresh process, on two devices, each call still runs on its device's rows; an index out of
    range on one device raises there too."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    blob = tmp_path / "program.bin"
    for stage, out in (("export", tmp_path / "want.npy"), ("run", tmp_path / "got.npy")):
        r = subprocess.run([sys.executable, "-c", EXPORT_CHILD, stage, str(blob), str(out)], capture_output=True,
                           text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-4000:]
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy"))


ERRORS_CHILD = r'''
import json, os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import opforge.jax as oj

ops = oj.ops
rng = np.random.default_rng(0)
mesh = jax.make_mesh((2,), ("rows",), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,))
rows = NamedSharding(mesh, P("rows"))
x = rng.standard_normal((8, 6)).astype(np.float32)
idx = rng.integers(0, 6, (8, 2)).astype(np.int32)
labels = rng.integers(0, 6, (8,)).astype(np.int32)
table = rng.standard_normal((10, 3)).astype(np.float32)
tokens = rng.integers(0, 10, (8, 4)).astype(np.int32)

take = jax.jit(lambda x, i: ops.take_along_axis(x, i, axis=1))
grad = jax.jit(jax.grad(lambda x, i: ops.sum(ops.mul(ops.take_along_axis(x, i, axis=1), 2.0))))
CASES = {  # name: (program, good arguments, the bad value's position (only the second device's rows))
    "take_along_axis_split": (take, (jax.device_put(x, rows), jax.device_put(idx, rows)), (1, (6, 1), 99)),
    # (its gradient scatters by the same indices, split too; the unused forward call is dropped)
    "grad_take_along_axis_split": (grad, (jax.device_put(x, rows), jax.device_put(idx, rows)), (1, (7, 0), -7)),
}
report = {}
for name, (f, args, (at, where, value)) in CASES.items():
    want = jax.tree_util.tree_map(np.asarray, f(*args))
    bad = list(args)
    b = np.array(args[at])
    b[where] = value
    bad[at] = jax.device_put(b, args[at].sharding) if isinstance(args[at], jax.Array) else b
    try:
        jax.block_until_ready(f(*bad))
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    again = jax.tree_util.tree_map(np.asarray, f(*args))  # (the program and process still work)
    report[name] = {"error": error,
                    "again": all(np.array_equal(g, w) for g, w in zip(jax.tree_util.tree_leaves(again),
                                                                         jax.tree_util.tree_leaves(want)))}

# inside shard_map, a call's checks are its device's own: no collective is added, which control
# flow that differs between devices (here a cond on each device's count) would leave unmatched
n = np.array([1, 3], np.int32)
def body(x, i, n):
    zeros = jax.lax.pcast(jnp.zeros((x.shape[0], 2), x.dtype), "rows", to="varying")
    return jax.lax.cond(n[0] > 1, lambda: ops.take_along_axis(x, i, axis=1), lambda: zeros)
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("rows"), P("rows"), P("rows")), out_specs=P("rows")))
want = np.concatenate([np.zeros((4, 2), np.float32), np.take_along_axis(x[4:], idx[4:], axis=1)])
report["cond_in_shard_map"] = {"equal": bool(np.array_equal(np.asarray(f(x, idx, n)), want))}
print("REPORT" + json.dumps(report))
'''


@pytest.fixture(scope="module")
def errors() -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(ERRORS_CHILD)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(line for line in r.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


@pytest.mark.parametrize("name, message", [
    ("take_along_axis_split", "OUT_OF_RANGE: [take_along_axis] index 99 is out of range for axis 1 of size 6"),
    ("grad_take_along_axis_split", "OUT_OF_RANGE: [scatter_add_along_axis] index -7 is out of range"),
])
def test_a_bad_index_on_one_devices_rows_raises_on_every_device(errors: dict[str, Any], name: str,
                                                                message: str) -> None:
    """An index out of range in one device's rows of a split call fails the program with the op's
    error, at once, and the next run with good indices works: each device's check waits for every
    device's status (before, that device stopped alone while the other waited in its next
    collective, and XLA's CPU client aborted the process after 40 s)."""
    got = errors[name]  # (a device left waiting would have aborted the child: the fixture's return code)
    assert got["error"] is not None and message in got["error"], got
    assert got["again"], got


def test_inside_shard_map_control_flow_that_differs_between_devices_runs(errors: dict[str, Any]) -> None:
    assert errors["cond_in_shard_map"] == {"equal": True}
