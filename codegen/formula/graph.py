"""Graph formulas (``bprop``, ``bprop.let``, ``impl.composite``): checked against the ops they call
and lowered to code in a ``Lang`` (C++ or Python) in one walk, so each language emits exactly what
was checked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Callable, Mapping, Optional

from ..errors import SpecError, did_you_mean
from .kinds import BOOL, EMPTY_LIST, FLOAT, FLOAT_LIST, INT, INT_LIST, NUMBER, OUTPUTS, STR, TENSOR, Kind, VType
from .lang import CPP, CppLang
from .syntax import (ARITHMETIC_OPS, COMPARE_OPS, OPERATOR_OPS, Binary, BoolLit, Call, Formula, ListLit, Name, Node, Num, Select,
                     Str, Unary)


class Param(StrEnum):
    """What a helper's parameter takes."""

    TENSOR = "tensor"
    AXES = "axes"          # an optional list[int] (an int is one axis)
    BOOL = "bool"
    OPTIONAL = "optional"  # an optional input or attr (if_given's test)
    INPUT = "input"        # a differentiable input (if_needs's test)
    ANY = "any"


# the types a helper's tensor, axes and bool parameters want
PARAM_TYPES = {Param.TENSOR: TENSOR, Param.AXES: VType(Kind.INT_LIST, optional=True), Param.BOOL: BOOL}

# helpers usable in graph formulas: name -> (parameters, result type; None: its branches' type)
HELPERS: Mapping[str, tuple[tuple[Param, ...], Optional[VType]]] = {
    "zeros_like": ((Param.TENSOR,), TENSOR),
    "ones_like": ((Param.TENSOR,), TENSOR),
    "cast_like": ((Param.TENSOR, Param.TENSOR), TENSOR),
    "numel": ((Param.TENSOR,), NUMBER),
    "numel_ratio": ((Param.TENSOR, Param.TENSOR), NUMBER),
    "expand_reduced": ((Param.TENSOR, Param.TENSOR, Param.AXES, Param.BOOL), TENSOR),
    "if_given": ((Param.OPTIONAL, Param.ANY, Param.ANY), None),
    "if_needs": ((Param.INPUT, Param.ANY, Param.ANY), None),
}


@dataclass(frozen=True)
class OpSignature:
    """What a formula needs to know to call an op."""

    name: str
    inputs: tuple[tuple[str, bool], ...]          # (name, optional)
    attrs: tuple[tuple[str, str, bool, str, str], ...]  # (name, type (AttrType), required, C++ default, Python default)
    outputs: tuple[str, ...]
    # per input, the index of its type variable (-1: a concrete dtype); empty: not known
    groups: tuple[int, ...] = ()

    def outputs_text(self) -> str:
        return f"{len(self.outputs)} output{'s' if len(self.outputs) != 1 else ''} ({', '.join(self.outputs)})"

    def default_code(self, attr: str, lang: CppLang) -> str:
        """The attr's default value as code in lang."""
        row = next(a for a in self.attrs if a[0] == attr)
        return lang.attr_default(row[3], row[4])


@dataclass
class GraphScope:
    """Names visible in a bprop or composite formula."""

    tensors: Mapping[str, str]         # name -> code (a tensor)
    optional: set[str]                 # tensor names that may be absent (null)
    attrs: Mapping[str, tuple[VType, str]]  # name -> (type, code): attrs, and number lets
    ops: Mapping[str, OpSignature]
    used_ops: set[str] = field(default_factory=set)
    # optional tensors present with another (an optional input's tangent in jvp formulas): name -> them
    companions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # lets bound only when optional inputs are given (``a: if_given(w, f)``): name -> those inputs
    guards: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # bprop formulas only: the differentiable inputs, name -> index (if_needs's tests)
    needs: Optional[Mapping[str, int]] = None
    # each use of a tensor name: name -> the inputs whose gradients if_needs branches around the
    # use ask for (so a let is computed only where a taken branch reads it)
    uses: dict[str, list[frozenset[int]]] = field(default_factory=dict)

    def unlock(self, name: str) -> list[str]:
        """Mark optional input ``name`` given (with its companions); returns what to mark back."""
        unlocked = [n for n in (name, *self.companions.get(name, ())) if n in self.optional]
        self.optional.difference_update(unlocked)
        return unlocked


Lowered = tuple[str, VType]  # (code, the value's type)


