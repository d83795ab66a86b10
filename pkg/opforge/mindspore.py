"""opforge ops as MindSpore primitives, in PyNative and Graph mode, with MindSpore's autograd.

Every op of the package is an ``ops.Custom(func_type="aot")`` primitive calling the op's AOT
entry point in this wheel's shared library (MindSpore's AOT C ABI, see ``aot/aot.h``), with the
``CustomRegOp`` registration built from the op's registration table and a ``bprop`` built from
the spec's gradient formulas over these same primitives. Nothing is written per op::

    import opforge.mindspore as om

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ops = om.ops                                # default attrs, all inputs
            self.act = om.primitive("leaky_relu", alpha=0.2)  # other attrs: their own primitive

        def construct(self, x, y):
            return self.act(self.ops.mul(x, y))

- ``ops.<name>`` is the op's primitive with its default attrs and every input present.
- ``primitive(name, without=(...), **attrs)`` is the primitive for other attr values or without
  some optional inputs (attrs are fixed per primitive, as MindSpore's are). Primitives are cached.
- ``functional.<name>(*inputs, **attrs)`` picks the primitive per call; meant for PyNative code.
- Composite ops without a bprop of their own (``square``) are functions over the primitives.

- ``register_module(m)`` gives the same for the ops of an op module (``opforge.load``'s result, a
  package's ``<pkg>._ops``): an ``OpSet`` with ``.ops``, ``.functional`` and ``.primitive``.

Attrs reach the kernel as MindSpore prim attrs (``CustomRegOp.attr(name, "required", "str",
value=text)``); the kernel reads them through ``extra``. An aot op's external kernel gets them with
MindSpore's types instead (``Attr<float>``...), as MindSpore's own AOT kernels read them. Output
shapes come from each entry point's C++ ``<symbol>InferShape`` (generated from the spec's shape
rules; dimensions may be unknown, so Graph mode compiles once for dynamic shapes), dtypes from the
op's own meta rule (``opforge._C._meta``), which for static shapes also raises the op's own
TypeError/ValueError before any kernel runs (MindSpore never casts a dtype the op does not list).
Ops of impl kind ``aot`` and ops with an ``infer(fn)`` rule take their shapes from the meta rule,
static only.

On a MindSpore GPU build (``device_target="GPU"``) the ops the cu130 wheel runs on cuda are
registered for target ``GPU``: MindSpore passes device buffers and its stream, and the entry point
queues the op's work on that stream. (Not verified here: PyPI's MindSpore is a CPU build.)

MindSpore 2.10 needs NumPy 1.x: ``pip install mindspore==2.10.0 "numpy<2"``.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import numpy as np

try:
    import mindspore as ms
    from mindspore import nn
    from mindspore import ops as _msops
    from mindspore.ops import functional as _msF
    from mindspore.ops import CustomRegOp
    from mindspore.ops import signature as _sig
    from mindspore._c_expression import prim_type as _prim_type
except ImportError as e:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "opforge.mindspore needs MindSpore: pip install mindspore==2.10.0 \"numpy<2\" "
        f"(import failed: {e})") from e

import opforge
import opforge._C as _C
import opforge._formulas as _formulas
from opforge._opdef import OpDef, canonical_attr, check_number, plain_attr

# MindSpore's AotExtra (the `extra` of an AOT call, an op's attrs) is read through a copy of its
# class in src/aot/aot_extra.cpp: its header cannot be compiled outside MindSpore, so opforge calls
# its virtual functions by their places in the vtable. These are MindSpore 2.10's declarations in
# order (custom_aot_extra.h); another layout would make every attr read call the wrong function.
_AOT_EXTRA_LAYOUT = (
    "virtual ~AotExtra() = default;",
    "virtual bool HasAttr(std::string name) = 0;",
    "virtual bool GetAttrBool(std::string name) = 0;",
    "virtual int64_t GetAttrInt(std::string name) = 0;",
    "virtual float GetAttrFloat(std::string name) = 0;",
    "virtual std::string GetAttrStr(std::string name) = 0;",
    "virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;",
    "virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;",
    "virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;",
    "virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;",
    "std::vector<size_t> workspace_;",
    "AotKernelData *kernel_data_{nullptr};",
)
_AOT_EXTRA_HEADER = "include/mindspore/ccsrc/utils/custom_aot_extra.h"


def _aot_extra_layout(header: str) -> tuple[str, ...]:
    """The virtual functions and data members of class AotExtra in a custom_aot_extra.h, in order,
    each on one line with single spaces (comments dropped)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", header, flags=re.S)
    m = re.search(r"\bclass\s+AotExtra\s*\{", text)
    if m is None:
        return ()
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = text[m.end():i - 1]
    # the members at the class's own level: function bodies ({...}) removed, then split at ';'
    flat, depth = [], 0
    for ch in body:
        if ch == "{":
            depth += 1
            flat.append(ch if depth == 1 else "")
        elif ch == "}":
            depth -= 1
            flat.append(ch + ";" if depth == 0 else "")
        else:
            flat.append(ch if depth <= 1 else "")
    out = []
    for decl in "".join(flat).split(";"):
        decl = " ".join(decl.replace("public:", " ").replace("private:", " ").replace("protected:", " ").split())
        if decl.startswith("virtual ") or (decl.endswith("_") or decl.endswith("_{nullptr}")) and "(" not in decl:
            out.append(decl + ";")
    return tuple(out)


