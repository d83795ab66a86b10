"""opforge.jax in a program sharded over host devices: a call split by rows (each device runs the
op on its rows) against the same call on gathered operands (what every opforge call did before
calls said their batch dims) and against jax.numpy's op, sharded alike; same process, medians of
runs timed in turn.

    python benchmarks/jax_sharding.py [--devices 2] [--out FILE]

XLA's CPU client makes one device per `--xla_force_host_platform_device_count`, each running its
part of the program on its own thread: on a machine with as many cores as devices, the split call
does 1/devices of the work per core and moves nothing between devices; the gathered one copies the
operand to every device and computes all of it on each. Needs JAX (a NumPy 2 environment).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--out", help="write the markdown table here too")
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import opforge.jax as oj

    mesh = jax.make_mesh((args.devices,), ("rows",), devices=jax.devices("cpu"), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, P("rows"))
    whole = NamedSharding(mesh, P())

    def compile_gathered(f: Callable[..., Any], *inputs: Any) -> Any:
        """f compiled with opforge's calls left whole (batch dims 0, no shard_map, elementwise
        calls not partitioned: XLA gathers their operands)."""
        keep = oj._Op.batch_dims, oj._Op.rows_split, oj._Op._lower_elementwise, oj._broadcast_sharding
        oj._Op.batch_dims = lambda self, *_: 0  # type: ignore[method-assign]
        oj._Op.rows_split = lambda self, *_: None  # type: ignore[method-assign]
        oj._Op._lower_elementwise = lambda self, *_: None  # type: ignore[method-assign]
        oj._broadcast_sharding = lambda *_: None
        jax.clear_caches()  # (each op's call is a jit of its own: traced and lowered again)
        try:
            return jax.jit(f).lower(*inputs).compile()
        finally:
            (oj._Op.batch_dims, oj._Op.rows_split, oj._Op._lower_elementwise,  # type: ignore[method-assign]
             oj._broadcast_sharding) = keep
            jax.clear_caches()

    rng = np.random.default_rng(0)
    cases = []
    for shape in [(8192, 1024), (65536, 256)]:
        x = jax.device_put(rng.standard_normal(shape).astype(np.float32), rows)
        cases.append((f"softmax {shape} float32, axis -1", (x,), lambda x: oj.ops.softmax(x, axis=-1),
                      lambda x: jax.nn.softmax(x, axis=-1)))
    x = jax.device_put(rng.standard_normal((8192, 1024)).astype(np.float32), rows)
    b = jax.device_put(rng.standard_normal(1024).astype(np.float32), whole)
    cases.append(("gelu(x + bias), (8192, 1024) float32, bias (1024,)", (x, b),
                  lambda x, b: oj.ops.gelu(oj.ops.add(x, b)), lambda x, b: jax.nn.gelu(x + b, approximate=False)))
    # (split along the last dim: an elementwise call is partitioned over every dim of its results)
    columns = NamedSharding(mesh, P(None, "rows"))
    xc, bc = jax.device_put(np.asarray(x), columns), jax.device_put(np.asarray(b), rows)
    cases.append(("gelu(x + bias), x split by columns, bias split", (xc, bc),
                  lambda x, b: oj.ops.gelu(oj.ops.add(x, b)), lambda x, b: jax.nn.gelu(x + b, approximate=False)))
    cases.append(("layer_norm (8192, 1024) float32, no weight", (x,), lambda x: oj.ops.layer_norm(x)[0],
                  lambda x: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)))

    # calls with a whole operand (a weight), under a mesh of explicit axes: run in shard_map
    explicit = jax.make_mesh((args.devices,), ("rows",), devices=jax.devices("cpu"),
                             axis_types=(AxisType.Explicit,))
    xe = jax.device_put(np.asarray(x), NamedSharding(explicit, P("rows")))
    w = jax.device_put(rng.standard_normal((1024, 1024)).astype(np.float32) / 32, NamedSharding(explicit, P()))
    be = jax.device_put(np.asarray(b), NamedSharding(explicit, P()))
    cases.append(("explicit axes: linear (8192, 1024) by (1024, 1024) float32, with bias", (xe, w, be),
                  lambda x, w, b: oj.ops.linear(x, w, b), lambda x, w, b: x @ w.T + b))
    cases.append(("explicit axes: gelu(x + bias), (8192, 1024) float32, bias (1024,)", (xe, be),
                  lambda x, b: oj.ops.gelu(oj.ops.add(x, b)), lambda x, b: jax.nn.gelu(x + b, approximate=False)))
    cases.append(("explicit axes: layer_norm (8192, 1024) float32, weight and bias", (xe, be, be),
                  lambda x, g, b: oj.ops.layer_norm(x, g, b)[0],
                  lambda x, g, b: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
                  * g + b))
    xce, bce = (jax.device_put(np.asarray(a), NamedSharding(explicit, s)) for a, s in ((x, P(None, "rows")), (b, P("rows"))))
    cases.append(("explicit axes: gradients of sum(gelu(x + bias)), x split by columns, bias split", (xce, bce),
                  jax.grad(lambda x, b: oj.ops.sum(oj.ops.gelu(oj.ops.add(x, b))), argnums=(0, 1)),
                  jax.grad(lambda x, b: jnp.sum(jax.nn.gelu(x + b, approximate=False)), argnums=(0, 1))))
    cases.append(("explicit axes: linear's gradients (x, weight, bias), shapes as above", (xe, w, be),
                  jax.grad(lambda x, w, b: oj.ops.sum(oj.ops.linear(x, w, b)), argnums=(0, 1, 2)),
                  jax.grad(lambda x, w, b: jnp.sum(x @ w.T + b), argnums=(0, 1, 2))))

    lines = [f"# opforge.jax sharded over {args.devices} host devices", "",
             f"`python benchmarks/jax_sharding.py --devices {args.devices}`; {platform.processor() or platform.machine()},"
             f" {os.cpu_count()} cores; Python {platform.python_version()}, JAX {jax.__version__}. Medians of 15 "
             "timings taken in turn; each program under jax.jit with its input split by rows over the devices (or by "
             "columns where named; automatic axes; the rows named so have a mesh of explicit axes, where a call with a "
             "whole operand runs in shard_map).", "",
             "| call | opforge, split by rows | opforge, gathered | jax.numpy | split / gathered | split / jax.numpy |",
             "|---|---|---|---|---|---|"]
    for name, inputs, ours, builtin in cases:
        compiled = [jax.jit(ours).lower(*inputs).compile(), compile_gathered(ours, *inputs),
                    jax.jit(builtin).lower(*inputs).compile()]
        outs = [[np.asarray(o) for o in jax.tree_util.tree_leaves(c(*inputs))] for c in compiled]
        for got, gathered, want in zip(*outs):  # (a gradient's sums over rows: in another order)
            scale = 2e-5 * max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got, gathered, rtol=2e-4, atol=scale)
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=scale)
        gathers = [c.as_text().count(" all-gather(") for c in compiled]
        assert gathers[0] == 0 and gathers[1] > 0, gathers
        times: list[list[float]] = [[] for _ in compiled]
        for _ in range(15):
            for c, ts in zip(compiled, times):
                t0 = time.perf_counter()
                jax.block_until_ready(c(*inputs))
                ts.append(time.perf_counter() - t0)
        ms = [statistics.median(ts) * 1e3 for ts in times]
        lines.append(f"| {name} | {ms[0]:.2f} ms | {ms[1]:.2f} ms | {ms[2]:.2f} ms | {ms[0] / ms[1]:.2f} | "
                     f"{ms[0] / ms[2]:.2f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
