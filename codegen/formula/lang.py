"""How lowered graph formulas are spelled: C++ (the generated Function classes) and Python (the
framework adapters' op table). Checking is the same walk for both (``graph.lower_graph``)."""

from __future__ import annotations

from .. import escape
from .kinds import NUMBER_KINDS, Kind, VType
from .syntax import COMPARE_OPS


class CppLang:
    """How lowered graph formulas are spelled in C++ (the generated Function classes)."""

    null = "nullptr"
    untyped_empty_list = "{}"  # [] where the attr's list type is not known yet
    AND, OR = " && ", " || "

    def attr_default(self, cpp: str, py: str) -> str:
        """An attr's default value (given in both languages) as code in this one."""
        return cpp

    def op(self, name: str, args: list[str]) -> str:
        return f"ops::{name}({', '.join(args)})"

    def scalar_like(self, value: str, like: str) -> str:
        return f"scalar_like({value}, {like})"

    def with_number(self, fn: str, tensor: str, number: str, number_first: bool) -> str:
        """``tensor <op> number`` (or ``number <op> tensor``) by op fn, with the number in the
        compute type of the tensor's dtype (functional.h's with_number)."""
        a, b = ("num_s", "num_t") if number_first else ("num_t", "num_s")
        return (f"with_number({tensor}, {number}, [&](const TensorPtr& num_t, const TensorPtr& num_s) "
                f"{{ return ops::{fn}({a}, {b}); }})")

    def output(self, outputs: str, k: int) -> str:
        """Output k of a multi-output op's call (a TensorList in C++, a tuple in Python)."""
        return f"{outputs}[{k}]"

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

    def num_list(self, items: list[str], kind: Kind) -> str:
        if kind == Kind.INT:
            return f"std::vector<int64_t>{{{', '.join(items)}}}"
        return f"std::vector<double>{{{', '.join(f'double({c})' for c in items)}}}"

    def given_attr(self, code: str) -> tuple[str, str]:
        """(test, the value inside the given branch) of an optional attr."""
        return code, f"(*{code})"

    def given_tensor(self, code: str) -> str:
        return code

    def choose(self, test: str, a: str, b: str) -> str:
        return f"({test} ? {a} : {b})"

    def need(self, k: int) -> str:
        """Whether a backward computes input k's gradient."""
        return f"need_{k}"

    def let_condition(self, when: tuple[tuple[int, ...], ...], given: tuple[str, ...]) -> str:
        """When a backward computes a let: some set of inputs in ``when`` all need their gradients,
        and the optional inputs it needs are ``given`` (their tests)."""
        terms = [self.all_of([self.need(k) for k in ks]) for ks in when]
        cond = self.any_of(terms) if terms else self.boolean(False)
        if given:
            return self.all_of([f"({cond})" if len(terms) > 1 else cond, *given])
        return cond

    def all_of(self, terms: list[str]) -> str:
        return self.AND.join(terms)

    def any_of(self, terms: list[str]) -> str:
        if len(terms) == 1:
            return terms[0]
        return self.OR.join(f"({t})" if self.AND in t else t for t in terms)

    def helper(self, name: str, args: list[str]) -> str:
        return f"{name}({', '.join(args)})"

    def convert_attr(self, want: VType, code: str, got: VType) -> str | None:
        """Code passing a value of type ``got`` to an attr of type ``want`` (optional when the attr
        may be None), or None when the value does not fit."""
        if got == want:
            return code
        if got.optional:
            return None
        kind, want_kind = got.kind, want.kind
        if kind == want_kind:
            return code
        if want_kind == Kind.FLOAT and kind in (Kind.INT, Kind.NUMBER):
            return self.as_float(code)
        if want_kind == Kind.INT_LIST:
            if kind == Kind.INT:
                return self.one_int_list(code)
            if kind == Kind.EMPTY_LIST:
                return self.empty_list(Kind.INT)
        if want_kind == Kind.FLOAT_LIST:
            if kind == Kind.INT_LIST:
                return self.floats_of_ints(code)
            if kind in NUMBER_KINDS:
                return self.one_float_list(code)
            if kind == Kind.EMPTY_LIST:
                return self.empty_list(Kind.FLOAT)
        return None

    def as_float(self, code: str) -> str:
        return f"double({code})"

    def one_int_list(self, code: str) -> str:
        return f"std::vector<int64_t>{{{code}}}"

    def empty_list(self, kind: Kind) -> str:
        return "std::vector<int64_t>{}" if kind == Kind.INT else "std::vector<double>{}"

    def floats_of_ints(self, code: str) -> str:
        return f"to_float_list({code})"

    def one_float_list(self, code: str) -> str:
        return f"std::vector<double>{{double({code})}}"


class PyLang(CppLang):
    """The same formulas spelled in Python for framework adapters: ops are ``F.<op>`` (the
    framework's registered opforge ops) and helpers ``H.<helper>`` (its tensor helpers)."""

    null = "None"
    untyped_empty_list = "[]"
    AND, OR = " and ", " or "

    def attr_default(self, cpp: str, py: str) -> str:
        return py

    def op(self, name: str, args: list[str]) -> str:
        return f"F.{name}({', '.join(args)})"

    def scalar_like(self, value: str, like: str) -> str:
        return f"H.scalar_like({value}, {like})"

    def with_number(self, fn: str, tensor: str, number: str, number_first: bool) -> str:
        a, b = ("num_s", "num_t") if number_first else ("num_t", "num_s")
        return f"H.with_number({tensor}, {number}, lambda f, num_t, num_s: f.{fn}({a}, {b}), F)"

    def bind_like(self, code: str, name: str, body: str) -> str:
        return f"(lambda {name}: {body})({code})"

    def number(self, op: str, left: str, right: str) -> str:
        return f"({left} {op} {right})"

    def boolean(self, value: bool) -> str:
        return "True" if value else "False"

    def string(self, value: str) -> str:
        return escape.py_str(value)

    def num_list(self, items: list[str], kind: Kind) -> str:
        return f"[{', '.join(items)}]"

    def given_attr(self, code: str) -> tuple[str, str]:
        return f"{code} is not None", code

    def given_tensor(self, code: str) -> str:
        return f"{code} is not None"

    def choose(self, test: str, a: str, b: str) -> str:
        return f"({a} if {test} else {b})"

    def need(self, k: int) -> str:
        return f"need[{k}]"

    def helper(self, name: str, args: list[str]) -> str:
        return f"H.{name}({', '.join(args)})"

    def as_float(self, code: str) -> str:
        return code  # Python numbers pass to float parameters as they are

    def one_int_list(self, code: str) -> str:
        return f"[{code}]"

    def empty_list(self, kind: Kind) -> str:
        return "[]"

    def floats_of_ints(self, code: str) -> str:
        return f"[float(v) for v in {code}]"

    def one_float_list(self, code: str) -> str:
        return f"[{code}]"


CPP = CppLang()
PY = PyLang()
