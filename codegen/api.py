"""Types and names of model things in the generated languages (C++ and Python), and an op's
formulas lowered to them: what the dest modules place."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Protocol, Sequence, Union

from . import escape
from .formula import dims
from .formula.expr import LoweredExpr, lower_expr
from .formula.graph import GraphScope, OpSignature, lower_graph, lower_outputs, peel_guards
from .formula.kinds import NUMBER, TENSOR, VType, attr_vtype
from .formula.lang import CPP, CppLang
from .formula.syntax import Binary, Call, Formula, Unary, names_in
from .model import AotImpl, Attr, AttrType, CompositeImpl, CppImpl, DType, ExprImpl, Format, OpSpec, expr_scope
from .targets import HOST, Backend, Build

DTYPE_ENUM = {
    DType.BOOL: "Bool", DType.UINT8: "UInt8", DType.INT8: "Int8", DType.INT16: "Int16", DType.INT32: "Int32",
    DType.INT64: "Int64", DType.FLOAT16: "Float16", DType.BFLOAT16: "BFloat16", DType.FLOAT32: "Float32",
    DType.FLOAT64: "Float64",
}
DTYPE_STORAGE = {
    DType.BOOL: "bool", DType.UINT8: "uint8_t", DType.INT8: "int8_t", DType.INT16: "int16_t",
    DType.INT32: "int32_t", DType.INT64: "int64_t", DType.FLOAT16: "Half", DType.BFLOAT16: "BFloat16",
    DType.FLOAT32: "float", DType.FLOAT64: "double",
}
FORMAT_ENUM = {Format.DEFAULT: "Format::Default", Format.NCHW: "Format::NCHW", Format.NHWC: "Format::NHWC"}
ATTR_CPP = {AttrType.BOOL: "bool", AttrType.INT: "int64_t", AttrType.FLOAT: "double", AttrType.STR: "std::string",
            AttrType.INT_LIST: "std::vector<int64_t>", AttrType.FLOAT_LIST: "std::vector<double>"}
ATTR_PY = {AttrType.BOOL: "bool", AttrType.INT: "int", AttrType.FLOAT: "float", AttrType.STR: "str",
           AttrType.INT_LIST: "Sequence[int]", AttrType.FLOAT_LIST: "Sequence[float]"}
# the runtime's converters of an attr value (python::attr_<...>, aot::AttrSource::attr_<...>)
ATTR_CONVERTER = {AttrType.BOOL: "attr_bool", AttrType.INT: "attr_int", AttrType.FLOAT: "attr_float",
                  AttrType.STR: "attr_str", AttrType.INT_LIST: "attr_int_list",
                  AttrType.FLOAT_LIST: "attr_float_list"}


def dtype_enum(d: str) -> str:
    """The runtime's DType enumerator of a concrete dtype."""
    return f"DType::{DTYPE_ENUM[DType(d)]}"


def attr_cpp_type(a: Attr) -> str:
    t = ATTR_CPP[a.type]
    return f"std::optional<{t}>" if a.optional_value else t


def cpp_literal(atype: AttrType, value: Any) -> str:
    """A C++ expression of an attr value."""
    if atype == AttrType.BOOL:
        return "true" if value else "false"
    if atype == AttrType.INT:
        return f"int64_t({value})"
    if atype == AttrType.FLOAT:
        return repr(float(value))  # finite: the model rejects inf and nan
    if atype == AttrType.STR:
        return f"std::string({escape.cpp_str(value)})"
    if atype == AttrType.INT_LIST:
        return "std::vector<int64_t>{" + ", ".join(str(int(v)) for v in value) + "}"
    if atype == AttrType.FLOAT_LIST:
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
    """A Python expression of an attr value."""
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def py_default(a: Attr) -> str:
    """The Python default value of an attr ("" when required)."""
    if a.required:
        return ""
    return "None" if a.optional_value else py_literal(a.default)


