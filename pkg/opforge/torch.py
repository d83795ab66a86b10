"""opforge ops as PyTorch operators: ``torch.ops.opforge.<name>``, generated from the op table.

    import torch, opforge.torch
    x = torch.randn(4, requires_grad=True)
    y = opforge.torch.ops.leaky_relu(x, alpha=0.2)   # == torch.ops.opforge.leaky_relu
    y.sum().backward()

Importing this module registers every op of the package through ``torch.library``, with no
per-op code: each op's schema comes from its spec (inputs as ``Tensor``/``Tensor?``, then its
attrs with their defaults), and three kernels come from the generated op table
(``opforge._formulas``) and the runtime. The CPU, CUDA and Autograd kernels are C++ when opforge's
native kernels build against the installed torch (``opforge/_torch_native.py``: compiled on first
use, cached; ``OPFORGE_TORCH_NATIVE=0`` or a failed build: the Python kernels below, after one
warning), with the same behaviour as the Python ones described here:

- **CPU**: exchanges memory with the opforge runtime through DLPack (no copies) and runs the op's
  opforge kernel; a call the registration table does not allow raises the runtime's exception,
  which names the op and what it supports.
- **CUDA** (the cu130 wheel, ops with cuda rows): the same exchange with torch.cuda tensors
  (zero copy), the op running on torch's current stream of the inputs' device. An op without a
  cuda kernel has no CUDA registration: torch says so (``NotImplementedError``: could not run
  ``opforge::<op>`` with arguments from the 'CUDA' backend).
- **Fake/Meta**: output shapes and dtypes from the spec's rules, checked by the same C++ code as a
  real call (``opforge._C._meta``), so ``torch.compile`` and ``FakeTensor`` tracing see the same
  errors as eager calls. Rules ``same``, ``broadcast``, ``reduce``, ``matmul`` and shape
  expressions (with the spec's ``checks``, from the op table's ``shapes``) are computed on the
  symbolic sizes, so dynamic dims stay dynamic; ``infer(fn)`` rules are C++ functions and
  specialize dynamic dims to their values.
- **Autograd**: a ``torch.autograd.Function`` whose backward is the spec's bprop formula evaluated
  with these same torch ops, so gradients of gradients work; outputs the spec marks not
  differentiable (indices) are marked so, non-differentiable inputs (labels) get no gradient.

Inputs that share a type variable with another input may be Python numbers, as in opforge's own
API: each such input has an overload ``<op>.scalar_<input>`` taking it as a ``Scalar``, converted
to the other input's dtype (``ops.add(t, 1.0)``, ``ops.where(c, t, 0.0)``, ``ops.pow(2.0, t)``),
which torch's overload resolution picks for a number. One number per call; the result has the
tensor's dtype (no type promotion).

Composite ops (an ``impl.composite`` formula and no bprop) register the formula itself as their
``CompositeImplicitAutograd`` kernel. Torch tensors carry no layout format: they reach the runtime
as ``DefaultFormat``. Elementwise (``expr``) ops keep ``channels_last``, as torch's pointwise ops
do: when the first 4-d input is channels_last, the inputs reach the kernel as NHWC views (no
copies) and the results come back as channels_last tensors. An op with a layout attr (``format``:
NCHW or NHWC, as ``bias_add``'s) called with NCHW and channels_last 4-d inputs runs as NHWC on their
NHWC views, and its outputs of their shape come back channels_last.
"""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError("opforge.torch needs PyTorch, which is not installed; install it with "
                      "`pip install torch==2.13.0` (the version opforge is tested with)") from exc

import torch.autograd.forward_ad as _fwad
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true, sym_and, sym_or
from torch._C import _from_dlpack, _to_dlpack

import opforge._C as _C
import opforge._formulas as _formulas
from opforge import _torch_native
from opforge._opdef import OpDef, ShapeHelpers, check_number, kind_shape
from opforge._opdef import axes as _axes

__all__ = ["ops", "NAMESPACE", "schema", "scalar_slots", "register_ops", "register_module", "TORCH_DTYPES"]

NAMESPACE = "opforge"

_SCHEMA_TYPES = {"bool": "bool", "int": "int", "float": "float", "str": "str",
                 "list[int]": "int[]", "list[float]": "float[]"}

#: torch dtype -> opforge dtype name, for the dtypes both have
TORCH_DTYPES = {
    torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float32: "float32", torch.float64: "float64",
}
_FROM_NAME = {v: k for k, v in TORCH_DTYPES.items()}


# ---------------------------------------------------------------------------- schema


# torch's schema lexer reads C escapes: these, and other control characters as octal (\015);
# a "\n" default written as it is broke the whole module's registration
_SCHEMA_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def _schema_default(atype: str, value: Any) -> str:
    if atype == "bool":
        return "True" if value else "False"
    if atype == "str":
        return '"' + "".join(_SCHEMA_ESCAPES.get(c) or (f"\\{ord(c):03o}" if ord(c) < 32 or ord(c) == 127 else c)
                           for c in value) + '"'
    if atype in ("list[int]", "list[float]"):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    return repr(value)


def schema(op: OpDef, scalar: Optional[int] = None) -> str:
    """The op's torch schema: ``name(Tensor x, Tensor? w=None, int[]? axis=None, ...) -> Tensor``;
    with ``scalar`` = k, its overload ``name.scalar_<input k>`` taking input k as a ``Scalar``."""
    args = [f"Tensor? {i.name}=None" if i.optional else f"{'Scalar' if k == scalar else 'Tensor'} {i.name}"
            for k, i in enumerate(op.inputs)]
    for a in op.attrs:
        t = _SCHEMA_TYPES[a.type]
        if a.required:
            args.append(f"{t} {a.name}")
        elif a.default is None:
            args.append(f"{t}? {a.name}=None")
        else:
            args.append(f"{t} {a.name}={_schema_default(a.type, a.default)}")
    returns = "Tensor" if len(op.outputs) == 1 else "(" + ", ".join("Tensor" for _ in op.outputs) + ")"
    name = op.name if scalar is None else f"{op.name}.scalar_{op.inputs[scalar].name}"
    return f"{name}({', '.join(args)}) -> {returns}"


