"""Shape rules as data: an output's shape written as an expression over its inputs' shapes and its
attrs (``shape(indices) + [dim(weight, 1)]``), and the op's ``checks`` (a condition and the error
it raises), checked and lowered in one walk to C++ (eager calls, AOT, meta) and to Python (the
adapters' fake kernels, where sizes may be symbolic: torch's SymInts stay symbolic, so dynamic
shapes need no specialization).

Values: a dimension (an int), dimensions (a list of them), a bool, a str (an attr, only compared).

- ``rank(t)``: t's number of dimensions; ``dim(t, i)``: its size along i (negative from the end;
  out of range raises); ``shape(t)``: its dimensions; ``dims(t, start)``, ``dims(t, start, stop)``:
  a slice of them, as Python's ``shape[start:stop]``;
- ``[a, b]``: dimensions; ``+`` concatenates dimensions, and adds dimensions (``- *`` too: in
  C++ a result that would overflow int64 raises ValueError naming the op, runtime/functional.h);
- comparisons of dimensions (all six), of dimension lists and strs (``==``, ``!=``): bools;
- ``where(test, a, b)``: a choice; ``if_given(w, a, b)``: a when the optional input w is given;
- ``drop(d, i)``: dimensions d without the i-th (negative from the end; a 0-d tensor's dimensions
  with i 0 or -1 stay empty, as its axis 0 is no axis);
- in checks and their messages (the shape rules of those names are whole rules):
  ``broadcast(t, u, ...)``, the inputs' broadcast shape (ValueError naming them when they do not
  broadcast); ``reduce(t, axis, keepdims)``, t's shape reduced over an axis attr;
  ``matmul(a, b)``, matmul's result shape (its errors); ``broadcasts(d, e)``, whether dimensions d
  broadcast to dimensions e;
- attrs: int (a dimension), bool, list[int] (dimensions), str (compared with a string).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Mapping, Optional, Sequence

from .. import escape
from ..errors import SpecError, did_you_mean
from .syntax import COMPARE_OPS, Binary, BoolLit, Call, Formula, ListLit, Name, Node, Num, Str, Unary


class DKind(StrEnum):
    DIM = "a dimension"
    DIMS = "dimensions"
    BOOL = "a bool"
    STR = "a str"


FUNCTIONS = {"rank": (1, 1), "dim": (2, 2), "shape": (1, 1), "dims": (2, 3), "where": (3, 3), "if_given": (3, 3),
             "drop": (2, 2), "broadcast": (2, 99), "reduce": (3, 3), "matmul": (2, 2), "broadcasts": (2, 2)}
# (the functions a shape rule of an output has as its whole rule, and the test of broadcasting: in
# checks and their messages, where every dimension is known)
CHECK_FUNCTIONS = frozenset({"broadcast", "reduce", "matmul", "broadcasts"})


@dataclass(frozen=True)
class DimScope:
    op: str
    inputs: Sequence[str]
    optional: set[str]
    attrs: Mapping[str, str]      # name -> attr type as specs spell it ("int", "list[int]", ...)
    optional_attrs: frozenset[str] = frozenset()  # attrs without a default that may be None


_ATTR_KINDS = {"int": DKind.DIM, "bool": DKind.BOOL, "list[int]": DKind.DIMS, "str": DKind.STR}


# C++ functors of the comparisons, for dim_compare (dynamic lowering)
_CPP_COMPARE = {"<": "std::less<>", "<=": "std::less_equal<>", ">": "std::greater<>", ">=": "std::greater_equal<>",
                "==": "std::equal_to<>", "!=": "std::not_equal_to<>"}
# C++ arithmetic of dimensions: checked for int64 overflow (shape_add, ...), and in dynamic lowering
# keeping unknown dimensions unknown (dim_add, ...)
_CPP_ARITH = {"+": "add", "-": "sub", "*": "mul"}


class _Lowering:
    """One walk over a shape expression, checking it and writing C++ or Python. ``dynamic`` C++
    reads dimensions that may be unknown (kUnknownDim, runtime/functional.h): arithmetic keeps them
    unknown, and a comparison or an index that needs one throws UnknownShape."""

    def __init__(self, formula: Formula, scope: DimScope, cpp: bool, dynamic: bool = False, check: bool = False):
        self.formula = formula
        self.scope = scope
        self.cpp = cpp
        self.dynamic = dynamic and cpp
        self.check = check
        self.present: set[str] = set()
        # C++ checks: the values of broadcast(), reduce() and matmul() computed once per check_shapes
        # (code -> the local holding it; ``bindings`` the locals this expression defines, each
        # computed where the expression first needs it, outside any where()/if_given() branch)
        self.hoist: Optional[dict[str, str]] = None
        self.bindings: Optional[list[tuple[str, str]]] = None
        self.branch = 0

    def op_name(self) -> str:
        return escape.cpp_str(self.scope.op)

    def arith(self, name: str) -> str:
        """The runtime function of a C++ arithmetic operation (runtime/functional.h)."""
        return f"{'dim' if self.dynamic else 'shape'}_{name}"

    def index(self, node: Node) -> str:
        """A dimension used as an index (dim(), dims())."""
        code = self.want(node, (DKind.DIM,))
        constant = isinstance(node, Num) or (isinstance(node, Unary) and isinstance(node.operand, Num))
        return f"known({code})" if self.dynamic and not constant else code

    def error(self, node: Node, message: str) -> SpecError:
        return self.formula.error(node.pos, message)

    def tensor(self, node: Node) -> str:
        """An input as a function's argument (C++: the TensorPtr; Python: its shape tuple)."""
        if not isinstance(node, Name) or node.id not in self.scope.inputs:
            raise self.error(node, "expected an input's name")
        if node.id in self.scope.optional and node.id not in self.present:
            raise self.error(node, f"optional input '{node.id}' may be absent; use if_given({node.id}, ..., ...)")
        return f"v_{node.id}" if self.cpp else f"s_{node.id}"

    def want(self, node: Node, kinds: tuple[DKind, ...]) -> str:
        code, kind = self.go(node)
        if kind not in kinds:
            raise self.error(node, f"expected {' or '.join(kinds)}, got {kind}")
        return code

    def go(self, node: Node) -> tuple[str, DKind]:
        cpp = self.cpp
        if isinstance(node, Num):
            if not isinstance(node.value, int):
                raise self.error(node, "dimensions are integers")
            return (f"int64_t({node.text})" if cpp else node.text), DKind.DIM
        if isinstance(node, BoolLit):
            return ("true" if node.value else "false") if cpp else repr(node.value), DKind.BOOL
        if isinstance(node, Str):
            return (f"std::string({escape.cpp_str(node.value)})" if cpp else escape.py_str(node.value)), DKind.STR
        if isinstance(node, Name):
            if node.id in self.scope.attrs:
                kind = _ATTR_KINDS.get(self.scope.attrs[node.id])
                if kind is None:
                    raise self.error(node, f"attr '{node.id}' is {self.scope.attrs[node.id]}; shape rules read "
                                     "int, bool, list[int] and str attrs")
                if node.id in self.scope.optional_attrs:
                    raise self.error(node, f"attr '{node.id}' may be None (it has no default): shape rules read "
                                     "attrs that have a value (a list[int] axis may go to reduce())")
                return (f"attrs.{node.id}" if cpp else f"a_{node.id}"), kind
            if node.id in self.scope.inputs:
                raise self.error(node, f"'{node.id}' is a tensor: use shape({node.id}), dim({node.id}, i) or "
                                 f"rank({node.id})")
            known = list(self.scope.inputs) + list(self.scope.attrs)
            raise self.error(node, f"unknown name '{node.id}'{did_you_mean(node.id, known)}")
        if isinstance(node, ListLit):
            items = [self.want(i, (DKind.DIM,)) for i in node.items]
            return (f"Shape{{{', '.join(items)}}}" if cpp else f"[{', '.join(items)}]"), DKind.DIMS
        if isinstance(node, Unary):
            operand = self.want(node.operand, (DKind.DIM,))
            if isinstance(node.operand, Num) or not self.cpp:  # (a literal's negation cannot overflow)
                return f"(-{operand})", DKind.DIM
            return f"{self.arith('neg')}({self.op_name()}, {operand})", DKind.DIM
        if isinstance(node, Binary):
            return self.binary(node)
        if isinstance(node, Call):
            return self.call(node)
        raise self.error(node, "not allowed in a shape rule")

    def binary(self, node: Binary) -> tuple[str, DKind]:
        lc, lk = self.go(node.left)
        rc, rk = self.go(node.right)
        if node.op in COMPARE_OPS:
            ok = lk == rk and (lk == DKind.DIM or node.op in ("==", "!="))
            if not ok:
                raise self.error(node, f"cannot compare {lk} with {rk} by '{node.op}'")
            if self.dynamic and lk == DKind.DIM:
                return f"dim_compare({lc}, {rc}, {_CPP_COMPARE[node.op]}())", DKind.BOOL
            if self.dynamic and lk == DKind.DIMS:
                return f"dims_compare({lc}, {rc}, {'true' if node.op == '==' else 'false'})", DKind.BOOL
            if not self.cpp and lk == DKind.DIMS:  # (one test of symbolic sizes: no guard on each)
                return f"H.{'dims_equal' if node.op == '==' else 'dims_differ'}({lc}, {rc})", DKind.BOOL
            return f"({lc} {node.op} {rc})", DKind.BOOL
        if node.op == "+" and lk == rk == DKind.DIMS:
            return (f"shape_cat({lc}, {rc})" if self.cpp else f"({lc} + {rc})"), DKind.DIMS
        if node.op in ("+", "-", "*") and lk == rk == DKind.DIM:
            return ((f"{self.arith(_CPP_ARITH[node.op])}({self.op_name()}, {lc}, {rc})" if self.cpp
                     else f"({lc} {node.op} {rc})"), DKind.DIM)
        raise self.error(node, f"operator '{node.op}' does not apply to {lk} and {rk}")

    def call(self, node: Call) -> tuple[str, DKind]:
        f = node.func
        if f not in FUNCTIONS:
            raise self.error(node, f"unknown function '{f}' in a shape rule{did_you_mean(f, FUNCTIONS)}")
        lo, hi = FUNCTIONS[f]
        if node.kwargs or not lo <= len(node.args) <= hi:
            count = str(lo) if lo == hi else f"{lo} or {hi}"
            raise self.error(node, f"{f}() takes {count} arguments")
        if f in CHECK_FUNCTIONS and not self.check:
            raise self.error(node, f"{f}() is for checks and their messages; an output whose shape is "
                             f"{'a broadcast, a reduction or a matmul' if f != 'broadcasts' else 'any'} "
                             "takes the shape rule of that name as its whole rule")
        a, cpp, op = node.args, self.cpp, escape.cpp_str(self.scope.op) if self.cpp else repr(self.scope.op)
        if f in ("drop", "broadcasts", "broadcast", "reduce", "matmul"):
            code, kind = self.check_call(node, f, a, cpp, op)
            return self.shared(code) if f in CHECK_FUNCTIONS and kind == DKind.DIMS else code, kind
        if f == "rank":
            t = self.tensor(a[0])
            return (f"int64_t({t}->dim())" if cpp else f"len({t})"), DKind.DIM
        if f == "shape":
            t = self.tensor(a[0])
            return (f"{t}->shape()" if cpp else f"list({t})"), DKind.DIMS
        if f == "dim":
            t = self.tensor(a[0])
            i = self.index(a[1])
            name = a[0].id  # type: ignore[union-attr]
            return (f"shape_dim({op}, {escape.cpp_str(name)}, {t}->shape(), {i})" if cpp
                    else f"H.dim({op}, {name!r}, {t}, {i})"), DKind.DIM
        if f == "dims":
            t = self.tensor(a[0])
            start = self.index(a[1])
            if len(a) == 3:
                stop = self.index(a[2])
                return (f"shape_slice({t}->shape(), {start}, {stop})" if cpp else f"list({t}[{start}:{stop}])"), DKind.DIMS
            return (f"shape_slice({t}->shape(), {start})" if cpp else f"list({t}[{start}:])"), DKind.DIMS
        if f == "where":
            test = self.want(a[0], (DKind.BOOL,))
            self.branch += 1
            try:
                bc, bk = self.go(a[1])
                cc, ck = self.go(a[2])
            finally:
                self.branch -= 1
            if bk != ck:
                raise self.error(node, f"where(): both branches must be of one kind, got {bk} and {ck}")
            return (f"({test} ? {bc} : {cc})" if cpp else f"({bc} if {test} else {cc})"), bk
        # if_given(w, a, b)
        w = a[0]
        if not (isinstance(w, Name) and w.id in self.scope.optional):
            raise self.error(w, "if_given() needs an optional input as its first argument")
        given = w.id in self.present
        self.present.add(w.id)
        self.branch += 1
        try:
            bc, bk = self.go(a[1])
        finally:
            if not given:
                self.present.discard(w.id)
        try:
            cc, ck = self.go(a[2])
        finally:
            self.branch -= 1
        if bk != ck:
            raise self.error(node, f"if_given(): both branches must be of one kind, got {bk} and {ck}")
        test = f"v_{w.id}" if cpp else f"s_{w.id} is not None"
        return (f"({test} ? {bc} : {cc})" if cpp else f"({bc} if {test} else {cc})"), bk

    def shared(self, code: str) -> str:
        """A C++ check's broadcast(), reduce() or matmul() value: the local an earlier check (or an
        earlier part of this one) computed, or a new local, computed before this check's test when
        that test always reaches it (outside where() and if_given() branches)."""
        if self.hoist is None:
            return code
        if code in self.hoist:
            return self.hoist[code]
        if self.branch or self.bindings is None:
            return code
        var = f"k{len(self.hoist)}_"
        self.hoist[code] = var
        self.bindings.append((var, code))
        return var

    def check_call(self, node: Call, f: str, a: Sequence[Node], cpp: bool, op: str) -> tuple[str, DKind]:
        """drop(), broadcasts() and the functions of checks: broadcast(), reduce(), matmul()."""
        if f == "drop":
            d = self.want(a[0], (DKind.DIMS,))
            i = self.index(a[1])
            return (f"shape_drop({op}, {d}, {i})" if cpp else f"H.drop({op}, {d}, {i})"), DKind.DIMS
        if f == "broadcasts":
            d = self.want(a[0], (DKind.DIMS,))
            e = self.want(a[1], (DKind.DIMS,))
            return (f"broadcasts_to({d}, {e})" if cpp else f"H.broadcasts({d}, {e})"), DKind.BOOL
        if f == "broadcast":
            ts = [self.tensor(t) for t in a]
            names = [t.id for t in a if isinstance(t, Name)]  # (each a Name: self.tensor checked it)
            if len(set(names)) != len(names):
                raise self.error(node, "broadcast() names each input once")
            if cpp:
                return (f"broadcast_shapes({op}, {{{', '.join(f'{t}.get()' for t in ts)}}}, "
                        f"{{{', '.join(escape.cpp_str(n) for n in names)}}})"), DKind.DIMS
            return f"H.broadcast({op}, {tuple(names)!r}, {', '.join(ts)})", DKind.DIMS
        if f == "matmul":
            ta, tb = self.tensor(a[0]), self.tensor(a[1])
            return (f"matmul_shape({op}, {ta}->shape(), {tb}->shape())" if cpp
                    else f"H.matmul({op}, {ta}, {tb})"), DKind.DIMS
        # reduce(t, axis, keepdims)
        t = self.tensor(a[0])
        attr = a[1]
        if not (isinstance(attr, Name) and self.scope.attrs.get(attr.id) in ("int", "list[int]")) or (
                self.scope.attrs[attr.id] == "int" and attr.id in self.scope.optional_attrs):
            raise self.error(attr, "reduce() takes a list[int] attr or an int attr with a value as its axis")
        keep = self.want(a[2], (DKind.BOOL,))
        if not cpp:
            return f"H.reduce({op}, {t}, a_{attr.id}, {keep})", DKind.DIMS
        value = f"attrs.{attr.id}"
        axes = (f"Axes(std::vector<int64_t>{{{value}}})" if self.scope.attrs[attr.id] == "int"
                else f"Axes({value})")
        return f"reduce_shape({op}, {t}->shape(), {axes}, {keep})", DKind.DIMS


