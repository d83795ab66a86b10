"""The op's Python-facing entry (``runtime/binding.h``): ``call_<op>`` and ``meta_<op>`` over
converted parameters, and ``register_<op>``, which registers its row and returns its entry with the
attrs' defaults. No pybind11: the runtime's Python face binds arguments to the entry."""

from __future__ import annotations

from typing import Any

from .. import api
from ..model import Attr, OpSpec


def _attr_arg(a: Attr, index: int) -> str:
    """The attr's value as the op's C++ API takes it, from the entry's converted values."""
    getter = "take_optional" if a.optional_value else "take"
    return f"binding::{getter}<{api.ATTR_CPP[a.type]}>(a[{index}])"


def _default(a: Attr) -> str:
    """The attr's default (std::nullopt: required; an empty AttrValue: None)."""
    if a.required:
        return "std::nullopt"
    if a.optional_value:
        return "AttrValue()"
    return f"AttrValue({api.cpp_literal(a.type, a.default)})"


def context(op: OpSpec) -> dict[str, Any]:
    """What templates/binding.cpp.j2 and binding_register.cpp.j2 place."""
    n_in = len(op.inputs)
    return {
        "name": op.name,
        "multi_output": len(op.outputs) > 1,
        "call_args": ", ".join([f"in[{k}]" for k in range(n_in)]
                               + [_attr_arg(a, k) for k, a in enumerate(op.attrs)]),
        "defaults": ", ".join(_default(a) for a in op.attrs),
    }