def scalar_slots(op: OpDef) -> list[tuple[int, int]]:
    """(k, j): input k may be a Python number, as in opforge's own API, which takes the dtype of
    input j (the first other required input of the same type variable), as torch's ``Scalar``
    overloads do (``add(t, 1.0)``)."""
    slots = []
    for k, i in enumerate(op.inputs):
        if i.optional or i.dtype not in op.typevars:
            continue
        j = next((j for j, o in enumerate(op.inputs) if j != k and not o.optional and o.dtype == i.dtype), None)
        if j is not None:
            slots.append((k, j))
    return slots


def _scalar_kernel(op: OpDef, k: int, j: int, default: Any) -> Callable[..., Any]:
    """The ``scalar_<input>`` overload: the number as a 0-d tensor of input j's dtype and device,
    then the op (CompositeImplicitAutograd: autograd, fake tensors and torch.compile see the op)."""
    def kernel(*args: Any) -> Any:
        full = list(_full_args(op, args))
        value, like = full[k], full[j]
        if isinstance(value, complex):
            raise TypeError(f"[{op.name}] input '{op.inputs[k].name}': complex numbers are not supported "
                            "(opforge has no complex dtypes)")
        full[k] = _scalar(op, k, j, value, like)
        return default(*full)

    return kernel


def _scalar(op: OpDef, k: int, j: int, value: Any, like: Any) -> Any:
    """Input k's number as a 0-d tensor of input j's dtype and device, checked as opforge's own API
    checks a number: a float for an integer or bool input is a TypeError, an int out of the dtype's
    range a ValueError (both naming the op); a float beyond a floating dtype's range is inf, as
    NumPy converts it. (Symbolic numbers, under torch.compile, are converted as they are.)"""
    dtype = like.dtype
    kind = "f" if dtype.is_floating_point else "b" if dtype == torch.bool else "i"
    if isinstance(value, (int, float)):  # (not a SymInt/SymFloat: those are converted as they are)
        check_number(op, op.inputs[k].name, value, TORCH_DTYPES.get(dtype, str(dtype)), kind,
                     (torch.iinfo(dtype).min, torch.iinfo(dtype).max) if kind == "i" else (0, 1),
                     f" (bound by input '{op.inputs[j].name}')", "a tensor")
    if isinstance(value, (int, float)) and kind == "f":
        value = float(value)
        if dtype != torch.float64 and math.isfinite(value) and abs(value) > torch.finfo(dtype).max:
            # (rounded as NumPy converts it, to inf past the dtype's range; torch's conversion raises)
            return torch.scalar_tensor(value, dtype=torch.float64, device=like.device).to(dtype)
    return torch.scalar_tensor(value, dtype=dtype, device=like.device)


