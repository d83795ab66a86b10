"""Property-based fuzzing of every op (fast profile; the long one is tools/fuzz_ops.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import opforge
from opforge import _formulas  # (opforge's own ops: list_ops() also has ops that tests load)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

import opfuzz  # noqa: E402


def test_every_op_is_fuzzed() -> None:
    assert set(opfuzz.OP_NAMES) == set(_formulas.OPS)


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_random_calls_raise_named_errors_or_match_numpy(seed: int) -> None:
    opfuzz.check_call(seed)


def _seed(valid: bool) -> int:
    return next(s for s in range(1000) if (opfuzz.draw(s)[3] is not None) == valid)


def test_the_checker_rejects_a_wrong_result(monkeypatch) -> None:
    seed = _seed(valid=True)
    name = opfuzz.draw(seed)[0]
    real = getattr(opfuzz.ops, name)

    def off_by_one(*args, **attrs):
        out = real(*args, **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        bad = [opforge.tensor(o.astype("float64").numpy() + 1).astype(o.dtype) for o in outs]
        return tuple(bad) if isinstance(out, tuple) else bad[0]

    monkeypatch.setattr(opfuzz.ops, name, off_by_one)
    with pytest.raises(AssertionError):
        opfuzz.check_call(seed)


def test_the_checker_rejects_an_unnamed_or_undocumented_error(monkeypatch) -> None:
    seed = _seed(valid=False)
    name = opfuzz.draw(seed)[0]

    def raises(exc):
        def fn(*args, **attrs):
            raise exc
        return fn

    monkeypatch.setattr(opfuzz.ops, name, raises(ValueError("no op name here")))
    with pytest.raises(AssertionError, match=re.escape(f"not naming [{name}]")):
        opfuzz.check_call(seed)
    monkeypatch.setattr(opfuzz.ops, name, raises(RuntimeError(f"[{name}] internal")))
    with pytest.raises(AssertionError, match=re.escape(f"{name} raised RuntimeError: [{name}] internal")):
        opfuzz.check_call(seed)
