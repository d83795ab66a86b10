"""Formula language for ``impl.expr``, ``impl.composite`` and ``bprop``: parse, check, lower to C++.

A restricted grammar (never ``eval``): numbers, strings, ``True``/``False``, names, lists,
unary ``-``, ``+ - * /``, comparisons, calls with positional and keyword arguments.
Checking and C++ lowering are one walk, so what is checked is exactly what is emitted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from . import escape
from .errors import Loc, SpecError, did_you_mean

# ---------------------------------------------------------------------------- AST


@dataclass(frozen=True)
class Num:
    value: Union[int, float]
    text: str
    pos: int


@dataclass(frozen=True)
class Str:
    value: str
    pos: int


@dataclass(frozen=True)
class BoolLit:
    value: bool
    pos: int


@dataclass(frozen=True)
class Name:
    id: str
    pos: int


@dataclass(frozen=True)
class ListLit:
    items: tuple
    pos: int


@dataclass(frozen=True)
class Unary:
    op: str
    operand: "Node"
    pos: int


@dataclass(frozen=True)
class Binary:
    op: str
    left: "Node"
    right: "Node"
    pos: int


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple
    kwargs: tuple  # ((name, node, pos), ...)
    pos: int


Node = Union[Num, Str, BoolLit, Name, ListLit, Unary, Binary, Call]

# ---------------------------------------------------------------------------- parsing


class FormulaSyntaxError(Exception):
    def __init__(self, pos: int, message: str):
        self.pos = pos
        self.message = message
        super().__init__(message)


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<str>"[^"\\]*"|'[^'\\]*')
  | (?P<op>>=|<=|==|!=|\*\*|[-+*/()<>,=\[\]])
""", re.VERBOSE | re.ASCII)