def _full_args(op: OpDef, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Every parameter (inputs, then attrs): the dispatcher may drop trailing defaults."""
    n = len(op.inputs) + len(op.attrs)
    if len(args) == n:
        return args
    tail = [None] * (len(op.inputs) - len(args)) if len(args) < len(op.inputs) else []
    given = len(args) + len(tail) - len(op.inputs)
    return (*args, *tail, *(a.default for a in op.attrs[given:]))


# ---------------------------------------------------------------------------- the CPU kernel


def _to_runtime(t: Any) -> Any:
    return None if t is None else _to_dlpack(t)


# ---- memory formats: an elementwise (expr) op keeps channels_last, as torch's pointwise ops do

def _channels_last(tensors: Sequence[Any]) -> bool:
    """Whether an elementwise op's result is channels_last: its inputs have at most 4 dims and the
    first 4-d one is channels_last (and not also contiguous, as when C or H*W is 1)."""
    first = None
    for t in tensors:
        if t is None:
            continue
        if t.dim() > 4:
            return False
        if first is None and t.dim() == 4:
            first = t
    return (first is not None and not first.is_contiguous()
            and first.is_contiguous(memory_format=torch.channels_last))


def _nhwc(t: Any) -> Any:
    """t (broadcast to 4 dims, NCHW) as an NHWC view: a channels_last tensor's is contiguous."""
    if t is None:
        return None
    if t.dim() < 4:
        t = t[(None,) * (4 - t.dim())]
    return t.permute(0, 2, 3, 1)


def _nchw(t: Any) -> Any:
    """An NHWC result as the NCHW tensor torch sees, in channels_last memory (a view)."""
    return t.permute(0, 3, 1, 2)


def _format_attr(op: OpDef) -> Optional[int]:
    """The index of an op's layout attr: ``format``, choosing NCHW or NHWC (bias_add's)."""
    for k, a in enumerate(op.attrs):
        if a.name == "format" and a.type == "str" and set(a.choices or ()) == {"NCHW", "NHWC"}:
            return k
    return None


def _nhwc_call(op: OpDef, fmt: Optional[int], args: tuple[Any, ...]) -> Optional[tuple[list[Any], list[Any], list[bool]]]:
    """How a call runs in NHWC order, if it does (inputs, attrs, which outputs to view back as
    channels_last NCHW), else None: an elementwise op whose first 4-d input is channels_last, on
    NHWC views of every input; an op with a layout attr given NCHW and channels_last 4-d inputs,
    on NHWC views of those with the attr NHWC (the outputs of their shape come back)."""
    n_in = len(op.inputs)
    tensors, attrs = list(args[:n_in]), list(args[n_in:])
    if op.impl == "expr":
        if not _channels_last(tensors):
            return None
        return [_nhwc(t) for t in tensors], attrs, [True] * len(op.outputs)
    if fmt is None or attrs[fmt] != "NCHW":
        return None
    four = [t for t in tensors if t is not None and t.dim() == 4]
    if not four or not all(not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
                           for t in four):
        return None
    attrs[fmt] = "NHWC"
    names = {i.name for i, t in zip(op.inputs, tensors) if t is not None and t.dim() == 4}
    back = [o.shape == "same" and o.shape_args[0] in names for o in op.outputs]
    return [_nhwc(t) if t is not None and t.dim() == 4 else t for t in tensors], attrs, back


def _out_of_memory_as_torch(run: Callable[..., Any]) -> Callable[..., Any]:
    """run, its MemoryError raised as torch.OutOfMemoryError (what torch's allocators raise, and the
    native kernels: the op's message kept)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except MemoryError as e:
            raise torch.OutOfMemoryError(str(e)) from None

    return call


def _cpu_kernel(op: OpDef, run: Callable[..., Any]) -> Callable[..., Any]:
    run = _out_of_memory_as_torch(run)
    n_in = len(op.inputs)
    single = len(op.outputs) == 1
    elementwise = op.impl == "expr"
    fmt = _format_attr(op)

    def kernel(*args: Any) -> Any:
        args = _full_args(op, args)
        tensors = args[:n_in]
        nhwc = _nhwc_call(op, fmt, args) if elementwise or fmt is not None else None
        if nhwc is not None:  # computed in NHWC order, no copies
            ins, attrs, back = nhwc
            out = run(*[_to_runtime(t) for t in ins], *attrs)
            outs = [out] if single else list(out)
            res = [_nchw(_from_dlpack(o.__dlpack__())) if b else _from_dlpack(o.__dlpack__())
                   for o, b in zip(outs, back)]
            return res[0] if single else tuple(res)
        out = run(*[_to_runtime(t) for t in tensors], *args[n_in:])
        if single:
            return _from_dlpack(out.__dlpack__())
        return tuple(_from_dlpack(o.__dlpack__()) for o in out)

    if n_in == 1 and single:
        def kernel1(x: Any, *attrs: Any) -> Any:
            if len(attrs) != len(op.attrs) or ((elementwise or fmt is not None) and x.dim() == 4):
                return kernel(x, *attrs)
            return _from_dlpack(run(_to_dlpack(x), *attrs).__dlpack__())
        return kernel1
    if n_in == 2 and single and not any(i.optional for i in op.inputs):
        def kernel2(x: Any, y: Any, *attrs: Any) -> Any:
            if len(attrs) != len(op.attrs) or ((elementwise or fmt is not None) and (x.dim() == 4 or y.dim() == 4)):
                return kernel(x, y, *attrs)
            return _from_dlpack(run(_to_dlpack(x), _to_dlpack(y), *attrs).__dlpack__())
        return kernel2
    return kernel


# ---------------------------------------------------------------------------- device kernels


def _device_kernel(op: OpDef, run: Callable[..., Any], meta: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    """The kernel for torch tensors on a device (cuda): the inputs reach the op through DLPack
    (zero copy), and its results are torch tensors allocated here (shapes and dtypes from the op's
    meta rule) that the op writes through ``out=``: memory of torch's caching allocator, so inside
    ``torch.cuda.graph`` capture the results live in the graph's pool. The op runs on torch's
    current stream of the inputs' device, which is opforge's current stream during the call, so
    torch's work before and after is ordered with opforge's without synchronizing (the op's own
    temporaries come from opforge's stream-ordered allocator on that stream: captured, they are
    allocation and free nodes of the graph)."""
    run = _out_of_memory_as_torch(run)
    n_in = len(op.inputs)
    single = len(op.outputs) == 1
    streams = torch.get_device_module(device_type)

    fmt = _format_attr(op)

    def kernel(*args: Any) -> Any:
        args = _full_args(op, args)
        like = next(t for t in args[:n_in] if t is not None)
        nhwc = _nhwc_call(op, fmt, args)
        tensors, attrs, back = nhwc if nhwc is not None else (args[:n_in], args[n_in:], [False] * len(op.outputs))
        metas = meta(*_stand_ins(op, tensors, int), *attrs)  # raises what the call would
        outs = [torch.empty(shape, dtype=_FROM_NAME[dtype], device=like.device) for shape, dtype in metas]
        index = like.device.index if like.device.index is not None else streams.current_device()
        name = f"{device_type}:{index}"
        stream = streams.current_stream(index).cuda_stream
        previous = _C._current_stream(name)[1]
        _C._set_current_stream(name, stream, op.name)  # (RuntimeError inside an opforge.cuda.graph capture)
        try:
            given = [_C.from_dlpack(_to_dlpack(o)) for o in outs]
            run(*[_to_runtime(t) for t in tensors], *attrs, out=given[0] if single else tuple(given))
        finally:
            _C._set_current_stream(name, previous)
        res = [_nchw(r) if b else r for r, b in zip(outs, back)]
        return res[0] if single else tuple(res)

    return kernel


# ---------------------------------------------------------------------------- the fake kernel


def _is_symbolic(shape: Sequence[Any]) -> bool:
    return any(isinstance(s, torch.SymInt) for s in shape)


def _hint(s: Any) -> int:
    """A size's value without adding a guard (validation and dtypes only: the shapes come from the
    spec's rules on the symbolic sizes). A data-dependent size (an unbacked SymInt, as of
    ``x[x > 0]``) has no value: a stand-in, large and distinct per symbol, within its range, as
    torch reasons about such sizes (not 0 or 1, equal to no constant); a call valid only for some
    values of it (broadcast against a fixed size) is refused, as torch's own ops refuse it."""
    if not isinstance(s, torch.SymInt):
        return int(s)
    hint = s.node.hint
    if hint is not None:
        return int(hint)
    env, expr = s.node.shape_env, s.node.expr
    backed = getattr(env, "backed_var_to_val", None)
    backed = env.var_to_val if backed is None else backed
    values = {}
    for sym in expr.free_symbols:
        known = backed.get(sym)
        if known is None:
            digits = "".join(c for c in str(sym) if c.isdigit())
            known = 1009 + 4 * int(digits or 0)
            bounds = env.var_to_range.get(sym)
            if bounds is not None:
                low, high = bounds.lower, bounds.upper
                known = max(int(low), known) if low.is_finite else known
                known = min(int(high), known) if high.is_finite else known
        values[sym] = known
    return int(expr.xreplace(values))


