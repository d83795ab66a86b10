"""Train a small classifier in JAX with opforge ops (linear, layer_norm, gelu, cross_entropy).

    python examples/jax_mlp.py            # needs JAX: pip install "opforge[jax]"
    python examples/jax_mlp.py --devices 2   # data parallel over 2 devices (host ones here)

The same model and data as examples/torch_mlp.py: three interleaved spirals, linear ->
layer_norm -> gelu -> linear, trained by plain gradient descent inside one ``jax.jit``-compiled
step; the loss printed every few steps falls. The ops are ``opforge.jax.ops.*``: JAX
differentiates them (their gradients are the specs' formulas) and compiles them into the step
like its own operations. ``jnp_loss`` is the same model in ``jax.numpy``, for comparison.

With ``--devices N`` the step is data parallel (``data_parallel_step``): each device runs the
model on its rows of the batch inside ``jax.shard_map`` and the gradients are averaged with
``jax.lax.pmean``; the losses equal the one-device run's. On a CPU the N devices are host devices
(``--xla_force_host_platform_device_count``, set here before JAX starts).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

if __name__ == "__main__" and "--devices" in sys.argv:  # (host devices exist only if asked before JAX starts)
    _n = sys.argv[sys.argv.index("--devices") + 1]
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_n}"

import jax
import jax.numpy as jnp
import numpy as np

import opforge.jax as oj

ops = oj.ops
Params = dict[str, Any]


def init(features: int, hidden: int, classes: int, seed: int = 0, dtype: Any = np.float32) -> Params:
    rng = np.random.default_rng(seed)
    return {
        "w1": jnp.asarray(rng.standard_normal((hidden, features)) * features ** -0.5, dtype),
        "b1": jnp.zeros(hidden, dtype),
        "norm_weight": jnp.ones(hidden, dtype),
        "norm_bias": jnp.zeros(hidden, dtype),
        "w2": jnp.asarray(rng.standard_normal((classes, hidden)) * hidden ** -0.5, dtype),
        "b2": jnp.zeros(classes, dtype),
    }


def model(p: Params, x: Any) -> Any:
    """linear -> layer_norm -> gelu -> linear, all opforge ops."""
    h = ops.linear(x, p["w1"], p["b1"])
    h, _, _ = ops.layer_norm(h, p["norm_weight"], p["norm_bias"])  # (y, mean, rstd)
    h = ops.gelu(h)
    return ops.linear(h, p["w2"], p["b2"])


def loss_fn(p: Params, x: Any, labels: Any) -> Any:
    return ops.cross_entropy(model(p, x), labels)


def jnp_loss(p: Params, x: Any, labels: Any) -> Any:
    """The same model and loss in jax.numpy."""
    h = x @ p["w1"].T + p["b1"]
    mean = h.mean(-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    h = jax.nn.gelu(h * p["norm_weight"] + p["norm_bias"], approximate=False)
    logits = h @ p["w2"].T + p["b2"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()


def sgd_step(loss: Any, lr: float) -> Any:
    """One jit-compiled step of plain gradient descent on ``loss``: (params, x, labels) -> (params, loss)."""
    @jax.jit
    def step(p: Params, x: Any, labels: Any) -> tuple[Params, Any]:
        value, grads = jax.value_and_grad(loss)(p, x, labels)
        return jax.tree.map(lambda w, g: w - lr * g, p, grads), value

    return step


def data_parallel_step(loss: Any, lr: float, mesh: Any) -> Any:
    """``sgd_step`` split over the mesh's "data" axis: the batch's rows divided among the devices,
    the parameters on every device. Each device's rows' mean loss is averaged over the devices
    (``pmean``) inside the differentiated function, so the gradients (of parameters the same on
    every device: JAX sums their per-device parts) are the one-device step's on the whole batch."""
    from jax.sharding import PartitionSpec as P

    def mean_loss(p: Params, x: Any, labels: Any) -> Any:
        return jax.lax.pmean(loss(p, x, labels), "data")

    def local(p: Params, x: Any, labels: Any) -> tuple[Params, Any]:
        value, grads = jax.value_and_grad(mean_loss)(p, x, labels)
        return jax.tree.map(lambda w, g: w - lr * g, p, grads), value

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())))


def spirals(n_per_class: int, classes: int = 3, seed: int = 0, dtype: Any = np.float32) -> tuple[Any, Any]:
    """Points on `classes` interleaved noisy spiral arms in the plane, and their arm index."""
    rng = np.random.default_rng(seed)
    r = np.linspace(0.05, 1.0, n_per_class)
    xs, ys = [], []
    for c in range(classes):
        theta = 4.0 * r + 2 * math.pi * c / classes + 0.2 * rng.standard_normal(n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, c, np.int64))  # (int32 in JAX without x64)
    return jnp.asarray(np.concatenate(xs), dtype), jnp.asarray(np.concatenate(ys))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--devices", type=int, default=1, help="data parallel over this many devices")
    args = p.parse_args()

    x, labels = spirals(200)
    params = init(2, args.hidden, 3)
    if args.devices > 1:
        devices = jax.devices()[:args.devices]
        if len(devices) < args.devices or len(x) % args.devices:
            p.error(f"--devices {args.devices}: {len(devices)} devices present, {len(x)} rows to divide")
        mesh = jax.make_mesh((args.devices,), ("data",), devices=devices)
        step = data_parallel_step(loss_fn, args.lr, mesh)
        rows, whole = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)) for spec in (["data"], []))
        x, labels, params = jax.device_put(x, rows), jax.device_put(labels, rows), jax.device_put(params, whole)
        print(f"data parallel over {', '.join(str(d) for d in devices)}")
    else:
        step = sgd_step(loss_fn, args.lr)
    predict = jax.jit(model)
    # (host devices: each step is waited for. XLA's CPU client, given many queued steps whose
    # devices meet in an all-reduce, can starve one device's thread on a machine with few cores:
    # the other waits 40 s and aborts the process, with jax.numpy's model as with opforge's)
    wait = args.devices > 1 and jax.devices()[0].platform == "cpu"
    for i in range(args.steps + 1):
        params, loss = step(params, x, labels)
        if wait:
            jax.block_until_ready(loss)
        if i % 50 == 0:
            accuracy = float((predict(params, x).argmax(1) == labels).mean())
            print(f"step {i:4d}  loss {float(loss):.4f}  accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
