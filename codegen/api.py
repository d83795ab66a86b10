"""C++ names, types and lowered formulas for one op: what the templates place."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from . import escape
from .formula import CPP, CppLang, GraphScope, OpSignature, lower_graph, names_in
from .model import Attr, OpSpec

DTYPE_ENUM = {
    "bool": "Bool", "uint8": "UInt8", "int8": "Int8", "int16": "Int16", "int32": "Int32",
    "int64": "Int64", "float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32",
    "float64": "Float64",
}
DTYPE_STORAGE = {
    "bool": "bool", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "float16": "Half", "bfloat16": "BFloat16", "float32": "float",
    "float64": "double",
}
FORMAT_ENUM = {"DefaultFormat": "Format::Default", "NCHW": "Format::NCHW", "NHWC": "Format::NHWC"}
ATTR_CPP = {"bool": "bool", "int": "int64_t", "float": "double", "str": "std::string",
            "list[int]": "std::vector<int64_t>", "list[float]": "std::vector<double>"}
ATTR_PY = {"bool": "bool", "int": "int", "float": "float", "str": "str",
           "list[int]": "Sequence[int]", "list[float]": "Sequence[float]"}
ATTR_KIND = {"bool": "Bool", "int": "Int", "float": "Float", "str": "Str",
             "list[int]": "IntList", "list[float]": "FloatList"}


def dtype_enum(d: str) -> str:
    return f"DType::{DTYPE_ENUM[d]}"


def attr_cpp_type(a: Attr) -> str:
    t = ATTR_CPP[a.type]
    return f"std::optional<{t}>" if a.optional_value else t


def cpp_literal(atype: str, value: Any) -> str:
    if atype == "bool":
        return "true" if value else "false"
    if atype == "int":
        return f"int64_t({value})"
    if atype == "float":
        return repr(float(value))  # finite: the model rejects inf and nan
    if atype == "str":
        return f"std::string({escape.cpp_str(value)})"
    if atype == "list[int]":
        return "std::vector<int64_t>{" + ", ".join(str(int(v)) for v in value) + "}"
    if atype == "list[float]":
        return "std::vector<double>{" + ", ".join(repr(float(v)) for v in value) + "}"
    raise ValueError(atype)


def attr_cpp_default(a: Attr) -> Optional[str]:
    """The C++ default argument, or None for a required attr."""
    if a.required:
        return None
    if a.optional_value:
        return "std::nullopt"
    return cpp_literal(a.type, a.default)


def py_literal(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def py_default(a: Attr) -> str:
    """The Python default value of an attr ("" when required)."""
    if a.required:
        return ""
    return "None" if a.optional_value else py_literal(a.default)


def aot_symbols(op: OpSpec) -> list[tuple[int, str]]:
    """The op's exported AOT entry points (seed 004's C ABI): one per combination of present
    optional inputs, as (mask of present inputs, symbol). All present: ``opforge_<op>``; else
    ``opforge_<op>__without__<input>[__<input>...]``."""
    optional = [k for k, i in enumerate(op.inputs) if i.optional]
    full = (1 << len(op.inputs)) - 1
    out = []
    for absent_bits in range(1 << len(optional)):
        absent = [optional[j] for j in range(len(optional)) if (absent_bits >> j) & 1]
        mask = full & ~sum(1 << k for k in absent)
        symbol = f"opforge_{op.name}" + "".join(
            ("__without__" if j == 0 else "__") + op.inputs[k].name for j, k in enumerate(absent))
        out.append((mask, symbol))
    return out


def signature(op: OpSpec) -> OpSignature:
    return OpSignature(
        op.name,
        tuple((i.name, i.optional) for i in op.inputs),
        tuple((a.name, a.type, a.required, attr_cpp_default(a) or "", py_default(a)) for a in op.attrs),
        len(op.outputs),
    )


# ---------------------------------------------------------------------------- graph formulas


@dataclass(frozen=True)
class LoweredBprop:
    lets: tuple[tuple[str, str, str, tuple[int, ...]], ...]  # (name, C++ code, C++ type, inputs needing it)
    grads: tuple[tuple[int, str, str], ...]               # (input index, input name, C++ code)
    saved: tuple[tuple[str, tuple[int, ...]], ...]        # (tensor name, input indices needing it)
    uses_attrs: bool
    used_ops: tuple[str, ...]


@dataclass(frozen=True)
class Lowered:
    composite: Optional[str]
    bprop: Optional[LoweredBprop]
    used_ops: tuple[str, ...]


def _attr_scope(op: OpSpec, prefix: str) -> dict[str, tuple[str, str]]:
    out = {}
    for a in op.attrs:
        kind = ("optional " + a.type) if a.optional_value else a.type
        out[a.name] = (kind, f"{prefix}{a.name}")
    return out


def graph_scopes(op: OpSpec, table: Mapping[str, OpSpec], lang: CppLang = CPP) -> Lowered:
    """Check and lower the op's composite and bprop formulas to ``lang`` (raises SpecError).

    Tensors are ``v_<name>`` in every language; attrs are ``attrs.<name>`` in C++ and
    ``a_<name>`` in Python."""
    prefix = "attrs." if lang is CPP else "a_"
    sigs = {name: signature(o) for name, o in table.items()}
    used: set[str] = set()
    composite = None
    if op.impl.kind == "composite" and op.impl.formula is not None:
        scope = GraphScope({i.name: f"v_{i.name}" for i in op.inputs},
                           {i.name for i in op.inputs if i.optional}, _attr_scope(op, prefix), sigs)
        code, kind = lower_graph(op.impl.formula, scope, lang)
        if kind != "tensor":
            raise op.impl.formula.error(0, f"a composite formula must give a tensor, got {kind}")
        composite = code
        used |= scope.used_ops
    bprop = None
    if op.bprop is not None:
        tensors = {i.name: f"v_{i.name}" for i in op.inputs}
        tensors.update({o.name: f"v_{o.name}" for o in op.outputs})
        tensors.update({o.grad_name: f"v_{o.grad_name}" for o in op.outputs if o.differentiable})
        optional = {i.name for i in op.inputs if i.optional}
        index = {i.name: k for k, i in enumerate(op.inputs)}
        deps: dict[str, set[str]] = {}
        lets = []
        bscope_used: set[str] = set()
        scalars = _attr_scope(op, prefix)
        for name, f in op.bprop.lets:
            scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs)
            code, kind = lower_graph(f, scope, lang)
            if kind == "tensor":
                tensors[name] = f"v_{name}"
            elif kind in ("number", "int", "float"):
                scalars[name] = ("number", f"v_{name}")
            else:
                raise f.error(0, f"a let must give a tensor or a number, got {kind}")
            bscope_used |= scope.used_ops
            refs = names_in(f.ast)
            # everything a let reads, transitively (intermediate lets included)
            deps[name] = set().union(*[{r} | deps.get(r, set()) for r in refs]) if refs else set()
            lets.append((name, code, "TensorPtr" if kind == "tensor" else "double"))
        grads = []
        needers: dict[str, set[int]] = {}
        for name, f in op.bprop.grads:
            scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs)
            code, kind = lower_graph(f, scope, lang)
            if kind != "tensor":
                raise f.error(0, f"a gradient must be a tensor, got {kind}")
            bscope_used |= scope.used_ops
            grads.append((index[name], name, code))
            for r in names_in(f.ast):
                for needed in {r} | deps.get(r, set()):
                    needers.setdefault(needed, set()).add(index[name])
        saveable = [i.name for i in op.inputs] + [o.name for o in op.outputs]
        saved = tuple((n, tuple(sorted(needers[n]))) for n in saveable if n in needers)
        let_rows = tuple((n, c, t, tuple(sorted(needers.get(n, set())))) for n, c, t in lets)
        uses_attrs = any(a.name in needers for a in op.attrs)
        bprop = LoweredBprop(let_rows, tuple(grads), saved, uses_attrs, tuple(sorted(bscope_used)))
        used |= bscope_used
    return Lowered(composite, bprop, tuple(sorted(used)))