def _stand_ins(op: OpDef, tensors: Sequence[Any], size: Callable[[Any], int]) -> list[Any]:
    """opforge meta tensors of torch tensors' shapes (each size through ``size``) and dtypes, for the
    op's meta rule; TypeError naming the op for a dtype opforge does not have."""
    stand_ins: list[Any] = []
    for inp, t in zip(op.inputs, tensors):
        if t is None:
            stand_ins.append(None)
        elif t.dtype not in TORCH_DTYPES:
            raise TypeError(f"[{op.name}] input '{inp.name}' has dtype {t.dtype}, which opforge does not "
                            f"have; supported dtypes: {', '.join(TORCH_DTYPES.values())}")
        else:
            stand_ins.append(_C._meta_tensor([size(s) for s in t.shape], TORCH_DTYPES[t.dtype]))
    return stand_ins


def _fake_kernel(op: OpDef, meta: Callable[..., Any]) -> Callable[..., Any]:
    n_in = len(op.inputs)
    names = [i.name for i in op.inputs]
    fmt_attr = _format_attr(op)

    def fake(*args: Any) -> Any:
        args = _full_args(op, args)
        tensors = args[:n_in]
        attrs = dict(zip((a.name for a in op.attrs), args[n_in:]))
        present = [t for t in tensors if t is not None]
        like = present[0]
        # (this is the Meta kernel too: a cpu tensor beside a meta one must not get an uninitialized
        # cpu result; the real kernels refuse inputs on different devices alike)
        for t in present[1:]:
            if t.device != like.device:
                first = names[next(k for k, x in enumerate(tensors) if x is like)]
                other = names[next(k for k, x in enumerate(tensors) if x is t)]
                raise RuntimeError(f"[{op.name}] inputs are on different devices: '{first}' on {like.device}, "
                                   f"'{other}' on {t.device}")
        symbolic = any(_is_symbolic(t.shape) for t in present)
        infer = any(o.shape == "infer" for o in op.outputs)
        # infer() rules are C++: their inputs' sizes are specialized (guarded) to their values
        size = int if (symbolic and infer) else _hint
        if size is int and any(s.node.hint is None for t in present for s in t.shape if isinstance(s, torch.SymInt)):
            raise NotImplementedError(f"[{op.name}] has a shape rule of C++ only (infer()), which cannot take "
                                      "data-dependent sizes (as of x[x > 0]) under torch.compile; call it outside "
                                      "the compiled region or give its spec a shape expression")
        metas = meta(*_stand_ins(op, tensors, size), *args[n_in:])  # raises what a real call would
        # the spec's checks and shape expressions on the symbolic sizes: constraints, not guards
        # on their values (so dynamic dims stay dynamic)
        exprs = (op.shapes(H, *(None if t is None else tuple(t.shape) for t in tensors), *args[n_in:])
                 if symbolic and op.shapes is not None else None)
        nhwc = _nhwc_call(op, fmt_attr, args)
        results = []
        for k, (out, (shape, dtype)) in enumerate(zip(op.outputs, metas)):
            if symbolic and out.shape == "expression" and exprs is not None:
                shape = exprs[k]
            elif symbolic and out.shape == "matmul":
                # (with the inner dims' check: a constraint relating them, as torch.matmul's)
                ins = dict(zip(names, tensors))
                shape = H.matmul(op.name, ins[out.shape_args[0]].shape, ins[out.shape_args[1]].shape)
            elif symbolic and out.shape != "infer":
                # (infer(): the C++ rule only, None)
                shape = kind_shape(out, {n: t.shape for n, t in zip(names, tensors) if t is not None}, attrs,
                                   torch.broadcast_shapes)
            empty = like.new_empty(shape, dtype=_FROM_NAME[dtype])
            results.append(empty.contiguous(memory_format=torch.channels_last) if nhwc and nhwc[2][k] else empty)
        return results[0] if len(results) == 1 else tuple(results)

    return fake


# ---------------------------------------------------------------------------- autograd


class _Helpers(ShapeHelpers):
    """The tensor helpers generated formulas call (see opforge/_opdef.py), in torch."""

    @staticmethod
    def scalar_like(value: Any, like: torch.Tensor) -> torch.Tensor:
        if isinstance(value, torch.Tensor):  # (a number computed from symbolic numel()s)
            return value.to(dtype=like.dtype, device=like.device)
        return torch.full((), value, dtype=like.dtype, device=like.device)

    @staticmethod
    def with_number(t: torch.Tensor, value: Any, fn: Callable[..., torch.Tensor], F: Any) -> torch.Tensor:  # noqa: N803
        if t.dtype == torch.float16 or t.dtype == torch.bfloat16:
            wide = t.to(torch.float32)
            return fn(F, wide, _Helpers.scalar_like(value, wide)).to(t.dtype)
        return fn(F, t, _Helpers.scalar_like(value, t))

    zeros_like = staticmethod(torch.zeros_like)
    ones_like = staticmethod(torch.ones_like)

    @staticmethod
    def cast_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return t.to(like.dtype)

    @staticmethod
    def numel_ratio(a: torch.Tensor, b: torch.Tensor) -> Any:
        na: Any = a.numel()  # (an int, or a SymInt under torch.compile)
        nb: Any = b.numel()
        if isinstance(na, int) and isinstance(nb, int):
            return 0.0 if nb == 0 else na / nb
        # (symbolic sizes: 0-d float64 tensors, as numel's, with no question asked of the sizes)
        ta = torch.scalar_tensor(na, dtype=torch.float64, device=b.device)
        tb = torch.scalar_tensor(nb, dtype=torch.float64, device=b.device)
        return ta / tb.clamp_min(1) * tb.clamp_max(1)  # (counts: 0 when nb is 0)

    @staticmethod
    def numel(t: torch.Tensor) -> Any:
        # (an empty tensor's 0 as NaN: a user's formula may divide by it, and Python's division by
        # 0 raises where C++'s gives inf; opforge's own ratios are numel_ratio's)
        n: Any = t.numel()  # (an int, or a SymInt under torch.compile)
        if isinstance(n, int):
            return math.nan if n == 0 else n
        # (a symbolic size, under torch.compile: a 0-d float64 tensor, whose division by 0 is NaN
        # or inf where Python's raised ZeroDivisionError, and which asks nothing of the size)
        return torch.scalar_tensor(n, dtype=torch.float64, device=t.device)

    @staticmethod
    def expand_reduced(g: torch.Tensor, like: torch.Tensor, axes: Any, keepdims: bool) -> torch.Tensor:
        if not keepdims:
            for a in _axes(axes, like.dim()):
                g = g.unsqueeze(a)
        return g.expand(like.shape)

    @staticmethod
    def check(op: str, test: Any, message: Callable[[], str]) -> None:
        # (a SymBool becomes a constraint on the symbolic sizes, not a guard on their values)
        torch._check_value(test, lambda: f"[{op}] {message()}")  # type: ignore[no-untyped-call]

    # (checks on data-dependent sizes, x[x > 0]'s: a size is taken as 1 only where that is decided,
    # as torch.broadcast_shapes takes it, and tests stay SymBools, constraints checked at run time)
    @staticmethod
    def _known_one(n: Any) -> bool:
        return bool(guard_or_false(n == 1))

    @staticmethod
    def _either(a: Any, b: Any) -> Any:
        return sym_or(a, b)

    @staticmethod
    def _all(tests: Sequence[Any]) -> Any:
        return sym_and(True, *tests)

    @staticmethod
    def _not(test: Any) -> Any:
        return torch.sym_not(test)  # type: ignore[no-untyped-call]

    @staticmethod
    def reduce_grad(g: torch.Tensor, meta: tuple[torch.Size, torch.dtype]) -> torch.Tensor:
        shape, dtype = meta
        # (not g.shape != shape: a tuple comparison asks size == size of symbolic sizes before it
        # compares the lengths, a guard that specializes a dynamic batch equal to a broadcast size)
        if len(g.shape) != len(shape) or not all(statically_known_true(a == b) for a, b in zip(g.shape, shape)):
            g = g.sum_to_size(shape)
        return g if g.dtype == dtype else g.to(dtype)


