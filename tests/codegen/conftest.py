"""Codegen test setup: import the source tree's `codegen`, and helpers to load throwaway specs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from codegen import SpecErrors, load_specs  # noqa: E402
from codegen.model import OpSpec  # noqa: E402

SPEC_DIR = ROOT / "op_specs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def real_ops() -> list[OpSpec]:
    """Every op of op_specs/: the table that spec formulas may call."""
    return load_specs([SPEC_DIR], kernel_root=ROOT)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path, so spec errors show short relative paths (specs/<op>.yaml)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_specs(root: Path, files: dict[str, str]) -> None:
    """Write {relative path: YAML text} under root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


SpecErrorsOf = Callable[..., str]


@pytest.fixture
def spec_errors(in_tmp: Path, real_ops: list[OpSpec]) -> SpecErrorsOf:
    """spec_errors({'<op>': yaml}, ...) -> the SpecErrors text of loading specs/ (must fail).

    The specs are loaded with the real ops as the formula table, so formulas may call mul, sum...
    """

    def run(files: dict[str, str], *, dirs: Sequence[str] = ("specs",),
            kernel_root: Optional[Path] = None) -> str:
        write_specs(in_tmp, {(k if k.endswith(".yaml") else f"specs/{k}.yaml"): v
                             for k, v in files.items()})
        with pytest.raises(SpecErrors) as info:
            load_specs(list(dirs), kernel_root=kernel_root, known=real_ops)
        return str(info.value)

    return run
