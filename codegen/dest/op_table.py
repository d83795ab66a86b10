"""``_formulas.py``: the op table of framework adapters (opforge.torch, opforge.mindspore): every
op's inputs, attrs, outputs and shape rules as data, its composite and gradient formulas lowered to
Python over the adapter's ops ``F`` and helpers ``H``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .. import api
from ..formula import dims
from ..formula.lang import PY
from ..model import AotImpl, OpSpec
from ..targets import BUILDS, TARGETS, Build
from .render import Rendered, banner, render


def _tuple(items: Sequence[str]) -> str:
    return "".join(f"{x}, " for x in items).rstrip()


def _bprop(op: OpSpec, lb: api.LoweredBprop) -> list[str]:
    """The body of ``_bprop_<op>``: lets, then one reduced gradient (or None) per input."""
    lines = []
    for n, code, _, when, given in lb.lets:
        lines.append(f"v_{n} = {code} if {PY.let_condition(when, given)} else None")
    grads = {k: code for k, _, code in lb.grads}
    lines.append("return (")
    for k, _ in enumerate(op.inputs):
        if k in grads:
            lines.append(f"    H.reduce_grad({grads[k]}, meta[{k}]) if need[{k}] else None,")
        else:
            lines.append("    None,")
    lines.append(")")
    return lines


def _jvp(op: OpSpec, lj: api.LoweredJvp) -> list[str]:
    """The body of ``_jvp_<op>``: tangents (zeros where none was given), lets, one tangent (or None)
    per output."""
    lines = []
    for k, t, name in lj.tangents:
        value = f"t[{k}] if t[{k}] is not None else H.zeros_like(v_{name})"
        if op.inputs[k].optional:
            value = f"({value}) if v_{name} is not None else None"
        lines.append(f"v_{t} = {value}")
    lines += [f"v_{n} = {code} if {' and '.join(given)} else None" if given else f"v_{n} = {code}"
              for n, code, _, given in lj.lets]
    codes = dict(lj.outputs)
    for k, terms in lj.terms:
        # (a sum of terms reading different tangents: those whose tangents were all not given left
        # out, not multiplied by zeros; then broadcast to the output's shape, as the sum was)
        acc, out = f"s{k}_", f"v_{op.outputs[k].name}"
        lines.append(f"{acc} = None")
        for sign, code, needs in terms:
            test = " or ".join(f"t[{j}] is not None" for j in needs)
            add = "F.add" if sign > 0 else "F.sub"
            first = "term_" if sign > 0 else "F.neg(term_)"
            lines.append(f"if {test}:")
            lines.append(f"    term_ = {code}")
            lines.append(f"    {acc} = {first} if {acc} is None else {add}({acc}, term_)")
        lines.append(f"{acc} = H.zeros_like({out}) if {acc} is None else {acc} if tuple({acc}.shape) == "
                     f"tuple({out}.shape) else F.add({acc}, H.zeros_like({out}))")
        codes[k] = acc
    lines.append("return (" + "".join(f"{codes.get(k, 'None')}, " for k in range(len(op.outputs))).rstrip() + ")")
    return lines


def _shapes(op: OpSpec) -> Optional[list[str]]:
    """The body of ``_shapes_<op>`` (ops with checks or shape expressions): the checks through
    ``H.check(op, test, message)``, then one shape per output (None where the rule is not an
    expression), over the inputs' shapes ``s_<input>`` (None when absent) and the attrs."""
    exprs = [o.shape.formula for o in op.outputs]
    if not op.checks and not any(exprs):
        return None
    scope = api.dim_scope(op)
    lines = []
    for c in op.checks:
        test, pieces = dims.lower_check(c, scope, cpp=False)
        parts = []
        for literal, code in pieces:
            if literal:
                parts.append(repr(literal))
            if code:
                parts.append(code if code.startswith("H.shape_str(") else f"str({code})")
        lines.append(f"H.check({op.name!r}, {test}, lambda: {' + '.join(parts) or repr('')})")
    shapes = [dims.lower_dims(f, scope, dims.DKind.DIMS, cpp=False) if f is not None else "None" for f in exprs]
    lines.append("return (" + "".join(f"{c}, " for c in shapes).rstrip() + ")")
    return lines