H = _Helpers()


def _autograd_function(op: OpDef, overload: Any, F: Any) -> Any:
    """The op's ``torch.autograd.Function`` (setup_context style, so that ``torch.func``'s grad, vjp,
    jacrev, jvp, jacfwd and hessian transform it): backward is the spec's bprop formula and jvp its
    jvp formula, both evaluated with these same torch ops (so they compose: gradients of
    gradients, forward over reverse); vmap of it is generated from the ops' own batching."""
    n_in = len(op.inputs)
    n_attrs = len(op.attrs)
    out_names = [o.name for o in op.outputs]
    slot = {i.name: k for k, i in enumerate(op.inputs)}
    slot.update({n: n_in + k for k, n in enumerate(out_names)})
    saved = [(slot[n], needers) for n, needers in op.saved]
    diff_out = [k for k, o in enumerate(op.outputs) if o.differentiable]
    non_diff = [k for k, o in enumerate(op.outputs) if not o.differentiable]
    single = len(op.outputs) == 1
    bprop = op.bprop
    jvp_formula = op.jvp
    if bprop is None:
        raise ValueError(f"[{op.name}] has no bprop: its outputs never require grad")

    def forward(*args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        need = ctx.needs_input_grad[:n_in]
        values = (*inputs[:n_in], *outs)
        keep = [values[s] if any(need[k] for k in needers) else None for s, needers in saved]
        ctx.save_for_backward(*keep)
        ctx.metas = [None if t is None or not need[k] else (t.shape, t.dtype)
                     for k, t in enumerate(inputs[:n_in])]
        ctx.attrs = inputs[n_in:n_in + n_attrs]
        if non_diff:
            ctx.mark_non_differentiable(*(outs[k] for k in non_diff))
        # (an input without a tangent reaches jvp as None, not zeros: the jvp formula leaves out its
        # terms, where zeros times an infinite factor, pow's log(x) at x < 0, would be NaN; backward
        # makes its absent gradients zeros itself)
        ctx.set_materialize_grads(False)
        ctx.outs_like = [(outs[k].shape, outs[k].dtype, outs[k].device) for k in diff_out]
        if jvp_formula is not None:
            # what jvp reads, always: whether it will run cannot be told here in compiled code, whose
            # dual levels torch enters in C++ only (forward_ad._current_level stays -1). torch drops
            # it once the forward is done; set as ctx.save_for_forward(*values) sets it, without that
            # method's check of each value (tensors or None here), a measurable part of a call
            ctx.saved_for_forward = values

    def backward(ctx: Any, *grads: Any) -> Any:
        values: list[Any] = [None] * (n_in + len(out_names))
        for (s, _), t in zip(saved, ctx.saved_tensors):
            values[s] = t
        need = ctx.needs_input_grad[:n_in]
        douts = [grads[k] if grads[k] is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for k, (shape, dtype, device) in zip(diff_out, ctx.outs_like)]
        result = bprop(F, H, need, ctx.metas, *values, *douts, *ctx.attrs)
        return (*result, *([None] * n_attrs))

    def jvp(ctx: Any, *tangents: Any) -> Any:
        _FORWARD_AD_SEEN[0] = True
        if jvp_formula is None:
            raise RuntimeError(f"[{op.name}] has no forward-mode derivative (jvp): its spec gives no jvp formula "
                               "and none can be derived; add a jvp section to the op's spec, or use reverse mode")
        result = jvp_formula(F, H, tangents[:n_in], *ctx.saved_tensors, *ctx.attrs)
        return result[0] if single else tuple(result)

    return type(f"{op.name}_autograd", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
                 "backward": staticmethod(backward), "jvp": staticmethod(jvp),
                 "vmap": staticmethod(_batching_rule(op, overload))})