def _check_aot_extra(ms_root: str, version: str) -> None:
    """Refuses a MindSpore whose AotExtra differs from the layout opforge reads (ImportError)."""
    header = os.path.join(ms_root, _AOT_EXTRA_HEADER)
    if not os.path.isfile(header):
        if not version.startswith("2.10."):
            raise ImportError(f"opforge.mindspore reads MindSpore 2.10's AotExtra; MindSpore {version} ships no "
                              f"{_AOT_EXTRA_HEADER} to check its layout against: pip install mindspore==2.10.0")
        return
    with open(header, encoding="utf-8", errors="replace") as f:
        found = _aot_extra_layout(f.read())
    if found != _AOT_EXTRA_LAYOUT:
        diff = next((f"{i}: {w!r} where opforge reads {h!r}" for i, (w, h) in
                     enumerate(zip(found + ("(none)",) * len(_AOT_EXTRA_LAYOUT), _AOT_EXTRA_LAYOUT)) if w != h),
                    f"{len(found)}: more members than opforge reads")
        raise ImportError(f"opforge.mindspore: MindSpore {version}'s AotExtra ({header}) is not the layout opforge "
                          f"calls (member {diff}); calling it would run the wrong functions: pip install "
                          "mindspore==2.10.0")


_check_aot_extra(os.path.dirname(ms.__file__), ms.__version__)

__all__ = ["ops", "functional", "primitive", "register_module", "OpSet", "LIBRARY", "F", "H", "LaunchTypeError",
           "LaunchValueError", "LaunchIndexError", "LaunchError"]

#: The shared library holding every op's AOT entry point (libopforge.so, beside opforge._C).
LIBRARY: str = opforge.LIBRARY

# the host's row of the target table (codegen/targets.py)
_CPU = _formulas.TARGETS["cpu"]


def _target(op: OpDef) -> Any:
    """The target row ops.Custom registers op for: MindSpore's device target (``GPU``: the cu130
    wheel's cuda rows, whose AOT entry points take device pointers and MindSpore's stream) when
    this build runs op there, else the host's."""
    want = ms.get_context("device_target")
    return next((_formulas.TARGETS[t] for t in op.runs if _formulas.TARGETS[t].mindspore_target == want), _CPU)

_DTYPES = {
    "bool": ms.bool_, "uint8": ms.uint8, "int8": ms.int8, "int16": ms.int16, "int32": ms.int32,
    "int64": ms.int64, "float16": ms.float16, "bfloat16": ms.bfloat16, "float32": ms.float32,
    "float64": ms.float64,
}
_FROM_MS = {str(v): k for k, v in _DTYPES.items()}
_FROM_MS.update({str(ms.TensorType(v)): k for k, v in _DTYPES.items()})


# element types are singletons: their ids name them without a (slow) str() per call
_BY_ID = {id(v): k for k, v in _DTYPES.items()}


def _dtype_key(d: Any) -> Any:
    try:
        return id(d.element_type())
    except AttributeError:  # not a tensor type: _dtype_name reports it
        return str(d)


def _dtype_name(op: OpDef, arg: str, d: Any) -> str:
    try:
        name = _BY_ID.get(id(d.element_type()))
    except AttributeError:
        name = None
    if name is not None:
        return name
    text = str(d)
    if text.startswith("Ref[") and text.endswith("]"):  # a Parameter
        text = text[4:-1]
    name = _FROM_MS.get(text)
    if name is None:
        raise TypeError(f"[{op.name}] input '{arg}' has dtype {d}, which opforge does not have; "
                        f"supported dtypes: {', '.join(_DTYPES)}")
    return name


def _attr_text(atype: str, value: Any) -> str:
    """An attr's value as the text the AOT entry point parses (aot/aot.h)."""
    if value is None:
        return "None"
    if atype.startswith("list["):
        return ",".join(_attr_text(atype[5:-1], v) for v in value)
    if atype == "float":
        return repr(float(value))
    if atype == "bool":
        return "True" if value else "False"
    return str(value)


def _reads_as_default(a: Any, value: Any) -> bool:
    """Whether an opforge entry point without attr ``a`` in its extra reads ``value``: the spec's
    default, whose text (aot/aot.h's AttrSource: the default's Python literal, brackets and quotes
    taken off) parses as value's. Such attrs are left out of the primitive: MindSpore's PyNative
    path writes every primitive attr into each call's cache key (measured with callgrind: about
    8,800 instructions a call for leaky_relu's alpha, 3.5% of the call; cpu-mindspore.md)."""
    if a.required:
        return False
    if value is None or a.default is None:
        return value is None and a.default is None
    if a.type == "str":  # (a default Python's repr escapes reaches the kernel escaped)
        return bool(value == a.default and repr(a.default)[1:-1] == a.default)
    return _attr_text(a.type, value) == _attr_text(a.type, a.default)


# MindSpore's attr value types (CustomRegOp.attr) of spec attr types
_MS_ATTR_TYPES = {"bool": "bool", "int": "int", "float": "float", "str": "str", "list[int]": "listInt",
                  "list[float]": "listFloat"}


def _target_info(op: OpDef, meta: Any) -> dict[str, Any]:
    """The op's registration on its MindSpore target: its own module's (``meta`` its meta function),
    not the name's latest registration (another module's op of the same name has other rows)."""
    return next(t for t in _C._op_info_of(meta) if t["target"] == _target(op).mindspore_target)


def _rows(op: OpDef, present: Sequence[bool], meta: Any) -> list[tuple[tuple[str, str], ...]]:
    """The op's dtype rows on its target, as MindSpore DataType pairs for the present inputs and the outputs."""
    info = _target_info(op, meta)
    keep = [k for k, p in enumerate(present) if p] + list(range(len(op.inputs), len(op.inputs) + len(op.outputs)))
    rows: list[tuple[tuple[str, str], ...]] = []
    for row in info["dtype_format"]:
        if row[0][1] != "DefaultFormat":
            continue
        r = tuple((row[k][0], "DefaultFormat") for k in keep)
        if r not in rows:
            rows.append(r)
    return rows


