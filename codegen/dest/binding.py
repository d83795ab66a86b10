"""The op's Python binding: ``py_<op>`` and ``py_meta_<op>`` (parameters bound by the runtime's
OpCaller, defaults from the spec) and ``register_<op>``, which registers its row and defines both."""

from __future__ import annotations

from typing import Any

from .. import api, escape
from ..model import Attr, AttrType, OpSpec


def _py_attr(a: Attr, index: int) -> str:
    conv = f"python::{api.ATTR_CONVERTER[a.type]}"
    if a.optional_value:
        return (f"python::attr_optional(a[{index}], [](py::handle h) {{ return {conv}(kName, "
                f"\"{a.name}\", h); }})")
    return f"{conv}(kName, \"{a.name}\", a[{index}])"


def _py_default(a: Attr) -> str:
    """The Python default value of an attr (a null object when required)."""
    if a.required:
        return "py::object()"
    if a.optional_value:
        return "py::none()"
    v = a.default
    if a.type == AttrType.BOOL:
        return f"py::bool_({'true' if v else 'false'})"
    if a.type == AttrType.INT:
        return f"py::int_({int(v)})"
    if a.type == AttrType.FLOAT:
        return f"py::float_({float(v)!r})"
    if a.type == AttrType.STR:
        return f"py::str({escape.cpp_str(v)})"
    items = ", ".join(repr(x) for x in v)
    return f"py::make_tuple({items})" if v else "py::tuple()"


def context(op: OpSpec) -> dict[str, Any]:
    """What templates/binding.cpp.j2 and binding_register.cpp.j2 place."""
    n_in = len(op.inputs)
    return {
        "name": op.name,
        "ret_type": "TensorPtr" if len(op.outputs) == 1 else "TensorList",
        "py_inputs": [f"in.add(a[{k}]);" for k in range(n_in)],
        "py_attr_lines": [f"const auto a_{a.name} = {_py_attr(a, n_in + k)};" for k, a in enumerate(op.attrs)],
        "call_args": ", ".join([f"in[{k}]" for k in range(n_in)] + [f"a_{a.name}" for a in op.attrs]),
        "py_defaults": ", ".join(["py::none()" if i.optional else "py::object()" for i in op.inputs]
                                 + [_py_default(a) for a in op.attrs]),
    }