def _batching_rule(op: OpDef, overload: Any) -> Callable[..., Any]:
    """The op under ``torch.func.vmap`` (its autograd.Function's vmap rule): an elementwise (expr)
    op runs once on the whole batch (each batched input's batch dimension moved first, then padded
    to the others' rank, so broadcasting lines up); an op whose axis attrs say which inputs they
    index (the spec's ``axis_of``: reductions, softmax-like and norm ops) runs once with those
    inputs' batch dimension first and its axes shifted past it; matmul-like ops broadcast their
    batch dimensions natively (``matmul``), and an op whose one batched input is among the spec's
    ``batch_inputs`` (its leading dims are independent rows: ``linear``'s x) gets the batch dim
    first; any other op runs once per batch element and the
    results are stacked (the per-example loop, without torch's fallback warning)."""
    n_in = len(op.inputs)
    n_out = len(op.outputs)
    elementwise = op.impl == "expr"
    names = [i.name for i in op.inputs]
    axis_attrs = [k for k, a in enumerate(op.attrs) if a.axis_of]
    indexed = op.axis_indexed()
    reference = names.index(op.attrs[axis_attrs[0]].axis_of[0]) if axis_attrs else -1
    follows = op.outputs_follow_axes()
    matmul = len(op.outputs) == 1 and op.outputs[0].shape == "matmul"

    def shifted_axes(info: Any, ins: tuple[Any, ...], attrs: tuple[Any, ...], dims: tuple[Any, ...]) -> Any:
        """An op whose axis attrs index the batched inputs: those inputs with the batch dim first
        (the unbatched ones expanded to it), the axes shifted past it; None when the rule does not
        apply (an input batched that no axis indexes, a 0-d input, an axis out of range)."""
        if any(d is not None and t is not None and k not in indexed for k, (t, d) in enumerate(zip(ins, dims))):
            return None
        ref = ins[reference]
        rank = ref.dim() - (dims[reference] is not None)
        if rank == 0:
            return None
        new_attrs = list(attrs)
        for k in axis_attrs:
            value = attrs[k]
            axes = list(range(rank)) if value is None or value == [] else [value] if isinstance(value, int) else value
            if any(not -rank <= a < rank for a in axes):
                return None
            moved = [a % rank + 1 for a in axes]
            new_attrs[k] = moved[0] if isinstance(value, int) else moved
        size = info.batch_size
        new_ins = []
        for k, (t, d) in enumerate(zip(ins, dims)):
            if t is not None and k in indexed:
                t = t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(size, *t.shape)
            new_ins.append(t)
        return overload(*new_ins, *new_attrs)

    row_inputs = {names.index(n) for n in op.batch_inputs}

    def rule(info: Any, in_dims: tuple[Any, ...], *args: Any) -> Any:
        ins, attrs, dims = args[:n_in], args[n_in:], in_dims[:n_in]
        batched = [k for k, (t, d) in enumerate(zip(ins, dims)) if t is not None and d is not None]
        if len(batched) == 1 and batched[0] in row_inputs:  # its leading dims are independent rows
            k = batched[0]
            moved = list(ins)
            moved[k] = ins[k].movedim(dims[k], 0)
            return overload(*moved, *attrs), (0 if n_out == 1 else (0,) * n_out)
        if axis_attrs and follows:
            out = shifted_axes(info, ins, attrs, dims)
            if out is not None:
                return out, (0 if n_out == 1 else (0,) * n_out)
        if matmul and all(d is None or t.dim() >= 3 for t, d in zip(ins, dims)) or elementwise:
            # (a batched matmul operand of rank >= 2: batch dims broadcast like elementwise ones)
            rank = max(t.dim() - (d is not None) for t, d in zip(ins, dims))
            moved = []
            for t, d in zip(ins, dims):
                if d is not None:
                    t = t.movedim(d, 0)
                    pad = rank - (t.dim() - 1)
                    if pad:
                        t = t.reshape(t.shape[0], *([1] * pad), *t.shape[1:])
                moved.append(t)
            out = overload(*moved, *attrs)
            return out, (0 if n_out == 1 else (0,) * n_out)
        rows = []
        size = info.batch_size
        for b in range(max(size, 1)):  # (an empty batch: one call on zeros gives the shapes)
            rows.append(overload(*(t if d is None else t.select(d, b) if size else t.new_zeros(
                t.shape[:d] + t.shape[d + 1:]) for t, d in zip(ins, dims)), *attrs))
        if n_out == 1:
            return torch.stack(rows)[:size], 0
        return tuple(torch.stack([r[k] for r in rows])[:size] for k in range(n_out)), (0,) * n_out

    return rule


#: [True] once forward-mode AD has reached an opforge op in this process: a dual level open in
#: Python, or a jvp formula run (torch.compile traces a function in Python before running it)
_FORWARD_AD_SEEN = [False]
_unpack_dual = torch._VF._unpack_dual


def _forward_ad(args: Sequence[Any]) -> bool:
    """Whether a call needs forward-mode AD: a dual level open in Python (forward_ad.dual_level,
    torch.func.jvp), or an input with a tangent, tested as torch's autograd.Function tests it (at
    level 0, torch's one level). Compiled code enters its dual levels in C++ only, which
    forward_ad._current_level does not see; the test of the inputs costs about 1 us each, so the
    Autograd kernel makes it only once forward mode has reached an opforge op (_FORWARD_AD_SEEN)."""
    if _fwad._current_level >= 0:
        _FORWARD_AD_SEEN[0] = True
        return True
    return any(isinstance(a, torch.Tensor) and _has_tangent(a) for a in args)


def _has_tangent(t: Any) -> bool:
    try:
        return _unpack_dual(t, 0)[1] is not None
    except (RuntimeError, NotImplementedError):  # (a tensor of no view to unpack, sparse: no tangent)
        return False


def _functorch_kernel(op: OpDef, apply: Callable[..., Any]) -> Callable[..., Any]:
    n = len(op.inputs) + len(op.attrs)
    # (this key is above Autocast's: under torch.autocast the inputs are cast here, by the op's
    # policy, so the autograd.Function saves what the op computes with and its gradients and
    # tangents meet one dtype; the Autocast kernel below then has nothing left to cast)
    casts = {row.device_type: _autocast_cast(op, row.device_type) for row in _formulas.TARGETS.values()
             if op.autocast is not None and row.name in op.runs
             and torch._C._is_autocast_available(row.device_type)}

    def kernel(*args: Any) -> Any:
        full: Sequence[Any] = args if len(args) == n else _full_args(op, args)
        for device_type, cast in casts.items():
            if torch.is_autocast_enabled(device_type):
                full = cast(full)
        return apply(*full)

    return kernel


