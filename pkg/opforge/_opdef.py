"""The records of the generated op table (``opforge._formulas``) that framework adapters read.

Each op's inputs, attrs, outputs and shape rules are data; its composite formula and gradient
formulas are Python functions generated from the spec. Those functions compute with two
namespaces the adapter passes in: ``F``, the framework's own registered opforge ops
(``F.mul(a, b)``), and ``H``, its tensor helpers:

- ``H.scalar_like(value, t)``: a 0-d tensor of t's dtype holding value;
- ``H.with_number(t, value, fn, F)``: ``fn(F, t, value as a 0-d tensor)`` for a formula's ``t * 0.5``
  (``fn`` calls the operator's op of the namespace it is given), computed in float32 when t is
  float16 or bfloat16 (t widened, the result rounded back once);
- ``H.zeros_like(t)``, ``H.ones_like(t)``, ``H.numel(t)``, ``H.numel_ratio(a, b)`` (numel(a) / numel(b),
  0 when b is empty), ``H.cast_like(t, like)`` (t in like's
  dtype: derived formulas reading a tensor of another type variable);
- ``H.expand_reduced(g, like, axes, keepdims)``: g, reduced from like over axes, broadcast back;
- ``H.reduce_grad(g, meta)``: a gradient summed to an input's shape and cast to its dtype,
  ``meta`` being what the adapter recorded of that input;
- shape rules: ``H.dim(op, input, shape, i)`` (size i of a shape, ValueError when out of range),
  ``H.shape_str(shape)`` ("(2, 3)", as the runtime prints shapes), ``H.check(op, test, message)``
  (ValueError "[op] message()" unless test; symbolic tests become the framework's constraints).
"""

from __future__ import annotations

import re
import struct
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np


class TargetDef(NamedTuple):
    """A row of the target table (codegen/targets.py): how frameworks name a target's device."""

    name: str                 # cpu | cuda | ascend (a spec's targets key)
    device_type: str          # Tensor.device's prefix and torch's device type
    torch_dispatch_key: str
    mindspore_target: str     # CPU | GPU | Ascend
    dlpack_device_type: int


class BuildDef(NamedTuple):
    """A wheel backend of the target table: its label, the targets it compiles, whether it exists yet."""

    backend: str              # cpu | cuda (meson's ops_backend, opforge build --backend)
    wheel_label: str          # opforge-<version>+<label>
    targets: tuple[str, ...]
    available: bool
    runtime_requires: tuple[str, ...]  # PyPI requirements the wheel adds (nvidia-cuda-runtime~=13.0)
    runtime_libs: tuple[str, ...]      # "package:path" of their libraries that opforge._C links


class InputDef(NamedTuple):
    name: str
    dtype: str            # a type variable or a concrete dtype
    optional: bool
    differentiable: bool
    shape_only: bool = False  # only its shape and dtype are read (a stand-in without values will do)


class AttrDef(NamedTuple):
    name: str
    type: str             # bool | int | float | str | list[int] | list[float]
    required: bool
    default: Any          # None when required or when the attr is optional without a value
    choices: Optional[tuple[Any, ...]]
    axis_of: tuple[str, ...] = ()  # the inputs whose dimensions it indexes (an axis attr)


class OutputDef(NamedTuple):
    name: str
    dtype: str
    shape: str            # same | broadcast | reduce | matmul | infer | expression (see shapes)
    shape_args: tuple[Any, ...]  # the rule's arguments as written in the spec
    differentiable: bool