def _context(op: OpSpec, table: Mapping[str, api.Callee], build: Build) -> dict[str, Any]:
    lowered = api.lower_formulas(op, table, PY)
    attr_params = [f"a_{a.name}" for a in op.attrs]
    aot = (op.impl.library, op.impl.symbol) if isinstance(op.impl, AotImpl) else None
    ctx: dict[str, Any] = {
        "name": op.name, "impl": op.impl.kind, "doc": repr(op.doc.splitlines()[0] if op.doc else op.name),
        "typevars": _tuple([repr(v) for v, _ in op.typevars]),
        "inputs": [f"InputDef({i.name!r}, {str(i.dtype)!r}, {i.optional}, {i.differentiable}"
                   + (", shape_only=True)" if i.shape_only else ")") for i in op.inputs],
        "attrs": [f"AttrDef({a.name!r}, {str(a.type)!r}, {a.required}, {api.py_default(a) or 'None'}, "
                  f"{tuple(a.choices) if a.choices is not None else None!r}"
                  + (f", axis_of={a.axis_of!r})" if a.axis_of else ")") for a in op.attrs],
        "outputs": [f"OutputDef({o.name!r}, {str(o.dtype)!r}, {str(o.shape.kind)!r}, {o.shape.args!r}, "
                    f"{o.differentiable})" for o in op.outputs],
        "composite": lowered.composite,
        "composite_params": ", ".join([f"v_{i.name}" for i in op.inputs] + attr_params),
        "bprop": None, "bprop_params": "", "saved": "",
        "jvp": _jvp(op, lowered.jvp) if lowered.jvp is not None else None,
        "shapes": _shapes(op),
        "shapes_params": ", ".join([f"s_{i.name}" for i in op.inputs] + attr_params),
        "jvp_params": ", ".join([f"v_{i.name}" for i in op.inputs] + [f"v_{o.name}" for o in op.outputs]
                                + attr_params),
        "aot_symbols": _tuple([repr((m, sym)) for m, sym in api.aot_symbols(op)]),
        "aot_kernel": repr(aot),
        "runs": repr(tuple(str(t) for t in api.runnable_targets(op, build))),
        "autocast": repr(op.autocast),
        "batch_inputs": repr(op.batch_inputs),
    }
    lb = lowered.bprop
    if lb is None:
        return ctx
    params = ([f"v_{i.name}" for i in op.inputs] + [f"v_{o.name}" for o in op.outputs]
              + [f"v_{o.grad_name}" for o in op.outputs if o.differentiable] + attr_params)
    ctx.update(bprop=_bprop(op, lb), bprop_params=", ".join(params),
               saved=_tuple([repr((n, ks)) for n, ks in lb.saved]))
    return ctx


def render_formulas(ops: Sequence[OpSpec], sources: Sequence[str],
                    table: Optional[Mapping[str, api.Callee]] = None, build: Build = BUILDS["cpu"]) -> Rendered:
    """The adapters' op table for ops built by ``build``; their formulas may call any op of table
    (default: ops)."""
    if table is None:
        table = {o.name: o for o in ops}
    targets = [f"{str(r.name)!r}: TargetDef({str(r.name)!r}, {r.device_type!r}, {r.torch_dispatch_key!r}, "
               f"{r.mindspore_target!r}, {r.dlpack_device_type})" for r in TARGETS.values()]
    text = render("formulas.py.j2", banner=banner("#", f"{len(sources)} specs", "formulas.py.j2"),
                  ops=[_context(op, table, build) for op in ops], targets=targets,
                  builds=[f"{b.backend!r}: BuildDef({b.backend!r}, {b.wheel_label!r}, "
                          f"{tuple(str(t) for t in b.targets)!r}, {b.available}, {b.runtime_requires!r}, "
                          f"{b.runtime_libs!r})" for b in BUILDS.values()],
                  built_targets=_tuple([repr(str(t)) for t in build.targets]))
    return Rendered("_formulas.py", text)