def _autograd_kernel(op: OpDef, overload: Any, F: Any) -> Callable[..., Any]:
    fn = _autograd_function(op, overload, F) if op.bprop is not None else None
    after_autograd = torch._C._after_autograd_keyset
    any_requires_grad = torch._C._any_requires_grad
    is_grad_enabled = torch._C.is_grad_enabled
    apply = fn.apply if fn is not None else None
    n = len(op.inputs) + len(op.attrs)
    forward_ad, seen = _forward_ad, _FORWARD_AD_SEEN

    def kernel(keyset: Any, *args: Any) -> Any:
        if len(args) != n:
            args = _full_args(op, args)
        # (forward mode: see _forward_ad; the tangent test only once forward mode has been seen)
        if apply is not None and ((is_grad_enabled() and any_requires_grad(*args))
                                  or ((seen[0] or _fwad._current_level >= 0) and forward_ad(args))):
            return apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & after_autograd, *args)

    return kernel


# ---------------------------------------------------------------------------- autocast

_FLOAT_ORDER = {torch.float16: 0, torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}


def _autocast_kernel(op: OpDef, overload: Any, device_type: str) -> Callable[..., Any]:
    """The op under ``torch.autocast(device_type)``, by its spec's policy: ``lower`` casts its
    floating inputs of a type variable to the autocast dtype, ``float32`` to float32, ``promote``
    to the widest of them (float16 with bfloat16: float32, as torch promotes); then the op runs
    with autocast off for it. Inputs of a concrete dtype (labels, indices) are left alone, and so
    is float64 but under ``promote``, as torch's autocast leaves it."""
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))
    excluded = torch._C.DispatchKeySet(key)
    n_in = len(op.inputs)
    cast = _autocast_cast(op, device_type)

    def kernel(*args: Any) -> Any:
        full = cast(_full_args(op, args))
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return overload(*full[:n_in], *full[n_in:])

    return kernel


def _autocast_cast(op: OpDef, device_type: str) -> Callable[[Sequence[Any]], list[Any]]:
    """The cast of a call's arguments (inputs then attrs) under ``torch.autocast(device_type)``,
    by the op's policy (see _autocast_kernel): differentiable ``.to(dtype)`` of the castable
    inputs."""
    castable = [k for k, i in enumerate(op.inputs) if i.dtype in op.typevars]

    def target(tensors: list[Any]) -> Any:
        if op.autocast == "lower":
            return torch.get_autocast_dtype(device_type)
        if op.autocast == "float32":
            return torch.float32
        dtypes = {t.dtype for t in tensors}
        if dtypes == {torch.float16, torch.bfloat16}:
            return torch.float32
        return max(dtypes, key=lambda d: _FLOAT_ORDER[d]) if dtypes else None

    # (as torch's autocast: float64 is cast by promote alone, never lowered)
    eligible = _FLOAT_ORDER if op.autocast == "promote" else {d for d in _FLOAT_ORDER if d != torch.float64}

    def cast(args: Sequence[Any]) -> list[Any]:
        floats = [args[k] for k in castable if isinstance(args[k], torch.Tensor) and args[k].dtype in eligible
                  and args[k].device.type == device_type]
        dtype = target(floats)
        out = list(args)
        for k in castable:
            t = out[k]
            if dtype is not None and isinstance(t, torch.Tensor) and t.dtype in eligible and t.dtype != dtype:
                out[k] = t.to(dtype)
        return out

    return cast


def _register_autocast(lib: Any, op: OpDef, overload: Any) -> None:
    for row in _formulas.TARGETS.values():
        if row.name not in op.runs or not torch._C._is_autocast_available(row.device_type):
            continue
        kernel = _autocast_kernel(op, overload, row.device_type)
        key = "Autocast" + torch._C._dispatch_key_for_device(row.device_type)
        lib.impl(op.name, kernel, key)
        # (torch.compile runs autocast through the Python dispatcher: the same kernel there)
        overload.py_impl(getattr(torch._C.DispatchKey, key))(kernel)


# ---------------------------------------------------------------------------- registration


def _register_native(native: Any, namespace: str, op: OpDef, fn: Any, overload: Any, F: Any) -> None:
    """The op's CPU, CUDA (when this build runs it there) and Autograd kernels in C++
    (opforge/_torch_native.py): the CPU kernel runs the op's opforge entry on the torch tensors'
    memory, the CUDA kernel does what ``_device_kernel`` does, in C++; the Autograd kernel records a C++ node whose
    backward calls the spec's bprop formula, given here, and hands calls with forward-mode tangents,
    tensor subclasses or symbolic sizes to the op's autograd.Function (the Python path)."""
    names = [i.name for i in op.inputs]
    slot = {n: k for k, n in enumerate(names)}
    slot.update({o.name: len(names) + k for k, o in enumerate(op.outputs)})
    same_input = [names.index(o.shape_args[0]) if o.shape == "same" and o.shape_args[0] in names else -1
                  for o in op.outputs]
    saved = [(slot[n], list(needers)) for n, needers in op.saved]
    backward = fallback = None
    if op.bprop is not None:
        bprop = op.bprop

        def backward(need: Any, metas: Any, values: Any, douts: Any, attrs: Any) -> Any:
            return bprop(F, H, need, metas, *values, *douts, *attrs)

        fallback = _autograd_function(op, overload, F).apply
    native.register(namespace, fn, op.impl == "expr", -1 if (k := _format_attr(op)) is None else k, same_input,
                    [o.differentiable for o in op.outputs], saved, backward, fallback, "cuda" in op.runs)



