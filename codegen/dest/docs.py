"""The op reference (``opforge docs``): one Markdown page per op (signature, attrs, dtypes per target, gradient
formulas, an example), from the specs alone, plus an index."""

from __future__ import annotations

from typing import Sequence

from .. import api
from ..model import FLOAT_DTYPES, AotImpl, Attr, CompositeImpl, DType, OpSpec
from .render import Rendered, banner, render


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _allowed(a: Attr) -> str:
    parts = []
    if a.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in a.choices))
    if a.min is not None:
        parts.append(f"≥ {a.min}")
    if a.max is not None:
        parts.append(f"≤ {a.max}")
    return "; ".join(parts)


def example(op: OpSpec) -> list[str]:
    """Python lines calling the op on random inputs of its first test case's shapes (NumPy)."""
    shapes = list(op.tests.shapes[0]) if op.tests and op.tests.shapes else [(3, 4)] * len(op.inputs)
    # defaults, unless the op has a required attr: then the first attr set of its tests
    required = any(a.required for a in op.attrs)
    attrs = dict(op.tests.attrs[0]) if required and op.tests and op.tests.attrs else {}
    dtypes = dict(op.typevars)
    lines = ["import numpy as np", "import opforge", "", "rng = np.random.default_rng(0)"]
    args = []
    for i, shape in zip(op.inputs, shapes):
        if shape is None:
            continue
        d = dtypes[i.dtype][-1] if i.dtype in dtypes else DType(i.dtype)
        if d in (DType.FLOAT16, DType.BFLOAT16):
            d = DType.FLOAT32
        shape = tuple(shape)
        if d == DType.BOOL:
            value = f"rng.random({shape}) > 0.5"
        elif d in FLOAT_DTYPES:
            lo, hi = dict(op.tests.domain).get(i.name, (-2.0, 2.0)) if op.tests else (-2.0, 2.0)
            value = f"rng.uniform({lo}, {hi}, {shape}).astype(np.{d})"
        else:
            value = f"rng.integers(0, 2, {shape}).astype(np.{d})"
        lines.append(f"{i.name} = {value}")
        args.append(f"{i.name}={i.name}" if i.optional else i.name)
    args += [f"{k}={v!r}" for k, v in attrs.items()]
    lines.append(f"out = opforge.ops.{op.name}({', '.join(args)})")
    lines.append("print(out)")
    return lines


def render_op_page(op: OpSpec, source: str) -> Rendered:
    grads = api.derivative_lines(op, "    ")
    targets = []
    for t in op.targets:
        dts = "; ".join(f"{v}: {', '.join(ds)}" for v, ds in t.dtypes) or "concrete dtypes only"
        targets.append({"name": t.name, "dtypes": dts, "formats": ", ".join(t.formats), "rows": len(t.rows())})
    aot = (op.impl.library, op.impl.symbol) if isinstance(op.impl, AotImpl) else None
    text = render(
        "op.md.j2", banner=banner("", source, "op.md.j2").strip(),
        name=op.name, sig=api.py_signature(op), doc=op.doc, impl=op.impl.kind, aot=aot, spec=source,
        inputs=[{"name": i.name, "dtype": i.dtype, "optional": i.optional, "differentiable": i.differentiable,
                 "shape_only": i.shape_only, "doc": _cell(i.doc)} for i in op.inputs],
        attrs=[{"name": a.name, "type": a.type,
                "default": "required" if a.required else ("`None`" if a.optional_value
                                                          else f"`{api.py_literal(a.default)}`"),
                "allowed": _allowed(a), "doc": _cell(a.doc)} for a in op.attrs],
        outputs=[{"name": o.name, "dtype": o.dtype, "shape": o.shape.text, "differentiable": o.differentiable,
                  "doc": _cell(o.doc)} for o in op.outputs],
        targets=targets, grads=grads,
        composite=op.impl.formula.text if isinstance(op.impl, CompositeImpl) else None,
        example=example(op))
    return Rendered(f"{op.name}.md", text)


def render_docs(ops: Sequence[OpSpec], sources: dict[str, str]) -> list[Rendered]:
    pages = [render_op_page(op, sources[op.name]) for op in ops]
    index = ["# opforge op reference", "", f"{len(ops)} ops, generated from their specs by `opforge docs`.", "",
             "| op | impl | summary |", "|---|---|---|"]
    for op in ops:
        first = op.doc.split(". ")[0].rstrip(".") + "." if op.doc else ""
        index.append(f"| [`{op.name}`]({op.name}.md) | {op.impl.kind} | {_cell(first)} |")
    return pages + [Rendered("index.md", "\n".join(index) + "\n")]
