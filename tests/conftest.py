"""Shared test setup: the repository root and the specs the package was built from."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

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


@pytest.fixture(scope="session", autouse=True)
def mindspore_dumps_out_of_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """MindSpore writes ./rank_<id>/om/analyze_fail.ir when a graph fails to compile; MS_OM_PATH
    (read at the failure, so in-process tests and the subprocesses they start both see it) sends it
    to a temporary directory instead. A value set by the caller is kept."""
    with pytest.MonkeyPatch.context() as mp:
        if "MS_OM_PATH" not in os.environ:
            mp.setenv("MS_OM_PATH", str(tmp_path_factory.mktemp("mindspore-om")))
        yield
