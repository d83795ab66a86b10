"""Shared test setup: the repository root and the specs the package was built from."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "op_specs"


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