def aot_symbols(op: OpSpec) -> list[tuple[int, str]]:
    """The op's exported AOT entry points (MindSpore's AOT C ABI): one per combination of present
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


# An op a formula may call: its spec, or only its signature (opforge's own ops, as an installed
# opforge's op table gives them: no YAML is parsed for them).
Callee = Union[OpSpec, OpSignature]


def signature(op: Callee) -> OpSignature:
    """What a formula calling op needs to know of it."""
    if isinstance(op, OpSignature):
        return op
    return OpSignature(
        op.name,
        tuple((i.name, i.optional) for i in op.inputs),
        tuple((a.name, a.type, a.required, attr_cpp_default(a) or "", py_default(a)) for a in op.attrs),
        tuple(o.name for o in op.outputs),
        _groups([v for v, _ in op.typevars], [str(i.dtype) for i in op.inputs]),
    )


def _groups(typevars: Sequence[str], dtypes: Sequence[str]) -> tuple[int, ...]:
    """Per input, the index of its type variable among typevars (-1: a concrete dtype)."""
    return tuple(typevars.index(d) if d in typevars else -1 for d in dtypes)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _InputRecord(_Named, Protocol):
    @property
    def optional(self) -> bool: ...
    @property
    def dtype(self) -> str: ...


class _AttrRecord(_Named, Protocol):
    @property
    def type(self) -> str: ...
    @property
    def required(self) -> bool: ...
    @property
    def default(self) -> Any: ...


class OpRecord(_Named, Protocol):
    """An op as the generated op table (``_formulas.py``, ``opforge/_opdef.py``'s OpDef) has it."""

    @property
    def typevars(self) -> Sequence[str]: ...
    @property
    def inputs(self) -> Sequence[_InputRecord]: ...
    @property
    def attrs(self) -> Sequence[_AttrRecord]: ...
    @property
    def outputs(self) -> Sequence[_Named]: ...


def record_signature(op: OpRecord) -> OpSignature:
    """An op's signature from its op-table record (the same as signature() of its spec)."""
    attrs = []
    for a in op.attrs:
        t = AttrType(a.type)
        if a.required:
            cpp, py = "", ""
        elif a.default is None:  # optional, without a value
            cpp, py = "std::nullopt", "None"
        else:
            v = tuple(a.default) if isinstance(a.default, list) else a.default
            cpp, py = cpp_literal(t, v), py_literal(v)
        attrs.append((a.name, t, a.required, cpp, py))
    return OpSignature(op.name, tuple((i.name, i.optional) for i in op.inputs), tuple(attrs),
                       tuple(o.name for o in op.outputs), _groups(op.typevars, [i.dtype for i in op.inputs]))


# ---------------------------------------------------------------------------- the Python API


def py_signature(op: OpSpec, inplace: bool = False) -> str:
    """The op's Python signature (stubs, docstrings, docs); with inplace, its in-place variant's
    (the first input is the tensor written, and there is no out=)."""
    parts = []
    for k, i in enumerate(op.inputs):
        if inplace and k == 0:
            parts.append(f"{i.name}: Tensor")
            continue
        parts.append(f"{i.name}: TensorLike | None = None" if i.optional else f"{i.name}: TensorLike")
    for a in op.attrs:
        t = ATTR_PY[a.type]
        if a.required:
            parts.append(f"{a.name}: {t}")
        elif a.optional_value:
            parts.append(f"{a.name}: {t} | None = None")
        else:
            parts.append(f"{a.name}: {t} = {py_literal(a.default)}")
    ret = "Tensor" if len(op.outputs) == 1 else f"tuple[{', '.join('Tensor' for _ in op.outputs)}]"
    if inplace:
        return f"{op.inplace}({', '.join(parts)}) -> Tensor"
    parts.append("*, out: Tensor | None = None" if len(op.outputs) == 1 else f"*, out: {ret} | None = None")
    return f"{op.name}({', '.join(parts)}) -> {ret}"


def docstring(op: OpSpec) -> str:
    """The Python docstring: signature, doc, inputs, attrs, outputs, dtypes per target."""
    lines = [py_signature(op), "", op.doc, ""]
    if op.inplace:
        lines += [f"In place: ``{py_signature(op, inplace=True)}`` writes the result into "
                  f"``{op.inputs[0].name}`` and returns it.", ""]
    lines.append("Inputs:")
    for i in op.inputs:
        extra = [i.dtype]
        if i.optional:
            extra.append("optional")
        if not i.differentiable:
            extra.append("not differentiable")
        lines.append(f"    {i.name} ({', '.join(extra)}){': ' + i.doc if i.doc else ''}")
    if op.attrs:
        lines.append("Attrs:")
        for a in op.attrs:
            extra = [a.type]
            if a.required:
                extra.append("required")
            elif a.has_default:
                extra.append(f"default {py_literal(a.default)}")
            else:
                extra.append("optional")
            if a.choices:
                extra.append("one of " + ", ".join(str(c) for c in a.choices))
            if a.min is not None:
                extra.append(f">= {a.min}")
            if a.max is not None:
                extra.append(f"<= {a.max}")
            lines.append(f"    {a.name} ({', '.join(extra)}){': ' + a.doc if a.doc else ''}")
    lines.append("Outputs:")
    for o in op.outputs:
        extra = [o.dtype, f"shape {o.shape.text}"]
        if not o.differentiable:
            extra.append("not differentiable")
        lines.append(f"    {o.name} ({', '.join(extra)}){': ' + o.doc if o.doc else ''}")
    if op.checks:
        lines.append("Checks (else ValueError):")
        lines += [f"    {c.require.text}: {c.text}" for c in op.checks]
    if op.typevars:
        lines.append("Dtypes:")
        for t in op.targets:
            desc = "; ".join(f"{v}: {', '.join(ds)}" for v, ds in t.dtypes)
            lines.append(f"    {t.name}: {desc} (formats: {', '.join(t.formats)})")
    lines += derivative_lines(op, "    ")
    return "\n".join(lines)


def derivative_lines(op: OpSpec, indent: str = "") -> list[str]:
    """The op's gradients (reverse mode) and tangents (forward mode) as docs and ``opforge info``
    show them, saying which were derived and from what."""
    lines = []
    if op.bprop is not None:
        how = f" (derived from {op.bprop.derived})" if op.bprop.derived else ""
        lines.append(f"Gradients{how}:")
        lines += [f"{indent}let {', '.join(ns)} = {f.text}" for ns, f in op.bprop.lets]
        lines += [f"{indent}d{n} = {f.text}" for n, f in op.bprop.grads]
    if op.jvp is not None:
        how = f" (derived from {op.jvp.derived})" if op.jvp.derived else ""
        lines.append(f"Tangents (forward mode){how}:")
        lines += [f"{indent}let {', '.join(ns)} = {f.text}" for ns, f in op.jvp.lets]
        lines += [f"{indent}{n}_t = {f.text}" for n, f in op.jvp.tangents]
    elif op.bprop is not None:
        lines.append("Tangents (forward mode): none (forward mode raises)")
    return lines


# ---------------------------------------------------------------------------- formulas


def lowered_expr(op: OpSpec) -> Optional[LoweredExpr]:
    """An expr op's formulas as one C++ expression over compute type C (None for other kinds): the
    value of its one output, or a tuple of one value per output."""
    if not isinstance(op.impl, ExprImpl):
        return None
    scope = expr_scope(op.inputs, op.attrs, op.outputs, dict(op.typevars))
    flags: dict[str, str] = {}
    codes = [lower_expr(f, scope, flags).code for _, f in op.impl.formulas]
    code = codes[0] if len(codes) == 1 else "std::make_tuple(" + ", ".join(codes) + ")"
    return LoweredExpr(code, tuple(flags.items()))



# a lowered let: (name, code, C++ type, names it feeds, tests of the optional inputs it needs)
LetRow = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]