def _reg_info(op: OpDef, present: Sequence[bool], attrs: Sequence[Any], meta: Any) -> dict[str, Any]:
    reg = CustomRegOp(op.name)
    index = 0
    for i, p in zip(op.inputs, present):
        if p:
            reg = reg.input(index, i.name)
            index += 1
    for k, o in enumerate(op.outputs):
        reg = reg.output(k, o.name)
    for a, v in zip(op.attrs, attrs):
        if op.aot_kernel is None:  # opforge's entry points read every attr as text (exact floats)
            if not _reads_as_default(a, v):  # (an attr left out: the entry point takes its default)
                reg = reg.attr(a.name, "required", "str", value=_attr_text(a.type, v))
        elif v is not None:  # an external kernel reads them with MindSpore's types (Attr<T>)
            reg = reg.attr(a.name, "required", _MS_ATTR_TYPES[a.type], value=list(v) if isinstance(v, tuple) else v)
    for row in _rows(op, present, meta):
        reg = reg.dtype_format(*row)
    info: dict[str, Any] = reg.target(_target(op).mindspore_target).get_op_info()
    return info


def _full_attrs(op: OpDef, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    values = list(args)
    if len(values) > len(op.attrs):
        raise TypeError(f"[{op.name}] takes {len(op.attrs)} attrs ({', '.join(a.name for a in op.attrs)}), "
                        f"got {len(values)}")
    # (kwargs read, not popped: Graph mode compiles this, in a functional call's attrs)
    for a in op.attrs[len(values):]:
        if a.name in kwargs:
            values.append(kwargs[a.name])
        elif a.required:
            raise TypeError(f"[{op.name}] missing required attr '{a.name}'")
        else:
            values.append(list(a.default) if isinstance(a.default, tuple) else a.default)
    names = [a.name for a in op.attrs]
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        raise TypeError(f"[{op.name}] unknown attr(s) {', '.join(unknown)}; attrs: "
                        f"{', '.join(a.name for a in op.attrs) or 'none'}")
    return tuple(values)


def _cpp_shapes(op: OpDef) -> bool:
    """Whether MindSpore infers op's shapes by its C++ entry points (``<symbol>InferShape`` in the
    library, generated from the spec's shape rules, which take dimensions unknown until a call:
    Graph mode with dynamic shapes). Not for an op whose rule is infer() code, nor for an aot op
    (its external library has no such function): their shapes come from the meta rule, static."""
    return op.aot_kernel is None and all(o.shape != "infer" for o in op.outputs)


class _Infer:
    """Output dtypes (and, for static shapes, shapes) of one primitive, from the op's meta rule,
    which raises what a real call would (cached per input shapes and dtypes: PyNative infers on
    every call). MindSpore takes the shapes from the C++ InferShape entry point where the op has
    one (``_cpp_shapes``); with dimensions unknown until the call (-1, or a rank of -2) only the
    dtypes are inferred here, from the registration rows."""

    def __init__(self, op: OpDef, present: Sequence[bool], attrs: tuple[Any, ...], metas: Any):
        self.op = op
        self.present = tuple(present)
        self.attrs = attrs
        self.meta = getattr(metas, op.name)
        self.cpp_shapes = _cpp_shapes(op)
        self.cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __call__(self, args: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
        try:  # the common case in one pass: tensor types, whose element types are singletons
            key = tuple([(tuple(a["shape"]), id(a["dtype"].element_type())) for a in args])
        except AttributeError:
            key = tuple([(tuple(a["shape"]), _dtype_key(a["dtype"])) for a in args])
        except TypeError:  # (a PyNative call's None has no shape: "'NoneType' object is not iterable")
            raise self.not_a_tensor(args) from None
        try:
            hit = self.cache.get(key)
        except TypeError:  # (a list or tuple's shape holds lists: "unhashable type: 'list'")
            raise self.not_a_tensor(args) from None
        if hit is not None:
            return hit
        shapes = tuple([k[0] for k in key])
        op = self.op
        names = [i.name for i, p in zip(op.inputs, self.present) if p]
        if len(args) != len(names):
            raise TypeError(f"[{op.name}] this primitive takes {len(names)} inputs ({', '.join(names)}), "
                            f"got {len(args)}")
        dtypes = [_dtype_name(op, name, a["dtype"]) for name, a in zip(names, args)]
        dynamic = [name for name, shape in zip(names, shapes) if any(s is None or s < 0 for s in shape)]
        if dynamic:
            if not self.cpp_shapes:
                rule = "its shape rule is infer() code" if op.aot_kernel is None else "it is an aot op"
                raise ValueError(f"[{op.name}] input '{dynamic[0]}': dynamic shape {list(shapes[names.index(dynamic[0])])} "
                                 f"is not supported for this op ({rule}, which opforge.mindspore evaluates with "
                                 "static shapes); use static shapes")
            result = self.dynamic_dtypes(shapes, dtypes)
        else:
            metas = self.meta(*self.stand_ins([list(s) for s in shapes], dtypes), *self.attrs)
            out_shapes = [list(s) for s, _ in metas]
            out_dtypes = [ms.TensorType(_DTYPES[d]) for _, d in metas]  # not a bare dtype: 0-d would be a scalar
            result = ((out_shapes[0], out_dtypes[0]) if len(metas) == 1 else (tuple(out_shapes), tuple(out_dtypes)))
        if len(self.cache) < 256:
            self.cache[key] = result
        return result

    def not_a_tensor(self, args: Sequence[dict[str, Any]]) -> TypeError:
        """The TypeError naming the first argument that is not a tensor (None, a list or a tuple)."""
        names = [i.name for i, p in zip(self.op.inputs, self.present) if p]
        for name, a in zip(names, args):
            d = a.get("dtype")
            if not isinstance(d, ms.dtype.TensorType):
                what = "None" if d is None else f"a {type(d).__name__}" if isinstance(d, (list, tuple)) else str(d)
                return TypeError(f"[{self.op.name}] input '{name}' must be a Tensor, got {what}")
        return TypeError(f"[{self.op.name}] its inputs must be Tensors")

    def stand_ins(self, shapes: Sequence[list[int]], dtypes: Sequence[str]) -> list[Any]:
        it = iter(zip(shapes, dtypes))
        out: list[Any] = []
        for p in self.present:
            if not p:
                out.append(None)
                continue
            shape, dtype = next(it)
            out.append(_C._meta_tensor(shape, dtype))
        return out

    def dynamic_dtypes(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]) -> tuple[Any, Any]:
        """The output dtypes of the registration row these input dtypes select (shapes: rank
        unknown, as MindSpore takes them from InferShape); TypeError from the meta rule if none."""
        op = self.op
        keep = [k for k, p in enumerate(self.present) if p]
        info = _target_info(op, self.meta)
        for row in info["dtype_format"]:
            if all(row[k][0] == d for k, d in zip(keep, dtypes)):
                outs = [ms.TensorType(_DTYPES[row[len(op.inputs) + j][0]]) for j in range(len(op.outputs))]
                break
        else:
            # the meta rule's TypeError (dtypes are checked before shapes; unknown dims as 1)
            self.meta(*self.stand_ins([[1 if d is None or d < 0 else d for d in s] if s != (-2,) else []
                                       for s in shapes], dtypes), *self.attrs)
            raise TypeError(f"[{op.name}] input dtypes ({', '.join(dtypes)}) are not registered")
        if len(outs) == 1:
            return [-2], outs[0]
        return tuple([-2] for _ in outs), tuple(outs)


class LaunchTypeError(TypeError, RuntimeError):
    """An op's TypeError when its kernel ran: a RuntimeError too, as MindSpore raised it."""


class LaunchValueError(ValueError, RuntimeError):
    """An op's ValueError when its kernel ran: a RuntimeError too, as MindSpore raised it."""


class LaunchIndexError(IndexError, RuntimeError):
    """An op's IndexError when its kernel ran (a label or index out of range): a RuntimeError
    too, as MindSpore raised it."""


class LaunchError(RuntimeError):
    """An op's other failure when its kernel ran."""


_LAUNCH_ERRORS: dict[int, type[RuntimeError]] = {1: LaunchTypeError, 2: LaunchValueError, 3: LaunchIndexError}
_LAUNCH_CLASSES = (*_LAUNCH_ERRORS.values(), LaunchError)


def _launch_error(prim: "Primitive", e: RuntimeError) -> Optional[RuntimeError]:
    """opforge's exception for a failed PyNative launch of prim's entry point, or None. MindSpore
    reports only the entry point's status ("... function(opforge_cross_entropy) is 3"), opforge's
    message going to stderr: the library keeps the process's last failure (_aot_take_failure),
    raised here with its type when it is prim's op's."""
    if isinstance(e, _LAUNCH_CLASSES) or prim.opdef.aot_kernel is not None or f"function({prim.symbol})" not in str(e):
        return None
    status, message = _C._aot_take_failure()
    if not message.startswith(f"[{prim.opdef.name}]"):
        return None
    return _LAUNCH_ERRORS.get(status, LaunchError)(message)


class Primitive(_msops.Custom):  # type: ignore[misc]  # (MindSpore has no type information)
    """One opforge op with fixed attrs and a fixed set of present inputs, as a MindSpore
    ``ops.Custom`` AOT primitive (of opforge's own ops, or of ``opset``'s: a registered module)."""

    def __init__(self, op: OpDef, present: Sequence[bool], attrs: tuple[Any, ...], opset: Optional[OpSet] = None,
                 cpp_shapes: Optional[bool] = None):
        opset = opset or _OWN
        self.opdef = op
        self.infer = _Infer(op, present, attrs, opset.meta)
        self._cpp = _cpp_shapes(op) if cpp_shapes is None else cpp_shapes
        self._eager: Optional[Primitive] = None
        self._made = (op, tuple(present), attrs, opset)
        # the present inputs that may be bool tensors (a mask: where's condition), for __call__
        rows = _target_info(op, self.infer.meta)["dtype_format"]
        kept = [k for k, p in enumerate(present) if p]
        self._bools = tuple(j for j, k in enumerate(kept) if any(row[k][0] == "bool" for row in rows))
        if op.aot_kernel is not None:
            # an aot op: MindSpore calls its external kernel directly (path resolved, and the
            # library and symbol checked, here: RuntimeError naming them otherwise)
            library, symbol = op.aot_kernel
            func = f"{_C._aot_library(op.name, library, symbol)}:{symbol}"
        else:
            func = f"{opset.library}:{op.aot_symbol(tuple(present))}"
        self.symbol = func.rpartition(":")[2]  # (the entry point MindSpore names when a launch fails)
        super().__init__(
            func,
            # None: MindSpore calls the entry point's C++ InferShape (dynamic shapes in Graph mode);
            # else __infer__ below gives the shapes (a function here: MindSpore's placeholder)
            out_shape=None if self._cpp else (lambda *shapes: None),
            out_dtype=lambda *dtypes: None,
            func_type="aot",
            bprop=_bprop(op, present, attrs, opset.F),
            reg_info=_reg_info(op, present, attrs, getattr(opset.meta, op.name)),
        )
        if self._cpp:
            # Graph mode checks a call's arguments (__check__) before the C++ InferShape reads them
            self.set_prim_type(_prim_type.py_infer_check)

    def __call__(self, *args: Any) -> Any:
        """A PyNative call. Its shapes are known, and MindSpore opens the library again (a dlopen)
        on every PyNative call of a C++ InferShape, about 60 µs here: the call goes to a twin of
        this primitive that takes its shapes from ``__infer__`` (Python, cached). Graph mode
        compiles this primitive itself (never calls it), with the C++ InferShape dynamic shapes need."""
        args = _numbers_as_tensors(self.opdef, self._made[1], args)
        try:
            return self._launch(args)
        except RuntimeError as e:
            error = _launch_error(self, e)
            if error is None:
                raise
            raise error from e

    def _launch(self, args: tuple[Any, ...]) -> Any:
        if self._bools:
            # a bool tensor takes no gradient: cut it off here, as PyNative adds up the bprop's zeros
            # for a mask given to two primitives (one where(c, ...) beside another) with Add, which
            # refuses bool ("For primitive[Add] ... but got Tensor[Bool]"); MindSpore's own ops are
            # not accumulated there
            args = tuple(_msops.stop_gradient(a) if j in self._bools and isinstance(a, ms.Tensor)
                         and a.dtype == ms.bool_ else a for j, a in enumerate(args))
        if not self._cpp:
            return super().__call__(*args)
        if self._eager is None:
            self._eager = _new_primitive(*self._made, cpp_shapes=False)
        return self._eager(*args)

    def __check__(self, *args: dict[str, Any]) -> None:
        """Graph mode's check of a call's arguments, before MindSpore calls the C++ InferShape:
        every one a tensor. MindSpore hands the InferShape the shapes of tensor arguments only, so
        a number, None or a tuple there made the inputs after it read past MindSpore's arrays. A
        Python number is converted only beside a tensor of its type variable (the signature,
        ``_signed``); others are refused here, naming the input."""
        op = self.opdef
        names = [i.name for i, p in zip(op.inputs, self._made[1]) if p]
        if len(args) != len(names):
            raise TypeError(f"[{op.name}] this primitive takes {len(names)} inputs ({', '.join(names)}), "
                            f"got {len(args)}")
        for name, a in zip(names, args):
            dtype = a.get("dtype")
            if not isinstance(dtype, ms.dtype.TensorType):
                value = a.get("value")
                allowed = ", ".join(self._input_dtypes(name))
                if isinstance(value, (bool, int, float)):
                    raise TypeError(
                        f"[{op.name}] input '{name}' must be a Tensor in Graph mode, got the number {value!r} "
                        f"({dtype}): MindSpore makes a number a tensor only beside a tensor of its type "
                        f"variable; pass ms.Tensor({value!r}, dtype), its dtypes: {allowed}")
                raise TypeError(f"[{op.name}] input '{name}' must be a Tensor in Graph mode, got {dtype}; "
                                f"its dtypes: {allowed}")

    def _input_dtypes(self, name: str) -> list[str]:
        k = self.opdef.input_index(name)
        rows = _target_info(self.opdef, self.infer.meta)["dtype_format"]
        return sorted({row[k][0] for row in rows})

    def __infer__(self, *args: dict[str, Any]) -> dict[str, Any]:
        shape, dtype = self.infer(args)
        return {"shape": shape, "dtype": dtype, "value": None}


def _new_primitive(op: OpDef, present: Sequence[bool], attrs: tuple[Any, ...], opset: Optional[OpSet] = None,
                   cpp_shapes: Optional[bool] = None) -> Primitive:
    """A Primitive whose class has the MindSpore signature of its present inputs (``_signed``)."""
    names = tuple((i.name, op.typevars.index(i.dtype) if i.dtype in op.typevars else -1)
                  for i, p in zip(op.inputs, present) if p)
    prim = _signed(names)(op, present, attrs, opset, cpp_shapes)
    if not prim._cpp:
        # (its shapes come from __infer__, not the C++ InferShape; and MindSpore's PyNative calls
        # take one signature for every Custom primitive of a process: PyNative calls convert
        # numbers in Primitive.__call__)
        prim.set_signatures(())
    return prim


_INT_BOUNDS = {n: (int(np.iinfo(n).min), int(np.iinfo(n).max)) for n in ("uint8", "int8", "int16", "int32", "int64")}


def _numbers_as_tensors(op: OpDef, present: Sequence[bool], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A PyNative call's Python numbers given for an input of a type variable, each a 0-d tensor of
    the dtype of the first tensor given for that type variable, checked as opforge checks numbers
    (Graph mode converts them by the primitive's signature, ``_signed``; PyNative calls go through
    here instead: MindSpore caches one signature for every ``Custom`` primitive of a process)."""
    if not any(isinstance(a, (bool, int, float)) for a in args):
        return args
    inputs = [i for i, p in zip(op.inputs, present) if p]
    out = list(args)
    for k, (inp, a) in enumerate(zip(inputs, args)):
        if not isinstance(a, (bool, int, float)) or inp.dtype not in op.typevars:
            continue
        j = next((j for j, (o, b) in enumerate(zip(inputs, args)) if o.dtype == inp.dtype and isinstance(b, ms.Tensor)),
                 None)
        if j is None:
            continue  # (no tensor binds it: MindSpore's default dtype, as in Graph mode)
        name = _FROM_MS.get(str(args[j].dtype), str(args[j].dtype))
        kind = "b" if name == "bool" else "i" if name in _INT_BOUNDS else "f"
        check_number(op, inp.name, a, name, kind, _INT_BOUNDS.get(name, (0, 1)), f" (bound by input '{inputs[j].name}')",
                     "a Tensor")
        out[k] = ms.Tensor(a, args[j].dtype)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _signed(names: tuple[tuple[str, int], ...]) -> type[Primitive]:
    """Primitive with the MindSpore signature (``__mindspore_signature__``) of inputs ``names``,
    each with the index of its type variable (-1: a concrete dtype): the inputs of one type
    variable are one dtype group (T, T1, ...), so MindSpore converts them as it converts its own
    ops' operands (``ops.mul(x, 2.0)``) in both modes: a Python number becomes a 0-d tensor of its
    partner's dtype, tensors of two dtypes are promoted to a common one. Without it a number
    reached the op as a scalar, which MindSpore leaves out of the shapes it hands the C++
    InferShape in Graph mode: the inputs after it read past MindSpore's arrays."""
    groups = [_sig.sig_dtype.T] + [getattr(_sig.sig_dtype, f"T{k}") for k in range(1, 10)]
    signature = tuple(_sig.make_sig(n, dtype=groups[g]) if g >= 0 else _sig.make_sig(n) for n, g in names)
    return type("Primitive", (Primitive,), {"__mindspore_signature__": signature, "__module__": __name__})


def _bprop(op: OpDef, present: Sequence[bool], attrs: tuple[Any, ...], F: Any) -> Callable[..., tuple[Any, ...]]:  # noqa: N803
    """MindSpore's bprop for one primitive: ``(*inputs, out, dout) -> input grads``, evaluating the
    spec's gradient formulas (the op table's) with the primitives of namespace F. Graph mode compiles it."""
    n_in = sum(1 for p in present if p)
    if n_in not in _BPROP_ARITY:
        raise ValueError(f"[{op.name}] opforge.mindspore takes ops with 1 to {max(_BPROP_ARITY)} present inputs "
                         f"(a bprop's parameters are spelled out for Graph mode), not {n_in}")
    multi = len(op.outputs) > 1
    diff_out = tuple(k for k, o in enumerate(op.outputs) if o.differentiable)
    formula = op.bprop
    need = tuple(i.differentiable and p for i, p in zip(op.inputs, present))
    slots = tuple(present)

    def zeros(ins: tuple[Any, ...], out: Any, dout: Any) -> tuple[Any, ...]:
        return tuple(_msops.zeros_like(t) for t in ins)

    if formula is None:
        return _BPROP_ARITY[n_in](zeros)

    def impl(ins: tuple[Any, ...], out: Any, dout: Any) -> tuple[Any, ...]:
        full: tuple[Any, ...] = ()
        j = 0
        for p in slots:
            if p:
                full = full + (ins[j],)
                j = j + 1
            else:
                full = full + (None,)
        outs = out if multi else (out,)
        douts = dout if multi else (dout,)
        meta: tuple[Any, ...] = ()
        for t in full:  # (the input too: reduce_grad may sum to its shape with opforge's sum_to_like)
            meta = meta + ((None if t is None else (t.shape, t.dtype, t)),)
        douts_d: tuple[Any, ...] = ()
        for k in diff_out:
            douts_d = douts_d + (douts[k],)
        grads = formula(F, H, need, meta, *(full + tuple(outs) + douts_d + attrs))
        result: tuple[Any, ...] = ()
        for k in range(len(slots)):
            if slots[k]:
                result = result + ((grads[k] if need[k] else _msops.zeros_like(full[k])),)
        return result

    return _BPROP_ARITY[n_in](impl)


# MindSpore reads a bprop's parameters (inputs..., out, dout) from its signature: one fixed-arity
# wrapper per input count.
_Impl = Callable[[tuple[Any, ...], Any, Any], tuple[Any, ...]]  # (present inputs, out, dout) -> input grads


def _bprop1(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0,), out, dout)
    return bprop


def _bprop2(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1), out, dout)
    return bprop


