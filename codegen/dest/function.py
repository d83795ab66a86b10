"""The op's C++ Function class and API: its header (attrs struct, ``ops::<op>`` declaration,
kernel and infer declarations) and, in its TU, the expr functor, attr checks, Forward/Backward,
``ops::<op>`` and the meta rule."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .. import api, escape
from ..formula import dims
from ..formula.lang import CPP
from ..api import Lowered, LoweredBprop
from ..model import (AotImpl, Attr, AttrType, CompositeImpl, CppImpl, DType, ExprImpl, OpSpec, PyfuncImpl,
                     ShapeKind, ShapeRule)
from ..targets import HOST as HOST_TARGET
from ..targets import TARGETS, Backend, Build, TargetRow

_cpp_str = escape.cpp_str
# the target whose kernels every build compiles and whose kernel file holds infer() shape rules
HOST: TargetRow = TARGETS[HOST_TARGET]


# ---------------------------------------------------------------------------- pieces


def shape_expr(op: OpSpec, rule: ShapeRule, output: str) -> str:
    """C++ computing output ``output``'s shape from the inputs (``v_<name>``) and ``attrs``; an
    expression's or an infer() function's result is checked (runtime/functional.h's output_shape)."""
    a = rule.args
    if rule.kind == ShapeKind.SAME:
        return f"v_{a[0]}->shape()"
    if rule.kind == ShapeKind.BROADCAST:
        ptrs = ", ".join(f"v_{n}.get()" for n in a)
        names = ", ".join(_cpp_str(n) for n in a)
        return f"broadcast_shapes(kName, {{{ptrs}}}, {{{names}}})"
    if rule.kind == ShapeKind.REDUCE:
        axis = op.attr(a[1])
        if axis.type == AttrType.INT:
            axes = f"Axes(std::vector<int64_t>{{attrs.{axis.name}}})"
        else:
            axes = f"Axes(attrs.{axis.name})"
        keep = a[2] if a[2] in ("true", "false") else f"attrs.{a[2]}"
        return f"reduce_shape(kName, v_{a[0]}->shape(), {axes}, {keep})"
    if rule.kind == ShapeKind.MATMUL:
        return f"matmul_shape(kName, v_{a[0]}->shape(), v_{a[1]}->shape())"
    inputs = ", ".join(f"v_{i.name}" for i in op.inputs)
    if rule.kind == ShapeKind.EXPRESSION:
        assert rule.formula is not None
        code = dims.lower_dims(rule.formula, api.dim_scope(op), dims.DKind.DIMS, cpp=True)
    else:
        code = f"{a[0]}(TensorList{{{inputs}}}, attrs)"
    return f"output_shape(kName, {_cpp_str(output)}, {code})"


def dynamic_shape_expr(op: OpSpec, rule: ShapeRule, output: str) -> str:
    """C++ computing an output's shape from the inputs' dimensions, which may be unknown
    (``v_<name>`` a ``const DimsOf*``; runtime/functional.h): the rule without the op's checks."""
    assert rule.kind != ShapeKind.INFER, "infer() rules are code over tensors"
    if rule.kind == ShapeKind.BROADCAST:
        return f"broadcast_dims(kName, {{{', '.join(f'v_{n}->shape()' for n in rule.args)}}})"
    if rule.kind == ShapeKind.EXPRESSION:
        assert rule.formula is not None
        code = dims.lower_dims(rule.formula, api.dim_scope(op), dims.DKind.DIMS, cpp=True, dynamic=True)
        return f"output_dims(kName, {_cpp_str(output)}, {code})"
    return shape_expr(op, rule, output)  # same(), reduce() and matmul() read dimensions alone


def _check_lines(op: OpSpec) -> list[str]:
    """check_shapes' body: the axis attrs in range of the input they index (IndexError), then each
    of the spec's checks, a ValueError naming the op when false."""
    lines = []
    # (the kernels' own check, in the meta rule too: a call whose outputs are empty runs no kernel
    # in XLA, and fake tensors run none; first, so that the spec's checks may read dim(x, axis))
    optional = {i.name for i in op.inputs if i.optional}
    for a in op.attrs:
        if not a.axis_of:
            continue
        # (against every input named, but where a keepdims attr may take the axis out of the others,
        # take_along_axis's indices: there against the first, the input the axes are of;
        # check_axes: normalize_axes' checks without allocating, for an int, a list, or an absent one)
        keepdims = any(b.name == "keepdims" for b in op.attrs)
        for n in a.axis_of[:1] if keepdims else a.axis_of:
            check = f"check_axes(kName, attrs.{a.name}, int64_t(v_{n}->dim()));"
            lines.append(f"if (v_{n}) {check}" if n in optional else check)
    hoist: dict[str, str] = {}  # (broadcast(), reduce(), matmul() values: computed once per call)
    for c in op.checks:
        bindings: list[tuple[str, str]] = []
        test, pieces = dims.lower_check(c, api.dim_scope(op), cpp=True, hoist=hoist, bindings=bindings)
        lines += [f"const Shape {var} = {code};" for var, code in bindings]
        args = []
        for literal, code in pieces:
            if literal:
                args.append(escape.cpp_str(literal))
            if code:
                args.append(code)
        lines.append(f"if (!{test}) fail<ValueError>(kName, {', '.join(args)});")
    return lines


def dtype_expr(op: OpSpec, dtype: str) -> str:
    """C++ giving an output's dtype: its type variable's binding in this call, or a constant."""
    names = [v for v, _ in op.typevars]
    if dtype in names:
        return f"call.var({names.index(dtype)})"
    return api.dtype_enum(dtype)


def _storage(dtype: str, binding: Mapping[str, DType]) -> str:
    return api.DTYPE_STORAGE[binding[dtype] if dtype in binding else DType(dtype)]


def _bindings(op: OpSpec, target: Backend) -> list[dict[str, DType]]:
    """Distinct type-variable bindings of the target's rows, in row order (none without rows)."""
    out: list[dict[str, DType]] = []
    t = op.target(target)
    for binding, _ in t.rows() if t is not None else ():
        if binding not in out:
            out.append(binding)
    return out


def _condition(op: OpSpec, binding: Mapping[str, DType]) -> str:
    names = [v for v, _ in op.typevars]
    parts = [f"call.var({names.index(v)}) == {api.dtype_enum(d)}" for v, d in binding.items()]
    return " && ".join(parts) if parts else "true"


def _template_args(op: OpSpec, binding: Mapping[str, DType], qualified: bool = False) -> str:
    def name(d: DType) -> str:
        t = api.DTYPE_STORAGE[d]
        return f"opforge::{t}" if qualified and t in ("Half", "BFloat16") else t

    return ", ".join(name(binding[v]) for v, _ in op.typevars)


def _kernel_params(op: OpSpec, qualified: bool = False) -> str:
    p = "opforge::" if qualified else ""
    params = [f"const {p}TensorPtr& {i.name}" for i in op.inputs]
    params += [f"const {p}TensorPtr& {o.name}" for o in op.outputs]
    params.append(f"const {p}{op.class_name}Attrs& attrs")
    return ", ".join(params)


def _attr_check(a: Attr) -> list[str]:
    lines = []
    val = f"attrs.{a.name}"
    guard = ""
    if a.optional_value:
        guard = f"{val} && "
        val = f"(*attrs.{a.name})"
    if a.choices is not None:
        cond = " || ".join(f"{val} == {api.cpp_literal(a.type, c)}" for c in a.choices)
        shown = _cpp_str(f"attr '{a.name}' must be one of: " + ", ".join(str(c) for c in a.choices) + "; got ")
        lines.append(f"if ({guard}!({cond})) fail<ValueError>(kName, {shown}, {val});")
    # (negated, so that a NaN, which compares false with anything, is refused too)
    if a.min is not None:
        lines.append(f"if ({guard}!({val} >= {a.min!r})) fail<ValueError>(kName, \"attr '{a.name}' must be >= "
                     f"{a.min}, got \", {val});")
    if a.max is not None:
        lines.append(f"if ({guard}!({val} <= {a.max!r})) fail<ValueError>(kName, \"attr '{a.name}' must be <= "
                     f"{a.max}, got \", {val});")
    return lines


def _ret_type(op: OpSpec) -> str:
    return "TensorPtr" if len(op.outputs) == 1 else "TensorList"


def _params(op: OpSpec, with_defaults: bool) -> str:
    """The parameters of ``ops::<op>``: inputs, then attrs (with their C++ defaults)."""
    params = [f"const TensorPtr& v_{i.name}" for i in op.inputs]
    for a in op.attrs:
        d = api.attr_cpp_default(a) if with_defaults else None
        params.append(f"{api.attr_cpp_type(a)} v_{a.name}" + (f" = {d}" if d is not None else ""))
    return ", ".join(params)


# ---------------------------------------------------------------------------- Forward


def _kernel_branches(op: OpSpec, target: Backend = HOST_TARGET, loop_ns: str = "",
                     args: str = "expr_args(attrs)") -> list[tuple[str, str, str]]:
    """(if / else if, condition, call) per dtype binding of the target's rows: the kernel call of an
    expr op (the elementwise loop of namespace ``loop_ns`` with the functor made of ``args``) or
    of a cpp op (the target's hand-written kernel)."""
    tvars = [v for v, _ in op.typevars]
    inputs = op.inputs
    branches: list[tuple[str, str, str]] = []
    for b in _bindings(op, target):
        if isinstance(op.impl, ExprImpl):
            out = op.outputs[0]
            ctype = (f"compute_t<{_storage(inputs[[i.dtype for i in inputs].index(tvars[0])].dtype, b)}>"
                     if tvars and any(i.dtype == tvars[0] for i in inputs)
                     else f"compute_t<{_storage(out.dtype, b)}>")
            in_tys = [_storage(i.dtype, b) for i in inputs]
            ins = ", ".join(f"v_{i.name}.get()" for i in inputs)
            functor = f"{op.class_name}Expr<{ctype}>{{{args}}}"
            if len(op.outputs) == 1:
                tys = ", ".join([_storage(out.dtype, b)] + in_tys)
                body = f"{loop_ns}elementwise<{tys}>(*v_{out.name}, {functor}, {{{ins}}});"
            else:  # one pass writing every output
                outs = ", ".join(_storage(o.dtype, b) for o in op.outputs)
                tys = ", ".join([f"std::tuple<{outs}>"] + in_tys)
                ptrs = ", ".join(f"v_{o.name}.get()" for o in op.outputs)
                body = f"{loop_ns}elementwise_n<{tys}>({{{ptrs}}}, {functor}, {{{ins}}});"
        else:
            args = ", ".join([f"c_{i.name}" for i in inputs] + [f"v_{o.name}" for o in op.outputs] + ["attrs"])
            targs = f"<{_template_args(op, b)}>" if tvars else ""
            body = f"{TARGETS[target].namespace}::{op.name}{targs}({args});"
        branches.append(("if" if not branches else "else if", _condition(op, b), body))
    return branches


def _device_kernel_params(op: OpSpec) -> str:
    """The parameters of a generated device kernel of an expr op (``kernels::cuda::<op>``)."""
    tensors = [f"const TensorPtr& v_{o.name}" for o in op.outputs] + [f"const TensorPtr& v_{i.name}" for i in op.inputs]
    return ", ".join([f"const CallInfo& call", f"const {op.class_name}ExprArgs& a"] + tensors)


def _forward(op: OpSpec, lowered: Lowered, build: Build) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Forward's lines up to the kernel call, and the kernel call's branches: by the call's device
    for the device targets whose kernels ``build`` compiles, then by dtype on the host."""
    check_args = ", ".join(f"v_{i.name}.get()" for i in op.inputs)
    fwd = [f"const CallInfo call = check_call(kInfo, {{{check_args}}});"]
    if op.checks:
        fwd.append(f"check_shapes({', '.join([f'v_{i.name}' for i in op.inputs] + ['attrs'])});")
    impl = op.impl
    if isinstance(impl, (ExprImpl, CppImpl)):
        if isinstance(impl, CppImpl):
            for i in op.inputs:
                fwd.append(f"const TensorPtr c_{i.name} = v_{i.name} ? contiguous(v_{i.name}) : nullptr;")
        for o in op.outputs:
            fwd.append(f"TensorPtr v_{o.name} = empty({dtype_expr(op, o.dtype)}, "
                       f"{shape_expr(op, o.shape, o.name)}, call.format, call.device);")
        device: list[tuple[str, str, str]] = []
        for t in api.device_kernel_targets(op, build):
            row = TARGETS[t]
            if isinstance(impl, ExprImpl):  # the generated kernel dispatches on its dtype rows
                tensors = ", ".join([f"v_{o.name}" for o in op.outputs] + [f"v_{i.name}" for i in op.inputs])
                body = f"{row.namespace}::{op.name}(call, expr_args(attrs), {tensors});"
            else:  # the target's hand-written kernel, per dtype row of the target
                code = "\n".join(f"{kw} ({cond}) {{\n  {call}\n}}" for kw, cond, call in _kernel_branches(op, t))
                code += '\nelse {\n  fail<TypeError>(kName, "no kernel for this dtype on ", call.device.str());\n}'
                body = code.replace("\n", "\n      ")
            device.append(("if" if not device else "else if",
                           f"call.device.type == DeviceType::{row.macro_suffix}", body))
        host = _kernel_branches(op)
        if device and host:
            host = [("else if", cond, body) for _, cond, body in host]
        return fwd, device + host
    if isinstance(impl, PyfuncImpl):
        for o in op.outputs:
            fwd.append(f"TensorPtr v_{o.name} = empty({dtype_expr(op, o.dtype)}, "
                       f"{shape_expr(op, o.shape, o.name)}, call.format);")
        fwd.append("pyfunc::Kwargs kwargs;")
        fwd += [f"kwargs.add({_cpp_str(a.name)}, attrs.{a.name});" for a in op.attrs]
        ins = ", ".join(f"v_{i.name}" for i in op.inputs)
        names = ", ".join(_cpp_str(o.name) for o in op.outputs)
        outs = ", ".join(f"v_{o.name}" for o in op.outputs)
        fwd.append(f"pyfunc::call(kName, {_cpp_str(impl.function)}, {{{ins}}}, {{{names}}}, {{{outs}}}, kwargs);")
        return fwd, []
    if isinstance(impl, AotImpl):
        ins = ", ".join(f"v_{i.name}" for i in op.inputs)
        shapes = ", ".join(shape_expr(op, o.shape, o.name) for o in op.outputs)
        dtypes = ", ".join(dtype_expr(op, o.dtype) for o in op.outputs)
        extra = ""
        if op.attrs:  # the kernel reads them from its extra, as under MindSpore
            fwd.append("aot::ExtraAttrs extra;")
            fwd += [f"extra.add({_cpp_str(a.name)}, attrs.{a.name});" for a in op.attrs]
            extra = ", &extra"
        fwd.append(f"const TensorList r = aot::call_external(kName, {_cpp_str(impl.library)}, "
                   f"{_cpp_str(impl.symbol)}, {{{ins}}}, {{{shapes}}}, {{{dtypes}}}, call.device{extra});")
        for k, o in enumerate(op.outputs):
            fwd.append(f"TensorPtr v_{o.name} = r[{k}];")
        return fwd, []
    fwd.append(f"TensorPtr v_{op.outputs[0].name} = {lowered.composite};")
    fwd.append(composite_check(op))
    return fwd, []


def composite_check(op: OpSpec) -> str:
    """C++ checking a composite's result (v_<output>) against its dtype and shape rule."""
    o = op.outputs[0]
    return (f"check_composite_result(kName, {_cpp_str(o.name)}, v_{o.name}, {dtype_expr(op, o.dtype)}, "
            f"{shape_expr(op, o.shape, o.name)});")


def _saves(op: OpSpec, lb: LoweredBprop) -> list[str]:
    """Forward's tail: save what the bprop formulas read, only for inputs that need grad."""
    need = sorted({k for _, ks in lb.saved for k in ks} | {k for k, _, _ in lb.grads})
    saves = [f"const bool need_{k} = ctx->NeedGrad(v_{op.inputs[k].name});" for k in need]
    any_need = " || ".join(f"need_{k}" for k in need) or "false"
    entries = ", ".join(f"({' || '.join(f'need_{k}' for k in ks)}) ? v_{n} : nullptr" for n, ks in lb.saved)
    saves.append(f"if ({any_need}) {{")
    saves.append(f"  ctx->SaveForBackward({{{entries}}});")
    if lb.uses_attrs:
        saves.append("  ctx->SaveAttrs(attrs);")
    saves.append("}")
    return saves


def _backward(op: OpSpec, lb: LoweredBprop) -> list[str]:
    """Backward's body: the saved tensors, the lets and gradients each input's need guards."""
    # (padded with nullptr: a node is recorded for any input that requires grad, but Forward
    # saves only when an input whose formula reads them does, so the list may be empty)
    bw = ["TensorList saved = ctx->GetSavedTensors();", f"saved.resize({len(lb.saved)});"]
    for k, (n, _) in enumerate(lb.saved):
        bw.append(f"[[maybe_unused]] const TensorPtr& v_{n} = saved[{k}];")
    for k, o in enumerate(op.outputs):
        if o.differentiable:
            bw.append(f"[[maybe_unused]] const TensorPtr& v_{o.grad_name} = grad_outputs[{k}];")
    if lb.uses_attrs:
        bw.append(f"const {op.class_name}Attrs& attrs = ctx->GetAttrs<{op.class_name}Attrs>();")
    for k in sorted({k for k, _, _ in lb.grads}):
        bw.append(f"const bool need_{k} = ctx->NeedsInputGrad({k});")
    for n, code, ctype, when, given in lb.lets:
        bw.append(f"{ctype} v_{n}{{}};")
        bw.append(f"if ({CPP.let_condition(when, given)}) v_{n} = {code};")
    bw.append(f"TensorList grads({len(op.inputs)});")
    for k, n, code in lb.grads:
        bw.append(f"if (need_{k}) grads[{k}] = ctx->ReduceGrad({k}, {code});")
    bw.append("return grads;")
    return bw


def _jvp(op: OpSpec, lj: api.LoweredJvp) -> list[str]:
    """Jvp's body: the outputs, each input's tangent (zeros where the caller gave none), lets, and
    one tangent per differentiable output (nullptr for the others)."""
    lines = [f"[[maybe_unused]] const TensorPtr& v_{o.name} = outputs[{k}];" for k, o in enumerate(op.outputs)]
    for k, t, name in lj.tangents:
        value = f"tangents[{k}] ? tangents[{k}] : zeros_like(v_{name})"
        if op.inputs[k].optional:
            value = f"v_{name} ? ({value}) : nullptr"
        lines.append(f"[[maybe_unused]] const TensorPtr v_{t} = {value};")
    for n, code, ctype, given in lj.lets:
        if given:  # bound only when the optional inputs it needs are given
            code = f"({' && '.join(given)}) ? {code} : {ctype}{{}}"
        lines.append(f"[[maybe_unused]] const {ctype} v_{n} = {code};")
    lines.append(f"TensorList out({len(op.outputs)});")
    split = dict(lj.terms)
    for k, code in lj.outputs:
        if k not in split:
            lines.append(f"out[{k}] = {code};")
            continue
        # (a sum of terms reading different tangents: those whose tangents were all not given left
        # out, not multiplied by zeros; then broadcast to the output's shape, as the sum was)
        out = f"v_{op.outputs[k].name}"
        lines.append("{")
        lines.append("  TensorPtr acc;")
        for sign, term, needs in split[k]:
            test = " || ".join(f"tangents[{j}]" for j in needs)
            first = "term" if sign > 0 else "ops::neg(term)"
            lines.append(f"  if ({test}) {{")
            lines.append(f"    TensorPtr term = {term};")
            lines.append(f"    acc = acc ? ops::{'add' if sign > 0 else 'sub'}(acc, term) : {first};")
            lines.append("  }")
        lines.append(f"  out[{k}] = !acc ? zeros_like({out}) : acc->shape() == {out}->shape() ? acc "
                     f": ops::add(acc, zeros_like({out}));")
        lines.append("}")
    lines.append("return out;")
    return lines


_SCALAR_ATTRS = (AttrType.BOOL, AttrType.INT, AttrType.FLOAT)


def _expr_functor(op: OpSpec) -> Optional[dict[str, Any]]:
    """The expression functor (one for the host and CUDA devices, in the op's header) and the plain
    struct of attr values it reads (``<Cls>ExprArgs``: scalar attrs, optional ones as
    ``DeviceOptional``, and the str attr tests computed once per call), copied to the device."""
    lowered = api.lowered_expr(op)
    if lowered is None:
        return None
    tparams = ", ".join(f"typename P{k}" for k in range(len(op.inputs)))
    fparams = ", ".join(f"P{k} v_{i.name}" for k, i in enumerate(op.inputs))
    fields, init = [], []
    for a in op.attrs:
        if a.type in _SCALAR_ATTRS:
            t = api.ATTR_CPP[a.type]
            fields.append(f"DeviceOptional<{t}> {a.name};" if a.optional_value else f"{t} {a.name};")
            init.append(f"e.{a.name} = a.{a.name};")
    for m, code in lowered.flags:
        fields.append(f"bool {m};")
        init.append(f"e.{m} = {code};")
    return {"tparams": tparams, "params": fparams, "expr": lowered.code, "fields": fields, "init": init,
            "flags": [f"[[maybe_unused]] const bool {m} = a.{m};" for m, _ in lowered.flags]}


# ---------------------------------------------------------------------------- contexts


def header_context(op: OpSpec, build: Build) -> dict[str, Any]:
    """What templates/op.h.j2 places: the kernel declarations of the targets ``build`` compiles."""
    tvars = [v for v, _ in op.typevars]
    kernels = []
    compiled = [t for t in build.targets if t == HOST_TARGET or build.device_kernels]
    for row in (TARGETS[t] for t in compiled if isinstance(op.impl, CppImpl) and op.target(t) is not None):
        tparams = ", ".join(f"typename {v}" for v in tvars)
        inst = [f"template void opforge::{row.namespace}::{op.name}<{_template_args(op, b, True)}>"
                f"({_kernel_params(op, qualified=True)});" for b in (_bindings(op, row.name) if tvars else [])]
        kernels.append({"namespace": row.namespace, "path": row.kernel_path(op.name),
                        "template": f"template <{tparams}>\n" if tvars else "",
                        "params": _kernel_params(op), "instantiations": inst or ["/* not a template */"],
                        "macro": f"OPFORGE_INSTANTIATE_{op.name.upper()}_{row.macro_suffix}"})
    attr_fields = []
    for a in op.attrs:
        d = api.attr_cpp_default(a)
        attr_fields.append(f"{api.attr_cpp_type(a)} {a.name}" + (f" = {d}" if d is not None else "{}") + ";")
    return {
        "name": op.name, "cls": op.class_name,
        "doc_first": escape.cpp_comment(op.doc.splitlines()[0] if op.doc else op.name),
        "attr_fields": attr_fields, "ret_type": _ret_type(op), "params_decl": _params(op, with_defaults=True),
        "infer_fns": sorted({o.shape.args[0] for o in op.outputs if o.shape.kind == ShapeKind.INFER}),
        "kernels": kernels, "infer_path": HOST.kernel_path(op.name),
        "expr": _expr_functor(op),
        "device_kernels": [{"namespace": TARGETS[t].namespace, "params": _device_kernel_params(op),
                            "file": f"{op.name}{TARGETS[t].kernel_suffix}"}
                           for t in api.generated_device_targets(op, build)],
    }


def device_kernel_context(op: OpSpec, target: Backend) -> dict[str, Any]:
    """What templates/op_device.cu.j2 places: the generated kernel of an expr op on a device
    target (the target table's namespace; the elementwise loop of runtime/cuda/elementwise.cuh)."""
    return {"name": op.name, "namespace": TARGETS[target].namespace, "params": _device_kernel_params(op),
            "branches": _kernel_branches(op, target, "::opforge::cuda::", "a")}


def context(op: OpSpec, lowered: Lowered, build: Build) -> dict[str, Any]:
    """What templates/function.cpp.j2 places (and op.cpp.j2's includes of the ops formulas call)."""
    cls = op.class_name
    inputs = op.inputs
    forward, branches = _forward(op, lowered, build)
    lb = lowered.bprop
    return {
        "name": op.name, "cls": cls,
        "includes": sorted(f"{o}.h" for o in lowered.used_ops if o != op.name),
        "pyfunc": isinstance(op.impl, PyfuncImpl),  # (its kernel is python/pyfunc.h's call)
        "expr": _expr_functor(op),
        "attr_params": ", ".join(f"{api.attr_cpp_type(a)} v_{a.name}" for a in op.attrs),
        "attr_assign": [f"attrs.{a.name} = v_{a.name};" for a in op.attrs],
        "attr_checks": [line for a in op.attrs for line in _attr_check(a)],
        "has_function": op.has_autograd_function,
        "ret_type": _ret_type(op),
        "forward_params": ", ".join([f"const TensorPtr& v_{i.name}" for i in inputs] + [f"const {cls}Attrs& attrs"]),
        "forward": forward, "branches": branches,
        "non_diff": ", ".join(f"v_{o.name}" for o in op.outputs if not o.differentiable),
        "saves": _saves(op, lb) if lb is not None else [],
        "backward": {"lines": _backward(op, lb)} if lb is not None else {},
        "jvp": _jvp(op, lowered.jvp) if lowered.jvp is not None else [],
        "checks": _check_lines(op),
        "check_shape_args": ", ".join([f"v_{i.name}" for i in op.inputs] + ["attrs"]),
        "outputs_ret": (f"v_{op.outputs[0].name}" if len(op.outputs) == 1
                        else "TensorList{" + ", ".join(f"v_{o.name}" for o in op.outputs) + "}"),
        "params": _params(op, with_defaults=False),
        "attr_args": ", ".join(f"v_{a.name}" for a in op.attrs),
        "apply_args": ", ".join([f"v_{i.name}" for i in inputs] + ["attrs"]),
        "check_args": ", ".join(f"v_{i.name}.get()" for i in inputs),
        "composite_code": lowered.composite,
        "composite_check": composite_check(op) if isinstance(op.impl, CompositeImpl) else "",
        "composite_output": op.outputs[0].name,
        # the rules over dimensions that may be unknown (the AOT InferShape entry points, aot.cpp.j2)
        "dynamic_shape_rows": ([dynamic_shape_expr(op, o.shape, o.name) for o in op.outputs]
                               if all(o.shape.kind != ShapeKind.INFER for o in op.outputs) else []),
        "meta_rows": [f"TensorMeta{{{shape_expr(op, o.shape, o.name)}, {dtype_expr(op, o.dtype)}, call.device}}" for o in op.outputs],
    }