def _lower_let(key: str, names: tuple[str, ...], f: Formula, scope: GraphScope, lang: CppLang,
               guards: dict[str, tuple[str, ...]]) -> tuple[list[tuple[str, str, str, tuple[str, ...]]], VType]:
    """One let of a bprop or jvp: rows (name, code, C++ type, tests of the optional inputs it
    needs) and its value's type. Several names bind a call's outputs: a row ``key`` holds them
    (the TensorList ``v_<key>``), then one row per name. A let ``if_given(w, f)`` is bound only
    when w is given: its names go into ``guards``, which later formulas' scopes check."""
    need, f = peel_guards(f, scope)
    for g in need:
        scope.unlock(g)
    given = tuple(lang.given_tensor(scope.tensors[g]) for g in need)
    if len(names) > 1:
        code = lower_outputs(f, names, scope, lang)
        rows = [(key, code, "TensorList", given)]
        rows += [(name, lang.output(f"v_{key}", j), "TensorPtr", given) for j, name in enumerate(names)]
        kind = TENSOR
    else:
        code, kind = lower_graph(f, scope, lang)
        if not (kind.is_tensor or kind.is_number):
            raise f.error(0, f"a let must give a tensor or a number, got {kind}")
        if need and not kind.is_tensor:
            raise f.error(0, f"a let bound by if_given() must give a tensor, got {kind}")
        rows = [(names[0], code, "TensorPtr" if kind.is_tensor else "double", given)]
    for name in names:
        if need:
            guards[name] = need
    return rows, kind