class _Lowering:
    """One walk over a formula's AST: each node kind checked and spelled by its own method."""

    def __init__(self, formula: Formula, scope: GraphScope, lang: CppLang):
        self.formula = formula
        self.scope = scope
        self.lang = lang
        self.counter = 0
        self.needed: frozenset[int] = frozenset()  # the if_needs first branches around the node

    def error(self, pos: int, message: str) -> SpecError:
        return self.formula.error(pos, message)

    # -- helpers
    def need_op(self, name: str, pos: int, what: str) -> OpSignature:
        if name not in self.scope.ops:
            raise self.error(pos, f"{what} needs op '{name}', which is not defined")
        self.scope.used_ops.add(name)
        return self.scope.ops[name]

    def bind_like(self, tensor_code: str, build: Callable[[str], str]) -> str:
        """Evaluate tensor_code once: scalars become 0-d tensors of its dtype."""
        if re.fullmatch(r"v_\w+", tensor_code):
            return build(tensor_code)
        name = f"t{self.counter}_"
        self.counter += 1
        return self.lang.bind_like(tensor_code, name, build(name))

    # -- nodes
    def go(self, node: Node) -> Lowered:
        if isinstance(node, Num):
            if isinstance(node.value, int):
                return node.text, INT
            return repr(float(node.value)), FLOAT
        if isinstance(node, BoolLit):
            return self.lang.boolean(node.value), BOOL
        if isinstance(node, Str):
            return self.lang.string(node.value), STR
        if isinstance(node, ListLit):
            return self.list_lit(node)
        if isinstance(node, Name):
            return self.name(node)
        if isinstance(node, Unary):
            code, kind = self.go(node.operand)
            if kind.is_tensor:
                self.need_op("neg", node.pos, "unary '-'")
                return self.lang.op("neg", [code]), TENSOR
            return self.lang.negate(code), kind
        if isinstance(node, Binary):
            return self.binary(node)
        if isinstance(node, Select):
            return self.select(node)
        if isinstance(node, Call):
            if node.func in HELPERS:
                if node.func == "if_given":
                    return self.if_given(node)
                return self.if_needs(node) if node.func == "if_needs" else self.helper(node)
            if node.func == "where" and len(node.args) == 3 and not node.kwargs:
                chosen = self.static_where(node)
                if chosen is not None:
                    return chosen
            if node.func in self.scope.ops:
                return self.call_op(node)
            known = list(self.scope.ops) + list(HELPERS)
            raise self.error(node.pos, f"unknown op '{node.func}'{did_you_mean(node.func, known)}")
        raise self.error(0, "unsupported expression")  # pragma: no cover

    def list_lit(self, node: ListLit) -> Lowered:
        if not node.items:
            return self.lang.untyped_empty_list, EMPTY_LIST
        items = [self.go(i) for i in node.items]
        types = {t for _, t in items}
        if types <= {INT}:
            return self.lang.num_list([c for c, _ in items], Kind.INT), INT_LIST
        if all(t.is_number for t in types):
            return self.lang.num_list([c for c, _ in items], Kind.FLOAT), FLOAT_LIST
        raise self.error(node.pos, "list items must be numbers")

    def name(self, node: Name) -> Lowered:
        scope = self.scope
        if node.id in scope.tensors:
            if node.id in scope.optional:
                owner = next((k for k, v in scope.companions.items() if node.id in v), None)
                if owner is not None:
                    raise self.error(node.pos, f"'{node.id}' is absent with optional input '{owner}'; "
                                     f"use it in if_given({owner}, ..., ...)'s first branch")
                raise self.error(node.pos, f"optional input '{node.id}' may be absent; "
                                 f"use if_given({node.id}, ..., ...)")
            absent = [g for g in scope.guards.get(node.id, ()) if g in scope.optional]
            if absent:
                needs = " and ".join(scope.guards[node.id])
                raise self.error(node.pos, f"let '{node.id}' is bound only when {needs} "
                                 f"{'is' if len(scope.guards[node.id]) == 1 else 'are'} given; use it in "
                                 + " inside ".join(f"if_given({g}, ..., ...)" for g in absent)
                                 + "'s first branch")
            scope.uses.setdefault(node.id, []).append(self.needed)
            return scope.tensors[node.id], TENSOR
        if node.id in scope.attrs:
            scope.uses.setdefault(node.id, []).append(self.needed)
            atype, code = scope.attrs[node.id]
            return code, atype
        known = list(scope.tensors) + list(scope.attrs)
        raise self.error(node.pos, f"unknown name '{node.id}'{did_you_mean(node.id, known)}")

    def static_where(self, node: Call) -> Optional[Lowered]:
        """``where(test, a, b)`` whose test is a bool (an attr test such as ``approximate ==
        "tanh"``, as derived formulas have), not a tensor: one branch, chosen once per call."""
        test, kind = self.go(node.args[0])
        if kind != BOOL:
            return None
        ac, ak = self.go(node.args[1])
        bc, bk = self.go(node.args[2])
        if ak.is_tensor != bk.is_tensor:
            raise self.error(node.pos, "where() with a bool test: both branches must be tensors or both numbers")
        return self.lang.choose(test, ac, bc), ak

    def binary(self, node: Binary) -> Lowered:
        op, lang = node.op, self.lang
        lc, lk = self.go(node.left)
        rc, rk = self.go(node.right)
        if op in ("==", "!=") and lk == STR and rk == STR:  # a str attr tested against a string
            return lang.number(op, lc, rc), BOOL
        for k, n in ((lk, node.left), (rk, node.right)):
            if not (k.is_tensor or k.is_number):
                raise self.error(n.pos, f"operator '{op}' needs tensors or numbers, got {k}")
        if not lk.is_tensor and not rk.is_tensor:
            return lang.number(op, lc, rc), (BOOL if op in COMPARE_OPS else NUMBER)
        fn = self.need_op(OPERATOR_OPS[op], node.pos, f"operator {op!r}").name
        if lk.is_tensor and rk.is_tensor:
            return lang.op(fn, [lc, rc]), TENSOR
        if op in ARITHMETIC_OPS:  # (computed as the op's kernel computes its dtype: 16-bit floats in float32)
            if lk.is_tensor:
                return lang.with_number(fn, lc, rc, number_first=False), TENSOR
            return lang.with_number(fn, rc, lc, number_first=True), TENSOR
        if lk.is_tensor:
            return self.bind_like(lc, lambda t: lang.op(fn, [t, lang.scalar_like(rc, t)])), TENSOR
        return self.bind_like(rc, lambda t: lang.op(fn, [lang.scalar_like(lc, t), t])), TENSOR

    def select(self, node: Select) -> Lowered:
        """``op(...).output``: one output of a multi-output op's call."""
        call = node.call
        if call.func not in self.scope.ops:
            if call.func in HELPERS:
                raise self.error(node.pos, f"{call.func}() has one result: nothing to select")
            return self.go(call)  # reports the unknown op
        sig = self.scope.ops[call.func]
        if len(sig.outputs) == 1:
            raise self.error(node.pos, f"op '{call.func}' has one output: call it without selecting")
        if node.name not in sig.outputs:
            raise self.error(node.pos, f"op '{call.func}' has no output '{node.name}'"
                             f"{did_you_mean(node.name, sig.outputs)}; it has {sig.outputs_text()}")
        code, _ = self.call_op(call, whole=True)
        return self.lang.output(code, sig.outputs.index(node.name)), TENSOR

    def call_op(self, node: Call, whole: bool = False) -> Lowered:
        """A call of an op: a tensor, or with ``whole`` the outputs of a multi-output op (OUTPUTS),
        which a let binds or ``.output`` selects from."""
        sig = self.need_op(node.func, node.pos, "this formula")
        if len(sig.outputs) != 1 and not whole:
            raise self.error(node.pos, f"op '{node.func}' has {sig.outputs_text()}: select one "
                             f"({node.func}(...).{sig.outputs[0]}) or bind them all in a let "
                             f"({', '.join(sig.outputs)}: {node.func}(...))")
        result = TENSOR if len(sig.outputs) == 1 else OUTPUTS
        required = [n for n, opt in sig.inputs if not opt]
        if not (len(required) <= len(node.args) <= len(sig.inputs)):
            names = ", ".join(n for n, _ in sig.inputs)
            count = (f"{len(sig.inputs)}" if len(required) == len(sig.inputs)
                     else f"{len(required)} to {len(sig.inputs)}")
            raise self.error(node.pos, f"{node.func}() takes {count} input"
                             f"{'s' if len(sig.inputs) != 1 else ''} ({names}), got {len(node.args)}")
        lowered = [self.go(a) for a in node.args]
        like = next((k for k, (_, kind) in enumerate(lowered) if kind.is_tensor), None)
        for (code, kind), arg in zip(lowered, node.args):
            if not kind.is_tensor and (not kind.is_number or like is None):
                raise self.error(arg.pos, f"{node.func}(): inputs must be tensors, got {kind}")
        if sig.groups and like is not None:
            # a number takes the dtype of a tensor given for an input of its type variable (as
            # calls take numbers), not of any tensor: where(x > 0, 1.5, -2.5)'s numbers are not bool
            partners = set()
            for k, ((_, kind), arg) in enumerate(zip(lowered, node.args)):
                if kind.is_tensor:
                    continue
                partner = next((j for j, (_, other) in enumerate(lowered) if other.is_tensor and sig.groups[k] >= 0
                                and sig.groups[j] == sig.groups[k]), None)
                if partner is None:
                    why = ("has no tensor of its type variable beside it to take a dtype from" if sig.groups[k] >= 0
                           else "is an input of a fixed dtype, which a number does not take")
                    raise self.error(arg.pos, f"{node.func}(): the number for input '{sig.inputs[k][0]}' {why}: "
                                     "write it as a tensor (a tensor of the intended dtype times the number)")
                partners.add(partner)
            if len(partners) > 1:
                raise self.error(node.pos, f"{node.func}(): numbers of two type variables in one call: write one "
                                 "of them as a tensor")
            like = partners.pop() if partners else like
        tail = [self.lang.null] * (len(sig.inputs) - len(node.args))
        args = self.op_attrs(node, sig)

        def build(t: str) -> str:
            ins = [t if k == like else (code if kind.is_tensor else self.lang.scalar_like(code, t))
                   for k, (code, kind) in enumerate(lowered)]
            return self.lang.op(node.func, ins + tail + args)

        if like is None or all(kind.is_tensor for _, kind in lowered):
            return build(lowered[like][0] if like is not None else ""), result
        return self.bind_like(lowered[like][0], build), result

    def op_attrs(self, node: Call, sig: OpSignature) -> list[str]:
        """The called op's attrs as code: the keyword arguments given, converted to each attr's
        type, else its default."""
        given = {k: (v, p) for k, v, p in node.kwargs}
        attr_names = [a[0] for a in sig.attrs]
        for k, (_, p) in given.items():
            if k not in attr_names:
                raise self.error(p, f"{node.func}() has no attr '{k}'{did_you_mean(k, attr_names)}")
        args: list[str] = []
        for name, atype, required_attr, default, _ in sig.attrs:
            if name in given:
                value, p = given[name]
                code, kind = self.go(value)
                want = VType(Kind(str(atype)), optional=default == "std::nullopt")
                converted = self.lang.convert_attr(want, code, kind)
                if converted is None:
                    raise self.error(p, f"{node.func}(): attr '{name}' must be {want}, got {kind}")
                args.append(converted)
            elif required_attr:
                raise self.error(node.pos, f"{node.func}(): missing required attr '{name}'")
            else:
                args.append(sig.default_code(name, self.lang))
        return args

    def check_helper_arity(self, node: Call) -> tuple[Param, ...]:
        params, _ = HELPERS[node.func]
        if node.kwargs:
            raise self.error(node.kwargs[0][2], f"{node.func}() takes no keyword arguments")
        if len(node.args) != len(params):
            raise self.error(node.pos, f"{node.func}() takes {len(params)} argument"
                             f"{'s' if len(params) != 1 else ''}, got {len(node.args)}")
        return params

    def if_given(self, node: Call) -> Lowered:
        if len(node.args) == 2 and not node.kwargs:
            raise self.error(node.pos, "if_given() with two arguments (no value when absent) may only be a let's "
                             "whole formula, binding the let only when the input is given")
        self.check_helper_arity(node)
        scope, lang = self.scope, self.lang
        cond = node.args[0]
        is_attr = isinstance(cond, Name) and cond.id in scope.attrs and scope.attrs[cond.id][0].optional
        if not (isinstance(cond, Name) and (cond.id in scope.optional or is_attr)):
            raise self.error(cond.pos, "if_given() needs an optional input or optional attr "
                             "as its first argument")
        assert isinstance(cond, Name)
        if is_attr:  # present in the first branch only: there the attr has its plain type
            saved = scope.attrs[cond.id]
            test, inner = lang.given_attr(saved[1])
            scope.attrs = {**scope.attrs, cond.id: (saved[0].given(), inner)}
            try:
                ac, ak = self.go(node.args[1])
            finally:
                scope.attrs = {**scope.attrs, cond.id: saved}
        else:
            unlocked = scope.unlock(cond.id)
            try:
                ac, ak = self.go(node.args[1])
            finally:
                scope.optional.update(unlocked)
            test = lang.given_tensor(scope.tensors[cond.id])
        bc, bk = self.go(node.args[2])
        if ak.is_tensor != bk.is_tensor:
            raise self.error(node.pos, "if_given(): both branches must be tensors or both numbers")
        return lang.choose(test, ac, bc), ak

    def if_needs(self, node: Call) -> Lowered:
        """``if_needs(x, a, b)``: a when this backward computes input x's gradient (x is then
        given), else b: two ways to the same gradient, the cheaper one for the gradients asked for
        (a frozen weight's is not, but under MindSpore, which asks for every given input's)."""
        self.check_helper_arity(node)
        scope = self.scope
        if scope.needs is None:
            raise self.error(node.pos, "if_needs() is for bprop formulas: only a backward knows which "
                             "gradients are asked for")
        cond = node.args[0]
        if not (isinstance(cond, Name) and cond.id in scope.needs):
            raise self.error(cond.pos, "if_needs() needs a differentiable input as its first argument"
                             f" ({', '.join(scope.needs)})")
        k = scope.needs[cond.id]
        unlocked = scope.unlock(cond.id)  # (an input whose gradient is asked for is given)
        outer, self.needed = self.needed, self.needed | {k}
        try:
            ac, ak = self.go(node.args[1])
        finally:
            scope.optional.update(unlocked)
            self.needed = outer
        bc, bk = self.go(node.args[2])
        if ak.is_tensor != bk.is_tensor:
            raise self.error(node.pos, "if_needs(): both branches must be tensors or both numbers")
        return self.lang.choose(self.lang.need(k), ac, bc), ak

    def helper(self, node: Call) -> Lowered:
        params = self.check_helper_arity(node)
        codes = []
        for param, arg in zip(params, node.args):
            code, kind = self.go(arg)
            want = PARAM_TYPES[param]
            converted = (code if kind == want else self.lang.convert_attr(want, code, kind) if param == Param.AXES
                         else None)
            if converted is None:
                raise self.error(arg.pos, f"{node.func}(): expected {want}, got {kind}")
            codes.append(converted)
        result = HELPERS[node.func][1]
        assert result is not None  # (if_given and if_needs, typed by their branches, are lowered apart)
        return self.lang.helper(node.func, codes), result


