"""Formula syntax for ``impl.expr``, ``impl.composite`` and ``bprop``: the AST, a restricted parser
(never ``eval``) and the source mapping that points errors at a formula's characters.

Grammar: numbers, strings, ``True``/``False``, names, lists, unary ``-``, ``+ - * /``,
comparisons, calls with positional and keyword arguments, and one output of a call selected by name
(``layer_norm(x).mean``). Checking and lowering live in
``expr`` (elementwise) and ``graph`` (bprop and composite formulas).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Union

from ..errors import Loc, SpecError

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
    items: tuple[Node, ...]
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
    args: tuple[Node, ...]
    kwargs: tuple[tuple[str, Node, int], ...]
    pos: int


@dataclass(frozen=True)
class Select:
    """One output of a multi-output op's call, by name: ``layer_norm(x).mean``."""

    call: Call
    name: str
    pos: int  # of the name


Node = Union[Num, Str, BoolLit, Name, ListLit, Unary, Binary, Call, Select]

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
  | (?P<op>>=|<=|==|!=|\*\*|[-+*/()<>,=\[\].])
""", re.VERBOSE | re.ASCII)

COMPARE_OPS = (">", "<", ">=", "<=", "==", "!=")


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise FormulaSyntaxError(i, f"unexpected character {text[i]!r}")
        kind = m.lastgroup or ""
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
            if isinstance(operand, Num):  # (-(-3) is 3: its text may not read as C++'s decrement)
                text = operand.text[1:] if operand.text.startswith("-") else "-" + operand.text
                return Num(-operand.value, text, pos)
            return Unary("-", operand, pos)
        return self.primary()

    def primary(self) -> Node:
        kind, text, pos = self.take()
        if kind == "num":
            is_int = re.fullmatch(r"[0-9]+", text) is not None
            if is_int and len(text) > 1 and text.startswith("0"):
                # (C++ reads 010 as octal 8, Python refuses it)
                raise FormulaSyntaxError(pos, f"integer {text} has a leading zero; write {int(text)}")
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
                return self.selected(self.call(text, pos))
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

    def selected(self, call: Call) -> Node:
        """A call, or ``call.output``."""
        if self.peek()[1] != ".":
            return call
        self.take()
        kind, text, pos = self.take()
        if kind != "name":
            found = "end of formula" if kind == "end" else repr(text)
            raise FormulaSyntaxError(pos, f"expected an output name after '.', found {found}")
        if self.peek()[1] == ".":
            raise FormulaSyntaxError(self.peek()[2], "an output is a tensor: nothing to select from it")
        return Select(call, text, pos)

    def call(self, func: str, pos: int) -> Call:
        self.expect("(")
        args: list[Node] = []
        kwargs: list[tuple[str, Node, int]] = []
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
        children: list[Node] = []
        if isinstance(n, Unary):
            children = [n.operand]
        elif isinstance(n, Binary):
            children = [n.left, n.right]
        elif isinstance(n, ListLit):
            children = list(n.items)
        elif isinstance(n, Call):
            children = list(n.args) + [a for _, a, _ in n.kwargs]
        elif isinstance(n, Select):
            children = [n.call]
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
    """Every plain name a formula reads (not function names, nor if_needs's test)."""
    if isinstance(node, Name):
        return {node.id}
    if isinstance(node, Select):
        return names_in(node.call)
    out: set[str] = set()
    if isinstance(node, (Unary,)):
        return names_in(node.operand)
    if isinstance(node, Binary):
        return names_in(node.left) | names_in(node.right)
    if isinstance(node, ListLit):
        for item in node.items:
            out |= names_in(item)
    if isinstance(node, Call):
        # (if_needs's first argument asks whether a gradient is computed: no read of the tensor)
        for a in node.args[1:] if node.func == "if_needs" else node.args:
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
    if isinstance(node, Select):
        return ops_in(node.call)
    if isinstance(node, Unary):
        return {"neg"} | ops_in(node.operand)
    if isinstance(node, Binary):
        return {OPERATOR_OPS[node.op]} | ops_in(node.left) | ops_in(node.right)
    if isinstance(node, ListLit):
        return set().union(*[ops_in(i) for i in node.items]) if node.items else set()
    return set()



# ---------------------------------------------------------------------------- operators

# arithmetic in graph formulas is sugar for these ops
# the operators whose number operand, beside a 16-bit float tensor, is computed in float32 (the
# tensor widened, the result rounded once: what the op's kernel does with two tensors), not
# rounded to the tensor's dtype first (1/n in mean's gradient is subnormal in float16 past n = 16384)
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/"})

OPERATOR_OPS: Mapping[str, str] = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "neg": "neg",
    ">": "greater", "<": "less", ">=": "greater_equal", "<=": "less_equal",
    "==": "equal", "!=": "not_equal",
}

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
    """Parse a formula from a YAML scalar of the given style (see source._style)."""
    quoted = style[:1] in ("'", '"')
    inline = style in ("", "'", '"') and "\n" not in text  # columns map one to one
    base = loc.shifted(1) if quoted else loc
    try:
        ast = parse(text)
    except FormulaSyntaxError as exc:
        at = base.shifted(exc.pos) if inline else base
        raise SpecError(at, key, f"syntax error: {exc.message}") from None
    return Formula(text, ast, base, key, inline)