def _fewest(when: set[frozenset[int]]) -> tuple[tuple[int, ...], ...]:
    """A let's condition (any of the sets of inputs whose gradients are all asked for), without a
    set that holds another (need_0 && need_1 || need_1 is need_1), in a fixed order."""
    kept = [w for w in when if not any(v < w for v in when)]
    return tuple(sorted((tuple(sorted(w)) for w in kept), key=lambda t: (len(t), t)))


@dataclass(frozen=True)
class LoweredBprop:
    # (name, C++ code, C++ type, when it is computed: any of these sets of inputs whose gradients
    # are all asked for, tests of the optional inputs it needs)
    lets: tuple[tuple[str, str, str, tuple[tuple[int, ...], ...], tuple[str, ...]], ...]
    grads: tuple[tuple[int, str, str], ...]               # (input index, input name, C++ code)
    saved: tuple[tuple[str, tuple[int, ...]], ...]        # (tensor name, input indices needing it)
    uses_attrs: bool
    used_ops: tuple[str, ...]


@dataclass(frozen=True)
class LoweredJvp:
    tangents: tuple[tuple[int, str, str], ...]   # (input index, tangent name, how the tangent is bound)
    lets: tuple[tuple[str, str, str, tuple[str, ...]], ...]  # (name, code, C++ type, tests of the inputs it needs)
    outputs: tuple[tuple[int, str], ...]         # (output index, code of its tangent)
    # (output index, its tangent's terms: (sign, code, the inputs whose tangents the term reads)),
    # for a tangent that is a sum of terms reading different tangents: a term is evaluated only
    # where one of its tangents was given (a tangent not given is zero, and zero times an
    # infinite factor, pow's log(x) at x < 0, is NaN where the term is zero)
    terms: tuple[tuple[int, tuple[tuple[int, str, tuple[int, ...]], ...]], ...] = ()


@dataclass(frozen=True)
class Lowered:
    composite: Optional[str]
    bprop: Optional[LoweredBprop]
    used_ops: tuple[str, ...]
    jvp: Optional[LoweredJvp] = None


def _attr_scope(op: OpSpec, prefix: str) -> dict[str, tuple[VType, str]]:
    return {a.name: (attr_vtype(a.type, a.optional_value), f"{prefix}{a.name}") for a in op.attrs}