COMPARE_OPS = (">", "<", ">=", "<=", "==", "!=")


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise FormulaSyntaxError(i, f"unexpected character {text[i]!r}")
        kind = m.lastgroup
        if m.group() == "**":
            raise FormulaSyntaxError(i, "'**' is not supported; use square(), or pow() in an expr")
        if kind != "ws":
            tokens.append((kind, m.group(), i))
        i = m.end()
    tokens.append(("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def take(self) -> tuple[str, str, int]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, value: str) -> int:
        kind, text, pos = self.take()
        if text != value or kind not in ("op",):
            found = "end of formula" if kind == "end" else repr(text)
            raise FormulaSyntaxError(pos, f"expected '{value}', found {found}")
        return pos

    def parse(self) -> Node:
        node = self.comparison()
        kind, text, pos = self.peek()
        if kind != "end":
            raise FormulaSyntaxError(pos, f"unexpected {text!r}")
        return node

    def comparison(self) -> Node:
        left = self.additive()
        kind, text, pos = self.peek()
        if kind == "op" and text in COMPARE_OPS:
            self.take()
            right = self.additive()
            left = Binary(text, left, right, pos)
            kind, text, pos = self.peek()
            if kind == "op" and text in COMPARE_OPS:
                raise FormulaSyntaxError(pos, "chained comparisons are not supported")
        return left

    def additive(self) -> Node:
        left = self.term()
        while True:
            kind, text, pos = self.peek()
            if kind == "op" and text in ("+", "-"):
                self.take()
                left = Binary(text, left, self.term(), pos)
            else:
                return left

    def term(self) -> Node:
        left = self.unary()
        while True:
            kind, text, pos = self.peek()
            if kind == "op" and text in ("*", "/"):
                self.take()
                left = Binary(text, left, self.unary(), pos)
            else:
                return left

    def unary(self) -> Node:
        kind, text, pos = self.peek()
        if kind == "op" and text == "-":
            self.take()
            operand = self.unary()
            if isinstance(operand, Num):
                return Num(-operand.value, "-" + operand.text, pos)
            return Unary("-", operand, pos)
        return self.primary()

    def primary(self) -> Node:
        kind, text, pos = self.take()
        if kind == "num":
            is_int = re.fullmatch(r"[0-9]+", text) is not None
            value = int(text) if is_int else float(text)
            if (is_int and value > 2 ** 63 - 1) or (not is_int and not math.isfinite(value)):
                raise FormulaSyntaxError(pos, f"number {text} is out of range")
            return Num(value, text, pos)
        if kind == "str":
            return Str(text[1:-1], pos)
        if kind == "name":
            if text in ("True", "False", "true", "false"):
                return BoolLit(text in ("True", "true"), pos)
            nk, nt, _ = self.peek()
            if nk == "op" and nt == "(":
                return self.call(text, pos)
            return Name(text, pos)
        if kind == "op" and text == "(":
            node = self.comparison()
            self.expect(")")
            return node
        if kind == "op" and text == "[":
            items = []
            if self.peek()[1] != "]":
                items.append(self.comparison())
                while self.peek()[1] == ",":
                    self.take()
                    items.append(self.comparison())
            self.expect("]")
            return ListLit(tuple(items), pos)
        found = "end of formula" if kind == "end" else repr(text)
        raise FormulaSyntaxError(pos, f"unexpected {found}")

    def call(self, func: str, pos: int) -> Call:
        self.expect("(")
        args: list = []
        kwargs: list = []
        if self.peek()[1] != ")":
            while True:
                kind, text, kpos = self.peek()
                nxt = self.tokens[self.i + 1] if kind != "end" else (kind, text, kpos)
                if kind == "name" and nxt[1] == "=" and nxt[0] == "op":
                    self.take()
                    self.take()
                    if any(k == text for k, _, _ in kwargs):
                        raise FormulaSyntaxError(kpos, f"keyword '{text}' given twice")
                    kwargs.append((text, self.comparison(), kpos))
                else:
                    if kwargs:
                        raise FormulaSyntaxError(kpos, "positional argument after keyword argument")
                    args.append(self.comparison())
                if self.peek()[1] == ",":
                    self.take()
                    continue
                break
        self.expect(")")
        return Call(func, tuple(args), tuple(kwargs), pos)


MAX_DEPTH = 100  # nesting of a formula's expression tree


def _depth(node: Node) -> int:
    stack, deepest = [(node, 1)], 0
    while stack:  # iterative: a formula's depth must not exhaust Python's stack
        n, d = stack.pop()
        deepest = max(deepest, d)
        children: list = []
        if isinstance(n, Unary):
            children = [n.operand]
        elif isinstance(n, Binary):
            children = [n.left, n.right]
        elif isinstance(n, ListLit):
            children = list(n.items)
        elif isinstance(n, Call):
            children = list(n.args) + [a for _, a, _ in n.kwargs]
        stack.extend((c, d + 1) for c in children)
    return deepest


def parse(text: str) -> Node:
    """Parse a formula; raises FormulaSyntaxError with a character offset."""
    try:
        node = _Parser(text).parse()
    except RecursionError:
        raise FormulaSyntaxError(0, f"formula nests more than {MAX_DEPTH} levels") from None
    if _depth(node) > MAX_DEPTH:
        raise FormulaSyntaxError(0, f"formula nests more than {MAX_DEPTH} levels")
    return node


def names_in(node: Node) -> set[str]:
    """Every plain name a formula refers to (not function names)."""
    if isinstance(node, Name):
        return {node.id}
    out: set[str] = set()
    if isinstance(node, (Unary,)):
        return names_in(node.operand)
    if isinstance(node, Binary):
        return names_in(node.left) | names_in(node.right)
    if isinstance(node, ListLit):
        for item in node.items:
            out |= names_in(item)
    if isinstance(node, Call):
        for a in node.args:
            out |= names_in(a)
        for _, a, _ in node.kwargs:
            out |= names_in(a)
    return out


def ops_in(node: Node) -> set[str]:
    """Every op name a graph formula may call: explicit calls and the ops behind operators."""
    if isinstance(node, Call):
        out = {node.func}
        for a in node.args:
            out |= ops_in(a)
        for _, a, _ in node.kwargs:
            out |= ops_in(a)
        return out
    if isinstance(node, Unary):
        return {"neg"} | ops_in(node.operand)
    if isinstance(node, Binary):
        return {OPERATOR_OPS[node.op]} | ops_in(node.left) | ops_in(node.right)
    if isinstance(node, ListLit):
        return set().union(*[ops_in(i) for i in node.items]) if node.items else set()
    return set()


# ---------------------------------------------------------------------------- source mapping


@dataclass(frozen=True)
class Formula:
    """A formula as written in a spec, with enough to point errors at its characters."""

    text: str
    ast: Node
    loc: Loc
    key: str
    inline: bool  # single-line plain/quoted scalar: columns map one to one

    def error(self, pos: int, message: str) -> SpecError:
        loc = self.loc.shifted(pos) if self.inline else self.loc
        return SpecError(loc, self.key, message)


def make_formula(text: str, loc: Loc, key: str, style: str) -> Formula:
    """Parse a formula from a YAML scalar of the given style (see load._style)."""
    quoted = style[:1] in ("'", '"')
    inline = style in ("", "'", '"') and "\n" not in text  # columns map one to one
    base = loc.shifted(1) if quoted else loc
    try:
        ast = parse(text)
    except FormulaSyntaxError as exc:
        at = base.shifted(exc.pos) if inline else base
        raise SpecError(at, key, f"syntax error: {exc.message}") from None
    return Formula(text, ast, base, key, inline)


# ---------------------------------------------------------------------------- elementwise (expr) lowering

# scalar functions usable in ``impl.expr``: name -> (arity, C++ function)
EXPR_FUNCTIONS: Mapping[str, tuple[int, str]] = {
    "where": (3, ""), "exp": (1, "fn::exp"), "log": (1, "fn::log"), "log1p": (1, "fn::log1p"),
    "expm1": (1, "fn::expm1"), "sqrt": (1, "fn::sqrt"), "rsqrt": (1, "fn::rsqrt"),
    "tanh": (1, "fn::tanh"), "abs": (1, "fn::abs"), "sin": (1, "fn::sin"), "cos": (1, "fn::cos"),
    "erf": (1, "fn::erf"), "floor": (1, "fn::floor"), "ceil": (1, "fn::ceil"),
    "maximum": (2, "fn::maximum"), "minimum": (2, "fn::minimum"), "pow": (2, "fn::pow"),
}

NUMERIC_ATTRS = ("int", "float", "bool")


@dataclass
class ExprScope:
    """Names visible in an ``impl.expr`` formula: input elements and scalar attrs."""

    inputs: Sequence[str]
    attrs: Mapping[str, str]  # name -> attr type
    optional_attrs: set = field(default_factory=set)  # attrs without a value by default (None)
    choices: Mapping[str, tuple] = field(default_factory=dict)  # str attr -> its choices


@dataclass(frozen=True)
class LoweredExpr:
    code: str                                  # C++ expression over compute type C
    flags: tuple[tuple[str, str], ...]         # (member, initializer): str attr tests, once per call


def lower_expr(formula: Formula, scope: ExprScope) -> LoweredExpr:
    """Check an elementwise formula and lower it to a C++ expression over compute type ``C``.

    A str attr may only be compared with a string literal (``approximate == "tanh"``); the test
    becomes a bool member of the functor, computed once per call rather than per element.
    """
    flags: dict[str, str] = {}
    present: set[str] = set()  # optional attrs known to be given (inside if_given's first branch)

    def str_test(node: Binary) -> str | None:
        if node.op not in ("==", "!=") or not any(isinstance(s, Str) for s in (node.left, node.right)):
            return None
        name = node.left if isinstance(node.left, Name) else node.right
        lit = node.right if isinstance(node.right, Str) else node.left
        if not (isinstance(name, Name) and isinstance(lit, Str) and scope.attrs.get(name.id) == "str"):
            raise formula.error(node.pos, "a string can only be compared with a str attr")
        if name.id in scope.optional_attrs and name.id not in present:
            raise formula.error(name.pos, f"attr '{name.id}' may be None; use if_given({name.id}, ..., ...)")
        allowed = scope.choices.get(name.id)
        if allowed is not None and lit.value not in allowed:
            raise formula.error(lit.pos, f"'{lit.value}' is not a choice of attr '{name.id}' "
                                f"({', '.join(map(str, allowed))}){did_you_mean(lit.value, map(str, allowed))}")
        member = "f_" + name.id + "_" + re.sub(r"\W", "_", lit.value) + f"_{len(flags)}"
        value = f"*a.{name.id}" if name.id in scope.optional_attrs else f"a.{name.id}"
        flags.setdefault(member, f"{value} == {escape.cpp_str(lit.value)}")
        return member if node.op == "==" else f"!{member}"

    def go(node: Node) -> str:
        if isinstance(node, Num):
            return f"C({node.text})"
        if isinstance(node, BoolLit):
            return "true" if node.value else "false"
        if isinstance(node, Name):
            if node.id in scope.inputs:
                return f"v_{node.id}"
            if node.id in scope.attrs:
                kind = scope.attrs[node.id]
                if node.id in scope.optional_attrs and node.id not in present:
                    raise formula.error(node.pos, f"attr '{node.id}' may be None; use "
                                        f"if_given({node.id}, ..., ...) or give it a default")
                if kind not in NUMERIC_ATTRS:
                    raise formula.error(node.pos, f"attr '{node.id}' is {kind}; only int, float and bool attrs "
                                        "(and str attrs compared with a string) can be used in an elementwise "
                                        "expression")
                value = f"(*a.{node.id})" if node.id in scope.optional_attrs else f"a.{node.id}"
                return value if kind == "bool" else f"C({value})"
            known = list(scope.inputs) + list(scope.attrs)
            raise formula.error(node.pos, f"unknown name '{node.id}'{did_you_mean(node.id, known)}")
        if isinstance(node, Unary):
            return f"(-{go(node.operand)})"
        if isinstance(node, Binary):
            test = str_test(node)
            if test is not None:
                return test
            return f"({go(node.left)} {node.op} {go(node.right)})"
        if isinstance(node, Call) and node.func == "if_given":
            if len(node.args) != 3 or node.kwargs:
                raise formula.error(node.pos, "if_given() takes 3 arguments")
            cond = node.args[0]
            if not (isinstance(cond, Name) and cond.id in scope.optional_attrs):
                raise formula.error(cond.pos, "if_given() needs an optional attr as its first argument "
                                    "in an elementwise expression")
            given = cond.id in present
            present.add(cond.id)
            try:
                a = go(node.args[1])
            finally:
                if not given:
                    present.discard(cond.id)
            return f"(a.{cond.id} ? C({a}) : C({go(node.args[2])}))"
        if isinstance(node, Call):
            if node.func not in EXPR_FUNCTIONS:
                raise formula.error(node.pos, f"unknown function '{node.func}' in an elementwise "
                                    f"expression{did_you_mean(node.func, EXPR_FUNCTIONS)}")
            arity, cpp = EXPR_FUNCTIONS[node.func]
            if node.kwargs:
                raise formula.error(node.kwargs[0][2], f"{node.func}() takes no keyword arguments")
            if len(node.args) != arity:
                raise formula.error(node.pos, f"{node.func}() takes {arity} argument"
                                    f"{'s' if arity != 1 else ''}, got {len(node.args)}")
            args = [go(a) for a in node.args]
            if node.func == "where":
                return f"(({args[0]}) ? C({args[1]}) : C({args[2]}))"
            return f"{cpp}({', '.join(args)})"
        if isinstance(node, (Str, ListLit)):
            raise formula.error(node.pos, "strings and lists are not allowed in an elementwise expression")
        raise formula.error(0, "unsupported expression")  # pragma: no cover

    code = go(formula.ast)
    return LoweredExpr(code, tuple(flags.items()))


# ---------------------------------------------------------------------------- graph (bprop/composite) lowering

# arithmetic in graph formulas is sugar for these ops
OPERATOR_OPS: Mapping[str, str] = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "neg": "neg",
    ">": "greater", "<": "less", ">=": "greater_equal", "<=": "less_equal",
    "==": "equal", "!=": "not_equal",
}

# helpers usable in graph formulas: name -> (parameter kinds, result kind, C++ template)
HELPERS: Mapping[str, tuple[tuple[str, ...], str]] = {
    "zeros_like": (("tensor",), "tensor"),
    "ones_like": (("tensor",), "tensor"),
    "numel": (("tensor",), "number"),
    "expand_reduced": (("tensor", "tensor", "axes", "bool"), "tensor"),
    "if_given": (("optional", "any", "any"), "same"),
}


@dataclass(frozen=True)
class OpSignature:
    """What a formula needs to know to call an op."""

    name: str
    inputs: tuple[tuple[str, bool], ...]          # (name, optional)
    attrs: tuple[tuple[str, str, bool, str, str], ...]  # (name, type, required, C++ default, Python default)
    num_outputs: int

    def default_code(self, attr: str, lang: "CppLang") -> str:
        """The attr's default value as code in lang."""
        row = next(a for a in self.attrs if a[0] == attr)
        return row[4] if isinstance(lang, PyLang) else row[3]


@dataclass
class GraphScope:
    """Names visible in a bprop or composite formula."""

    tensors: Mapping[str, str]         # name -> C++ expression (TensorPtr)
    optional: set                      # tensor names that may be absent (nullptr)
    attrs: Mapping[str, tuple[str, str]]  # name -> (type, C++ expression)
    ops: Mapping[str, OpSignature]
    used_ops: set = field(default_factory=set)


class CppLang:
    """How lowered graph formulas are spelled in C++ (the generated Function classes)."""

    null = "nullptr"

    def op(self, name: str, args: list[str]) -> str:
        return f"ops::{name}({', '.join(args)})"

    def scalar_like(self, value: str, like: str) -> str:
        return f"scalar_like({value}, {like})"

    def bind_like(self, code: str, name: str, body: str) -> str:
        return f"[&](const TensorPtr& {name}) {{ return {body}; }}({code})"

    def number(self, op: str, left: str, right: str) -> str:
        if op in COMPARE_OPS:
            return f"({left} {op} {right})"
        return f"(double({left}) {op} double({right}))"

    def negate(self, code: str) -> str:
        return f"(-{code})"

    def boolean(self, value: bool) -> str:
        return "true" if value else "false"

    def string(self, value: str) -> str:
        return f"std::string({escape.cpp_str(value)})"

    def num_list(self, items: list[str], kind: str) -> str:
        if kind == "int":
            return f"std::vector<int64_t>{{{', '.join(items)}}}"
        return f"std::vector<double>{{{', '.join(f'double({c})' for c in items)}}}"

    def given_attr(self, code: str) -> tuple[str, str]:
        """(test, the value inside the given branch) of an optional attr."""
        return code, f"(*{code})"

    def given_tensor(self, code: str) -> str:
        return code

    def choose(self, test: str, a: str, b: str) -> str:
        return f"({test} ? {a} : {b})"

    def helper(self, name: str, args: list[str]) -> str:
        return f"{name}({', '.join(args)})"

    def convert_attr(self, want: str, code: str, kind: str) -> str | None:
        """Code passing a value of ``kind`` to an attr of type ``want`` ("optional T" when the
        attr may be None), or None when the value does not fit."""
        return _convert_attr(self, want, code, kind)

    def as_float(self, code: str) -> str:
        return f"double({code})"

    def one_int_list(self, code: str) -> str:
        return f"std::vector<int64_t>{{{code}}}"

    def empty_list(self, kind: str) -> str:
        return "std::vector<int64_t>{}" if kind == "int" else "std::vector<double>{}"

    def floats_of_ints(self, code: str) -> str:
        return f"to_float_list({code})"

    def one_float_list(self, code: str) -> str:
        return f"std::vector<double>{{double({code})}}"


class PyLang(CppLang):
    """The same formulas spelled in Python for framework adapters: ops are ``F.<op>`` (the
    framework's registered opforge ops) and helpers ``H.<helper>`` (its tensor helpers)."""

    null = "None"

    def op(self, name: str, args: list[str]) -> str:
        return f"F.{name}({', '.join(args)})"

    def scalar_like(self, value: str, like: str) -> str:
        return f"H.scalar_like({value}, {like})"

    def bind_like(self, code: str, name: str, body: str) -> str:
        return f"(lambda {name}: {body})({code})"

    def number(self, op: str, left: str, right: str) -> str:
        return f"({left} {op} {right})"

    def boolean(self, value: bool) -> str:
        return "True" if value else "False"

    def string(self, value: str) -> str:
        return escape.py_str(value)

    def num_list(self, items: list[str], kind: str) -> str:
        return f"[{', '.join(items)}]"

    def given_attr(self, code: str) -> tuple[str, str]:
        return f"{code} is not None", code

    def given_tensor(self, code: str) -> str:
        return f"{code} is not None"

    def choose(self, test: str, a: str, b: str) -> str:
        return f"({a} if {test} else {b})"

    def helper(self, name: str, args: list[str]) -> str:
        return f"H.{name}({', '.join(args)})"

    def as_float(self, code: str) -> str:
        return code  # Python numbers pass to float parameters as they are

    def one_int_list(self, code: str) -> str:
        return f"[{code}]"

    def empty_list(self, kind: str) -> str:
        return "[]"

    def floats_of_ints(self, code: str) -> str:
        return f"[float(v) for v in {code}]"

    def one_float_list(self, code: str) -> str:
        return f"[{code}]"


CPP = CppLang()
PY = PyLang()


def _convert_attr(lang: CppLang, want: str, code: str, kind: str) -> str | None:
    if want.startswith("optional "):
        if kind == want:
            return code
        want = want[len("optional "):]
    if kind == want:
        return code
    if want == "float" and kind in ("int", "number"):
        return lang.as_float(code)
    if want == "list[int]":
        if kind == "int":
            return lang.one_int_list(code)
        if kind == "empty list":
            return lang.empty_list("int")
    if want == "list[float]":
        if kind == "list[int]":
            return lang.floats_of_ints(code)
        if kind in ("int", "float", "number"):
            return lang.one_float_list(code)
        if kind == "empty list":
            return lang.empty_list("float")
    return None


def convert_attr(want: str, code: str, kind: str) -> str | None:
    """C++ code passing a value of ``kind`` to an attr of type ``want``, or None (see CppLang)."""
    return _convert_attr(CPP, want, code, kind)


def lower_graph(formula: Formula, scope: GraphScope, lang: CppLang = CPP) -> tuple[str, str]:
    """Check a graph formula and lower it to an expression in ``lang``; returns (code, kind).

    Checking is the same walk for every language, so each emits exactly what was checked."""

    def need_op(name: str, pos: int, what: str) -> OpSignature:
        if name not in scope.ops:
            raise formula.error(pos, f"{what} needs op '{name}', which is not defined")
        scope.used_ops.add(name)
        return scope.ops[name]

    counter = [0]

    def bind_like(tensor_code: str, build) -> str:
        """Evaluate tensor_code once: scalars become 0-d tensors of its dtype."""
        if re.fullmatch(r"v_\w+", tensor_code):
            return build(tensor_code)
        name = f"t{counter[0]}_"
        counter[0] += 1
        return lang.bind_like(tensor_code, name, build(name))

    def binary(op: str, left: Node, right: Node, pos: int) -> tuple[str, str]:
        lc, lk = go(left)
        rc, rk = go(right)
        for k, n in ((lk, left), (rk, right)):
            if k not in ("tensor", "number", "int", "float"):
                raise formula.error(_pos(n), f"operator '{op}' needs tensors or numbers, got {k}")
        if lk != "tensor" and rk != "tensor":
            return lang.number(op, lc, rc), ("bool" if op in COMPARE_OPS else "number")
        fn = need_op(OPERATOR_OPS[op], pos, f"operator {op!r}").name
        if lk == "tensor" and rk == "tensor":
            return lang.op(fn, [lc, rc]), "tensor"
        if lk == "tensor":
            return bind_like(lc, lambda t: lang.op(fn, [t, lang.scalar_like(rc, t)])), "tensor"
        return bind_like(rc, lambda t: lang.op(fn, [lang.scalar_like(lc, t), t])), "tensor"

    def call_op(node: Call) -> tuple[str, str]:
        sig = need_op(node.func, node.pos, "this formula")
        if sig.num_outputs != 1:
            raise formula.error(node.pos, f"op '{node.func}' has {sig.num_outputs} outputs; "
                                "only single-output ops can be called in a formula")
        required = [n for n, opt in sig.inputs if not opt]
        if not (len(required) <= len(node.args) <= len(sig.inputs)):
            names = ", ".join(n for n, _ in sig.inputs)
            count = (f"{len(sig.inputs)}" if len(required) == len(sig.inputs)
                     else f"{len(required)} to {len(sig.inputs)}")
            raise formula.error(node.pos, f"{node.func}() takes {count} input"
                                f"{'s' if len(sig.inputs) != 1 else ''} ({names}), got {len(node.args)}")
        lowered = [go(a) for a in node.args]
        like = next((k for k, (_, kind) in enumerate(lowered) if kind == "tensor"), None)
        for (code, kind), arg in zip(lowered, node.args):
            if kind != "tensor" and (kind not in ("number", "int", "float") or like is None):
                raise formula.error(_pos(arg), f"{node.func}(): inputs must be tensors, got {kind}")
        tail = [lang.null] * (len(sig.inputs) - len(node.args))
        args: list[str] = []
        given = {k: (v, p) for k, v, p in node.kwargs}
        attr_names = [a[0] for a in sig.attrs]
        for k, (_, p) in given.items():
            if k not in attr_names:
                raise formula.error(p, f"{node.func}() has no attr '{k}'{did_you_mean(k, attr_names)}")
        for name, atype, required_attr, default, _ in sig.attrs:
            if name in given:
                value, p = given[name]
                code, kind = go(value)
                want = "optional " + atype if default == "std::nullopt" else atype
                converted = lang.convert_attr(want, code, kind)
                if converted is None:
                    raise formula.error(p, f"{node.func}(): attr '{name}' must be {want}, got {kind}")
                args.append(converted)
            elif required_attr:
                raise formula.error(node.pos, f"{node.func}(): missing required attr '{name}'")
            else:
                args.append(sig.default_code(name, lang))

        def build(t: str) -> str:
            ins = [t if k == like else (code if kind == "tensor" else lang.scalar_like(code, t))
                   for k, (code, kind) in enumerate(lowered)]
            return lang.op(node.func, ins + tail + args)

        if like is None or all(kind == "tensor" for _, kind in lowered):
            return build(lowered[like][0] if like is not None else ""), "tensor"
        return bind_like(lowered[like][0], build), "tensor"

    def call_helper(node: Call) -> tuple[str, str]:
        params, result = HELPERS[node.func]
        if node.kwargs:
            raise formula.error(node.kwargs[0][2], f"{node.func}() takes no keyword arguments")
        if len(node.args) != len(params):
            raise formula.error(node.pos, f"{node.func}() takes {len(params)} argument"
                                f"{'s' if len(params) != 1 else ''}, got {len(node.args)}")
        if node.func == "if_given":
            cond = node.args[0]
            is_attr = (isinstance(cond, Name) and cond.id in scope.attrs
                       and scope.attrs[cond.id][0].startswith("optional "))
            if not (isinstance(cond, Name) and (cond.id in scope.optional or is_attr)):
                raise formula.error(_pos(cond), "if_given() needs an optional input or optional attr "
                                    "as its first argument")
            if is_attr:  # present in the first branch only: there the attr has its plain type
                saved = scope.attrs[cond.id]
                test, inner = lang.given_attr(saved[1])
                scope.attrs = {**scope.attrs, cond.id: (saved[0][len("optional "):], inner)}
                try:
                    ac, ak = go(node.args[1])
                finally:
                    scope.attrs = {**scope.attrs, cond.id: saved}
            else:
                scope.optional.discard(cond.id)
                try:
                    ac, ak = go(node.args[1])
                finally:
                    scope.optional.add(cond.id)
                test = lang.given_tensor(scope.tensors[cond.id])
            bc, bk = go(node.args[2])
            if (ak == "tensor") != (bk == "tensor"):
                raise formula.error(node.pos, "if_given(): both branches must be tensors or both numbers")
            return lang.choose(test, ac, bc), ak
        codes = []
        for param, arg in zip(params, node.args):
            code, kind = go(arg)
            want = {"tensor": "tensor", "axes": "optional list[int]", "bool": "bool"}[param]
            converted = (code if kind == want else lang.convert_attr(want, code, kind) if param == "axes"
                         else None)
            if converted is None:
                raise formula.error(_pos(arg), f"{node.func}(): expected {want}, got {kind}")
            codes.append(converted)
        return lang.helper(node.func, codes), result

    def go(node: Node) -> tuple[str, str]:
        if isinstance(node, Num):
            return (node.text if isinstance(node.value, int) else repr(float(node.value)),
                    "int" if isinstance(node.value, int) else "float")
        if isinstance(node, BoolLit):
            return lang.boolean(node.value), "bool"
        if isinstance(node, Str):
            return lang.string(node.value), "str"
        if isinstance(node, ListLit):
            if not node.items:
                return "{}" if lang is CPP else "[]", "empty list"
            items = [go(i) for i in node.items]
            kinds = {k for _, k in items}
            if kinds <= {"int"}:
                return lang.num_list([c for c, _ in items], "int"), "list[int]"
            if kinds <= {"int", "float", "number"}:
                return lang.num_list([c for c, _ in items], "float"), "list[float]"
            raise formula.error(node.pos, "list items must be numbers")
        if isinstance(node, Name):
            if node.id in scope.tensors:
                if node.id in scope.optional:
                    raise formula.error(node.pos, f"optional input '{node.id}' may be absent; "
                                        f"use if_given({node.id}, ..., ...)")
                return scope.tensors[node.id], "tensor"
            if node.id in scope.attrs:
                atype, code = scope.attrs[node.id]
                return code, atype
            known = list(scope.tensors) + list(scope.attrs)
            raise formula.error(node.pos, f"unknown name '{node.id}'{did_you_mean(node.id, known)}")
        if isinstance(node, Unary):
            code, kind = go(node.operand)
            if kind == "tensor":
                need_op("neg", node.pos, "unary '-'")
                return lang.op("neg", [code]), "tensor"
            return lang.negate(code), kind
        if isinstance(node, Binary):
            return binary(node.op, node.left, node.right, node.pos)
        if isinstance(node, Call):
            if node.func in HELPERS:
                return call_helper(node)
            if node.func in scope.ops:
                return call_op(node)
            known = list(scope.ops) + list(HELPERS)
            raise formula.error(node.pos, f"unknown op '{node.func}'{did_you_mean(node.func, known)}")
        raise formula.error(0, "unsupported expression")  # pragma: no cover

    code, kind = go(formula.ast)
    return code, kind


def _pos(node: Node) -> int:
    return node.pos