def _bprop3(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2), out, dout)
    return bprop


def _bprop4(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, i3: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2, i3), out, dout)
    return bprop


def _bprop5(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, i3: Any, i4: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2, i3, i4), out, dout)
    return bprop


def _bprop6(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, i3: Any, i4: Any, i5: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2, i3, i4, i5), out, dout)
    return bprop


def _bprop7(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, i3: Any, i4: Any, i5: Any, i6: Any, out: Any, dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2, i3, i4, i5, i6), out, dout)
    return bprop


def _bprop8(impl: _Impl) -> Callable[..., tuple[Any, ...]]:
    def bprop(i0: Any, i1: Any, i2: Any, i3: Any, i4: Any, i5: Any, i6: Any, i7: Any, out: Any,
              dout: Any) -> tuple[Any, ...]:
        return impl((i0, i1, i2, i3, i4, i5, i6, i7), out, dout)
    return bprop


_BPROP_ARITY = {1: _bprop1, 2: _bprop2, 3: _bprop3, 4: _bprop4, 5: _bprop5, 6: _bprop6, 7: _bprop7, 8: _bprop8}


def _keys(op: OpDef, values: Sequence[Any]) -> tuple[Any, ...]:
    """A call's attrs as the primitive cache's key, each in its one form (opforge._opdef's
    canonical_attr: checked for type, True not 1, floats equal by their bits, lists as tuples), so
    that equal keys are the same primitive: True == 1 == 1.0 and -0.0 == 0.0 took one another's
    primitive (the first one cached), a refused value failing valid calls after it."""
    return tuple(canonical_attr(op, a, v) for a, v in zip(op.attrs, values))


