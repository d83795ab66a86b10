"""Derivatives of elementwise (``impl.expr``) formulas, by symbolic differentiation.

An expr op computes each output element as a scalar function of its inputs' elements, so its
derivatives are elementwise too: for output o and input x, the partial derivative ∂o/∂x is another
expression over the same names. From the partials come both modes, as graph formulas (the language
of ``bprop`` and ``jvp``, calling ops):

- reverse (``bprop``): the gradient of input x is Σ_o d<o> · ∂o/∂x;
- forward (``jvp``): the tangent of output o is Σ_x ∂o/∂x · d<x>.

Rules: the chain rule over ``+ - * /``, ``exp log log1p expm1 sqrt rsqrt tanh sin cos erf abs
where maximum minimum pow floor ceil``; attrs and numbers are constants; comparisons and the
conditions of ``where`` have no derivative; ``where(c, a, b)`` keeps its branches,
``where(c, a', b')``. Where a function has no derivative at a point, the one chosen is PyTorch's:
``abs`` has ``sign(u)`` (0 at 0), ``maximum``/``minimum`` split a tie evenly (½ each), and a
``where`` boundary takes the branch the condition picks there (``where(x < 0, 0, x)`` has slope 1
at 0; relu's spec writes its bprop to get PyTorch's 0).

The result is simplified (no ``* 1``, ``+ 0``, folded numbers), subexpressions equal to an
output's own expression are read from that output (``exp``'s derivative is ``out``), and a
tensor subexpression used more than once is computed once in a ``let``. Formulas are returned as
text (parsed again by the model), so docs and ``opforge info`` show exactly what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from .syntax import COMPARE_OPS, Binary, BoolLit, Call, ListLit, Name, Node, Num, Select, Str, Unary

# a partial derivative; None is zero
D = Optional[Node]

_P = 0  # positions are meaningless in derived trees (the text is parsed again)


class DeriveError(Exception):
    """The formula uses something that cannot be differentiated (a message for the spec author)."""


# ---------------------------------------------------------------------------- building trees


def num(v: float) -> Num:
    if float(v).is_integer() and abs(v) < 2 ** 53:
        return Num(int(v), str(int(v)), _P)
    return Num(float(v), repr(float(v)), _P)


def is_num(n: Node, v: Optional[float] = None) -> bool:
    return isinstance(n, Num) and (v is None or n.value == v)


def neg(a: D) -> D:
    if a is None:
        return None
    if isinstance(a, Num):
        return num(-a.value)
    if isinstance(a, Unary):
        return a.operand
    return Unary("-", a, _P)


def add(a: D, b: D) -> D:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Num) and isinstance(b, Num):
        return num(a.value + b.value)
    if isinstance(b, Unary):
        return sub(a, b.operand)
    return Binary("+", a, b, _P)


def sub(a: D, b: D) -> D:
    if b is None:
        return a
    if a is None:
        return neg(b)
    if isinstance(a, Num) and isinstance(b, Num):
        return num(a.value - b.value)
    if isinstance(b, Unary):
        return add(a, b.operand)
    return Binary("-", a, b, _P)


def mul(a: D, b: D) -> D:
    if a is None or b is None or is_num(a, 0) or is_num(b, 0):
        return None
    if isinstance(a, Num) and isinstance(b, Num):
        return num(a.value * b.value)
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    if is_num(a, -1):
        return neg(b)
    if is_num(b, -1):
        return neg(a)
    if isinstance(a, Unary):
        return neg(mul(a.operand, b))
    if isinstance(b, Unary):
        return neg(mul(a, b.operand))
    if isinstance(b, Num) and not isinstance(a, Num):  # numbers first: 2 * x
        a, b = b, a
    if isinstance(a, Num) and isinstance(b, Binary) and b.op == "*" and isinstance(b.left, Num):
        return mul(num(a.value * b.left.value), b.right)  # 2 * (3 * x) = 6 * x
    for p, q in ((a, b), (b, a)):  # p * (1 / q) = p / q
        if isinstance(q, Binary) and q.op == "/" and is_num(q.left, 1):
            return div(p, q.right)
    return Binary("*", a, b, _P)


def div(a: D, b: Node) -> D:
    if a is None:
        return None
    if is_num(b, 1):
        return a
    if isinstance(a, Num) and isinstance(b, Num) and b.value != 0:
        return num(a.value / b.value)
    if isinstance(a, Unary):
        return neg(div(a.operand, b))
    return Binary("/", a, b, _P)


def call(func: str, *args: Node) -> Call:
    return Call(func, tuple(args), (), _P)


# ---------------------------------------------------------------------------- text


_PREC = {"cmp": 1, "+": 2, "-": 2, "*": 3, "/": 3, "unary": 4, "atom": 5}


def unparse(n: Node) -> str:
    """The formula text of a tree (parses back to the same tree, positions aside)."""
    return _unparse(n)[0]


def _unparse(n: Node) -> tuple[str, int]:
    if isinstance(n, Num):
        return n.text, (_PREC["unary"] if n.text.startswith("-") else _PREC["atom"])
    if isinstance(n, Name):
        return n.id, _PREC["atom"]
    if isinstance(n, BoolLit):
        return ("True" if n.value else "False"), _PREC["atom"]
    if isinstance(n, Str):
        return f'"{n.value}"', _PREC["atom"]
    if isinstance(n, ListLit):
        return "[" + ", ".join(unparse(i) for i in n.items) + "]", _PREC["atom"]
    if isinstance(n, Unary):
        text, p = _unparse(n.operand)
        return "-" + (text if p >= _PREC["unary"] and not text.startswith("-") else f"({text})"), _PREC["unary"]
    if isinstance(n, Binary):
        prec = _PREC["cmp"] if n.op in COMPARE_OPS else _PREC[n.op]
        lt, lp = _unparse(n.left)
        rt, rp = _unparse(n.right)
        # left-associative: the right operand of - and / (and of any comparison) needs parentheses
        # at equal precedence
        left = lt if lp >= prec and not (prec == _PREC["cmp"] and lp == prec) else f"({lt})"
        right = rt if rp > prec or (rp == prec and n.op in ("+", "*")) else f"({rt})"
        return f"{left} {n.op} {right}", prec
    if isinstance(n, Call):
        parts = [unparse(a) for a in n.args] + [f"{k}={unparse(v)}" for k, v, _ in n.kwargs]
        return f"{n.func}({', '.join(parts)})", _PREC["atom"]
    if isinstance(n, Select):
        return f"{unparse(n.call)}.{n.name}", _PREC["atom"]
    raise AssertionError(n)  # pragma: no cover


# ---------------------------------------------------------------------------- differentiation


@dataclass(frozen=True)
class ExprOp:
    """What differentiation needs of an expr op."""

    inputs: Sequence[str]
    differentiable: Sequence[str]
    outputs: Sequence[tuple[str, Node]]   # output name -> its formula's tree
    # the outputs with gradients (d<output>); None: every output
    differentiable_outputs: Optional[Sequence[str]] = None
    # each input's and output's dtype as its spec writes it (a type variable or a dtype); empty:
    # all one dtype. A gradient or tangent reading a tensor of another is given it cast_like the
    # input or output it is for (the expr's arithmetic converted every element to one compute type)
    dtypes: Mapping[str, str] = field(default_factory=dict)


def _refs_input(n: Node, inputs: Sequence[str]) -> bool:
    """Whether n reads one of the names ``inputs`` (tensors, in graph formulas)."""
    if isinstance(n, Name):
        return n.id in inputs
    if isinstance(n, Unary):
        return _refs_input(n.operand, inputs)
    if isinstance(n, Binary):
        return _refs_input(n.left, inputs) or _refs_input(n.right, inputs)
    if isinstance(n, Call):
        return any(_refs_input(a, inputs) for a in n.args)
    if isinstance(n, Select):
        return _refs_input(n.call, inputs)
    return False


def partial(node: Node, x: str, inputs: Sequence[str]) -> D:
    """∂node/∂x as a tree over the same names (None: zero)."""

    def d(n: Node) -> D:
        if isinstance(n, Name):
            return num(1) if n.id == x else None
        if isinstance(n, (Num, BoolLit, Str)):
            return None
        if isinstance(n, Unary):
            return neg(d(n.operand))
        if isinstance(n, Binary):
            if n.op in COMPARE_OPS:
                return None
            da, db = d(n.left), d(n.right)
            if n.op == "+":
                return add(da, db)
            if n.op == "-":
                return sub(da, db)
            if n.op == "*":
                return add(mul(da, n.right), mul(n.left, db))
            if n.op == "/":  # (a / b)' = a' / b - a b' / b²
                return sub(div(da, n.right), div(mul(n.left, db), Binary("*", n.right, n.right, _P)))
        if isinstance(n, Call):
            return call_rule(n)
        raise DeriveError(f"cannot differentiate {unparse(n)}")

    def call_rule(n: Call) -> D:
        f, args = n.func, n.args
        if f in ("floor", "ceil"):
            return None
        if f == "where":
            c, a, b = args
            da, db = d(a), d(b)
            if da is None and db is None:
                return None
            return call("where", c, da if da is not None else num(0), db if db is not None else num(0))
        if f == "if_given":
            c, a, b = args
            da, db = d(a), d(b)
            if da is None and db is None:
                return None
            return call("if_given", c, da if da is not None else num(0), db if db is not None else num(0))
        if f in ("maximum", "minimum"):
            a, b = args
            da, db = d(a), d(b)
            if da is None and db is None:
                return None
            first, second = (">", "<") if f == "maximum" else ("<", ">")
            tie = mul(num(0.5), add(da, db))
            return call("where", Binary(first, a, b, _P), da or num(0),
                        call("where", Binary(second, a, b, _P), db or num(0), tie or num(0)))
        if f == "pow":
            a, b = args
            da, db = d(a), d(b)
            ga = mul(mul(b, call("pow", a, sub(b, num(1)) or num(0))), da) if da is not None else None
            gb = mul(mul(n, call("log", a)), db) if db is not None else None
            return add(ga, gb)
        if len(args) != 1:
            raise DeriveError(f"cannot differentiate {f}()")
        u = args[0]
        du = d(u)
        if du is None:
            return None
        outer: dict[str, Callable[[], Node]] = {
            "exp": lambda: n,
            "expm1": lambda: call("exp", u),
            "sqrt": lambda: Binary("/", num(0.5), n, _P),
            # -0.5 rsqrt(u)^3, as torch (-0.5 * out / u gave -inf at u = -0.0, torch +inf)
            "rsqrt": lambda: Binary("*", Binary("*", Binary("*", num(-0.5), n, _P), n, _P), n, _P),
            "tanh": lambda: Binary("-", num(1), Binary("*", n, n, _P), _P),
            "sin": lambda: call("cos", u),
            "cos": lambda: Unary("-", call("sin", u), _P),
            "erf": lambda: Binary("*", num(1.1283791670955126), call("exp", Unary("-", Binary("*", u, u, _P), _P)), _P),
            "abs": lambda: call("sign", u),
        }
        if f == "log":  # du / u rather than du * (1 / u)
            return div(du, u)
        if f == "log1p":
            return div(du, Binary("+", num(1), u, _P))
        if f not in outer:
            raise DeriveError(f"no derivative rule for {f}()")
        return mul(outer[f](), du)

    return d(node)


# ---------------------------------------------------------------------------- to graph formulas


def scale(g: Node, p: D, like: Node) -> D:
    """g · p as a graph formula (g a tensor): pushed into the branches of where/if_given, so a
    branch that is a number becomes a tensor (``where(x > 0, dout, alpha * dout)``); a zero branch
    is ``zeros_like(like)``."""
    if p is None:
        return None
    if isinstance(p, Call) and p.func in ("where", "if_given"):
        a = scale(g, p.args[1], like)
        b = scale(g, p.args[2], like)
        zero = call("zeros_like", like)
        return call(p.func, p.args[0], a if a is not None else zero, b if b is not None else zero)
    if isinstance(p, Binary) and p.op == "*":  # (a number times a where/if_given: a tie's ½)
        for k, q in ((p.left, p.right), (p.right, p.left)):
            gk = mul(g, k)
            if isinstance(k, Num) and isinstance(q, Call) and q.func in ("where", "if_given") and gk is not None:
                return scale(gk, q, like)
    return mul(g, p) if not is_num(p, 1) else g


def _tensor_where(n: Node, tensors: Sequence[str], like: Node) -> Node:
    """Graph formulas compute with ops: a ``where`` picking between numbers by a tensor condition
    needs tensors of the right dtype (``ones_like``); ``sin``/``cos`` are the outputs of
    ``sincos``; a where whose condition is an attr test stays (chosen once per call)."""
    def go(m: Node) -> Node:
        if isinstance(m, Unary):
            return Unary(m.op, go(m.operand), _P)
        if isinstance(m, Binary):
            return Binary(m.op, go(m.left), go(m.right), _P)
        if isinstance(m, Call):
            args = tuple(go(a) for a in m.args)
            if m.func in ("sin", "cos"):
                return Select(Call("sincos", args, (), _P), m.func, _P)
            if m.func == "where" and _is_tensor(args[0], tensors):
                args = (args[0],) + tuple(a if _is_tensor(a, tensors)
                                          else mul(a, call("ones_like", like)) or call("zeros_like", like)
                                          for a in args[1:])
            return Call(m.func, args, m.kwargs, _P)
        return m
    return go(n)


def _tensor_dtypes(op: ExprOp) -> dict[str, str]:
    """The dtype (as the spec writes it) of every tensor a derived formula reads."""
    kinds = {x: op.dtypes[x] for x in op.inputs if x in op.dtypes}
    for o, _ in op.outputs:
        if o in op.dtypes:
            kinds[o] = kinds["d" + o] = op.dtypes[o]
    for x in op.differentiable:
        if x in op.dtypes:
            kinds[tangent(x)] = op.dtypes[x]
    return kinds


def _cast_others(n: Node, target: str, kinds: Mapping[str, str]) -> Node:
    """n (the gradient of input target, or the tangent of output target) with each tensor name of
    another dtype than target's read as ``cast_like(name, target)``: ops take one dtype per type
    variable (``x * n`` with n int32 has the gradient ``dout * cast_like(n, x)``)."""
    want = kinds.get(target)

    def cast(m: Node) -> Optional[Node]:
        if isinstance(m, Name) and m.id in kinds and kinds[m.id] != want:
            return call("cast_like", m, Name(target, _P))
        if isinstance(m, Call) and m.func == "where" and isinstance(m.args[0], Name):  # (a bool condition stays)
            return Call(m.func, (m.args[0], *(_rewrite(a, cast) for a in m.args[1:])), m.kwargs, _P)
        if isinstance(m, Binary) and m.op in COMPARE_OPS:
            # a comparison of one dtype's tensors (and numbers) stays in that dtype: `n > 2048` of
            # an int32 n, cast to float16, would compare 2048 (the expression compared 2049)
            if len({kinds[t.id] for t in _subtrees(m) if isinstance(t, Name) and t.id in kinds}) <= 1:
                return m
        return None
    return n if want is None else _rewrite(n, cast)


def _is_tensor(n: Node, names: Sequence[str]) -> bool:
    """Whether n's value is a tensor in a graph formula: it reads a tensor name (an input,
    output, gradient, tangent or let) or is a ``zeros_like``/``ones_like``."""
    if isinstance(n, Call) and n.func in ("zeros_like", "ones_like"):
        return True
    return _refs_input(n, names)


def _subst_outputs(n: Node, outputs: dict[str, str]) -> Node:
    """Subexpressions equal to an output's formula become that output's name."""
    text = unparse(n)
    if text in outputs and not isinstance(n, Name):
        return Name(outputs[text], _P)
    if isinstance(n, Unary):
        return Unary(n.op, _subst_outputs(n.operand, outputs), _P)
    if isinstance(n, Binary):
        return Binary(n.op, _subst_outputs(n.left, outputs), _subst_outputs(n.right, outputs), _P)
    if isinstance(n, Call):
        return Call(n.func, tuple(_subst_outputs(a, outputs) for a in n.args), n.kwargs, _P)
    if isinstance(n, Select):
        call_ = _subst_outputs(n.call, outputs)
        return Select(call_, n.name, _P) if isinstance(call_, Call) else call_
    return n


def _size(n: Node) -> int:
    if isinstance(n, Unary):
        return 1 + _size(n.operand)
    if isinstance(n, Binary):
        return 1 + _size(n.left) + _size(n.right)
    if isinstance(n, Call):
        return 1 + sum(_size(a) for a in n.args)
    if isinstance(n, Select):
        return _size(n.call)
    return 1


def _subtrees(n: Node) -> list[Node]:
    out = [n]
    if isinstance(n, Unary):
        out += _subtrees(n.operand)
    elif isinstance(n, Binary):
        out += _subtrees(n.left) + _subtrees(n.right)
    elif isinstance(n, Call):
        for a in n.args:
            out += _subtrees(a)
    elif isinstance(n, Select):
        out += _subtrees(n.call)
    return out


def _replace(n: Node, text: str, name: str) -> Node:
    if unparse(n) == text:
        return Name(name, _P)
    if isinstance(n, Unary):
        return Unary(n.op, _replace(n.operand, text, name), _P)
    if isinstance(n, Binary):
        return Binary(n.op, _replace(n.left, text, name), _replace(n.right, text, name), _P)
    if isinstance(n, Call):
        return Call(n.func, tuple(_replace(a, text, name) for a in n.args), n.kwargs, _P)
    if isinstance(n, Select):
        call_ = _replace(n.call, text, name)
        return Select(call_, n.name, _P) if isinstance(call_, Call) else call_
    return n


def share(formulas: list[tuple[str, Node]], tensors: Sequence[str], taken: set[str]
          ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Common tensor subexpressions (used twice or more across the formulas) bound once in lets,
    largest first; returns (lets, formulas) as (name, text)."""
    lets: list[tuple[str, Node]] = []
    counter = 0
    while True:
        counts: dict[str, int] = {}
        trees: dict[str, Node] = {}
        for _, f in formulas:
            for t in _subtrees(f):
                if _size(t) < 3 or not _is_tensor(t, tensors):
                    continue
                if isinstance(t, Call) and t.func in ("zeros_like", "ones_like"):
                    continue
                key = unparse(t)
                counts[key] = counts.get(key, 0) + 1
                trees[key] = t
        repeated = [k for k, c in counts.items() if c > 1]
        if not repeated:
            break
        key = max(repeated, key=lambda k: (_size(trees[k]), k))
        while f"e{counter}" in taken:
            counter += 1
        name = f"e{counter}"
        counter += 1
        formulas = [(o, _replace(f, key, name)) for o, f in formulas]
        lets = [(n, _replace(t, key, name)) for n, t in lets]
        lets.append((name, trees[key]))
        tensors = list(tensors) + [name]
    # a let may use lets bound after it (found later, smaller): order by dependency
    ordered: list[tuple[str, Node]] = []
    pending = list(lets)
    while pending:
        for item in pending:
            deps = {n for n, _ in pending if n != item[0]}
            if not any(_mentions(item[1], n) for n in deps):
                ordered.append(item)
                pending.remove(item)
                break
    return [(n, unparse(t)) for n, t in ordered], [(o, unparse(f)) for o, f in formulas]


