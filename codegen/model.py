"""The spec model: frozen dataclasses built from validated YAML, with their invariants."""

from __future__ import annotations

import ast as pyast
import itertools
import keyword
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import schema
from .errors import Loc, SpecError, SpecErrors, did_you_mean
from .formula import ExprScope, Formula, lower_expr, make_formula, names_in, ops_in
from .load import LocList, LocMap, display_path

CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export extern
false float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr
operator or or_eq private protected public register reinterpret_cast requires return short signed
sizeof static static_assert static_cast struct switch template this thread_local throw true try
typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
""".split())
# C++ type names visible where attrs become struct fields
CPP_TYPES = frozenset("""int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t std
TensorPtr TensorList Shape Axes DType Format Half BFloat16""".split())
# C and C++ standard library macros and names a generated TU sees (<cerrno>, <cassert>, <cstdio>, ...):
# as an identifier they expand or collide and the generated code stops compiling
C_LIBRARY_NAMES = frozenset("""errno assert NULL EOF stdin stdout stderr offsetof setjmp longjmp va_arg
va_start va_end va_copy va_list errno_t static_assert alignas alignof bool true false complex imaginary
noreturn thread_local isnan isinf isfinite signbit fpclassify math_errhandling
FILE BUFSIZ EXIT_SUCCESS EXIT_FAILURE RAND_MAX SIZE_MAX INFINITY NAN HUGE_VAL MB_CUR_MAX
unix linux i386 main environ errno_location""".split())
RESERVED = (frozenset(keyword.kwlist) | CPP_KEYWORDS | CPP_TYPES | C_LIBRARY_NAMES
            | {"let", "self", "ctx", "attrs"})

MAX_INPUTS = 8  # see ModelBuilder.build


def reserved_identifier(name: str) -> bool:
    """Whether C++ reserves name for the implementation: a double underscore anywhere, or a leading
    underscore followed by an uppercase letter."""
    return "__" in name or (len(name) > 1 and name[0] == "_" and name[1].isupper())
# op classes are CamelCase of the op name and live beside the runtime's own classes
RUNTIME_CLASSES = frozenset("""Tensor Storage Node Edge Function AutogradContext AccumulateGrad CppNode
GradMode GradModeGuard NoGradGuard TensorMeta OpInfo ArgInfo AttrInfo RowInfo TargetInfo CallInfo Error
TypeError ValueError IndexError RuntimeError Shape Format DType Device Half BFloat16 Axes""".split())
INT64 = (-(2 ** 63), 2 ** 63 - 1)

KERNEL_TARGETS = ("cpu",)  # targets whose hand-written kernels are compiled
SHAPE_RULES = ("same", "broadcast", "reduce", "matmul", "infer")
_SHAPE = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$")


def class_name(op: str) -> str:
    """The generated C++ class of an op: CamelCase of its name (leaky_relu -> LeakyRelu)."""
    return "".join(p.capitalize() for p in op.split("_"))


# ---------------------------------------------------------------------------- parts


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str            # a type variable or a concrete dtype
    optional: bool
    differentiable: bool
    doc: str
    loc: Loc


@dataclass(frozen=True)
class ShapeRule:
    kind: str             # same | broadcast | reduce | matmul | infer
    args: tuple[str, ...]
    text: str

    def inputs(self) -> tuple[str, ...]:
        """The inputs this rule reads shapes from."""
        if self.kind in ("same", "reduce"):
            return self.args[:1]
        if self.kind in ("broadcast", "matmul"):
            return self.args
        return ()


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str
    shape: ShapeRule
    differentiable: bool
    doc: str
    loc: Loc

    @property
    def grad_name(self) -> str:
        return "d" + self.name


@dataclass(frozen=True)
class Attr:
    name: str
    type: str             # bool | int | float | str | list[int] | list[float]
    default: Any          # None when there is no default
    has_default: bool
    required: bool
    choices: Optional[tuple]
    min: Optional[float]
    max: Optional[float]
    doc: str
    loc: Loc

    @property
    def optional_value(self) -> bool:
        """Not required and no default: the value may be absent (None)."""
        return not self.required and not self.has_default


@dataclass(frozen=True)
class Target:
    name: str
    dtypes: tuple[tuple[str, tuple[str, ...]], ...]   # type variable -> allowed dtypes
    formats: tuple[str, ...]

    def rows(self) -> list[tuple[dict[str, str], str]]:
        """Every (type-variable binding, format) combination: the registration rows."""
        names = [v for v, _ in self.dtypes]
        combos = itertools.product(*[d for _, d in self.dtypes]) if names else [()]
        return [(dict(zip(names, combo)), fmt) for combo in combos for fmt in self.formats]


@dataclass(frozen=True)
class Impl:
    kind: str             # expr | composite | cpp | aot
    formula: Optional[Formula]
    cpp_expr: Optional[str]   # lowered elementwise expression (expr kind)
    cpp_flags: tuple[tuple[str, str], ...]  # per-call bool members of the expr functor
    loc: Loc
    aot: Optional[tuple[str, str]] = None  # (library, symbol) of an aot kernel


@dataclass(frozen=True)
class Bprop:
    lets: tuple[tuple[str, Formula], ...]
    grads: tuple[tuple[str, Formula], ...]   # input name -> formula
    loc: Loc


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
    typevars: tuple[tuple[str, tuple[str, ...]], ...]
    targets: tuple[Target, ...]
    impl: Impl
    bprop: Optional[Bprop]
    tests: Optional[TestSpec]

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
        return not (self.impl.kind == "composite" and self.bprop is None)

    @staticmethod
    def from_yaml(name: str, doc: LocMap, kernel_root: Optional[Path] = None) -> "OpSpec":
        return _Builder(name, doc, kernel_root).build()


# ---------------------------------------------------------------------------- building


def _float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        not isinstance(v, int) or INT64[0] <= v <= INT64[1])


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64[0] <= v <= INT64[1]


def _value_ok(atype: str, v: Any) -> bool:
    if atype == "bool":
        return isinstance(v, bool)
    if atype == "int":
        return _int(v)
    if atype == "float":
        return _float(v)
    if atype == "str":
        return isinstance(v, str)
    if atype == "list[int]":
        return isinstance(v, list) and all(_int(x) for x in v)
    if atype == "list[float]":
        return isinstance(v, list) and all(_float(x) for x in v)
    return False


class _Builder:
    def __init__(self, name: str, doc: LocMap, kernel_root: Optional[Path]):
        self.name = name
        self.doc = doc
        self.body: LocMap = doc[name]
        self.path = doc.loc.path
        self.kernel_root = kernel_root
        self.errors: list[SpecError] = []

    # -- helpers
    def loc(self, *keys: Any, key: bool = False) -> Loc:
        from .load import locate
        return locate(self.doc, [self.name, *keys], key=key)

    def err(self, keys: tuple, message: str, *, key: bool = False) -> None:
        self.errors.append(SpecError(self.loc(*keys, key=key), ".".join(map(str, keys)), message))

    def formula(self, container: LocMap, k: str, keys: tuple) -> Formula:
        return make_formula(container[k], container.value_locs[k], ".".join(map(str, keys)),
                            container.value_styles[k])

    def check_name(self, keys: tuple, what: str) -> None:
        name = keys[-1]
        if name in RESERVED:
            self.err(keys, f"'{name}' is a reserved word and cannot name {what}", key=True)
        elif isinstance(name, str) and reserved_identifier(name):
            self.err(keys, f"'{name}' is reserved for the C++ implementation (it contains '__' or starts "
                     f"with '_' and an uppercase letter) and cannot name {what}", key=True)

    # -- build
    def build(self) -> OpSpec:
        b = self.body
        typevars = tuple((v, tuple(ds)) for v, ds in (b.get("dtypes") or {}).items())
        declared = dict(typevars)
        used_vars: set[str] = set()

        def dtype_ok(keys: tuple, dtype: str) -> None:
            if dtype in declared:
                used_vars.add(dtype)
            elif dtype not in schema.DTYPES:
                self.err(keys, f"unknown dtype or type variable '{dtype}'"
                         f"{did_you_mean(dtype, list(declared) + list(schema.DTYPES))}")

        inputs = []
        for n, spec in (b.get("inputs") or {}).items():
            self.check_name(("inputs", n), "an input")
            dtype = spec["dtype"]
            dtype_ok(("inputs", n, "dtype"), dtype)
            concrete_non_float = dtype in schema.DTYPES and dtype not in schema.FLOAT_DTYPES
            diff = spec.get("differentiable", not concrete_non_float)
            if diff and concrete_non_float:
                self.err(("inputs", n, "differentiable"), f"an input of dtype {dtype} cannot be differentiable")
            inputs.append(Input(n, dtype, spec.get("optional", False), diff, spec.get("doc", ""),
                                self.loc("inputs", n, key=True)))
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

        attrs = []
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
        for n in attr_types:
            if n in input_names:
                self.err(("attrs", n), f"'{n}' names both an input and an attr", key=True)

        outputs = []
        for n, spec in b["outputs"].items():
            self.check_name(("outputs", n), "an output")
            if n in input_names or n in attr_types:
                self.err(("outputs", n), f"'{n}' names both an output and an input or attr", key=True)
            dtype = spec["dtype"]
            dtype_ok(("outputs", n, "dtype"), dtype)
            if dtype in declared and not any(i.dtype == dtype for i in inputs):
                self.err(("outputs", n, "dtype"), f"type variable '{dtype}' is not bound by any input")
            shape = self.shape_rule(("outputs", n, "shape"), spec["shape"], inputs, attr_types)
            diff = spec.get("differentiable", dtype in declared or dtype in schema.FLOAT_DTYPES)
            outputs.append(Output(n, dtype, shape, diff, spec.get("doc", ""),
                                  self.loc("outputs", n, key=True)))
        for o in outputs:
            if o.grad_name in input_names or o.grad_name in attr_types:
                self.err(("outputs", o.name), f"the gradient of output '{o.name}' is named "
                         f"'{o.grad_name}' in formulas, which clashes with an input or attr", key=True)
        for v in declared:
            if v not in used_vars:
                self.err(("dtypes", v), f"type variable '{v}' is not used by any input or output", key=True)

        targets = self.targets(declared)
        impl = self.impl(inputs, attrs, outputs)
        bprop = self.bprop(inputs, outputs, impl)
        tests = self.tests(inputs, attrs)
        if self.errors:
            raise SpecErrors(self.errors)
        return OpSpec(self.name, self.path, self.doc.key_locs[self.name], b["doc"].strip(), tuple(inputs),
                      tuple(outputs), tuple(attrs), typevars, targets, impl, bprop, tests)

    def attr(self, n: str, spec: LocMap) -> Attr:
        keys = ("attrs", n)
        atype = spec["type"]
        has_default = "default" in spec and spec["default"] is not None
        default = spec.get("default")
        required = spec.get("required", not has_default and "default" not in spec)
        if required and has_default:
            self.err(keys + ("required",), "a required attr cannot have a default")
        if has_default:
            if not _value_ok(atype, default):
                what = {"float": "a finite float", "int": "an int64", "list[int]": "a list of int64",
                        "list[float]": "a list of finite floats"}.get(atype, atype)
                self.err(keys + ("default",), f"default must be {what}, got {default!r}")
            elif atype == "float":
                default = float(default)
            elif atype == "list[float]":
                default = [float(x) for x in default]
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
        if (lo is not None or hi is not None) and atype not in ("int", "float"):
            self.err(keys + ("min" if lo is not None else "max",), "min/max apply to int and float attrs only")
        elif has_default and atype in ("int", "float") and _value_ok(atype, default):
            if lo is not None and default < lo:
                self.err(keys + ("default",), f"default {default!r} is below min {lo}")
            if hi is not None and default > hi:
                self.err(keys + ("default",), f"default {default!r} is above max {hi}")
        return Attr(n, atype, tuple(default) if isinstance(default, list) else default,
                    has_default, bool(required), choices, lo, hi, spec.get("doc", ""),
                    self.loc("attrs", n, key=True))

    def shape_rule(self, keys: tuple, text: str, inputs: list[Input], attr_types: dict) -> ShapeRule:
        m = _SHAPE.match(text)
        bad = ShapeRule("same", (), text)
        if not m:
            self.err(keys, f"cannot parse shape rule '{text}': expected one of "
                     f"{', '.join(r + '(...)' for r in SHAPE_RULES)}")
            return bad
        kind, rest = m.group(1), m.group(2)
        args = tuple(a.strip() for a in rest.split(",")) if rest.strip() else ()
        if kind not in SHAPE_RULES:
            self.err(keys, f"unknown shape rule '{kind}'{did_you_mean(kind, SHAPE_RULES)}")
            return bad
        names = {i.name: i for i in inputs}

        def want_input(a: str) -> None:
            if a not in names:
                self.err(keys, f"shape rule {kind}() names unknown input '{a}'{did_you_mean(a, names)}")
            elif names[a].optional:
                self.err(keys, f"shape rule {kind}() cannot read optional input '{a}'")

        arity = {"same": (1, 1), "reduce": (3, 3), "matmul": (2, 2), "infer": (1, 1)}.get(kind, (1, 99))
        if not arity[0] <= len(args) <= arity[1]:
            self.err(keys, f"{kind}() takes {arity[0] if arity[0] == arity[1] else 'at least 1'} "
                     f"argument{'s' if arity[0] != 1 else ''}, got {len(args)}")
            return bad
        if kind in ("same", "broadcast", "matmul"):
            for a in args:
                want_input(a)
        elif kind == "reduce":
            want_input(args[0])
            spec_attrs = self.body.get("attrs") or {}

            def optional_attr(n: str) -> bool:
                a = spec_attrs.get(n) or {}
                return a.get("default") is None and a.get("required") is False

            if attr_types.get(args[1]) not in ("list[int]", "int") or (
                    attr_types.get(args[1]) == "int" and optional_attr(args[1])):
                self.err(keys, f"reduce() axis '{args[1]}' must be a list[int] attr or a non-optional int attr")
            if args[2] not in ("true", "false") and (attr_types.get(args[2]) != "bool" or optional_attr(args[2])):
                self.err(keys, f"reduce() keepdims '{args[2]}' must be true, false or a non-optional bool attr")
        elif kind == "infer":
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args[0]):
                self.err(keys, f"infer() needs a C++ function name, got '{args[0]}'")
        return ShapeRule(kind, args, text)

    def targets(self, declared: dict[str, tuple[str, ...]]) -> tuple[Target, ...]:
        out = []
        for tname, tspec in self.body["targets"].items():
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
            dtypes = tuple((v, tuple(narrowed.get(v, ds))) for v, ds in declared.items())
            formats = tuple(tspec.get("formats") or schema.FORMATS)
            out.append(Target(tname, dtypes, formats))
        return tuple(out)

    def impl(self, inputs: list[Input], attrs: list[Attr], outputs: list[Output]) -> Impl:
        impl: LocMap = self.body["impl"]
        loc = self.loc("impl")
        if len(impl) != 1:
            self.err(("impl",), "give exactly one of expr, composite, cpp, aot")
            return Impl("expr", None, None, (), loc)
        kind = next(iter(impl))
        keys = ("impl", kind)
        if kind == "cpp":
            for t in self.body["targets"]:
                if t not in KERNEL_TARGETS:
                    continue  # kernels for other targets are not built yet
                if self.kernel_root is not None:
                    kernel = self.kernel_root / "src" / "kernels" / t / f"{self.name}.cpp"
                    if not kernel.is_file():
                        self.err(keys, f"missing kernel file {display_path(str(kernel))} for target {t}")
            return Impl("cpp", None, None, (), loc)
        if kind == "aot":
            aot = impl["aot"]
            for o in outputs:
                if o.shape.kind == "infer":
                    self.err(keys, "shape rule infer() needs a cpp impl (the function lives in its kernel file)")
            if attrs:
                self.err(keys, "an aot op takes no attrs: seed 004's C ABI passes tensors only "
                               "(MindSpore's extra is not there when opforge calls the kernel)")
            return Impl("aot", None, None, (), loc, (str(aot["library"]), str(aot["symbol"])))
        if any(o.shape.kind == "infer" for o in outputs):
            self.err(keys, "shape rule infer() needs a cpp impl (the function lives in its kernel file)")
        try:
            formula = self.formula(impl, kind, keys)
        except SpecError as exc:
            self.errors.append(exc)
            return Impl(kind, None, None, (), loc)
        if kind == "composite":
            if len(outputs) != 1:
                self.err(keys, "a composite op has exactly one output")
            return Impl("composite", formula, None, (), loc)
        if len(outputs) != 1:
            self.err(keys, "an expr op has exactly one output; use a cpp impl for several")
        for o in outputs:
            if o.shape.kind not in ("same", "broadcast"):
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
        scope = ExprScope([i.name for i in inputs], {a.name: a.type for a in attrs},
                          {a.name for a in attrs if a.optional_value},
                          {a.name: a.choices for a in attrs if a.choices is not None})
        try:
            lowered = lower_expr(formula, scope)
        except SpecError as exc:
            self.errors.append(exc)
            return Impl("expr", formula, None, (), loc)
        return Impl("expr", formula, lowered.code, lowered.flags, loc)

    def bprop(self, inputs: list[Input], outputs: list[Output], impl: Impl) -> Optional[Bprop]:
        spec = self.body.get("bprop")
        diff = [i.name for i in inputs if i.differentiable]
        if spec is None:
            if impl.kind != "composite" and diff:
                self.errors.append(SpecError(self.doc.key_locs[self.name], "bprop",
                                             f"missing: give a formula for each differentiable input "
                                             f"({', '.join(diff)}), or mark inputs differentiable: false"))
            return None
        lets = []
        grads = []
        let_spec = spec.get("let") or {}
        taken = {i.name for i in inputs} | {o.name for o in outputs} | {o.grad_name for o in outputs}
        taken |= {a for a in (self.body.get("attrs") or {})}
        for n in let_spec:
            if n in taken:
                self.err(("bprop", "let", n), f"let name '{n}' shadows an input, output, attr or gradient", key=True)
                continue
            try:
                lets.append((n, self.formula(let_spec, n, ("bprop", "let", n))))
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


# ---------------------------------------------------------------------------- cross-op checks


def check_ops(ops: list[OpSpec], extra: Optional[list[OpSpec]] = None,
              broken: frozenset = frozenset()) -> list[SpecError]:
    """Checks that need every op: the ops that formulas call exist and are called correctly.

    Ops whose formulas call an op in ``broken`` (a spec that failed to load) are skipped: they
    are checked again once that spec is fixed, rather than reported as calling an unknown op.
    """
    from .api import graph_scopes  # formulas are checked by lowering them, as emit does

    errors: list[SpecError] = []
    table = {o.name: o for o in (extra or [])}
    table.update({o.name: o for o in ops})
    for op in ops:
        if broken & _called_ops(op):
            continue
        try:
            graph_scopes(op, table)
        except SpecError as exc:
            errors.append(exc)
    return errors


def _called_ops(op: OpSpec) -> set[str]:
    formulas = [f for _, f in op.bprop.lets + op.bprop.grads] if op.bprop else []
    if op.impl.kind == "composite" and op.impl.formula is not None:
        formulas.append(op.impl.formula)
    return set().union(*[ops_in(f.ast) for f in formulas]) if formulas else set()


__all__ = ["OpSpec", "Input", "Output", "Attr", "Target", "Impl", "Bprop", "TestSpec", "ShapeRule",
           "check_ops", "names_in", "LocList"]