def peel_guards(formula: Formula, scope: GraphScope) -> tuple[tuple[str, ...], Formula]:
    """A let's formula ``if_given(w, if_given(b, f))`` (no value when absent): the optional inputs
    it needs (w, b) and f, checked; the let is bound only when they are all given, and formulas
    may use it only where if_given has them given. Other formulas: ((), formula)."""
    guards: list[str] = []
    node = formula.ast
    while isinstance(node, Call) and node.func == "if_given" and len(node.args) == 2 and not node.kwargs:
        cond = node.args[0]
        if not (isinstance(cond, Name) and cond.id in scope.optional and cond.id in scope.tensors):
            raise formula.error(cond.pos, "if_given() binding a let needs an optional input as its first argument")
        if cond.id in guards:
            raise formula.error(cond.pos, f"if_given({cond.id}, ...) twice")
        guards.append(cond.id)
        node = node.args[1]
    return tuple(guards), (replace(formula, ast=node) if guards else formula)


def lower_outputs(formula: Formula, names: tuple[str, ...], scope: GraphScope, lang: CppLang = CPP) -> str:
    """Check a formula whose value a let binds to several ``names`` (a call of an op with that many
    outputs) and lower it to ``lang``: the op's outputs, in order."""
    node = formula.ast
    binding = ", ".join(names)
    if not (isinstance(node, Call) and node.func in scope.ops):
        raise formula.error(0, f"a let binding {len(names)} names ({binding}) needs a call of an op with "
                            f"{len(names)} outputs")
    sig = scope.ops[node.func]
    if len(sig.outputs) != len(names):
        raise formula.error(node.pos, f"op '{node.func}' has {sig.outputs_text()}, but the let binds "
                            f"{len(names)} name{'s' if len(names) != 1 else ''} ({binding})")
    code, _ = _Lowering(formula, scope, lang).call_op(node, whole=True)
    return code


def lower_graph(formula: Formula, scope: GraphScope, lang: CppLang = CPP) -> Lowered:
    """Check a graph formula and lower it to an expression in ``lang``; returns (code, kind).

    Checking is the same walk for every language, so each emits exactly what was checked."""
    return _Lowering(formula, scope, lang).go(formula.ast)
