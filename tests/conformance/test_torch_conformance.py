"""Conformance with PyTorch (issue 16): every ``sample_inputs`` and ``reference_inputs`` entry of
the OpInfo of each opforge op with a PyTorch counterpart (torch_table.py), run through
``opforge.torch.ops`` and compared with torch: values with PyTorch's own tolerances for the dtype
(``torch.testing.assert_close``), NaN positions, shapes and dtypes; and, where the OpInfo supports
autograd and the op has a gradient, the gradients for the same random output gradients. A sample
is left out only by a named entry of torch_table.DIFFERENCES; an entry no sample needs fails too.

    python tests/conformance/test_torch_conformance.py > docs/conformance.md   # the summary
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (the test extra installs it)")

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import opforge  # noqa: E402
import opforge._formulas as _formulas  # noqa: E402
import opforge.torch as ot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_table import COUNTERPARTS, DIFFERENCES, VALUE_RULES, Counterpart, NotMapped  # noqa: E402

OPINFOS = {(o.name, o.variant_test_name): o for o in op_db}
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}


@dataclasses.dataclass
class Stats:
    compared: int = 0     # samples run through both and compared (values)
    gradients: int = 0    # of those, also compared in their gradients
    closer_than_torch: int = 0  # 16-bit samples matching the float64 result where torch's differs
    excluded: dict[str, int] = dataclasses.field(default_factory=dict)  # by DIFFERENCES key
    failures: list[str] = dataclasses.field(default_factory=list)


def dtypes(c: Counterpart) -> list[str]:
    """The float dtypes of opforge's op (its cpu rows' first input) that torch's OpInfo supports too."""
    info = next(t for t in opforge.op_info(c.op) if t["target"] == "CPU")
    op = _formulas.OPS[c.op]
    col = next(k for k, i in enumerate(op.inputs) if i.dtype in op.typevars)  # (where: x, not condition)
    declared = {row[col][0] for row in info["dtype_format"]}
    theirs = OPINFOS[(c.torch, c.variant)].supported_dtypes("cpu")
    return [d for d in TORCH_DTYPES if d in declared and TORCH_DTYPES[d] in theirs]


def _samples(info: Any, dtype: Any, requires_grad: bool) -> list[Any]:
    return [*info.sample_inputs("cpu", dtype, requires_grad=requires_grad),
            *info.reference_inputs("cpu", dtype, requires_grad=requires_grad)]


def _leaves(values: list[Any]) -> list[Any]:
    return [v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for v in values]


def _flat(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _as_accurate(got: Any, want: Any, exact: Any) -> None:
    """AssertionError unless got is, element by element, as close to exact (the op in float64) as
    torch's own result want is, within the dtype's tolerance; NaN where exact is NaN."""
    for g, w, e in zip(_flat(got), _flat(want), _flat(exact)):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if not g.is_floating_point():
            torch.testing.assert_close(g, w)
            continue
        rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
                      torch.float64: (1e-7, 1e-7)}[g.dtype]
        g64, w64, e64 = g.double(), w.double(), e.double()
        nan = torch.isnan(e64)
        assert torch.equal(torch.isnan(g64), nan), "NaN positions differ from the float64 result"
        err, theirs = (g64 - e64).abs(), (w64 - e64).abs()
        finite = ~nan & torch.isfinite(e64)
        assert torch.equal(g64[~finite & ~nan], e64[~finite & ~nan]), "infinities differ from the float64 result"
        worse = finite & (err > torch.nan_to_num(theirs, nan=0.0) + atol + rtol * e64.abs())
        assert not bool(worse.any()), (f"{int(worse.sum())} elements further from the float64 result than torch's "
                                        f"(max error {err[worse].max().item():.3g} vs torch's "
                                        f"{theirs[worse].max().item():.3g})")


def _compare(got: Any, want: Any, exact: Callable[[], Any]) -> bool:
    """True when got matches torch's want with torch's tolerances; else, when it is as accurate as
    want against the float64 computation exact(), False (counted: torch's rounding differs);
    AssertionError otherwise."""
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
        return True
    except AssertionError:
        if all(w.dtype == torch.float64 for w in _flat(want) if w.is_floating_point()):
            raise
    _as_accurate(got, want, exact())
    return False


def _up(v: Any) -> Any:
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


