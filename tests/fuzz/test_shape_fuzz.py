"""A meta rule refuses what a call refuses: every op's spec cases with their shapes perturbed (a
dimension changed, one dropped or added, a shape drawn anew), run as a real call on NumPy inputs
and as the op's meta rule (``opforge._C._meta.<op>``, what adapters' fake tensors, MindSpore's
inference and XLA's abstract evaluation use) on stand-ins of the same shapes. Both must give the
same output shapes and dtypes, or the same error. A meta rule that accepts a call the kernel
refuses lets a framework trace a program that fails later, and XLA runs no kernel for an empty
result, so there the bad call returned a result. The one difference allowed is an index's value
out of range, which only the data shows.

The spec's checks are lowered to Python too (the op table's ``shapes``, evaluated by adapters on
symbolic sizes): on the same shapes, where it raises, it must raise what the C++ meta rule raises.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))

from opforge import _C, _formulas, ops  # noqa: E402
from opforge._opdef import ShapeHelpers  # noqa: E402

import cases as _cases  # noqa: E402

CASES = _cases.cases()
CALLS = 20_000
# (index and label values out of range: only the data shows them, never a meta rule)
DATA_ERROR = re.compile(r"(index|label) -?\d+ is out of range for")


def _perturb(rng: np.random.Generator, shape: Optional[tuple[int, ...]]) -> Optional[tuple[int, ...]]:
    if shape is None or rng.random() < 0.4:
        return shape
    s = list(shape)
    kind = rng.integers(4)
    if kind == 0 and s:
        s[rng.integers(len(s))] = int(rng.choice([0, 1, 2, 3, 5]))
    elif kind == 1 and s:
        del s[rng.integers(len(s))]
    elif kind == 2:
        s.insert(int(rng.integers(len(s) + 1)), int(rng.choice([1, 3])))
    else:
        s = [int(rng.choice([0, 1, 2, 3, 4])) for _ in range(rng.integers(0, 5))]
    return tuple(s)


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except (TypeError, ValueError, IndexError, MemoryError) as e:
        return type(e).__name__, str(e)


def _draw(seed: int) -> tuple[Any, tuple, list]:
    rng = np.random.default_rng(seed)
    case = CASES[rng.integers(len(CASES))]
    shapes = tuple(_perturb(rng, s) for s in case.shapes)
    return case, shapes, _cases.make_data(case.op, case.dtype, shapes, rng)


def _meta(case: Any, shapes: tuple) -> tuple[str, Any]:
    dtypes = [_cases.input_dtype(case.op, i.name, case.dtype) for i in case.op.inputs]
    stand_ins = [None if s is None else _C._meta_tensor(list(s), d) for s, d in zip(shapes, dtypes)]
    return _outcome(lambda: [(tuple(s), d) for s, d in getattr(_C._meta, case.op.name)(*stand_ins, **case.attrs)])


def test_meta_rules_refuse_what_calls_refuse() -> None:
    differ = []
    for seed in range(CALLS):
        case, shapes, data = _draw(seed)
        inputs = _cases.to_inputs(case.op, case.dtype, data)

        def call() -> list:
            outs = getattr(ops, case.op.name)(*inputs, **case.attrs)
            return [(o.shape, o.dtype) for o in (outs if isinstance(outs, tuple) else (outs,))]

        got, meta = _outcome(call), _meta(case, shapes)
        if got[0] != "ok" and DATA_ERROR.search(got[1]):
            continue
        if got != meta:
            differ.append(f"seed {seed}: {case.op.name} {case.dtype} shapes {shapes} attrs {case.attrs}: "
                          f"call {got}, meta rule {meta}")
    assert not differ, f"{len(differ)} of {CALLS} calls:\n" + "\n".join(differ[:20])


def test_the_python_lowering_of_checks_raises_what_the_meta_rule_raises() -> None:
    differ, raised = [], 0
    for seed in range(CALLS):
        case, shapes, _ = _draw(seed)
        op = _formulas.OPS[case.op.name]
        if op.shapes is None:
            continue
        attrs = _cases.full_attrs(case.op, case.attrs)
        meta = _meta(case, shapes)
        if meta[0] == "IndexError":  # (axes: the C++ rule checks them first, adapters run it first)
            continue
        py = _outcome(lambda: op.shapes(ShapeHelpers, *shapes, *[attrs[a.name] for a in op.attrs]))
        raised += py[0] != "ok"
        if (py[0] != "ok" and py != meta) or (py[0] == "ok" and meta[0] != "ok"):
            differ.append(f"seed {seed}: {case.op.name} shapes {shapes} attrs {case.attrs}: Python {py}, "
                          f"meta rule {meta}")
    assert not differ, f"{len(differ)} calls:\n" + "\n".join(differ[:20])
    assert raised > CALLS // 10  # (the perturbed shapes do reach the checks)