def lower_formulas(op: OpSpec, table: Mapping[str, Callee], lang: CppLang = CPP) -> Lowered:
    """Check and lower the op's composite and bprop formulas to ``lang`` (raises SpecError).

    Tensors are ``v_<name>`` in every language; attrs are ``attrs.<name>`` in C++ and
    ``a_<name>`` in Python."""
    prefix = "attrs." if lang is CPP else "a_"
    sigs = {name: signature(o) for name, o in table.items()}
    used: set[str] = set()
    composite: Optional[str] = None
    if isinstance(op.impl, CompositeImpl):
        scope = GraphScope({i.name: f"v_{i.name}" for i in op.inputs},
                           {i.name for i in op.inputs if i.optional}, _attr_scope(op, prefix), sigs)
        code, kind = lower_graph(op.impl.formula, scope, lang)
        if not kind.is_tensor:
            raise op.impl.formula.error(0, f"a composite formula must give a tensor, got {kind}")
        composite = code
        used |= scope.used_ops
    bprop: Optional[LoweredBprop] = None
    if op.bprop is not None:
        tensors = {i.name: f"v_{i.name}" for i in op.inputs}
        tensors.update({o.name: f"v_{o.name}" for o in op.outputs})
        tensors.update({o.grad_name: f"v_{o.grad_name}" for o in op.outputs if o.differentiable})
        optional = {i.name for i in op.inputs if i.optional}
        index = {i.name: k for k, i in enumerate(op.inputs)}
        differentiable = {i.name: k for k, i in enumerate(op.inputs) if i.differentiable}
        deps: dict[str, set[str]] = {}
        lets: list[LetRow] = []  # (name, code, C++ type, names it feeds, tests of the inputs it needs)
        let_uses: list[tuple[tuple[str, ...], dict[str, list[frozenset[int]]]]] = []  # (names, what it reads)
        guards: dict[str, tuple[str, ...]] = {}
        bscope_used: set[str] = set()
        scalars = _attr_scope(op, prefix)
        for k, (names, f) in enumerate(op.bprop.lets):
            scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs, guards=guards,
                               needs=differentiable)
            refs = names_in(f.ast)
            rows, kind = _lower_let(str(k), names, f, scope, lang, guards)
            # (a multi-output let's row str(k) feeds each of its names; a spec name is never a number)
            lets += [(n, c, t, names if n == str(k) else (n,), given) for n, c, t, given in rows]
            let_uses.append((names, scope.uses))
            bscope_used |= scope.used_ops
            for name in names:
                if kind.is_number:
                    scalars[name] = (NUMBER, f"v_{name}")
                else:
                    tensors[name] = f"v_{name}"
                # everything a let reads, transitively (intermediate lets included)
                deps[name] = set().union(*[{r} | deps.get(r, set()) for r in refs]) if refs else set()
        grads: list[tuple[int, str, str]] = []
        needers: dict[str, set[int]] = {}
        # when each let is computed: sets of inputs, each set's gradients all asked for at a use
        when: dict[str, set[frozenset[int]]] = {}
        for name, f in op.bprop.grads:
            scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs, guards=guards,
                               needs=differentiable)
            code, kind = lower_graph(f, scope, lang)
            if not kind.is_tensor:
                raise f.error(0, f"a gradient must be a tensor, got {kind}")
            bscope_used |= scope.used_ops
            grads.append((index[name], name, code))
            for r in names_in(f.ast):
                for needed in {r} | deps.get(r, set()):
                    needers.setdefault(needed, set()).add(index[name])
            for r, paths in scope.uses.items():
                when.setdefault(r, set()).update(p | {index[name]} for p in paths)
        for names, uses in reversed(let_uses):  # a let's uses of earlier lets, when it is computed
            outer = set().union(*[when.get(n, set()) for n in names])
            for r, paths in uses.items():
                when.setdefault(r, set()).update(w | p for w in outer for p in paths)
        saveable = [i.name for i in op.inputs] + [o.name for o in op.outputs]
        saved = tuple((n, tuple(sorted(needers[n]))) for n in saveable if n in needers)
        let_rows = tuple((n, c, t, _fewest(set().union(*[when.get(m, set()) for m in feeds])), given)
                         for n, c, t, feeds, given in lets)
        uses_attrs = any(a.name in needers for a in op.attrs)
        bprop = LoweredBprop(let_rows, tuple(grads), saved, uses_attrs, tuple(sorted(bscope_used)))
        used |= bscope_used
    jvp = _lower_jvp(op, sigs, lang, prefix, used)
    return Lowered(composite, bprop, tuple(sorted(used)), jvp)


