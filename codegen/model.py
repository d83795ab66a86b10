"""The spec model: frozen dataclasses with enums for every closed vocabulary, built from located
YAML (``OpSpec.from_yaml``) with each op's own invariants, and turned back into YAML (``to_yaml``).

No I/O and no target-language text: kernel files and cross-op calls are checked by ``load``;
formulas are parsed and checked by ``formula`` (an expr is checked by lowering it, and the code is
dropped), lowered for output by ``api``, and generated text is made by ``dest``."""

from __future__ import annotations

import ast as pyast
import itertools
import math
import re
import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, Union

import yaml

from .errors import Loc, SpecError, SpecErrors, did_you_mean
from .formula.expr import ExprScope, lower_expr
from .formula.kinds import Kind
from .formula import derive, dims
from .formula.syntax import Binary, Formula, make_formula
from .names import RESERVED, RUNTIME_CLASSES, class_name, reserved_identifier
from .source import LocMap, locate
from .targets import HOST, Backend

# ---------------------------------------------------------------------------- vocabularies
# (StrEnums: each member is its spec spelling, so a member prints, hashes and compares as that text.
# Code compares members with ==, not `is`: opforge.load's cache of parsed specs reads them back as
# plain strings, which equal their members.)


class DType(StrEnum):
    BOOL = "bool"
    UINT8 = "uint8"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def is_float(self) -> bool:
        return self in FLOAT_DTYPES


FLOAT_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64})


class Format(StrEnum):
    DEFAULT = "DefaultFormat"
    NCHW = "NCHW"
    NHWC = "NHWC"


class AttrType(StrEnum):
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    INT_LIST = "list[int]"
    FLOAT_LIST = "list[float]"


class ShapeKind(StrEnum):
    SAME = "same"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    MATMUL = "matmul"
    INFER = "infer"
    EXPRESSION = "expression"  # a shape expression (formula/dims.py), not a rule name


class ImplKind(StrEnum):
    EXPR = "expr"
    COMPOSITE = "composite"
    CPP = "cpp"
    AOT = "aot"
    PYFUNC = "pyfunc"


MAX_INPUTS = 8  # see _Builder.build
INT64 = (-(2 ** 63), 2 ** 63 - 1)
_SHAPE = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$")


def _dtype(text: str) -> str:
    """A concrete dtype as its DType, a type variable as its name."""
    try:
        return DType(text)
    except ValueError:
        return text


# ---------------------------------------------------------------------------- parts


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str            # a type variable, or a DType
    optional: bool
    differentiable: bool
    doc: str
    loc: Loc
    shape_only: bool = False  # only its shape and dtype are read (never differentiable)


@dataclass(frozen=True)
class ShapeRule:
    kind: ShapeKind
    args: tuple[str, ...]
    text: str
    formula: Optional[Formula] = None  # an expression rule's parsed text

    def inputs(self) -> tuple[str, ...]:
        """The inputs this rule reads shapes from."""
        if self.kind in (ShapeKind.SAME, ShapeKind.REDUCE):
            return self.args[:1]
        if self.kind in (ShapeKind.BROADCAST, ShapeKind.MATMUL):
            return self.args
        return ()


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str            # a type variable, or a DType
    shape: ShapeRule
    differentiable: bool
    doc: str
    loc: Loc

    @property
    def grad_name(self) -> str:
        return "d" + self.name


AttrValue = Union[bool, int, float, str, tuple[int, ...], tuple[float, ...]]


@dataclass(frozen=True)
class Attr:
    name: str
    type: AttrType
    default: Any          # an AttrValue; None when there is no default
    has_default: bool
    required: bool
    choices: Optional[tuple[Any, ...]]
    min: Optional[float]
    max: Optional[float]
    doc: str
    loc: Loc
    axis_of: tuple[str, ...] = ()  # inputs whose dimensions this (int or list[int]) attr indexes

    @property
    def optional_value(self) -> bool:
        """Not required and no default: the value may be absent (None)."""
        return not self.required and not self.has_default


@dataclass(frozen=True)
class Target:
    name: Backend
    dtypes: tuple[tuple[str, tuple[DType, ...]], ...]   # type variable -> allowed dtypes
    formats: tuple[Format, ...]

    def rows(self) -> list[tuple[dict[str, DType], Format]]:
        """Every (type-variable binding, format) combination: the registration rows."""
        names = [v for v, _ in self.dtypes]
        combos = itertools.product(*[d for _, d in self.dtypes]) if names else [()]
        return [(dict(zip(names, combo)), fmt) for combo in combos for fmt in self.formats]


# -- one Impl type per kind


@dataclass(frozen=True)
class Impl:
    """How an op computes its outputs; one subclass per ImplKind."""

    kind: ClassVar[ImplKind]
    loc: Loc


@dataclass(frozen=True)
class ExprImpl(Impl):
    """Elementwise expressions over the inputs and attrs, one per output in output order, compiled
    per dtype into one kernel that writes every output in one pass."""

    kind: ClassVar[ImplKind] = ImplKind.EXPR
    formulas: tuple[tuple[str, Formula], ...]   # output name -> formula

    @property
    def mapping(self) -> bool:
        """Written as a mapping output -> formula (``expr: {s: sin(x), c: cos(x)}``), not one string."""
        return any(f.key != "impl.expr" for _, f in self.formulas)


@dataclass(frozen=True)
class CompositeImpl(Impl):
    """A formula over other ops (no kernel)."""

    kind: ClassVar[ImplKind] = ImplKind.COMPOSITE
    formula: Formula


@dataclass(frozen=True)
class CppImpl(Impl):
    """A hand-written kernel, ``src/kernels/<target>/<op>.cpp`` per built target."""

    kind: ClassVar[ImplKind] = ImplKind.CPP


@dataclass(frozen=True)
class AotImpl(Impl):
    """A function of an external shared library with MindSpore's AOT C ABI."""

    kind: ClassVar[ImplKind] = ImplKind.AOT
    library: str
    symbol: str


@dataclass(frozen=True)
class PyfuncImpl(Impl):
    """A Python function ``module:function`` on NumPy arrays (CPU; for prototyping)."""

    kind: ClassVar[ImplKind] = ImplKind.PYFUNC
    function: str         # "module:function"


@dataclass(frozen=True)
class Bprop:
    lets: tuple[tuple[tuple[str, ...], Formula], ...]   # names bound (several: the outputs of one call)
    grads: tuple[tuple[str, Formula], ...]   # input name -> formula
    loc: Loc
    derived: str = ""  # "" when written in the spec, else what it was derived from ("impl.expr")