_plain = plain_attr  # (a cached attr as formulas and the AOT text take it)


class Composite(nn.Cell):  # type: ignore[misc]  # (MindSpore has no type information)
    """A composite op without a bprop of its own (``square``): its spec formula over the
    primitives, as a Cell (so Graph mode compiles it); gradients flow through the primitives."""

    def __init__(self, op: OpDef, present: tuple[bool, ...], attrs: tuple[Any, ...], opset: Optional[OpSet] = None):
        super().__init__()
        if op.composite is None:
            raise ValueError(f"[{op.name}] is not a composite op")
        self.formula = op.composite
        self.slots = present
        self.attrs = attrs
        self.F: SimpleNamespace = (opset or _OWN).F

    def construct(self, *inputs: Any) -> Any:
        full: tuple[Any, ...] = ()
        j = 0
        for p in self.slots:
            if p:
                full = full + (inputs[j],)
                j = j + 1
            else:
                full = full + (None,)
        return self.formula(self.F, H, *(full + self.attrs))


class _Helpers:
    """The tensor helpers generated formulas call (see opforge/_opdef.py), in MindSpore."""

    @staticmethod
    def scalar_like(value: Any, like: Any) -> Any:
        if isinstance(value, ms.Tensor):  # a number computed from numel()s
            return _msops.cast(value, like.dtype)
        return ms.Tensor(value, like.dtype)

    @staticmethod
    def with_number(t: Any, value: Any, fn: Callable[..., Any], F: Any) -> Any:  # noqa: N803
        # a number computed from numel()s is a tensor, which with dynamic shapes holds a value known
        # only when the graph runs: MindSpore's own ops take it there (an opforge primitive beside it
        # is inferred again at run time, which MindSpore cannot do in Python: "The prim is not a
        # PrimitivePy")
        ns = _ARITHMETIC if isinstance(value, ms.Tensor) else F
        if t.dtype == ms.float16 or t.dtype == ms.bfloat16:
            wide = _msops.cast(t, ms.float32)
            return _msops.cast(fn(ns, wide, _Helpers.scalar_like(value, wide)), t.dtype)
        return fn(ns, t, _Helpers.scalar_like(value, t))

    zeros_like = staticmethod(_msops.zeros_like)
    ones_like = staticmethod(_msops.ones_like)

    @staticmethod
    def cast_like(t: Any, like: Any) -> Any:
        return t if t.dtype == like.dtype else _msops.cast(t, like.dtype)

    @staticmethod
    def numel_ratio(a: Any, b: Any) -> Any:
        if _msF.isconstant(a.shape) and _msF.isconstant(b.shape):  # (tensors: Graph mode's numbers are float32)
            if b.size == 0:
                return ms.Tensor(0.0, ms.float64)
            return ms.Tensor(a.size, ms.float64) / ms.Tensor(b.size, ms.float64)
        na, nb = _Helpers.numel(a), _Helpers.numel(b)
        return na / _msops.maximum(nb, 1.0) * _msops.minimum(nb, 1.0)  # (counts: 0 when nb is 0)

    @staticmethod
    def numel(t: Any) -> Any:
        # a float64 0-d tensor, not an int: Graph mode computes with Python numbers in float32
        if not _msF.isconstant(t.shape):
            # (sizes known only when it runs: their product by MindSpore's ops, as a tensor of the
            # Python number t.size then has a type known only at run time, and the opforge
            # primitives after it were compiled then: "The prim is not a PrimitivePy")
            return _msops.prod(_msops.cast(_msops.dyn_shape(t), ms.float64))
        return ms.Tensor(t.size, ms.float64)

    @staticmethod
    def expand_reduced(g: Any, like: Any, axes: Any, keepdims: bool) -> Any:
        if not keepdims:
            if _msF.is_sequence_shape_unknown(like.shape):
                raise ValueError("[opforge.mindspore] the gradient of a reduction without keepdims needs its "
                                 "input's rank, which a Tensor(shape=None) input leaves unknown: declare the "
                                 "input with its rank (None for each size) in set_inputs")
            rank = len(like.shape)
            if axes is None:
                axes = tuple(range(rank))
            elif isinstance(axes, int):
                axes = (axes,)
            # (a 0-d tensor's axis 0 or -1 is no axis; [] is every axis: g is 0-d). In increasing
            # order by a loop over the dims: Graph mode failed to compile sorted() of a comprehension
            # over axis lists of two lengths in one graph (mean(x) beside mean(z, axis=[1]))
            for a in range(rank):
                if a in axes or a - rank in axes:
                    g = _msops.expand_dims(g, a)
        if not _msF.isconstant(like.shape):
            # (sizes known only when it runs: broadcast by a product with ones, as BroadcastTo to a
            # shape computed when the graph runs refuses 1 -> 0, and an opforge primitive after it
            # was inferred again at run time, which MindSpore cannot do: "The prim is not a
            # PrimitivePy")
            return _msops.mul(g, _msops.ones_like(like))
        return _msops.broadcast_to(g, like.shape)

    @staticmethod
    def reduce_grad(g: Any, meta: Any) -> Any:
        shape, dtype, like = meta
        if not _msF.isconstant(g.shape) or not _msF.isconstant(shape) or dtype == ms.bfloat16:
            # (sizes or rank known only when it runs, a Cell's set_inputs in Graph mode, where the
            # tuple arithmetic below cannot run; bfloat16, which MindSpore's sum has no CPU kernel for:
            # opforge's own sum_to_like, which takes both, an empty axis summing to 0)
            g = g if g.dtype == dtype else _msops.cast(g, dtype)
            return _OWN.F.sum_to_like(g, like)
        gshape = tuple(g.shape)
        shape = tuple(shape)
        if 0 in gshape:  # MindSpore's sum over an empty axis is not 0
            return _msops.zeros(shape, dtype)
        if gshape != shape:
            lead = len(gshape) - len(shape)
            axes = tuple(range(lead)) + tuple(
                lead + k for k, s in enumerate(shape) if s == 1 and gshape[lead + k] != 1)
            if axes:
                g = _msops.sum(g, axes, keepdim=True)
            g = _msops.reshape(g, shape)
        return g if g.dtype == dtype else _msops.cast(g, dtype)


