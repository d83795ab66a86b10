"""The registration table: each op's row (``OpInfo& kInfo``, never destroyed: inputs, outputs,
attrs, dtype x format rows per target) and ``ops_registry.cpp``, which registers every op of the
extension."""

from __future__ import annotations

from typing import Any, Sequence

from .. import api, escape
from ..model import OpSpec
from ..targets import TARGETS, Build
from .render import Rendered, banner, render, shown_sources

_cpp_str = escape.cpp_str


def _arg_info(tvars: list[str], name: str, dtype: str, optional: bool, diff: bool) -> str:
    tv = tvars.index(dtype) if dtype in tvars else -1
    concrete = api.dtype_enum(dtype) if tv < 0 else "DType::Bool"
    return (f"{{{_cpp_str(name)}, {tv}, {concrete}, {'true' if optional else 'false'}, "
            f"{'true' if diff else 'false'}}}")


def context(op: OpSpec, build: Build) -> dict[str, Any]:
    """What templates/registry_row.cpp.j2 places (and kDoc, which the row and the binding share)."""
    tvars = [v for v, _ in op.typevars]
    runnable = api.runnable_targets(op, build)
    info_targets = []
    for t in op.targets:
        rows = []
        for binding, fmt in t.rows():
            vars_ = [api.dtype_enum(binding[v]) for v in tvars] + ["DType::Bool"] * (4 - len(tvars))
            rows.append(f"RowInfo{{{{{{{', '.join(vars_)}}}}}, {api.FORMAT_ENUM[fmt]}}}")
        info_targets.append((t.name, TARGETS[t.name].mindspore_target, rows,
                             "true" if t.name in runnable else "false"))
    return {
        "doc": _cpp_str(api.docstring(op)),
        "impl": op.impl.kind,
        "info_typevars": ", ".join(_cpp_str(v) for v in tvars),
        "info_inputs": [_arg_info(tvars, i.name, i.dtype, i.optional, i.differentiable) for i in op.inputs],
        "info_outputs": [_arg_info(tvars, o.name, o.dtype, False, o.differentiable) for o in op.outputs],
        "info_attrs": [f"{{{_cpp_str(a.name)}, {_cpp_str(a.type)}, {'true' if a.required else 'false'}, "
                       f"{_cpp_str(api.py_default(a))}}}" for a in op.attrs],
        "info_targets": info_targets,
        "inplace": _cpp_str(op.inplace or ""),
        "foreach": "true" if op.foreach else "false",
    }


def render_registry(ops: Sequence[OpSpec], sources: Sequence[str]) -> Rendered:
    """``ops_registry.cpp``: all_ops(), every op's register function, which opforge._C defines."""
    text = render("registry.cpp.j2", banner=banner("//", shown_sources(list(sources)), "registry.cpp.j2"),
                  names=[o.name for o in ops])
    return Rendered("ops_registry.cpp", text)
