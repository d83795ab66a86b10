"""Inside jax.shard_map (and jax.pmap), an index out of range on one device's shard raises the op's
error on every device, at once: the call's status is all-reduced over the manual axes before its
check. (Before, only that device failed; the others waited for it in the next collective and XLA's
CPU client aborted the process after 40 s, the op's message never shown.)

Runs in a child process with four host devices, as tests/frameworks/test_jax_sharding.py's
sharded programs do (``--xla_force_host_platform_device_count`` must be set before JAX starts its
CPU client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed (pip install "opforge[jax]"; `nox -s jax` runs these)')

MANUAL_ERRORS_CHILD = r'''
import json, os, time
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import opforge.jax as oj

ops = oj.ops
rng = np.random.default_rng(0)
mesh = jax.make_mesh((4,), ("r",), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,))
grid = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,) * 2)
logits = rng.standard_normal((8, 6)).astype(np.float32)
labels = rng.integers(0, 6, (8,)).astype(np.int32)
table = rng.standard_normal((10, 3)).astype(np.float32)
tokens = rng.integers(0, 10, (8, 2)).astype(np.int32)
ce = lambda l, y: (jax.nn.logsumexp(l, 1) - jnp.take_along_axis(l, y[:, None], 1)[:, 0]).mean()
varying = lambda v: jax.lax.pcast(v, "r", to="varying")


def smap(f, in_specs=(P("r"), P("r")), on=mesh, **kw):
    return jax.jit(jax.shard_map(f, mesh=on, in_specs=in_specs, out_specs=P(), **kw))


rows = NamedSharding(grid, P(("a", "b")))  # (inside the shard_map over "a", the rows still split over "b")
CASES = {  # name: (opforge's program, jax.numpy's, arguments, (argument, where, bad value: the last device's))
    "cross_entropy_pmean": (smap(lambda l, y: jax.lax.pmean(ops.cross_entropy(l, y), "r")),
                            smap(lambda l, y: jax.lax.pmean(ce(l, y), "r")), (logits, labels), (1, 7, 99)),
    "grad_cross_entropy": (smap(lambda l, y: jax.lax.pmean(jax.grad(ops.cross_entropy)(l, y).sum(), "r")),
                           smap(lambda l, y: jax.lax.pmean(jax.grad(ce)(l, y).sum(), "r")), (logits, labels), (1, 7, 99)),
    "embedding_unchecked_vma": (smap(lambda t, i: jax.lax.psum(ops.sum(ops.embedding(i, t)), "r"), (P(), P("r")),
                                     check_vma=False),
                                smap(lambda t, i: jax.lax.psum(t[i].sum(), "r"), (P(), P("r")), check_vma=False),
                                (table, tokens), (1, (7, 1), 10)),
    "vmap_in_shard_map": (smap(lambda l, y: jax.lax.pmean(
                              jax.vmap(lambda a, b: ops.take_along_axis(a, b[None], axis=0))(l, y).sum(), "r")),
                          smap(lambda l, y: jax.lax.pmean(
                              jax.vmap(lambda a, b: jnp.take_along_axis(a, b[None], 0))(l, y).sum(), "r")),
                          (logits, labels), (1, 7, 99)),
    "partial_manual_axes": (
        jax.jit(jax.shard_map(lambda l, y: jax.lax.pmean(ops.sum(ops.take_along_axis(l, y[:, None], axis=1)), "a"),
                              mesh=grid, in_specs=(P("a"), P("a")), out_specs=P(), axis_names={"a"}),
                in_shardings=(rows, rows)),
        jax.jit(jax.shard_map(lambda l, y: jax.lax.pmean(jnp.take_along_axis(l, y[:, None], 1).sum(), "a"),
                              mesh=grid, in_specs=(P("a"), P("a")), out_specs=P(), axis_names={"a"}),
                in_shardings=(rows, rows)),
        (logits, labels), (1, 7, 99)),
    "pmap": (jax.pmap(lambda l, y: jax.lax.pmean(ops.cross_entropy(l, y), "i"), axis_name="i"),
             jax.pmap(lambda l, y: jax.lax.pmean(ce(l, y), "i"), axis_name="i"),
             (logits.reshape(4, 2, 6), labels.reshape(4, 2)), (1, (3, 1), 99)),
}
report = {}
for name, (f, want_f, args, (at, where, value)) in CASES.items():
    want = np.asarray(want_f(*args))
    good = bool(np.allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-6))
    bad = list(args)
    bad[at] = args[at].copy()
    bad[at][where] = value
    start = time.monotonic()
    try:
        jax.block_until_ready(f(*bad))
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    seconds = time.monotonic() - start
    again = bool(np.allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-6))  # (the program still works)
    report[name] = {"good": good, "error": error, "seconds": seconds, "again": again}

# valid programs that must not hang: a scan body and a remat'd function traced in the body, then
# called again under a cond some devices skip (JAX reuses their cached programs: an all-reduce
# baked in there left the other devices waiting; found by review), and a call under such a cond
body = lambda c, r: (c + ops.cross_entropy(r[0][None], r[1][None]), None)
first = lambda: jax.lax.axis_index("r") == 0
def reused(l, y):
    a = jax.lax.scan(body, varying(0.0), (l, y))[0]
    b = jax.lax.cond(first(), lambda: jax.lax.scan(body, varying(0.0), (l, y))[0], lambda: varying(0.0))
    f = jax.checkpoint(ops.cross_entropy)
    c = f(l, y) + jax.lax.cond(first(), lambda: f(l, y), lambda: varying(0.0))
    d = jax.lax.cond(first(), lambda: ops.cross_entropy(l, y), lambda: varying(0.0))
    return jax.lax.pmean(a + b + c + d, "r")
report["valid_reuse_under_cond"] = bool(np.isfinite(np.asarray(smap(reused)(logits, labels))))

# an op that cannot fail (no index or label) adds no collective: only the program's own psum
step = smap(lambda x, w: jax.lax.psum(ops.sum(ops.softmax(ops.linear(x, w), axis=-1)), "r"), (P("r"), P()))
report["all_reduces_without_checks"] = step.lower(logits, logits[:4].copy()).compile().as_text().count(" all-reduce(")
print("REPORT" + json.dumps(report))
'''


def test_inside_shard_map_a_bad_index_on_one_devices_shard_raises_on_every_device() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(MANUAL_ERRORS_CHILD)], capture_output=True, text=True,
                       timeout=600, env=env)
    # (a device left waiting in the collective aborts the child: SIGABRT after XLA's 40 s timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("REPORT"))[len("REPORT"):])
    messages = {
        "cross_entropy_pmean": "OUT_OF_RANGE: [cross_entropy] label 99 is out of range for 6 classes",
        "grad_cross_entropy": "OUT_OF_RANGE: [cross_entropy_backward] label 99 is out of range for 6 classes",
        "embedding_unchecked_vma": "OUT_OF_RANGE: [embedding] index 10 is out of range",
        "vmap_in_shard_map": "OUT_OF_RANGE: [take_along_axis] index 99 is out of range",
        "partial_manual_axes": "OUT_OF_RANGE: [take_along_axis] index 99 is out of range",
        "pmap": "OUT_OF_RANGE: [cross_entropy] label 99 is out of range for 6 classes",
    }
    for name, message in messages.items():
        got = report[name]
        assert got["good"] and got["again"], (name, got)
        assert got["error"] is not None and got["error"].startswith("JaxRuntimeError") and message in got["error"], \
            (name, got)
        assert got["seconds"] < 20, (name, got)  # (at once, not after a collective's timeout)
    assert report["valid_reuse_under_cond"] is True, report
    assert report["all_reduces_without_checks"] == 1, report
