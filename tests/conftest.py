"""Shared test setup: the repository root and the specs the package was built from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "op_specs"

# the op cases built from the specs (tests/ops/cases.py) serve the framework adapter tests too,
# and those train examples/torch_mlp.py's model
sys.path.insert(0, str(ROOT / "tests" / "ops"))
sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