def register_ops(table: dict[str, OpDef], kernels: Any, metas: Any, namespace: str,
                 extern: Optional[dict[str, Any]] = None) -> Any:
    """Define every op of ``table`` in the torch namespace ``namespace`` and register its kernels;
    ``kernels``/``metas`` hold the package's runtime entry points (``_C.ops``, ``_C._meta``);
    formulas may also call the ``extern`` operators (opforge's, for an op module).
    Returns the library (keep it alive: dropping it unregisters the ops)."""
    # (torch.ops.<namespace>.<op> finds the op only where the namespace object has no attribute
    # of that name: refused before anything is registered)
    taken = set(vars(torch._ops._OpNamespace(namespace))) | set(dir(torch._ops._OpNamespace))
    for name in table:
        if name in taken:
            raise ValueError(f"[{name}] cannot be registered with torch: torch.ops.{namespace}.{name} is an attribute "
                             "of torch's op namespaces, not an op; rename the op")
    lib = torch.library.Library(namespace, "DEF")
    for op in table.values():
        lib.define(schema(op))
        for k, _ in scalar_slots(op):
            lib.define(schema(op, scalar=k))
    F = SimpleNamespace(**(extern or {}),
                        **{name: getattr(getattr(torch.ops, namespace), name).default for name in table})
    for op in table.values():
        overload = getattr(F, op.name)
        for k, j in scalar_slots(op):
            scalar = _scalar_kernel(op, k, j, overload)
            lib.impl(f"{op.name}.scalar_{op.inputs[k].name}", scalar, "CompositeImplicitAutograd")
            # (under torch.func too: the number made a tensor where functorch's dispatch starts, so
            # its transforms see the op itself (jvp, vmap without the fallback))
            lib.impl(f"{op.name}.scalar_{op.inputs[k].name}", scalar, "FuncTorchDynamicLayerFrontMode")
        if op.composite is not None and op.bprop is None:
            composite = op.composite

            def decomposed(*args: Any, _op: OpDef = op, _f: Callable[..., Any] = composite) -> Any:
                return _f(F, H, *_full_args(_op, args))

            lib.impl(op.name, decomposed, "CompositeImplicitAutograd")
            # under torch.func too: decomposed where functorch's dispatch starts, so its transforms
            # see the ops of the formula
            lib.impl(op.name, decomposed, "FuncTorchDynamicLayerFrontMode")
            continue
        native = _torch_native.load()
        if native is not None:  # C++ CPU and Autograd kernels: no Python per call
            _register_native(native, namespace, op, getattr(kernels, op.name), overload, F)
        else:
            lib.impl(op.name, _cpu_kernel(op, getattr(kernels, op.name)), _formulas.TARGETS["cpu"].torch_dispatch_key)
        for target in op.runs:  # the device targets this build runs the op on (cuda; native: C++ above)
            if target != "cpu" and native is None:
                row = _formulas.TARGETS[target]
                lib.impl(op.name, _device_kernel(op, getattr(kernels, op.name), getattr(metas, op.name),
                                                 row.device_type),
                         row.torch_dispatch_key)
        torch.library.register_fake(f"{namespace}::{op.name}", _fake_kernel(op, getattr(metas, op.name)),
                                    lib=lib)
        # ops without a bprop (comparisons, indices) still get one: their outputs never require grad
        if native is None:
            lib.impl(op.name, _autograd_kernel(op, overload, F), "Autograd", with_keyset=True)
        if op.autocast is not None:
            _register_autocast(lib, op, overload)
        if op.bprop is not None:
            # torch.func's transforms: the autograd.Function applied where functorch's dispatch
            # starts, so its grad/jvp/vmap rules see it (an autograd.Function applied inside the
            # Autograd kernel is below them: torch's own custom ops fail there)
            apply = _autograd_function(op, overload, F).apply
            lib.impl(op.name, _functorch_kernel(op, apply), "FuncTorchDynamicLayerFrontMode")
        else:  # (no derivative: only vmap needs a rule)
            torch.library.register_vmap(f"{namespace}::{op.name}", _batching_rule(op, overload), lib=lib)
    return lib


# (kept on the extension module, which a second import of this one finds: torch takes one
# registration of a namespace per process, so importlib.reload or an import after removing this
# module from sys.modules reuses the first import's ops rather than fail to register them again)
_STATE: dict[str, Any] = getattr(_C, "_torch_state", None) or {}
if not _STATE:
    _STATE.update(lib=register_ops(_formulas.OPS, _C.ops, _C._meta, NAMESPACE), modules={})
    _C._torch_state = _STATE
_LIB = _STATE["lib"]

#: The ops as torch operators: ``ops.<name>`` is ``torch.ops.opforge.<name>``.
ops = getattr(torch.ops, NAMESPACE)

_MODULES: dict[str, tuple[Any, Any]] = _STATE["modules"]  # namespace -> (op module, its torch library)
_REGISTERING = _STATE.setdefault("registering", threading.RLock())  # (kept, as _MODULES, by a re-import)


def register_module(module: Any, namespace: Optional[str] = None) -> Any:
    """Make every op of an op module (``opforge.load``'s result, a package's ``<pkg>._ops``) a
    torch operator ``torch.ops.<namespace>.<op>``, as opforge's own are (fake kernel, autograd
    from its bprop, formulas calling opforge's ops too); returns ``torch.ops.<namespace>``.

    ``namespace`` defaults to the module's top-level name. torch cannot redefine operators, so a
    namespace holds one module per process: register a reloaded module under another name."""
    table = getattr(module, "__opforge_formulas__", None)
    if table is None:
        raise TypeError(f"[opforge.torch] {module!r} is not an opforge op module (no __opforge_formulas__): "
                        "pass what opforge.load returns or a package's <pkg>._ops")
    namespace = namespace or module.__name__.split(".")[0]
    if namespace == NAMESPACE:
        raise ValueError(f"[opforge.torch] namespace '{NAMESPACE}' holds opforge's own ops; pick another")
    with _REGISTERING:  # (threads registering one module at once: the first registers, the others reuse it)
        if namespace in _MODULES:
            if _MODULES[namespace][0] is module:
                return getattr(torch.ops, namespace)
            raise ValueError(f"[opforge.torch] namespace '{namespace}' already holds the ops of another module "
                             f"({_MODULES[namespace][0].__name__}); torch cannot redefine operators: pass "
                             "namespace='...'")
        base = {name: getattr(ops, name).default for name in _formulas.OPS}
        _MODULES[namespace] = (module, register_ops(table, module, module._meta, namespace, extern=base))
    return getattr(torch.ops, namespace)