@dataclass(frozen=True)
class Jvp:
    """Forward mode: the tangent of each differentiable output from the inputs' tangents
    (``<input>_t``, zeros where the caller gives none), the primal inputs, attrs and outputs."""

    lets: tuple[tuple[tuple[str, ...], Formula], ...]
    tangents: tuple[tuple[str, Formula], ...]   # output name -> formula
    loc: Loc
    derived: str = ""  # "" when written, "impl.expr" (symbolic), "bprop" (elementwise and linear)


@dataclass(frozen=True)
class TestSpec:
    reference: str
    domain: tuple[tuple[str, tuple[float, float]], ...]
    attrs: tuple[tuple[tuple[str, Any], ...], ...]
    shapes: tuple[tuple[Optional[tuple[int, ...]], ...], ...]
    tolerance: tuple[tuple[str, tuple[float, float]], ...]
    grad_tolerance: Optional[tuple[float, float]]


@dataclass(frozen=True)
class OpSpec:
    name: str
    path: str
    loc: Loc
    doc: str
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    attrs: tuple[Attr, ...]
    typevars: tuple[tuple[str, tuple[DType, ...]], ...]
    targets: tuple[Target, ...]
    impl: Impl
    bprop: Optional[Bprop]
    tests: Optional[TestSpec]
    # no `targets` key: the rows were derived (every built target, every declared dtype, every
    # format), as MindSpore derives registration info from the inputs when none is given; kept so
    # that to_yaml leaves the key out again (naming the built targets would fix them to this build's)
    targets_derived: bool = False
    jvp: Optional[Jvp] = None
    checks: tuple[dims.Check, ...] = ()  # conditions on shapes and attrs, checked before shape rules run
    autocast: Optional[str] = None  # policy under a framework's autocast: lower, float32, promote
    batch_inputs: tuple[str, ...] = ()  # inputs whose leading dims are independent rows (vmap)
    inplace: Optional[str] = None  # the in-place variant's name (add_): writes the output into inputs[0]
    foreach: bool = False  # opforge.foreach runs it over lists of tensors in one call (opforge.optim's steps)

    @property
    def class_name(self) -> str:
        return class_name(self.name)

    def input(self, name: str) -> Input:
        return next(i for i in self.inputs if i.name == name)

    def attr(self, name: str) -> Attr:
        return next(a for a in self.attrs if a.name == name)

    def target(self, name: str) -> Optional[Target]:
        return next((t for t in self.targets if t.name == name), None)

    @property
    def differentiable_inputs(self) -> tuple[Input, ...]:
        return tuple(i for i in self.inputs if i.differentiable)

    @property
    def has_autograd_function(self) -> bool:
        """A Function class is generated unless a composite op composes its gradient."""
        return not (isinstance(self.impl, CompositeImpl) and self.bprop is None)

    def formulas(self) -> list[Formula]:
        """The graph formulas: the composite's, bprop lets and gradients, jvp lets and tangents."""
        out = [self.impl.formula] if isinstance(self.impl, CompositeImpl) else []
        out += [f for _, f in self.bprop.lets + self.bprop.grads] if self.bprop else []
        return out + ([f for _, f in self.jvp.lets + self.jvp.tangents] if self.jvp else [])

    def tangent_name(self, input_name: str) -> str:
        """How jvp formulas name an input's tangent."""
        return derive.tangent(input_name)

    @staticmethod
    def from_yaml(name: str, doc: LocMap) -> "OpSpec":
        """The op ``name`` of a located, schema-checked spec document (raises SpecErrors)."""
        return _Builder(name, doc).build()

    def to_yaml(self) -> str:
        """The spec file text of this op, every derived default written out (but `targets`, left
        out when the spec left it out): parsing it gives an OpSpec equal to this one but for
        locations."""
        return yaml.dump({self.name: _yaml_body(self)}, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                         default_flow_style=False, width=100)


def expr_scope(inputs: Sequence[Input], attrs: Sequence[Attr], outputs: Sequence[Output],
               typevars: Mapping[str, Sequence[str]]) -> ExprScope:
    """The names an expr op's formula sees: its inputs' elements and its scalar attrs; and whether
    its arithmetic may see integers (a dtype of an input or output that is not a float)."""
    dtypes = {d for t in [*(i.dtype for i in inputs), *(o.dtype for o in outputs)] for d in typevars.get(t, (t,))}
    return ExprScope([i.name for i in inputs], {a.name: Kind(str(a.type)) for a in attrs},
                     {a.name for a in attrs if a.optional_value},
                     {a.name: a.choices for a in attrs if a.choices is not None},
                     integral=any(d not in FLOAT_DTYPES for d in dtypes))


# ---------------------------------------------------------------------------- back to YAML


def derive_formulas(impl: ExprImpl, inputs: Sequence[Input], outputs: Sequence[Output], attrs: Sequence[str],
                    mode: str) -> tuple[tuple[tuple[tuple[str, ...], Formula], ...], tuple[tuple[str, Formula], ...]]:
    """An expr op's bprop (mode "bprop") or jvp (mode "jvp") formulas by symbolic differentiation,
    as (lets, formulas) located at its impl.expr (raises derive.DeriveError)."""
    op = derive.ExprOp([i.name for i in inputs], [i.name for i in inputs if i.differentiable],
                       [(n, f.ast) for n, f in impl.formulas], [o.name for o in outputs if o.differentiable],
                       {**{i.name: i.dtype for i in inputs}, **{o.name: o.dtype for o in outputs}})
    taken = ({i.name for i in inputs} | {o.name for o in outputs} | set(attrs)
             | {"d" + o.name for o in outputs} | {derive.tangent(i.name) for i in inputs})
    result = derive.derive(op, mode, taken)
    note = f" (derived from impl.expr: {mode} " + "{}" + ")"
    lets = tuple(((n,), make_formula(t, impl.loc, mode + ".let." + n + note.format("let"), ">"))
                 for n, t in result.lets)
    formulas = tuple((k, make_formula(t, impl.loc, mode + "." + k + note.format(k), ">"))
                     for k, t in result.formulas)
    return lets, formulas