H = _Helpers()
# MindSpore's own arithmetic, for numbers known only when a graph runs (_Helpers.with_number)
_ARITHMETIC = SimpleNamespace(add=_msops.add, sub=_msops.sub, mul=_msops.mul, div=_msops.div)


class OpSet:
    """The ops of one op table as MindSpore primitives: opforge's own (this module's ``ops``,
    ``functional`` and ``primitive``) or an op module's (``register_module``).

    - ``ops.<name>``: the op's primitive with its default attrs and every input present (ops with a
      required attr, and composite ops without a bprop, as their ``functional`` form);
    - ``functional.<name>(*inputs, **attrs)``: picks the primitive per call (PyNative code);
    - ``primitive(name, without=(...), **attrs)``: the (cached) primitive for other attrs or
      without some optional inputs;
    - ``F``: the namespace bprop and composite formulas compute with (an op module's formulas may
      call opforge's own ops too)."""

    def __init__(self, table: dict[str, OpDef], library: str, kernels: Any, meta: Any, label: str,
                 base: Optional[OpSet] = None) -> None:
        self.table = table
        self.library = library
        self.kernels = kernels  # the ops' Python entries (their docstrings)
        self.meta = meta
        self.label = label
        self.F: SimpleNamespace = SimpleNamespace(**(vars(base.F) if base is not None else {}))
        _SETS[library] = self
        self.functional: SimpleNamespace = SimpleNamespace(**{name: self._functional(op) for name, op in table.items()})
        self.ops: SimpleNamespace = SimpleNamespace(**{name: self._default(op) for name, op in table.items()})
        for name, op in table.items():
            simple = not op.attrs and not any(i.optional for i in op.inputs) and not (op.composite and not op.bprop)
            setattr(self.F, name, getattr(self.ops, name) if simple else getattr(self.functional, name))

    def _make(self, op: OpDef, present: tuple[bool, ...], attrs: tuple[Any, ...]) -> Any:
        values = tuple(_plain(a) for a in attrs)
        if op.composite is not None and op.bprop is None:
            return Composite(op, present, values, self)
        return _new_primitive(op, present, values, self)

    def primitive(self, name: str, *, without: Sequence[str] = (), **attrs: Any) -> Any:
        """The MindSpore primitive of op ``name`` with these attrs (the others at their defaults)
        and without the optional inputs named in ``without``. Cached: equal arguments give the same
        primitive. Composite ops without a bprop give a ``Composite`` cell over the primitives."""
        op = self.table.get(name)
        if op is None:
            raise ValueError(f"[{self.label}] unknown op '{name}'; known ops: {', '.join(sorted(self.table))}")
        values = _full_attrs(op, (), dict(attrs))
        names = {i.name for i in op.inputs}
        for w in without:
            if w not in names or not op.inputs[op.input_index(w)].optional:
                optional = [i.name for i in op.inputs if i.optional]
                raise ValueError(f"[{name}] '{w}' is not an optional input; optional inputs: "
                                 f"{', '.join(optional) or 'none'}")
        present = tuple(i.name not in without for i in op.inputs)
        return _primitive(self.library, name, present, _keys(op, values))

    def _functional(self, op: OpDef) -> Callable[..., Any]:
        library, F = self.library, self.F  # noqa: N806

        def call(*args: Any, **kwargs: Any) -> Any:
            return _call(library, F, op, args, kwargs)

        call.__name__ = op.name
        call.__doc__ = getattr(self.kernels, op.name).__doc__
        return call

    def _default(self, op: OpDef) -> Any:
        if any(a.required for a in op.attrs):
            return getattr(self.functional, op.name)
        if op.aot_kernel is None:
            return self.primitive(op.name)
        try:
            present = tuple(True for _ in op.inputs)
            defaults = _keys(op, [a.default for a in op.attrs])
            if self.table.get(op.name) is op:
                return _primitive(self.library, op.name, present, defaults)
            return self._make(op, present, defaults)
        except RuntimeError as e:  # an aot op whose library is not there: the other ops still import
            message = str(e)

            def unavailable(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(message)

            unavailable.__name__ = op.name
            return unavailable


# the op sets by library (opforge's own and registered modules')
_SETS: dict[str, OpSet] = {}
_REGISTERING = threading.RLock()


# (module-level, cached and called with constants only: Graph mode runs it while it compiles a
# formula that calls an op's functional form. Not bounded: MindSpore keeps each Custom op's kernel,
# ~100 KB, whether the cache does or not (tried: 512 entries saved a fifth of it), and om.ops
# are the cached defaults, which must stay the same objects)
@functools.lru_cache(maxsize=None)
def _primitive(library: str, name: str, present: tuple[bool, ...], attrs: tuple[Any, ...]) -> Any:
    opset = _SETS[library]
    return opset._make(opset.table[name], present, attrs)


def _call(library: str, F: Any, op: OpDef, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:  # noqa: N803
    n_in = len(op.inputs)
    inputs = list(args[:n_in])
    for i in op.inputs[len(inputs):]:
        if i.name in kwargs:
            inputs.append(kwargs.pop(i.name))
        elif i.optional:
            inputs.append(None)
        else:
            raise TypeError(f"[{op.name}] missing input '{i.name}'")
    for i, t in zip(op.inputs, inputs):
        if t is None and not i.optional:
            raise TypeError(f"[{op.name}] input '{i.name}' is required (not optional): got None")
    values = _full_attrs(op, args[n_in:], kwargs)
    present = tuple(t is not None for t in inputs)
    if op.composite is not None and op.bprop is None:
        return op.composite(F, H, *inputs, *(_plain(v) for v in _keys(op, values)))
    prim = _primitive(library, op.name, present, _keys(op, values))
    return prim(*(t for t in inputs if t is not None))


_OWN = OpSet(_formulas.OPS, LIBRARY, _C.ops, _C._meta, "opforge.mindspore")

#: Every op as a MindSpore primitive with its default attrs and all inputs present (ops with a
#: required attr, and composite ops, as their ``functional`` form).
ops = _OWN.ops
#: Every op as a function picking its primitive per call (PyNative code; attrs as keywords).
functional = _OWN.functional
#: The primitive of an op for given attrs and present inputs (see OpSet.primitive).
primitive = _OWN.primitive
#: The namespace bprop and composite formulas compute with.
F = _OWN.F


def _default(op: OpDef) -> Any:
    """The default form of one of opforge's own ops (see OpSet)."""
    return _OWN._default(op)


def register_module(module: Any) -> OpSet:
    """The ops of an op module (``opforge.load``'s result, a package's ``<pkg>._ops``) as MindSpore
    primitives, as opforge's own are: returns its ``OpSet`` (``.ops``, ``.functional``,
    ``.primitive``), whose primitives call the module's AOT entry points in its own library, with
    bprops from its formulas (which may call opforge's own ops). Registering a module again gives
    the same OpSet; a reloaded module (a new library) gets a new one."""
    table = getattr(module, "__opforge_formulas__", None)
    library = getattr(module, "__file__", None)
    if table is None or library is None:
        raise TypeError(f"[opforge.mindspore] {module!r} is not an opforge op module (no __opforge_formulas__): "
                        "pass what opforge.load returns or a package's <pkg>._ops")
    with _REGISTERING:  # (threads registering one module at once get one OpSet)
        opset = _SETS.get(library)
        if opset is None or opset.table is not table:
            if opset is not None:  # the same library, another table: no primitive of the old one stays
                _primitive.cache_clear()
            opset = OpSet(table, library, module, module._meta, f"opforge.mindspore: {module.__name__}", base=_OWN)
    return opset