def lower_dims(formula: Formula, scope: DimScope, want: DKind, cpp: bool, dynamic: bool = False) -> str:
    """Check a shape-rule expression (of kind ``want``) and lower it to C++ (``dynamic``: over
    dimensions that may be unknown) or Python."""
    lowering = _Lowering(formula, scope, cpp, dynamic)
    code, kind = lowering.go(formula.ast)
    if kind != want:
        raise formula.error(0, f"a {'shape rule' if want == DKind.DIMS else 'check'} must give {want}, got {kind}")
    return code


@dataclass(frozen=True)
class Check:
    """A condition on the inputs' shapes and attrs, and the ValueError message when it is false:
    text with ``{expression}`` placeholders (a dimension, dimensions, a bool)."""

    require: Formula
    message: tuple[tuple[str, Optional[Formula]], ...]   # literal text, then the placeholder after it
    text: str


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def message_parts(text: str, make: Callable[[str, int], Formula]) -> tuple[tuple[str, Optional[Formula]], ...]:
    """The literal pieces of an error message and the formulas of its ``{...}`` placeholders
    (``make(text, offset)`` parses one, located at its offset in the message)."""
    parts: list[tuple[str, Optional[Formula]]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        parts.append((text[pos:m.start()], make(m.group(1), m.start(1))))
        pos = m.end()
    parts.append((text[pos:], None))
    return tuple(parts)


def lower_check(check: Check, scope: DimScope, cpp: bool, hoist: Optional[dict[str, str]] = None,
                bindings: Optional[list[tuple[str, str]]] = None) -> tuple[str, list[tuple[str, str]]]:
    """(the condition's code, the message's pieces as (literal, code of the value after it: "" for
    none)); a value of dimensions is formatted as a shape "(2, 3)" by both languages. C++ with
    ``hoist`` (one dict for all of an op's checks, in order): each broadcast(), reduce() and
    matmul() value is computed once, into a local that ``bindings`` gets as (name, code) to define
    before this check's test; the message reuses those locals (it is formatted only on failure)."""
    lowering = _Lowering(check.require, scope, cpp, check=True)
    if cpp:
        lowering.hoist, lowering.bindings = hoist, bindings
    code, kind = lowering.go(check.require.ast)
    if kind != DKind.BOOL:
        raise check.require.error(0, f"a check must give {DKind.BOOL}, got {kind}")
    test = code
    # a message is formatted only when the check fails: under ``if_given(w, ...)``, w is given
    req = check.require.ast
    given = ({req.args[0].id} if isinstance(req, Call) and req.func == "if_given" and req.args
             and isinstance(req.args[0], Name) else set())
    pieces = []
    for literal, f in check.message:
        if f is None:
            pieces.append((literal, ""))
            continue
        lowering = _Lowering(f, scope, cpp, check=True)
        lowering.present |= given
        if cpp:
            lowering.hoist = hoist  # (reused, never new: no bindings)
        code, kind = lowering.go(f.ast)
        if kind == DKind.DIMS:
            code = f"shape_str({code})" if cpp else f"H.shape_str({code})"
        elif kind == DKind.BOOL and cpp:
            code = f"({code} ? \"True\" : \"False\")"
        pieces.append((literal, code))
    return test, pieces