def _mentions(n: Node, name: str) -> bool:
    return any(isinstance(t, Name) and t.id == name for t in _subtrees(n))


@dataclass(frozen=True)
class Derived:
    lets: tuple[tuple[str, str], ...]       # (name, formula text)
    formulas: tuple[tuple[str, str], ...]   # (input name for bprop / output name for jvp, text)


def tangent(name: str) -> str:
    """How jvp formulas name an input's tangent (PyTorch's derivatives.yaml spells it so too)."""
    return name + "_t"


def derive(op: ExprOp, mode: str, taken: set[str]) -> Derived:
    """The op's ``bprop`` (mode "bprop": one gradient per differentiable input, from the output
    gradients ``d<output>``) or ``jvp`` (mode "jvp": one tangent per output, from the input
    tangents ``<input>_t``), as formula texts. ``taken``: names a let must not use."""
    outs = {unparse(f): o for o, f in op.outputs}
    partials = {(o, x): partial(f, x, op.inputs) for o, f in op.outputs for x in op.differentiable}
    results: list[tuple[str, Node]] = []
    like0 = Name(op.differentiable[0], _P) if op.differentiable else Name(op.inputs[0], _P)
    if mode == "bprop":
        graded = [o for o, _ in op.outputs if op.differentiable_outputs is None or o in op.differentiable_outputs]
        for x in op.differentiable:
            total: D = None
            for o in graded:  # (an output without a gradient, an index, has no d<output>)
                total = add(total, scale(Name("d" + o, _P), partials[(o, x)], Name("d" + o, _P)))
            results.append((x, total if total is not None else call("zeros_like", Name(x, _P))))
    else:
        for o, _ in op.outputs:
            total = None
            for x in op.differentiable:
                total = add(total, scale(Name(tangent(x), _P), partials[(o, x)], Name(tangent(x), _P)))
            results.append((o, total if total is not None else call("zeros_like", Name(o, _P))))
    tensors = (list(op.inputs) + [o for o, _ in op.outputs] + ["d" + o for o, _ in op.outputs]
               + [tangent(x) for x in op.differentiable])
    results = [(k, _tensor_where(_subst_outputs(f, outs), tensors, like0)) for k, f in results]
    if op.dtypes:
        results = [(k, _cast_others(f, k, _tensor_dtypes(op))) for k, f in results]
    lets, formulas = share(results, tensors, taken)
    return Derived(tuple(lets), tuple(formulas))


