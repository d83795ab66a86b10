"""Framework adapter tests share the op cases built from the specs (tests/ops/cases.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "examples"))
