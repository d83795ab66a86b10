"""opforge.jax where JAX is not installed (the `tests` nox session: NumPy 1.x, so no JAX 0.10):
a clear ImportError naming the install command."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="JAX is installed here")
def test_import_without_jax_names_the_install_command() -> None:
    r = subprocess.run([sys.executable, "-c", "import opforge.jax"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ImportError: opforge.jax needs JAX: pip install \"opforge[jax]\"" in r.stderr, r.stderr[-2000:]
    assert "numpy>=2" in r.stderr