class _Dumper(yaml.SafeDumper):
    """Block mappings; lists of scalars on one line, as specs write them (``T: [float32, float64]``)."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def _plain(v: Any) -> Any:
    """YAML data of a model value: enums as their text, tuples as lists."""
    if isinstance(v, StrEnum):
        return str(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def _yaml_body(op: OpSpec) -> dict[str, Any]:
    body: dict[str, Any] = {"doc": op.doc}
    body["inputs"] = {i.name: {"dtype": _plain(i.dtype), "optional": i.optional,
                               "differentiable": i.differentiable, **({"shape_only": True} if i.shape_only else {}),
                               **({"doc": i.doc} if i.doc else {})}
                      for i in op.inputs}
    if op.attrs:
        attrs: dict[str, Any] = {}
        for a in op.attrs:
            row: dict[str, Any] = {"type": str(a.type)}
            if a.has_default:
                row["default"] = _plain(a.default)
            elif not a.required:
                row["required"] = False
            for k, v in (("choices", a.choices), ("min", a.min), ("max", a.max)):
                if v is not None:
                    row[k] = _plain(v)
            if a.axis_of:
                row["axis_of"] = list(a.axis_of)
            if a.doc:
                row["doc"] = a.doc
            attrs[a.name] = row
        body["attrs"] = attrs
    body["outputs"] = {o.name: {"dtype": _plain(o.dtype), "shape": o.shape.text,
                                "differentiable": o.differentiable, **({"doc": o.doc} if o.doc else {})}
                       for o in op.outputs}
    if op.checks:
        body["checks"] = [{"require": c.require.text, "error": c.text} for c in op.checks]
    if op.typevars:
        body["dtypes"] = {v: _plain(ds) for v, ds in op.typevars}
    if not op.targets_derived:
        body["targets"] = {str(t.name): {**({"dtypes": {v: _plain(ds) for v, ds in t.dtypes}} if t.dtypes else {}),
                                             "formats": _plain(t.formats)} for t in op.targets}
    impl = op.impl
    if isinstance(impl, ExprImpl):
        body["impl"] = {"expr": {n: f.text for n, f in impl.formulas} if impl.mapping
                        else impl.formulas[0][1].text}
    elif isinstance(impl, CompositeImpl):
        body["impl"] = {str(impl.kind): impl.formula.text}
    elif isinstance(impl, AotImpl):
        body["impl"] = {"aot": {"library": impl.library, "symbol": impl.symbol}}
    elif isinstance(impl, PyfuncImpl):
        body["impl"] = {"pyfunc": impl.function}
    else:
        body["impl"] = {str(impl.kind): {}}
    if op.bprop is not None and not op.bprop.derived:
        bprop: dict[str, Any] = ({"let": {", ".join(ns): f.text for ns, f in op.bprop.lets}}
                                 if op.bprop.lets else {})
        bprop.update({n: f.text for n, f in op.bprop.grads})
        body["bprop"] = bprop
    if op.autocast is not None:
        body["autocast"] = op.autocast
    if op.batch_inputs:
        body["batch_inputs"] = list(op.batch_inputs)
    if op.inplace is not None:
        body["inplace"] = op.inplace
    if op.foreach:
        body["foreach"] = True
    if op.jvp is not None and not op.jvp.derived:
        jvp: dict[str, Any] = ({"let": {", ".join(ns): f.text for ns, f in op.jvp.lets}} if op.jvp.lets else {})
        jvp.update({n: f.text for n, f in op.jvp.tangents})
        body["jvp"] = jvp
    t = op.tests
    if t is not None:
        tests: dict[str, Any] = {"reference": t.reference}
        if t.domain:
            tests["domain"] = {n: list(r) for n, r in t.domain}
        if t.attrs:
            tests["attrs"] = [{n: _plain(v) for n, v in s} for s in t.attrs]
        if t.shapes:
            tests["shapes"] = [[None if s is None else list(s) for s in row] for row in t.shapes]
        if t.tolerance:
            tests["tolerance"] = {d: list(v) for d, v in t.tolerance}
        if t.grad_tolerance is not None:
            tests["grad_tolerance"] = list(t.grad_tolerance)
        body["tests"] = tests
    return body


# ---------------------------------------------------------------------------- building


def _float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        not isinstance(v, int) or INT64[0] <= v <= INT64[1])


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64[0] <= v <= INT64[1]


_VALUE_CHECKS: dict[str, Callable[[Any], bool]] = {
    AttrType.BOOL: lambda v: isinstance(v, bool),
    AttrType.INT: _int,
    AttrType.FLOAT: _float,
    AttrType.STR: lambda v: isinstance(v, str),
    AttrType.INT_LIST: lambda v: isinstance(v, list) and all(_int(x) for x in v),
    AttrType.FLOAT_LIST: lambda v: isinstance(v, list) and all(_float(x) for x in v),
}


def _value_ok(atype: AttrType, v: Any) -> bool:
    # (a dict, not an if-chain over the enum: a model read back from JSON holds the type as str)
    check = _VALUE_CHECKS.get(atype)
    return check is not None and check(v)


class _Builder:
    """Builds one OpSpec from its located YAML, collecting every mistake before raising them."""

    def __init__(self, name: str, doc: LocMap):
        self.name = name
        self.doc = doc
        self.body: LocMap = doc[name]
        self.path = doc.loc.path
        self.errors: list[SpecError] = []
        self.optional_attrs: frozenset[str] = frozenset()  # attrs that may be None (set with the attrs)

    # -- helpers
    def loc(self, *keys: Any, key: bool = False) -> Loc:
        return locate(self.doc, [self.name, *keys], key=key)

    def err(self, keys: tuple[Any, ...], message: str, *, key: bool = False) -> None:
        self.errors.append(SpecError(self.loc(*keys, key=key), ".".join(map(str, keys)), message))

    def formula(self, container: LocMap, k: str, keys: tuple[Any, ...]) -> Formula:
        return make_formula(container[k], container.value_locs[k], ".".join(map(str, keys)),
                            container.value_styles[k])

    def check_name(self, keys: tuple[Any, ...], what: str) -> None:
        name = keys[-1]
        if name in RESERVED:
            self.err(keys, f"'{name}' is a reserved word and cannot name {what}", key=True)
        elif name == "out" and what in ("an input", "an attr"):
            self.err(keys, f"'out' cannot name {what}: every op's Python function takes out= (the tensors that "
                     "receive its results)", key=True)
        elif isinstance(name, str) and reserved_identifier(name):
            self.err(keys, f"'{name}' is reserved for the C++ implementation (it contains '__' or starts "
                     f"with '_' and an uppercase letter) and cannot name {what}", key=True)

    # -- build
    def build(self) -> OpSpec:
        b = self.body
        typevars = tuple((v, tuple(DType(d) for d in ds)) for v, ds in (b.get("dtypes") or {}).items())
        declared = dict(typevars)
        used_vars: set[str] = set()

        def dtype_ok(keys: tuple[Any, ...], dtype: str) -> None:
            if dtype in declared:
                used_vars.add(dtype)
            elif not isinstance(_dtype(dtype), DType):
                self.err(keys, f"unknown dtype or type variable '{dtype}'"
                         f"{did_you_mean(dtype, list(declared) + list(DType))}")

        inputs = []
        for n, spec in (b.get("inputs") or {}).items():
            self.check_name(("inputs", n), "an input")
            dtype = _dtype(spec["dtype"])
            dtype_ok(("inputs", n, "dtype"), dtype)
            concrete_non_float = isinstance(dtype, DType) and not dtype.is_float
            shape_only = spec.get("shape_only", False)
            diff = spec.get("differentiable", not concrete_non_float and not shape_only)
            if diff and concrete_non_float:
                self.err(("inputs", n, "differentiable"), f"an input of dtype {dtype} cannot be differentiable")
            elif diff and shape_only:
                self.err(("inputs", n, "differentiable"), "a shape_only input cannot be differentiable")
            inputs.append(Input(n, dtype, spec.get("optional", False), diff, spec.get("doc", ""),
                                self.loc("inputs", n, key=True), shape_only))
        input_names = [i.name for i in inputs]
        for k, i in enumerate(inputs[:-1]):
            if i.optional and not inputs[k + 1].optional:
                self.err(("inputs", inputs[k + 1].name), "a required input cannot follow an optional one",
                         key=True)
        if len(declared) > 4:
            self.err(("dtypes",), "at most 4 type variables are supported")
        if len(inputs) > MAX_INPUTS:
            # opforge.mindspore binds bprops of 1 to 8 inputs, and each optional input doubles the
            # AOT entry points (8 optional inputs: 256): a 9th input built, then failed at every import
            self.err(("inputs", inputs[MAX_INPUTS].name), f"an op takes at most {MAX_INPUTS} inputs "
                     f"(this one has {len(inputs)}): the MindSpore bprop bindings and the AOT entry "
                     "points (one per combination of optional inputs) stop there", key=True)

        attrs: list[Attr] = []
        for n, spec in (b.get("attrs") or {}).items():
            self.check_name(("attrs", n), "an attr")
            attrs.append(self.attr(n, spec))
        for k, a in enumerate(attrs[1:], 1):
            # attrs follow the inputs in the Python signature: one without a default cannot follow
            # one that has a default (or may be None)
            if a.required and not attrs[k - 1].required:
                self.err(("attrs", a.name), f"a required attr cannot follow one with a default "
                         f"('{attrs[k - 1].name}'): list required attrs first", key=True)
        attr_types = {a.name: a.type for a in attrs}
        self.optional_attrs = frozenset(a.name for a in attrs if a.optional_value)
        for n in attr_types:
            if n in input_names:
                self.err(("attrs", n), f"'{n}' names both an input and an attr", key=True)

        outputs = []
        for n, spec in b["outputs"].items():
            self.check_name(("outputs", n), "an output")
            if n in input_names or n in attr_types:
                self.err(("outputs", n), f"'{n}' names both an output and an input or attr", key=True)
            dtype = _dtype(spec["dtype"])
            dtype_ok(("outputs", n, "dtype"), dtype)
            if dtype in declared and not any(i.dtype == dtype for i in inputs):
                self.err(("outputs", n, "dtype"), f"type variable '{dtype}' is not bound by any input")
            elif dtype in declared and not any(i.dtype == dtype and not i.optional for i in inputs):
                # (a call without them left it unbound: the error named bool, which nothing passed)
                self.err(("outputs", n, "dtype"), f"type variable '{dtype}' is bound only by optional inputs: "
                         "a call without them could not tell the output's dtype")
            shape = self.shape_rule(("outputs", n, "shape"), spec["shape"], inputs, attr_types, spec)
            diff = spec.get("differentiable", dtype in declared or dtype in FLOAT_DTYPES)
            outputs.append(Output(n, dtype, shape, diff, spec.get("doc", ""),
                                  self.loc("outputs", n, key=True)))
        for o in outputs:
            if o.grad_name in input_names or o.grad_name in attr_types or o.grad_name in [p.name for p in outputs]:
                self.err(("outputs", o.name), f"the gradient of output '{o.name}' is named "
                         f"'{o.grad_name}' in formulas, which clashes with an input, attr or output", key=True)
        for v in declared:
            if v not in used_vars:
                self.err(("dtypes", v), f"type variable '{v}' is not used by any input or output", key=True)

        checks = self.checks(inputs, attr_types)
        targets = self.targets(declared)
        impl = self.impl(inputs, attrs, outputs)
        kind = ImplKind(next(iter(b["impl"]))) if len(b["impl"]) == 1 else None
        bprop = self.bprop(inputs, outputs, kind, impl)
        jvp = self.jvp(inputs, attrs, outputs, impl, bprop)
        tests = self.tests(inputs, attrs)
        inplace = self.inplace(inputs, outputs)
        batch_inputs = self.batch_inputs(inputs)  # (before the errors are raised: it reports its own)
        if self.errors or impl is None:
            raise SpecErrors(self.errors)
        return OpSpec(self.name, self.path, self.doc.key_locs[self.name], b["doc"].strip(), tuple(inputs),
                      tuple(outputs), tuple(attrs), typevars, targets, impl, bprop, tests,
                      targets_derived="targets" not in b, jvp=jvp, checks=checks, autocast=b.get("autocast"),
                      batch_inputs=batch_inputs, inplace=inplace, foreach=bool(b.get("foreach", False)))

    def attr(self, n: str, spec: LocMap) -> Attr:
        keys = ("attrs", n)
        atype = AttrType(spec["type"])
        has_default = "default" in spec and spec["default"] is not None
        default: Any = spec.get("default")
        required = spec.get("required", not has_default and "default" not in spec)
        if required and has_default:
            self.err(keys + ("required",), "a required attr cannot have a default")
        if has_default:
            if not _value_ok(atype, default):
                what = {AttrType.FLOAT: "a finite float", AttrType.INT: "an int64", AttrType.INT_LIST: "a list of int64",
                        AttrType.FLOAT_LIST: "a list of finite floats"}.get(atype, atype)
                self.err(keys + ("default",), f"default must be {what}, got {default!r}")
            elif atype == AttrType.FLOAT:
                default = float(default)
            elif atype == AttrType.FLOAT_LIST:
                default = [float(x) for x in default]
            tiny = [x for x in (default if atype == AttrType.FLOAT_LIST else [default] if atype == AttrType.FLOAT else [])
                    if _value_ok(AttrType.FLOAT, x) and x != 0 and abs(float(x)) < sys.float_info.min]
            if tiny:  # (torch's schema parser reads its defaults with stod, which refuses them)
                self.err(keys + ("default",), f"default {tiny[0]!r} is subnormal, which PyTorch's op schema cannot "
                         "hold; use 0 or a float of at least 2.2250738585072014e-308 in magnitude")
        choices = spec.get("choices")
        if choices is not None:
            for i, c in enumerate(choices):
                if not _value_ok(atype, c):
                    self.err(keys + ("choices", i), f"choice must be {atype}, got {c!r}")
            if has_default and default not in choices:
                self.err(keys + ("default",), f"default {default!r} is not one of the choices")
            choices = tuple(choices)
        lo, hi = spec.get("min"), spec.get("max")
        for k, bound in (("min", lo), ("max", hi)):
            if bound is not None and not _float(bound):
                self.err(keys + (k,), f"{k} must be a finite number, got {bound!r}")
                lo, hi = (None, hi) if k == "min" else (lo, None)
        if (lo is not None or hi is not None) and atype not in (AttrType.INT, AttrType.FLOAT):
            self.err(keys + ("min" if lo is not None else "max",), "min/max apply to int and float attrs only")
        elif has_default and atype in (AttrType.INT, AttrType.FLOAT) and _value_ok(atype, default):
            if lo is not None and default < lo:
                self.err(keys + ("default",), f"default {default!r} is below min {lo}")
            if hi is not None and default > hi:
                self.err(keys + ("default",), f"default {default!r} is above max {hi}")
        axis_of = spec.get("axis_of") or ()
        axis_of = (axis_of,) if isinstance(axis_of, str) else tuple(axis_of)
        if axis_of and atype not in (AttrType.INT, AttrType.INT_LIST):
            self.err(keys + ("axis_of",), f"axis_of applies to int and list[int] attrs (axes), not {atype}")
        for name in axis_of:
            if name not in (self.body.get("inputs") or {}):
                self.err(keys + ("axis_of",), f"axis_of: '{name}' is not an input"
                         f"{did_you_mean(name, list(self.body.get('inputs') or {}))}")
        return Attr(n, atype, tuple(default) if isinstance(default, list) else default,
                    has_default, bool(required), choices, lo, hi, spec.get("doc", ""),
                    self.loc("attrs", n, key=True), axis_of)

    def inplace(self, inputs: list[Input], outputs: list[Output]) -> Optional[str]:
        """``inplace: add_``: the variant writes the op's one output into its first input, so that
        input must be a required tensor whose dtype is the output's."""
        name = self.body.get("inplace")
        if name is None:
            return None
        if len(outputs) != 1:
            self.err(("inplace",), f"an in-place variant needs exactly one output, '{self.name}' has {len(outputs)}")
        elif not inputs or inputs[0].optional:
            self.err(("inplace",), "an in-place variant writes into the first input, which must be required")
        elif inputs[0].dtype != outputs[0].dtype:
            self.err(("inplace",), f"an in-place variant writes the output into input '{inputs[0].name}', so their "
                     f"dtypes must be the same: '{outputs[0].dtype}' vs '{inputs[0].dtype}'")
        return str(name)

    def batch_inputs(self, inputs: list[Input]) -> tuple[str, ...]:
        names = [i.name for i in inputs]
        given = tuple(self.body.get("batch_inputs") or ())
        for k, n in enumerate(given):
            if n not in names:
                self.err(("batch_inputs", k), f"'{n}' is not an input{did_you_mean(n, names)}")
        return given

    def checks(self, inputs: list[Input], attr_types: dict[str, AttrType]) -> tuple[dims.Check, ...]:
        """``checks:``, each ``{require: <bool shape expression>, error: <message with {expression}
        placeholders>}``, checked by lowering."""
        out = []
        scope = self.dim_scope(inputs, attr_types)
        for k, item in enumerate(self.body.get("checks") or []):
            keys = ("checks", k)
            try:
                require = self.formula(item, "require", keys + ("require",))
                loc, style = item.value_locs["error"], item.value_styles["error"]

                def make(text: str, offset: int, _loc: Loc = loc, _style: str = style) -> Formula:
                    inline = _style in ("", "'", '"')  # (columns map one to one, past a quote)
                    return make_formula(text, _loc.shifted(offset) if inline else _loc, f"checks.{k}.error",
                                        _style if inline else ">")

                check = dims.Check(require, dims.message_parts(item["error"], make), item["error"])
                dims.lower_check(check, scope, cpp=False)
                out.append(check)
            except SpecError as exc:
                self.errors.append(exc)
        return tuple(out)

    def dim_scope(self, inputs: Sequence[Input], attr_types: dict[str, AttrType]) -> dims.DimScope:
        return dims.DimScope(self.name, [i.name for i in inputs], {i.name for i in inputs if i.optional},
                             {n: str(t) for n, t in attr_types.items()}, self.optional_attrs)

    def shape_rule(self, keys: tuple[Any, ...], text: str, inputs: list[Input],
                   attr_types: dict[str, AttrType], container: Optional[LocMap] = None) -> ShapeRule:
        m = _SHAPE.match(text)
        bad = ShapeRule(ShapeKind.SAME, (), text)
        rules = [str(k) for k in ShapeKind if k != ShapeKind.EXPRESSION]
        if m and m.group(1) not in rules and m.group(1) not in dims.FUNCTIONS:
            self.err(keys, f"unknown shape rule '{m.group(1)}'{did_you_mean(m.group(1), rules)}; rules: "
                     f"{', '.join(r + '(...)' for r in rules)}, or an expression over shape(), dims(), dim(), "
                     "rank() and the attrs")
            return bad
        if container is not None and (not m or m.group(1) not in rules):
            # an expression over the inputs' shapes and the attrs (formula/dims.py)
            try:
                formula = self.formula(container, "shape", keys)
                dims.lower_dims(formula, self.dim_scope(inputs, attr_types), dims.DKind.DIMS, cpp=False)
            except SpecError as exc:
                self.errors.append(exc)
                return bad
            return ShapeRule(ShapeKind.EXPRESSION, (), text, formula)
        if not m:
            self.err(keys, f"cannot parse shape rule '{text}': expected one of "
                     f"{', '.join(r + '(...)' for r in rules)}")
            return bad
        rest = m.group(2)
        args = tuple(a.strip() for a in rest.split(",")) if rest.strip() else ()
        if m.group(1) not in rules:
            self.err(keys, f"unknown shape rule '{m.group(1)}'{did_you_mean(m.group(1), rules)}")
            return bad
        kind = ShapeKind(m.group(1))
        names = {i.name: i for i in inputs}

        def want_input(a: str) -> None:
            if a not in names:
                self.err(keys, f"shape rule {kind}() names unknown input '{a}'{did_you_mean(a, names)}")
            elif names[a].optional:
                self.err(keys, f"shape rule {kind}() cannot read optional input '{a}'")

        arity = {ShapeKind.SAME: (1, 1), ShapeKind.REDUCE: (3, 3), ShapeKind.MATMUL: (2, 2),
                 ShapeKind.INFER: (1, 1)}.get(kind, (1, 99))
        if not arity[0] <= len(args) <= arity[1]:
            self.err(keys, f"{kind}() takes {arity[0] if arity[0] == arity[1] else 'at least 1'} "
                     f"argument{'s' if arity[0] != 1 else ''}, got {len(args)}")
            return bad
        if kind in (ShapeKind.SAME, ShapeKind.BROADCAST, ShapeKind.MATMUL):
            for a in args:
                want_input(a)
        elif kind == ShapeKind.REDUCE:
            want_input(args[0])
            if attr_types.get(args[1]) not in (AttrType.INT_LIST, AttrType.INT) or (
                    attr_types.get(args[1]) == AttrType.INT and args[1] in self.optional_attrs):
                self.err(keys, f"reduce() axis '{args[1]}' must be a list[int] attr or a non-optional int attr")
            if args[2] not in ("true", "false") and (attr_types.get(args[2]) != AttrType.BOOL
                                                     or args[2] in self.optional_attrs):
                self.err(keys, f"reduce() keepdims '{args[2]}' must be true, false or a non-optional bool attr")
        elif kind == ShapeKind.INFER:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args[0]):
                self.err(keys, f"infer() needs a C++ function name, got '{args[0]}'")
            elif (args[0] in RESERVED or args[0] in RUNTIME_CLASSES or reserved_identifier(args[0])
                  or re.fullmatch(r"k[A-Z]\w*", args[0]) or args[0] in ("meta", "make_attrs", "check_shapes")):
                # (a type, a macro, or a name the op's generated file defines: kName, kInfo, meta, ...)
                self.err(keys, f"infer() function name '{args[0]}' is taken by C++, the runtime or the op's "
                         "generated code; name the function after the op (infer_<op>_shape)")
        return ShapeRule(kind, args, text)

    def targets(self, declared: dict[str, tuple[DType, ...]]) -> tuple[Target, ...]:
        """The registration rows per target; without a `targets` key, the host target (cpu) with
        every declared dtype and format (the same rows as `targets: {cpu: {}}`, whatever the build)."""
        given = self.body.get("targets")
        spec = dict(given) if given is not None else {str(HOST): None}
        out = []
        for tname, tspec in spec.items():
            tspec = tspec or {}
            narrowed = dict(tspec.get("dtypes") or {})
            for v, ds in narrowed.items():
                if v not in declared:
                    self.err(("targets", tname, "dtypes", v), f"unknown type variable '{v}'"
                             f"{did_you_mean(v, declared)}", key=True)
                    continue
                for i, d in enumerate(ds):
                    if d not in declared[v]:
                        self.err(("targets", tname, "dtypes", v, i),
                                 f"{d} is not among the dtypes of {v} ({', '.join(declared[v])})")
            dtypes = tuple((v, tuple(DType(d) for d in narrowed.get(v, ds))) for v, ds in declared.items())
            formats = tuple(Format(f) for f in tspec.get("formats") or Format)
            out.append(Target(Backend(tname), dtypes, formats))
        return tuple(out)

    def impl(self, inputs: list[Input], attrs: list[Attr], outputs: list[Output]) -> Optional[Impl]:
        impl: LocMap = self.body["impl"]
        loc = self.loc("impl")
        if len(impl) != 1:
            self.err(("impl",), "give exactly one of " + ", ".join(ImplKind))
            return None
        kind = ImplKind(next(iter(impl)))
        keys = ("impl", str(kind))
        infer = any(o.shape.kind == ShapeKind.INFER for o in outputs)
        if kind == ImplKind.CPP:  # (its kernel files are the loader's to find)
            return CppImpl(loc)
        if kind == ImplKind.AOT:
            aot = impl["aot"]
            for o in outputs:
                if o.shape.kind == ShapeKind.INFER:
                    self.err(keys, "shape rule infer() needs a cpp impl (the function lives in its kernel file)")
            return AotImpl(loc, str(aot["library"]), str(aot["symbol"]))
        if infer:
            self.err(keys, "shape rule infer() needs a cpp impl (the function lives in its kernel file)")
        if kind == ImplKind.PYFUNC:  # (its module is imported at the first call)
            return PyfuncImpl(loc, str(impl["pyfunc"]))
        if kind == ImplKind.EXPR:
            return self.expr_impl(loc, inputs, attrs, outputs)
        try:
            formula = self.formula(impl, str(kind), keys)
        except SpecError as exc:
            self.errors.append(exc)
            return None
        if len(outputs) != 1:
            self.err(keys, "a composite op has exactly one output")
        return CompositeImpl(loc, formula)

    def expr_impl(self, loc: Loc, inputs: list[Input], attrs: list[Attr], outputs: list[Output]) -> Optional[ExprImpl]:
        """One formula per output: ``expr: f`` for a single output, ``expr: {out: f, ...}`` for any."""
        keys: tuple[Any, ...] = ("impl", "expr")
        self.check_expr_shapes(keys, inputs, outputs)
        impl: LocMap = self.body["impl"]
        names = [o.name for o in outputs]
        given: list[tuple[str, LocMap, str, tuple[Any, ...]]] = []  # (output, container, key, keys)
        if isinstance(impl["expr"], str):
            if len(outputs) != 1:
                self.err(keys, f"an expr op with {len(outputs)} outputs gives one formula per output: "
                         f"expr: {{{', '.join(n + ': ...' for n in names)}}}")
                return None
            given.append((names[0], impl, "expr", keys))
        else:
            spec: LocMap = impl["expr"]
            for n in spec:
                if n not in names:
                    self.err(keys + (n,), f"'{n}' is not an output{did_you_mean(n, names)}", key=True)
                else:
                    given.append((n, spec, n, keys + (n,)))
            for n in names:
                if n not in spec:
                    self.err(keys, f"missing formula for output '{n}'")
        # checked by lowering (the code is dest's to make again): what is checked is what is emitted
        scope = expr_scope(inputs, attrs, outputs, {})  # (the dtypes change what is emitted, not what is checked)
        formulas: dict[str, Formula] = {}
        for n, container, k, fkeys in given:
            try:
                formulas[n] = self.formula(container, k, fkeys)
                lower_expr(formulas[n], scope)
            except SpecError as exc:
                self.errors.append(exc)
        if len(formulas) != len(outputs):
            return None
        return ExprImpl(loc, tuple((n, formulas[n]) for n in names))

    def check_expr_shapes(self, keys: tuple[Any, ...], inputs: list[Input], outputs: list[Output]) -> None:
        """An expr op's kernel reads every input at each position of its outputs, which share one shape."""
        for o in outputs:
            if o.shape.kind not in (ShapeKind.SAME, ShapeKind.BROADCAST):
                self.err(keys, f"an expr op's output shape is same() or broadcast(), not {o.shape.kind}()")
                continue
            # the kernel reads every input at the output's positions: an input the rule leaves out
            # could be smaller than the output
            # (skipped where the rule or an input is already reported wrong)
            known = {i.name for i in inputs}
            left = [i.name for i in inputs if i.name not in o.shape.inputs()]
            if left and o.shape.args and set(o.shape.inputs()) <= known and not any(i.optional for i in inputs):
                names = ", ".join(i.name for i in inputs)
                self.err(("outputs", o.name, "shape"),
                         f"an expr op reads every input at each output position, so its output shape must "
                         f"cover all of them: {', '.join(repr(n) for n in left)} "
                         f"{'is' if len(left) == 1 else 'are'} left out (use broadcast({names}))")
        if any(i.optional for i in inputs):
            self.err(keys, "an expr op cannot have optional inputs")

    def derived(self, impl: ExprImpl, inputs: list[Input], outputs: list[Output], attrs: Sequence[str],
                mode: str) -> Optional[tuple[tuple[tuple[tuple[str, ...], Formula], ...], tuple[tuple[str, Formula], ...]]]:
        """derive_formulas, or None after reporting why they cannot be derived."""
        try:
            return derive_formulas(impl, inputs, outputs, attrs, mode)
        except derive.DeriveError as exc:
            self.errors.append(SpecError(impl.loc, "impl.expr", f"cannot derive the {mode}: {exc}; write a "
                                         f"{mode} section"))
            return None

    def bprop(self, inputs: list[Input], outputs: list[Output], kind: Optional[ImplKind],
              impl: Optional[Impl] = None) -> Optional[Bprop]:
        spec = self.body.get("bprop")
        diff = [i.name for i in inputs if i.differentiable]
        if spec is None and isinstance(impl, ExprImpl) and diff and any(o.differentiable for o in outputs):
            # derived: the gradient of each input from the expression (codegen/formula/derive.py)
            got = self.derived(impl, inputs, outputs, list(self.body.get("attrs") or {}), "bprop")
            return None if got is None else Bprop(got[0], got[1], impl.loc, derived="impl.expr")
        if spec is None:
            if kind != ImplKind.COMPOSITE and kind != ImplKind.EXPR and diff:
                self.errors.append(SpecError(self.doc.key_locs[self.name], "bprop",
                                             f"missing: give a formula for each differentiable input "
                                             f"({', '.join(diff)}), or mark inputs differentiable: false"))
            return None
        lets = []
        grads = []
        let_spec: LocMap = spec.get("let") or LocMap()
        taken = {i.name for i in inputs} | {o.name for o in outputs} | {o.grad_name for o in outputs}
        taken |= {a for a in (self.body.get("attrs") or {})}
        bound: set[str] = set()
        for key in let_spec:  # `name: f`, or `a, b, c: op(...)` binding each output of a call
            names = tuple(n.strip() for n in key.split(","))
            clash = next((n for n in names if n in taken), None)
            twice = next((n for k, n in enumerate(names) if n in bound or n in names[:k]), None)
            if clash is not None:
                self.err(("bprop", "let", key), f"let name '{clash}' shadows an input, output, attr or gradient",
                         key=True)
                continue
            if twice is not None:
                self.err(("bprop", "let", key), f"let name '{twice}' is bound twice", key=True)
                continue
            bound.update(names)
            try:
                lets.append((names, self.formula(let_spec, key, ("bprop", "let", key))))
            except SpecError as exc:
                self.errors.append(exc)
        for n in spec:
            if n == "let":
                continue
            if n not in {i.name for i in inputs}:
                self.err(("bprop", n), f"'{n}' is not an input{did_you_mean(n, [i.name for i in inputs])}",
                         key=True)
                continue
            if n not in diff:
                self.err(("bprop", n), f"input '{n}' is not differentiable and takes no bprop formula",
                         key=True)
                continue
            try:
                grads.append((n, self.formula(spec, n, ("bprop", n))))
            except SpecError as exc:
                self.errors.append(exc)
        for n in diff:
            if n not in spec:
                self.err(("bprop",), f"missing formula for differentiable input '{n}' "
                         "(or mark it differentiable: false)")
        return Bprop(tuple(lets), tuple(grads), self.loc("bprop"))

    def jvp(self, inputs: list[Input], attrs: list[Attr], outputs: list[Output], impl: Optional[Impl],
            bprop: Optional[Bprop]) -> Optional[Jvp]:
        """The forward-mode formulas: written (``jvp:``), derived from an expr op's expression, or
        for an elementwise op whose one gradient is linear in its output's gradient (PyTorch's
        ``auto_element_wise``), its bprop with the output gradient replaced by the input tangent.
        None: the op has no forward mode (a call with tangents raises, naming it)."""
        spec = self.body.get("jvp")
        diff_in = [i for i in inputs if i.differentiable]
        diff_out = [o for o in outputs if o.differentiable]
        names = {i.name for i in inputs} | {o.name for o in outputs} | {a.name for a in attrs}
        if spec is not None or isinstance(impl, ExprImpl):
            for i in diff_in:
                if derive.tangent(i.name) in names:
                    where = ("jvp",) if spec is not None else ("impl", "expr")
                    self.err(where, f"the tangent of input '{i.name}' is named '{derive.tangent(i.name)}' in "
                             "jvp formulas, which clashes with an input, output or attr")
                    return None
        if spec is None:
            if not diff_in or not diff_out:
                return None
            # a written bprop's choices at kinks win (relu, abs, pow); else the expression's derivative
            elementwise = self.elementwise_jvp(inputs, diff_out, bprop)
            if elementwise is not None or not isinstance(impl, ExprImpl):
                return elementwise
            got = self.derived(impl, inputs, outputs, [a.name for a in attrs], "jvp")
            return None if got is None else Jvp(got[0], got[1], impl.loc, derived="impl.expr")
        if not diff_in:
            self.err(("jvp",), "the op has no differentiable inputs: nothing has a tangent", key=True)
            return None
        taken = names | {derive.tangent(i.name) for i in diff_in}
        lets = []
        let_spec: LocMap = spec.get("let") or LocMap()
        bound: set[str] = set()
        for key in let_spec:
            bind = tuple(n.strip() for n in key.split(","))
            clash = next((n for n in bind if n in taken), None)
            twice = next((n for k, n in enumerate(bind) if n in bound or n in bind[:k]), None)
            if clash is not None:
                self.err(("jvp", "let", key), f"let name '{clash}' shadows an input, output, attr or tangent",
                         key=True)
                continue
            if twice is not None:
                self.err(("jvp", "let", key), f"let name '{twice}' is bound twice", key=True)
                continue
            bound.update(bind)
            try:
                lets.append((bind, self.formula(let_spec, key, ("jvp", "let", key))))
            except SpecError as exc:
                self.errors.append(exc)
        tangents = []
        out_names = [o.name for o in outputs]
        for n in spec:
            if n == "let":
                continue
            if n not in out_names:
                self.err(("jvp", n), f"'{n}' is not an output{did_you_mean(n, out_names)}", key=True)
                continue
            if n not in {o.name for o in diff_out}:
                self.err(("jvp", n), f"output '{n}' is not differentiable and has no tangent", key=True)
                continue
            try:
                tangents.append((n, self.formula(spec, n, ("jvp", n))))
            except SpecError as exc:
                self.errors.append(exc)
        for o in diff_out:
            if o.name not in spec:
                self.err(("jvp",), f"missing formula for differentiable output '{o.name}' (or mark it "
                         "differentiable: false)")
        return Jvp(tuple(lets), tuple(tangents), self.loc("jvp"))

    @staticmethod
    def elementwise_jvp(inputs: list[Input], diff_out: list[Output], bprop: Optional[Bprop]) -> Optional[Jvp]:
        """PyTorch's auto_element_wise case: one differentiable output o whose shape is same() or
        broadcast() of the inputs, and a written gradient of each differentiable input that is
        elementwise and linear in do (its lets inlined, if_needs's second branches taken): the Jacobian is diagonal per input, so the
        tangent of o is Σ_x (x's gradient formula with do replaced by x_t). The written formulas'
        choices at kinks (relu at 0, pow at 0) hold in forward mode too."""
        if bprop is None or bprop.derived or len(diff_out) != 1 or any(i.optional for i in inputs):
            return None
        o = diff_out[0]
        if o.shape.kind not in (ShapeKind.SAME, ShapeKind.BROADCAST):
            return None
        lets: dict[str, Any] = {}
        for names, f in bprop.lets:
            if len(names) != 1:
                return None
            lets[names[0]] = derive.inline(f.ast, lets)
        total = None
        for x, f in bprop.grads:
            body = derive.without_if_needs(derive.inline(f.ast, lets))
            if not derive.is_linear_in(body, o.grad_name):
                return None
            term = derive.substitute(body, o.grad_name, derive.tangent(x))
            total = term if total is None else Binary("+", total, term, 0)
        if total is None or not any(i.differentiable for i in inputs):
            return None
        text = derive.unparse(total)
        key = f"jvp.{o.name} (derived from bprop: elementwise and linear in {o.grad_name})"
        return Jvp((), ((o.name, make_formula(text, bprop.loc, key, ">")),), bprop.loc, derived="bprop")

    def tests(self, inputs: list[Input], attrs: list[Attr]) -> Optional[TestSpec]:
        spec = self.body.get("tests")
        if spec is None:
            return None
        ref = spec["reference"]
        try:
            pyast.parse(ref.strip(), mode="eval")
        except SyntaxError as exc:
            self.err(("tests", "reference"), f"not a Python expression: {exc.msg}")
        in_names = [i.name for i in inputs]
        attr_names = [a.name for a in attrs]
        for n in spec.get("domain") or {}:
            if n not in in_names:
                self.err(("tests", "domain", n), f"'{n}' is not an input{did_you_mean(n, in_names)}", key=True)
        attr_sets = []
        for i, aset in enumerate(spec.get("attrs") or []):
            for n, v in aset.items():
                if n not in attr_names:
                    self.err(("tests", "attrs", i, n), f"'{n}' is not an attr{did_you_mean(n, attr_names)}",
                             key=True)
                elif not _value_ok(next(a.type for a in attrs if a.name == n), v):
                    self.err(("tests", "attrs", i, n), f"value {v!r} does not fit attr type "
                             f"{next(a.type for a in attrs if a.name == n)}")
            attr_sets.append(tuple((n, tuple(v) if isinstance(v, list) else v) for n, v in aset.items()))
        shapes = []
        for i, row in enumerate(spec.get("shapes") or []):
            if len(row) != len(inputs):
                self.err(("tests", "shapes", i), f"gives {len(row)} shapes for {len(inputs)} inputs")
            shapes.append(tuple(None if s is None else tuple(s) for s in row))
        tol = tuple((d, (float(v[0]), float(v[1]))) for d, v in (spec.get("tolerance") or {}).items())
        gt = spec.get("grad_tolerance")
        return TestSpec(ref.strip(), tuple((n, (float(v[0]), float(v[1])))
                                           for n, v in (spec.get("domain") or {}).items()),
                        tuple(attr_sets), tuple(shapes), tol,
                        (float(gt[0]), float(gt[1])) if gt else None)


