"""Property-based fuzzing of every op (fast profile; the long one is tools/fuzz_ops.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import opforge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

import opfuzz  # noqa: E402


def test_every_op_is_fuzzed() -> None:
    assert set(opfuzz.OP_NAMES) == set(opforge.list_ops())


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_random_calls_raise_named_errors_or_match_numpy(seed: int) -> None:
    opfuzz.check_call(seed)