def run(c: Counterpart, dtype_name: str) -> Stats:
    info = OPINFOS[(c.torch, c.variant)]
    op = getattr(ot.ops, c.op)
    has_grad = _formulas.OPS[c.op].bprop is not None and info.supports_autograd
    stats = Stats()
    gen = torch.Generator().manual_seed(0)

    def mine(outs: Any) -> Any:
        return c.mine(outs) if c.mine else outs

    def call_torch(args: list[Any], kwargs: dict[str, Any]) -> Any:
        out = info.op(*args, **kwargs)
        return c.outputs(out) if c.outputs else out

    for k, sample in enumerate(_samples(info, TORCH_DTYPES[dtype_name], requires_grad=False)):
        try:
            tensors, attrs = c.adapt(sample)
            for key, rule in VALUE_RULES.get(c.op, []):
                if rule(tensors, attrs):
                    raise NotMapped(key)
        except NotMapped as e:
            key = str(e)
            stats.excluded[key] = stats.excluded.get(key, 0) + 1
            if (c.op, key) not in DIFFERENCES:
                stats.failures.append(f"sample {k}: not mapped ({key}) and not a documented difference")
            continue
        where = f"sample {k} ({', '.join(str(tuple(t.shape)) for t in tensors if isinstance(t, torch.Tensor))}, {attrs})"
        args = [sample.input, *sample.args]
        try:
            got = mine(op(*tensors, **attrs))
            want = call_torch(args, sample.kwargs)
            if not _compare(got, want, lambda: call_torch([_up(a) for a in args], sample.kwargs)):
                stats.closer_than_torch += 1
        except Exception as e:  # noqa: BLE001 - every difference is reported, with the sample
            stats.failures.append(f"{where}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
            continue
        stats.compared += 1
        if not has_grad or dtype_name not in ("float32", "float64"):
            continue
        leaves, theirs = _leaves(tensors), _leaves(args)
        diff = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        if not diff:
            continue
        try:
            outs = [o for o in _flat(mine(op(*leaves, **attrs))) if o.is_floating_point()]
            douts = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
            g_mine = torch.autograd.grad(outs, diff, douts, allow_unused=True)

            ref = [o for o in _flat(call_torch(theirs, sample.kwargs)) if o.is_floating_point()]
            ref_leaves = [t for t in theirs if isinstance(t, torch.Tensor) and t.requires_grad]
            g_theirs = tuple(torch.zeros_like(t) if g is None else g for g, t in
                             zip(torch.autograd.grad(ref, ref_leaves, douts, allow_unused=True), ref_leaves))
            g_mine = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(g_mine, diff))
            if dtype_name == "float64":  # torch's tolerances, as its own gradient tests (gradcheck) use
                torch.testing.assert_close(g_mine, g_theirs, equal_nan=True)
            else:  # float32: rounding-order noise of sums over broadcast dimensions (either way)
                torch.testing.assert_close(g_mine, g_theirs, equal_nan=True, rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            stats.failures.append(f"{where} gradient: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
            continue
        stats.gradients += 1
    return stats


@pytest.mark.parametrize("c", COUNTERPARTS, ids=lambda c: c.op)
def test_matches_torch(c: Counterpart) -> None:
    hit: set[str] = set()
    failures = []
    for d in dtypes(c):
        stats = run(c, d)
        hit |= set(stats.excluded)
        failures += [f"{d} {f}" for f in stats.failures]
    stale = [key for (op, key) in DIFFERENCES if op == c.op and key not in hit]
    assert not stale, f"[{c.op}] documented differences no sample needs any more (remove them): {stale}"
    assert not failures, f"[{c.op}] {len(failures)} differences from torch:\n" + "\n".join(failures[:20])


def test_every_counterpart_exists() -> None:
    for c in COUNTERPARTS:
        assert c.op in _formulas.OPS, c.op
        assert (c.torch, c.variant) in OPINFOS, (c.torch, c.variant)
        assert dtypes(c), f"{c.op}: no float dtype in common with torch's {c.torch}"


def report() -> str:
    lines = ["# Conformance with PyTorch", "",
             "Generated by `python tests/conformance/test_torch_conformance.py > docs/conformance.md` "
             f"(torch {torch.__version__}): every sample of the op's OpInfo (`sample_inputs` and "
             "`reference_inputs`) on the CPU, through `opforge.torch.ops`, compared with torch's own "
             "tolerances; gradients in float32 and float64 where the OpInfo supports autograd.", "",
             "A float16, bfloat16 or float32 result outside torch's tolerances of torch's result must be, "
             "element by element, as close as torch's to the op computed by torch in float64, within the "
             "same tolerances (the column 'closer than torch' counts those). float64 results and gradients "
             "are compared with torch's tolerances; float32 gradients with rtol 1e-4, atol 1e-5 (the "
             "rounding-order noise of sums over broadcast dimensions).", "",
             "| op | torch OpInfo | dtype | compared | closer than torch | gradients compared | excluded (documented) "
             "| differences |",
             "|---|---|---|---:|---:|---:|---|---:|"]
    for c in COUNTERPARTS:
        for d in dtypes(c):
            s = run(c, d)
            excluded = "; ".join(f"{k}: {n}" for k, n in sorted(s.excluded.items())) or "-"
            name = c.torch + (f" ({c.variant})" if c.variant else "")
            lines.append(f"| {c.op} | {name} | {d} | {s.compared} | {s.closer_than_torch} | {s.gradients} | {excluded} "
                         f"| {len(s.failures)} |")
    lines += ["", "## Documented differences", "", "| op | difference | why |", "|---|---|---|"]
    lines += [f"| {op} | {key} | {why} |" for (op, key), why in sorted(DIFFERENCES.items())]
    import test_numpy_special_values as npsv

    lines += ["", "# Conformance with NumPy on special values", "",
              "`tests/conformance/test_numpy_special_values.py`: " + npsv.__doc__.split("\n\n")[0].split(": ", 1)[1]
              .replace("\n", " ").rstrip(".") + ".", "",
              "| op | NumPy | dtypes | values compared per dtype |", "|---|---|---|---:|"]
    for arity, table in ((1, npsv.UNARY), (2, npsv.BINARY)):
        for op, fn in sorted(table.items()):
            kinds = npsv.declared(op)
            counts = {len(npsv.special_values(d)) ** arity for d in kinds}
            numpy_name = getattr(fn, "__name__", "maximum(x, 0)") if op != "relu" else "maximum(x, 0)"
            lines.append(f"| {op} | {numpy_name} | {', '.join(str(d) for d in kinds)} | "
                         f"{'/'.join(str(c) for c in sorted(counts))} |")
    lines += ["", "Documented differences from NumPy:", ""]
    lines += [f"- {op} ({aspect}): {why}" for (op, aspect), why in sorted(npsv.DIFFERENCES.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(report(), end="")
