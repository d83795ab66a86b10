"""mypy over the package's Python sources: the files and settings of pyproject.toml's [tool.mypy]."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("mypy", reason='mypy is not installed (pip install ".[test]")')


def test_mypy_is_clean() -> None:
    # no paths: mypy checks the `files` of [tool.mypy] (pkg/opforge, codegen), so extending that list extends
    # this test; its cache (.mypy_cache/) makes later runs take seconds
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mypy found errors:\n{r.stdout}{r.stderr}"
    assert r.stdout.startswith("Success: no issues found"), r.stdout
