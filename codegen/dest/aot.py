"""The op's AOT entry points (MindSpore's AOT C ABI, aot/aot.h): one exported symbol per combination
of present optional inputs, each running the op on the host's buffers (MindSpore's
``ops.Custom(func_type="aot")`` calls them)."""

from __future__ import annotations

from typing import Any

from .. import api
from ..model import Attr, OpSpec, ShapeKind


def _attr(a: Attr) -> str:
    conv = f"&aot::AttrSource::{api.ATTR_CONVERTER[a.type]}"
    if a.optional_value:
        return f"call.attr_optional<{api.ATTR_CPP[a.type]}>(\"{a.name}\", {conv})"
    return f"call.{api.ATTR_CONVERTER[a.type]}(\"{a.name}\")"


def has_infer_shape(op: OpSpec) -> bool:
    """Whether the op's entry points have InferShape companions: shape rules that are data (an
    infer() rule is code over tensors, which MindSpore's shape inference does not give)."""
    return all(o.shape.kind != ShapeKind.INFER for o in op.outputs)


def context(op: OpSpec, entry_points: bool = True) -> dict[str, Any]:
    """What templates/aot.cpp.j2 and aot_exports.cpp.j2 place (nothing when not ``entry_points``)."""
    infer = entry_points and has_infer_shape(op)
    return {
        "aot_entry_points": entry_points,
        "aot_infer_shape": infer,
        "aot_multi_output": len(op.outputs) > 1,
        "aot_dims_lines": [f"[[maybe_unused]] const DimsOf* v_{i.name} = call.dims({k});"
                           for k, i in enumerate(op.inputs)],
        "aot_attrs_args": ", ".join(f"a_{a.name}" for a in op.attrs),

        "aot_attr_lines": [f"const auto a_{a.name} = {_attr(a)};" for a in op.attrs],
        "aot_call_args": ", ".join([f"call.input({k})" for k in range(len(op.inputs))]
                                   + [f"a_{a.name}" for a in op.attrs]),
        "aot_symbols": api.aot_symbols(op),
    }