class OpDef(NamedTuple):
    name: str
    doc: str
    impl: str             # expr | cpp | composite | aot
    typevars: tuple[str, ...]
    inputs: tuple[InputDef, ...]
    attrs: tuple[AttrDef, ...]
    outputs: tuple[OutputDef, ...]
    composite: Optional[Callable[..., Any]]  # (F, H, *inputs, *attrs) -> tensor, for composite ops
    bprop: Optional[Callable[..., tuple[Any, ...]]]  # (F, H, need, meta, *inputs, *outputs, *douts, *attrs) -> grads
    saved: tuple[tuple[str, tuple[int, ...]], ...]  # (tensor name, input indices whose gradient reads it)
    aot_symbols: tuple[tuple[int, str], ...]  # (mask of present inputs, exported AOT entry point)
    aot_kernel: Optional[tuple[str, str]]  # (library, symbol) of an aot op's external kernel, else None
    runs: tuple[str, ...] = ("cpu",)  # the targets whose calls this build runs (its rows with compiled kernels)
    # forward mode: (F, H, tangents, *inputs, *outputs, *attrs) -> one tangent (or None) per output,
    # ``tangents`` one per input (None where none was given); None when the op has no jvp
    jvp: Optional[Callable[..., tuple[Any, ...]]] = None
    # the spec's checks and shape expressions: (H, *input shapes (None when absent), *attrs) -> one
    # shape (a list of sizes, symbolic ones kept) or None per output; None when the op has neither
    shapes: Optional[Callable[..., tuple[Any, ...]]] = None
    autocast: Optional[str] = None  # the spec's policy under autocast: lower | float32 | promote
    batch_inputs: tuple[str, ...] = ()  # inputs whose leading dims the op maps independently (vmap)

    def aot_symbol(self, present: tuple[bool, ...]) -> str:
        """The AOT entry point for a call whose inputs are present (a bool per input)."""
        mask = sum(1 << k for k, p in enumerate(present) if p)
        return next(sym for m, sym in self.aot_symbols if m == mask)

    def input_index(self, name: str) -> int:
        return next(k for k, i in enumerate(self.inputs) if i.name == name)

    def axis_indexed(self) -> set[int]:
        """The inputs its axis attrs index (the spec's ``axis_of``)."""
        return {self.input_index(n) for a in self.attrs for n in a.axis_of}

    def outputs_follow_axes(self) -> bool:
        """Whether every output's shape comes from inputs its axis attrs index, so that a batch
        dim put first on those inputs is dim 0 of every output (vmap's axes rule); not so for
        layer_norm_affine_backward, whose dweight is shaped like weight, which no axis indexes."""
        names = {i.name for i in self.inputs}
        indexed = self.axis_indexed()
        return all(self.input_index(n) in indexed for o in self.outputs
                   for n in re.findall(r"[A-Za-z_]\w*", " ".join([o.shape, *map(str, o.shape_args)]))
                   if n in names)


def axes(value: Any, rank: int) -> list[int]:
    """An axis attr's value (an int, a list, or None or an empty list: every axis, as the runtime's
    normalize_axes takes them) as sorted non-negative axes of a rank-``rank`` shape (a 0-d tensor's
    axis 0 or -1 is no axis, as in the runtime)."""
    given = [] if value is None else [value] if isinstance(value, int) else list(value)
    if not given or rank == 0:
        return list(range(rank))
    return sorted({a + rank if a < 0 else a for a in given})


def kind_shape(out: OutputDef, ins: dict[str, Any], attrs: dict[str, Any],
               broadcast: Callable[..., Sequence[Any]]) -> Optional[list[Any]]:
    """An output's shape by its rule's kind (same, broadcast, reduce, matmul) on input shapes
    whose sizes may be symbolic (a framework's: torch's SymInts, JAX's dim variables), kept so;
    ``broadcast`` the framework's broadcast of shapes. None for the other kinds (infer(), spec
    expressions: the op's ``shapes``)."""
    a = out.shape_args
    if out.shape == "same":
        return list(ins[a[0]])
    if out.shape == "broadcast":
        return list(broadcast(*(tuple(ins[n]) for n in a if ins.get(n) is not None)))
    if out.shape == "reduce":
        x = list(ins[a[0]])
        keep = {"true": True, "false": False}.get(a[2], attrs.get(a[2]))
        named = axes(attrs[a[1]], len(x))
        return [1 if k in named else n for k, n in enumerate(x) if keep or k not in named]
    if out.shape == "matmul":
        sa, sb = list(ins[a[0]]), list(ins[a[1]])
        va, vb = len(sa) == 1, len(sb) == 1
        sa = [1] + sa if va else sa
        sb = sb + [1] if vb else sb
        batch = list(broadcast(tuple(sa[:-2]), tuple(sb[:-2])))
        return batch + ([] if va else [sa[-2]]) + ([] if vb else [sb[-1]])
    return None


