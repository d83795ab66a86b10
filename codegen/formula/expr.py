"""Elementwise (``impl.expr``) formulas: checked and lowered to a C++ expression over the functor's
compute type ``C`` in one walk, so what is checked is exactly what is emitted."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .. import escape
from ..errors import did_you_mean
from .kinds import EXPR_ATTR_KINDS, Kind
from .syntax import Binary, BoolLit, Call, Formula, ListLit, Name, Node, Num, Select, Str, Unary

# the arithmetic operators: C++ functions that define integer overflow and division by zero
# (runtime/elementwise.h)
ARITH_FUNCTIONS: Mapping[str, str] = {"+": "fn::add", "-": "fn::sub", "*": "fn::mul", "/": "fn::div"}

# scalar functions usable in ``impl.expr``: name -> (arity, C++ function)
EXPR_FUNCTIONS: Mapping[str, tuple[int, str]] = {
    "where": (3, ""), "exp": (1, "fn::exp"), "log": (1, "fn::log"), "log1p": (1, "fn::log1p"),
    "expm1": (1, "fn::expm1"), "sqrt": (1, "fn::sqrt"), "rsqrt": (1, "fn::rsqrt"),
    "tanh": (1, "fn::tanh"), "abs": (1, "fn::abs"), "sin": (1, "fn::sin"), "cos": (1, "fn::cos"),
    "erf": (1, "fn::erf"), "floor": (1, "fn::floor"), "ceil": (1, "fn::ceil"),
    "maximum": (2, "fn::maximum"), "minimum": (2, "fn::minimum"), "pow": (2, "fn::pow"),
}


@dataclass
class ExprScope:
    """Names visible in an ``impl.expr`` formula: input elements and scalar attrs."""

    inputs: Sequence[str]
    attrs: Mapping[str, Kind]  # name -> the attr's type
    optional_attrs: set[str] = field(default_factory=set)  # attrs without a value by default (None)
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # str attr -> its choices
    # whether an input or output may hold integers (or bools): its + - * / then go through fn::add
    # and the others, which define overflow and division by zero (float-only ops keep the operators)
    integral: bool = True


@dataclass(frozen=True)
class LoweredExpr:
    code: str                                  # C++ expression over compute type C
    flags: tuple[tuple[str, str], ...]         # (member, initializer): str attr tests, once per call


def lower_expr(formula: Formula, scope: ExprScope, flags: dict[str, str] | None = None) -> LoweredExpr:
    """Check an elementwise formula and lower it to a C++ expression over compute type ``C``.

    A str attr may only be compared with a string literal (``approximate == "tanh"``); the test
    becomes a bool member of the functor, computed once per call rather than per element. The
    formulas of one functor (one per output) share ``flags``, the members made so far.
    """
    flags = {} if flags is None else flags
    present: set[str] = set()  # optional attrs known to be given (inside if_given's first branch)

    def str_test(node: Binary) -> str | None:
        if node.op not in ("==", "!=") or not any(isinstance(s, Str) for s in (node.left, node.right)):
            return None
        name = node.left if isinstance(node.left, Name) else node.right
        lit = node.right if isinstance(node.right, Str) else node.left
        if not (isinstance(name, Name) and isinstance(lit, Str) and scope.attrs.get(name.id) == Kind.STR):
            raise formula.error(node.pos, "a string can only be compared with a str attr")
        if name.id in scope.optional_attrs and name.id not in present:
            raise formula.error(name.pos, f"attr '{name.id}' may be None; use if_given({name.id}, ..., ...)")
        allowed = scope.choices.get(name.id)
        if allowed is not None and lit.value not in allowed:
            raise formula.error(lit.pos, f"'{lit.value}' is not a choice of attr '{name.id}' "
                                f"({', '.join(map(str, allowed))}){did_you_mean(lit.value, map(str, allowed))}")
        member = "f_" + name.id + "_" + re.sub(r"\W", "_", lit.value) + f"_{len(flags)}"
        test = f"{'*' if name.id in scope.optional_attrs else ''}a.{name.id} == {escape.cpp_str(lit.value)}"
        if name.id in scope.optional_attrs:  # (flags are set when the call starts, given or not)
            test = f"a.{name.id}.has_value() && {test}"
        flags.setdefault(member, test)
        return member if node.op == "==" else f"!{member}"

    def cast(code: str) -> str:
        """A value as compute type C: in an op that may compute in an integer type, through
        runtime/dtype.h's convert (a float out of the type's range saturates, NaN is 0: a plain
        conversion's result is undefined), else C's constructor."""
        return f"convert<C>({code})" if scope.integral else f"C({code})"

    def go(node: Node) -> str:
        if isinstance(node, Num):
            return cast(node.text)
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
                if kind not in EXPR_ATTR_KINDS:
                    raise formula.error(node.pos, f"attr '{node.id}' is {kind}; only int, float and bool attrs "
                                        "(and str attrs compared with a string) can be used in an elementwise "
                                        "expression")
                value = f"(*a.{node.id})" if node.id in scope.optional_attrs else f"a.{node.id}"
                return value if kind == Kind.BOOL else cast(value)
            known = list(scope.inputs) + list(scope.attrs)
            raise formula.error(node.pos, f"unknown name '{node.id}'{did_you_mean(node.id, known)}")
        if isinstance(node, Unary):
            return f"fn::neg({go(node.operand)})" if scope.integral else f"(-{go(node.operand)})"
        if isinstance(node, Binary):
            test = str_test(node)
            if test is not None:
                return test
            if node.op in ARITH_FUNCTIONS and scope.integral:
                return f"{ARITH_FUNCTIONS[node.op]}({go(node.left)}, {go(node.right)})"
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
            test = f"a.{cond.id}"
            if scope.attrs.get(cond.id) == Kind.STR:  # (the kernel's arguments hold flags, not strings)
                test = "f_" + cond.id + "_given"
                flags.setdefault(test, f"a.{cond.id}.has_value()")
            return f"({test} ? {cast(a)} : {cast(go(node.args[2]))})"
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
                return f"(({args[0]}) ? {cast(args[1])} : {cast(args[2])})"
            if node.func == "pow":  # (fn::pow takes one type: pow(x + 1, 2) of int8 x is pow(int, signed char))
                args = [a if a.startswith(("convert<C>(", "C(")) else cast(a) for a in args]
            return f"{cpp}({', '.join(args)})"
        if isinstance(node, Select):
            raise formula.error(node.pos, "an elementwise expression calls scalar functions, which have no "
                                "outputs to select")
        if isinstance(node, (Str, ListLit)):
            raise formula.error(node.pos, "strings and lists are not allowed in an elementwise expression")
        raise formula.error(0, "unsupported expression")  # pragma: no cover

    code = go(formula.ast)
    return LoweredExpr(code, tuple(flags.items()))
