"""examples/jax_mlp.py: the classifier of examples/torch_mlp.py trained in JAX with opforge ops,
against the same model in jax.numpy (runs in the ``jax`` nox session; skips without JAX)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed (pip install "opforge[jax]"; `nox -s jax` runs these)')

from conftest import ROOT  # noqa: E402


def test_training_matches_the_jnp_model_step_by_step() -> None:
    """The same init and data: opforge's losses over 40 jit-compiled SGD steps equal the jax.numpy
    model's within float32 tolerance, and fall."""
    from jax_mlp import init, jnp_loss, loss_fn, sgd_step, spirals

    x, labels = spirals(100)
    p_of, p_ref = init(2, 32, 3), init(2, 32, 3)
    step_of, step_ref = sgd_step(loss_fn, 0.5), sgd_step(jnp_loss, 0.5)
    losses, ref_losses = [], []
    for _ in range(40):
        p_of, loss = step_of(p_of, x, labels)
        # (float32 products as opforge's: JAX's default precision on a GPU rounds them to TF32)
        with jax.default_matmul_precision("highest"):
            p_ref, ref = step_ref(p_ref, x, labels)
        losses.append(float(loss))
        ref_losses.append(float(ref))
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-5)
    assert losses[-1] < 0.6 * losses[0], losses
    for k in p_of:
        np.testing.assert_allclose(p_of[k], p_ref[k], rtol=1e-3, atol=1e-4, err_msg=k)


def test_the_example_runs_and_its_loss_falls() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "jax_mlp.py"), "--steps", "100"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], r.stdout


def test_the_example_data_parallel_over_two_devices_trains_as_one_device() -> None:
    """``--devices 2``: the step in jax.shard_map over two host devices, each on half the batch,
    the gradients of the averaged loss; its losses and accuracies are the one-device run's."""
    runs = {}
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # (host devices, on a GPU machine too)
    for devices in ("1", "2"):
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "jax_mlp.py"), "--steps", "100",
                            "--devices", devices], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        runs[devices] = [(float(line.split()[3]), float(line.split()[5]))
                         for line in r.stdout.splitlines() if line.startswith("step")]
    assert "data parallel over" in r.stdout
    assert len(runs["2"]) == 3
    np.testing.assert_allclose(runs["2"], runs["1"], atol=2e-4)
