"""The op's AOT entry points (MindSpore's AOT C ABI, aot/aot.h): one exported symbol per combination
of present optional inputs, each running the op on the host's buffers (MindSpore's
``ops.Custom(func_type="aot")`` calls them)."""

from __future__ import annotations

from typing import Any

from .. import api
from ..model import Attr, OpSpec


def _attr(a: Attr) -> str:
    conv = f"&aot::Call::{api.ATTR_CONVERTER[a.type]}"
    if a.optional_value:
        return f"call.attr_optional<{api.ATTR_CPP[a.type]}>(\"{a.name}\", {conv})"
    return f"call.{api.ATTR_CONVERTER[a.type]}(\"{a.name}\")"


def context(op: OpSpec, entry_points: bool = True) -> dict[str, Any]:
    """What templates/aot.cpp.j2 and aot_exports.cpp.j2 place (nothing when not ``entry_points``)."""
    return {
        "aot_entry_points": entry_points,
        "aot_attr_lines": [f"const auto a_{a.name} = {_attr(a)};" for a in op.attrs],
        "aot_call_args": ", ".join([f"call.input({k})" for k in range(len(op.inputs))]
                                   + [f"a_{a.name}" for a in op.attrs]),
        "aot_symbols": api.aot_symbols(op),
    }