def is_linear_in(n: Node, g: str) -> bool:
    """Whether a graph formula is syntactically linear and elementwise in the tensor ``g``: g itself,
    scaled (``g * e``, ``e * g``, ``g / e``, ``-g``), sums of such, ``where``/``if_given`` over such
    branches, or a zero (``zeros_like``); ``e`` never mentions g."""
    if isinstance(n, Name):
        return n.id == g
    if isinstance(n, Unary):
        return is_linear_in(n.operand, g)
    if isinstance(n, Binary):
        if n.op in ("+", "-"):
            return is_linear_in(n.left, g) and is_linear_in(n.right, g)
        if n.op == "*":
            return ((is_linear_in(n.left, g) and not _mentions(n.right, g))
                    or (is_linear_in(n.right, g) and not _mentions(n.left, g)))
        if n.op == "/":
            return is_linear_in(n.left, g) and not _mentions(n.right, g)
        return False
    if isinstance(n, Call):
        if n.func == "zeros_like" and not n.kwargs:
            return True
        if n.func in ("where", "if_given") and len(n.args) == 3 and not n.kwargs:
            return not _mentions(n.args[0], g) and all(is_linear_in(a, g) for a in n.args[1:])
    return False


def _rewrite(n: Node, fn: Callable[[Node], Optional[Node]]) -> Node:
    """n rebuilt bottom-up where ``fn`` gives a replacement for a node (None: keep it, rewrite
    its children)."""
    got = fn(n)
    if got is not None:
        return got
    if isinstance(n, Unary):
        return Unary(n.op, _rewrite(n.operand, fn), _P)
    if isinstance(n, Binary):
        return Binary(n.op, _rewrite(n.left, fn), _rewrite(n.right, fn), _P)
    if isinstance(n, Call):
        return Call(n.func, tuple(_rewrite(a, fn) for a in n.args),
                    tuple((k, _rewrite(v, fn), p) for k, v, p in n.kwargs), _P)
    if isinstance(n, Select):
        c = _rewrite(n.call, fn)
        assert isinstance(c, Call)
        return Select(c, n.name, _P)
    if isinstance(n, ListLit):
        return ListLit(tuple(_rewrite(i, fn) for i in n.items), _P)
    return n


def substitute(n: Node, name: str, by: str) -> Node:
    """n with every Name ``name`` replaced by ``by``."""
    return _replace_name(n, name, Name(by, _P))


def without_if_needs(n: Node) -> Node:
    """n with each ``if_needs(x, a, b)`` replaced by b: both branches give the same gradient, and
    outside a backward (a jvp derived from the bprop) no gradient is asked for."""
    return _rewrite(n, lambda m: without_if_needs(m.args[2])
                    if isinstance(m, Call) and m.func == "if_needs" and len(m.args) == 3 else None)


def inline(n: Node, lets: dict[str, Node]) -> Node:
    """n with each Name bound in ``lets`` replaced by its tree."""
    for name, tree in lets.items():
        n = _replace_name(n, name, tree)
    return n


def _replace_name(n: Node, name: str, tree: Node) -> Node:
    return _rewrite(n, lambda m: tree if isinstance(m, Name) and m.id == name else None)