def _lower_jvp(op: OpSpec, sigs: Mapping[str, OpSignature], lang: CppLang, prefix: str,
               used: set[str]) -> Optional[LoweredJvp]:
    """The op's jvp formulas in ``lang``: tangents ``v_d<input>`` (a zero tensor where the caller
    gave none; optional inputs' tangents are absent with them), lets, one code per output."""
    if op.jvp is None:
        return None
    tensors = {i.name: f"v_{i.name}" for i in op.inputs}
    tensors.update({o.name: f"v_{o.name}" for o in op.outputs})
    optional = {i.name for i in op.inputs if i.optional}
    tangents = []
    for k, i in enumerate(op.inputs):
        if not i.differentiable:
            continue
        t = op.tangent_name(i.name)
        tensors[t] = f"v_{t}"
        if i.optional:
            optional.add(t)
        tangents.append((k, t, i.name))
    scalars = _attr_scope(op, prefix)
    # if_given(weight, ...) makes weight's tangent present too
    companions = {i.name: (op.tangent_name(i.name),) for i in op.inputs if i.optional and i.differentiable}
    lets: list[tuple[str, str, str, tuple[str, ...]]] = []
    guards: dict[str, tuple[str, ...]] = {}
    for k, (names, f) in enumerate(op.jvp.lets):
        scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs, companions=companions, guards=guards)
        # (a multi-output let's TensorList is v_<k>j: no spec name starts with a digit)
        rows, kind = _lower_let(f"{k}j", names, f, scope, lang, guards)
        lets += rows
        for name in names:
            if kind.is_number:
                scalars[name] = (NUMBER, f"v_{name}")
            else:
                tensors[name] = f"v_{name}"
        used |= scope.used_ops
    index = {o.name: k for k, o in enumerate(op.outputs)}
    # the inputs whose tangents each name reads (a tangent its own; a let those of its formula)
    reads: dict[str, frozenset[int]] = {t: frozenset({k}) for k, t, _ in tangents}
    for names, f in op.jvp.lets:
        for name in names:
            reads[name] = frozenset().union(*(reads.get(n, frozenset()) for n in names_in(f.ast)))
    outputs, split = [], []
    for name, f in op.jvp.tangents:
        scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs, companions=companions, guards=guards)
        code, kind = lower_graph(f, scope, lang)
        if not kind.is_tensor:
            raise f.error(0, f"a tangent must be a tensor, got {kind}")
        used |= scope.used_ops
        outputs.append((index[name], code))
        terms = _additive_terms(f.ast, 1)
        needs = [frozenset().union(*(reads.get(n, frozenset()) for n in names_in(node))) for _, node in terms]
        if len(set(needs)) < 2 or not all(needs) or not {"add", "sub", "neg"} <= set(sigs):
            continue  # (one term, or every term reads the same tangents: nothing to leave out)
        lowered = []
        for (sign, node), need in zip(terms, needs):
            scope = GraphScope(dict(tensors), set(optional), dict(scalars), sigs, companions=companions,
                               guards=guards)
            term, term_kind = lower_graph(replace(f, ast=node), scope, lang)
            if not term_kind.is_tensor:
                break
            used |= scope.used_ops | {"add", "sub", "neg"}
            lowered.append((sign, term, tuple(sorted(need))))
        else:
            split.append((index[name], tuple(lowered)))
    return LoweredJvp(tuple(tangents), tuple(lets), tuple(outputs), tuple(split))


def _additive_terms(node: Any, sign: int) -> list[tuple[int, Any]]:
    """A formula as a sum of signed terms: its top-level ``+``, ``-`` (binary and unary) and
    ``add``/``sub`` calls taken apart."""
    if isinstance(node, Binary) and node.op in ("+", "-"):
        return _additive_terms(node.left, sign) + _additive_terms(node.right, sign if node.op == "+" else -sign)
    if isinstance(node, Call) and node.func in ("add", "sub") and len(node.args) == 2 and not node.kwargs:
        return (_additive_terms(node.args[0], sign)
                + _additive_terms(node.args[1], sign if node.func == "add" else -sign))
    if isinstance(node, Unary) and node.op == "-":
        return _additive_terms(node.operand, -sign)
    return [(sign, node)]


def dim_scope(op: OpSpec) -> dims.DimScope:
    """What op's shape expressions and checks may read (formula/dims.py)."""
    return dims.DimScope(op.name, [i.name for i in op.inputs], {i.name for i in op.inputs if i.optional},
                         {a.name: str(a.type) for a in op.attrs},
                         frozenset(a.name for a in op.attrs if a.optional_value))


def device_kernel_targets(op: OpSpec, build: Build) -> tuple[Backend, ...]:
    """The targets besides the host whose kernels ``build`` compiles for op: those of its rows
    (an expr op's kernel is generated from its expression, a cpp op's is its kernel file of the
    target table, e.g. ``src/kernels/cuda/<op>.cu``)."""
    if not build.device_kernels or not isinstance(op.impl, (ExprImpl, CppImpl)):
        return ()
    return tuple(t for t in build.targets if t != HOST and op.target(t) is not None)


def generated_device_targets(op: OpSpec, build: Build) -> tuple[Backend, ...]:
    """The device targets whose kernel of op codegen writes (``<op>.cu``): expr ops only."""
    return device_kernel_targets(op, build) if isinstance(op.impl, ExprImpl) else ()


def runnable_targets(op: OpSpec, build: Build) -> tuple[Backend, ...]:
    """The targets of op whose calls ``build`` can run: the host (its kernels are always compiled)
    and the device targets whose kernels ``build`` compiles; a composite op runs on any built target
    through the ops it calls, which check their own rows, and an aot op on any its rows name (its
    external kernel gets that device's pointers and stream)."""
    anywhere = isinstance(op.impl, (CompositeImpl, AotImpl))
    runs = set(build.targets) if anywhere else {HOST, *device_kernel_targets(op, build)}
    return tuple(t.name for t in op.targets if t.name in runs and t.name in build.targets)