class ShapeHelpers:
    """The framework-independent part of an adapter's ``H``: the helpers of shape rules."""

    @staticmethod
    def dim(op: str, name: str, shape: Sequence[Any], i: int) -> Any:
        if not -len(shape) <= i < len(shape):
            raise ValueError(f"[{op}] dimension {i} of {name} is out of range for its shape "
                             f"{ShapeHelpers.shape_str(shape)}")
        return shape[i]

    @staticmethod
    def shape_str(shape: Sequence[Any]) -> str:
        return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"

    @staticmethod
    def check(op: str, test: Any, message: Callable[[], str]) -> None:
        if not test:
            raise ValueError(f"[{op}] {message()}")

    # The functions of checks, on sizes that may be symbolic (torch's SymInts, JAX's dimension
    # expressions): compared by == alone, combined by _either/_all, and taken as 1 only where
    # _known_one says so, which an adapter whose sizes may be data-dependent overrides (torch:
    # never a guard on an unbacked size; the test becomes a constraint checked at run time).

    @staticmethod
    def _known_one(n: Any) -> bool:
        return bool(n == 1)

    @staticmethod
    def _either(a: Any, b: Any) -> Any:
        return a or b

    @staticmethod
    def _all(tests: Sequence[Any]) -> Any:
        return all(tests)

    @staticmethod
    def _not(test: Any) -> Any:
        return not test

    @classmethod
    def dims_equal(cls, a: Sequence[Any], b: Sequence[Any]) -> Any:
        """A check's ``shape(a) == shape(b)``: one test over the sizes (for torch a SymBool, a
        constraint checked at run time, where list equality asked a yes or no of each size)."""
        a, b = list(a), list(b)
        return len(a) == len(b) and cls._all([x == y for x, y in zip(a, b)])

    @classmethod
    def dims_differ(cls, a: Sequence[Any], b: Sequence[Any]) -> Any:
        return cls._not(cls.dims_equal(a, b))

    @staticmethod
    def drop(op: str, d: Sequence[Any], i: int) -> list[Any]:
        d = list(d)
        if not d and i in (0, -1):
            return d
        if not -len(d) <= i < len(d):
            raise ValueError(f"[{op}] dimension {i} is out of range for dimensions {ShapeHelpers.shape_str(d)}")
        del d[i]
        return d

    @classmethod
    def broadcasts(cls, d: Sequence[Any], to: Sequence[Any]) -> Any:
        lead = len(to) - len(d)
        if lead < 0:
            return False
        return cls._all([cls._either(n == to[lead + k], n == 1) for k, n in enumerate(d)])

    @classmethod
    def broadcast(cls, op: str, names: Sequence[str], *shapes: Sequence[Any]) -> list[Any]:
        nd = max(len(s) for s in shapes)
        out: list[Any] = [None] * nd

        def message() -> str:
            given = ", ".join(f"{name} {cls.shape_str(t)}" for name, t in zip(names, shapes))
            return f"shapes cannot be broadcast together: {given}"

        for s in shapes:
            for k, n in enumerate(s):
                j = nd - len(s) + k
                o = out[j]
                if o is None or cls._known_one(o):
                    out[j] = n
                elif not (n is o or cls._known_one(n)):
                    cls.check(op, n == o, message)
        return [1 if o is None else o for o in out]

    @staticmethod
    def reduce(op: str, shape: Sequence[Any], axis: Any, keepdims: bool) -> list[Any]:
        rank = len(shape)
        seen: set[int] = set()
        for a in [] if axis is None else [axis] if isinstance(axis, int) else list(axis):  # (check_axes')
            if not -max(rank, 1) <= a < max(rank, 1):
                raise IndexError(f"[{op}] axis {a} is out of range for a tensor of rank {rank}")
            if rank and a % rank in seen:
                raise ValueError(f"[{op}] axis {a} is repeated")
            seen.add(a % max(rank, 1))
        named = axes(axis, rank)
        return [1 if k in named else n for k, n in enumerate(shape) if keepdims or k not in named]

    @classmethod
    def matmul(cls, op: str, a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
        sa, sb, shown = list(a), list(b), f"{cls.shape_str(a)} @ {cls.shape_str(b)}"
        if not sa or not sb:
            raise ValueError(f"[{op}] matmul needs inputs of rank >= 1, got {cls.shape_str(a)} and "
                             f"{cls.shape_str(b)}")
        a2 = [1] + sa if len(sa) == 1 else sa
        b2 = sb + [1] if len(sb) == 1 else sb
        cls.check(op, a2[-1] == b2[-2], lambda: f"matmul inner dimensions differ: {shown}")
        try:
            batch = cls.broadcast(op, ("a", "b"), a2[:-2], b2[:-2])
        except ValueError:
            raise ValueError(f"[{op}] matmul batch dimensions cannot be broadcast: {shown}") from None
        return batch + ([a2[-2]] if len(sa) > 1 else []) + ([b2[-1]] if len(sb) > 1 else [])


# ---------------------------------------------------------------------------- attr values


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def canonical_attr(op: OpDef, attr: AttrDef, value: Any) -> Any:
    """An attr's value in its one Python form (bool, int, float, str, tuple): what an adapter binds,
    compares and hashes (jax.jit's static arguments, opforge.mindspore's primitive cache: both by
    equality, and True == 1 == 1.0, -0.0 == 0.0), so a value of the wrong type is refused here
    rather than taken for an equal one; ranges and choices are the meta rule's to check."""
    if value is None:
        return None
    t = attr.type
    if t == "bool" and isinstance(value, (bool, np.bool_)):
        return bool(value)
    if t == "int" and _is_int(value):
        return int(value)
    if t == "float" and (_is_int(value) or isinstance(value, (float, np.floating))):
        return _float(op, attr, value)
    if t == "str" and isinstance(value, str):
        return value
    if t == "list[int]" and _is_int(value):  # (one int for a list of ints, as opforge's functions take it)
        return (int(value),)
    if t.startswith("list[") and isinstance(value, np.ndarray) and value.ndim == 0:  # (one number)
        return canonical_attr(op, attr, value.item())
    if t.startswith("list[") and isinstance(value, (list, tuple, np.ndarray)):
        items = list(np.asarray(value).tolist()) if isinstance(value, np.ndarray) else list(value)
        if t == "list[int]" and all(_is_int(v) for v in items):
            return tuple(int(v) for v in items)
        if t == "list[float]" and all(_is_int(v) or isinstance(v, (float, np.floating)) for v in items):
            return tuple(_float(op, attr, v) for v in items)
    raise TypeError(f"[{op.name}] attr '{attr.name}' must be {'an' if t == 'int' else 'a'} {t}"
                    f"{' or None' if not attr.required and attr.default is None else ''}, got {type(value).__name__}")


class AttrFloat(float):
    """A float attr as a cache key (jax.jit's static arguments, opforge.mindspore's primitives):
    equal to another float only with the same bits, so that -0.0 and 0.0 (equal as floats, and
    giving different results: leaky_relu's alpha, clamp's bounds) compile apart, and a NaN finds its
    own entry again. Against any other number, a float; formulas and meta rules get plain floats."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, float):
            return struct.pack("<d", self) == struct.pack("<d", other)
        return float.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(struct.pack("<d", self))


def _float(op: OpDef, attr: AttrDef, value: Any) -> AttrFloat:
    # (no try: MindSpore's Graph mode compiles this, in a functional call's attrs, and has no try)
    if _is_int(value) and abs(int(value)) >= 2**1024 - 2**970:  # (rounds past float64's largest value)
        raise ValueError(f"[{op.name}] attr '{attr.name}' is out of range for float")
    return AttrFloat(value)


def check_number(op: OpDef, input_name: str, value: Any, dtype_name: str, kind: str,
                 bounds: tuple[int, int], by: str, container: str) -> None:
    """A Python number for an input of dtype ``dtype_name`` (``kind``: "b" bool, "i" integer, "f"
    floating; ``bounds`` an integer dtype's range), checked as opforge's own API checks numbers: a
    float for a bool or integer input is a TypeError, an int out of the range (or past float64's,
    for a floating input) a ValueError, both naming the op; ``by`` says which input bound the dtype
    and ``container`` what to pass instead ("an array", "a tensor")."""
    where = f"[{op.name}] input '{input_name}'"
    if isinstance(value, float) and kind != "f":
        raise TypeError(f"{where}: a Python float cannot be {dtype_name}{by}; pass {container} of the intended dtype")
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = (0, 1) if kind == "b" else bounds if kind == "i" else (-(2**1024 - 2**970) + 1, 2**1024 - 2**970 - 1)
        if not low <= value <= high:
            shown = f" {value}" if kind != "f" else ""
            raise ValueError(f"{where}: the Python int{shown} is out of range for {dtype_name}{by}")


def plain_attr(value: Any) -> Any:
    """A canonical attr as formulas, meta rules and text take it: plain floats (an AttrFloat's
    equality is its bits', for caches alone), lists for tuples."""
    if isinstance(value, tuple):
        return [float(v) if isinstance(v, AttrFloat) else v for v in value]
    return float(value) if isinstance(value, AttrFloat) else value
