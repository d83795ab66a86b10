"""Functional autograd on top of the C++ engine: no_grad, grad, value_and_grad (reverse mode),
jvp and jacfwd (forward mode)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

from opforge import _C
from opforge._C import Tensor

Positions = Union[int, Sequence[int], None]


class _GradMode(contextlib.ContextDecorator):
    """Grad mode set to ``_mode`` inside, the previous mode back after. Each call of a decorated
    function gets a context of its own (a recursive call, or two threads calling it, must not share
    the mode to restore); a ``with`` of one instance nests (a stack)."""

    _mode: bool

    def __init__(self) -> None:
        self._prev: list[bool] = []

    def _recreate_cm(self) -> "_GradMode":
        return type(self)()

    def __enter__(self) -> None:
        self._prev.append(_C.is_grad_enabled())
        _C.set_grad_enabled(self._mode)

    def __exit__(self, *exc: Any) -> None:
        _C.set_grad_enabled(self._prev.pop())


class no_grad(_GradMode):
    """Context manager and decorator that turns off graph recording."""

    _mode = False


class enable_grad(_GradMode):
    """Context manager and decorator that turns graph recording back on."""

    _mode = True


class set_grad_enabled:
    """Sets graph recording on or off now, like ``torch.set_grad_enabled``: called alone, it stays
    so; as a context manager, the previous mode comes back on exit."""

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, (bool, np.bool_)):
            raise TypeError(f"[set_grad_enabled] mode must be a bool, got {type(mode).__name__}")
        self._prev = _C.is_grad_enabled()
        _C.set_grad_enabled(bool(mode))

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        _C.set_grad_enabled(self._prev)


def _as_leaf(x: Any) -> Tensor:
    """A fresh leaf that requires grad (sharing x's memory when x is a Tensor or array)."""
    import opforge

    if isinstance(x, Tensor) and _C._tangent(x) is not None:
        raise RuntimeError("[grad] a gradient inside forward mode (grad of a function of jvp's dual inputs) is "
                           "not supported: take the gradient of the jvp instead (reverse-over-forward), "
                           "e.g. grad(lambda x: (jvp(f, (x,), (v,))[1] * u).sum())")
    if isinstance(x, Tensor):
        t = x.detach()
    elif hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__"):
        t = opforge.tensor(x)
    else:
        t = opforge.tensor(x, dtype="float32" if isinstance(x, float) else None)
    if t.dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"[grad] can only differentiate with respect to floating-point inputs, got {t.dtype}")
    t.requires_grad = True
    return t


def _output(value: Any, has_aux: bool) -> tuple[Tensor, Any]:
    aux = None
    if has_aux:
        if not isinstance(value, tuple) or len(value) < 2:
            raise TypeError("[grad] with has_aux=True the function must return (output, aux...)")
        value, aux = value[0], value[1:]
    if isinstance(value, tuple):
        value = value[0]
    if not isinstance(value, Tensor):
        raise TypeError(f"[grad] the function must return an opforge Tensor, got {type(value).__name__}")
    return value, aux


def _grads(out: Tensor, wrt: list[Tensor], sens: Optional[Tensor]) -> list[Tensor]:
    if not out.requires_grad:
        return [_C._zeros_like(t) for t in wrt]
    got = _C._run_backward([out], [sens], False, False, wrt, True)
    return [g if g is not None else _C._zeros_like(t) for g, t in zip(got, wrt)]


def value_and_grad(fn: Callable[..., Any], grad_position: Positions = 0,
                   weights: Optional[Iterable[Tensor]] = None, has_aux: bool = False
                   ) -> Callable[..., tuple[Any, Any]]:
    """Like MindSpore's ``value_and_grad``: returns ``f(*args) -> (value, grads)``.

    ``grad_position``: an int (one gradient), a tuple of ints (a tuple of gradients) or None.
    ``weights``: tensors (``requires_grad=True``) the function closes over. With both, grads is
    ``(input_grads, weight_grads)``; with only weights, it is the tuple of weight gradients.
    The output must be a single-element tensor unless a ``sens`` keyword gives its gradient.
    """
    if grad_position is None and weights is None:
        raise ValueError("[value_and_grad] give grad_position, weights or both")
    weight_list = list(weights) if weights is not None else None
    for w in weight_list or []:
        if not isinstance(w, Tensor) or not w.requires_grad:
            raise TypeError("[value_and_grad] weights must be opforge Tensors with requires_grad=True")

    @functools.wraps(fn)
    def wrapper(*args: Any, sens: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        positions = (grad_position,) if isinstance(grad_position, int) else tuple(grad_position or ())
        for p in positions:
            if not -len(args) <= p < len(args):
                raise IndexError(f"[value_and_grad] grad_position {p} is out of range for {len(args)} arguments")
        argv = list(args)
        leaf_at: dict[int, Tensor] = {}  # a position given twice gets one leaf (and its gradient twice)
        for p in positions:
            k = p % len(argv)
            if k not in leaf_at:
                leaf_at[k] = argv[k] = _as_leaf(argv[k])
        leaves = [leaf_at[p % len(argv)] for p in positions]
        with enable_grad():
            value = fn(*argv, **kwargs)
        out, aux = _output(value, has_aux)
        sens_t = None if sens is None else _as_tensor(sens, "sens", "value_and_grad")
        grads = _grads(out, leaves + (weight_list or []), sens_t)
        gin, gw = grads[:len(leaves)], tuple(grads[len(leaves):])
        in_part: Any = gin[0] if isinstance(grad_position, int) else tuple(gin)
        if weight_list is None:
            result: Any = in_part
        elif grad_position is None:
            result = gw
        else:
            result = (in_part, gw)
        return (value if not has_aux else (out, *aux)), result

    return wrapper


def grad(fn: Callable[..., Any], argnums: Positions = 0, weights: Optional[Iterable[Tensor]] = None,
         has_aux: bool = False) -> Callable[..., Any]:
    """The gradient of fn with respect to the arguments at ``argnums`` (and ``weights``)."""
    vg = value_and_grad(fn, argnums, weights, has_aux)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1:]) if has_aux else g

    return wrapper


def gradients(outputs: Union[Tensor, Sequence[Tensor]], inputs: Union[Tensor, Sequence[Tensor]],
              grad_outputs: Optional[Sequence[Any]] = None, retain_graph: Optional[bool] = None,
              create_graph: bool = False, allow_unused: bool = False) -> tuple[Optional[Tensor], ...]:
    """The gradients of outputs with respect to inputs, without touching ``.grad``
    (like ``torch.autograd.grad``). With ``create_graph=True`` the results are differentiable."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    gs = list(grad_outputs) if grad_outputs is not None else [None] * len(outs)
    if len(gs) != len(outs):
        raise ValueError(f"[gradients] {len(outs)} outputs but {len(gs)} grad_outputs")
    for what, items in (("outputs", outs), ("inputs", ins)):
        for i, t in enumerate(items):
            if not isinstance(t, Tensor):
                raise TypeError(f"[gradients] {what}[{i}] must be an opforge Tensor, got {type(t).__name__}")
    retain = create_graph if retain_graph is None else retain_graph
    return tuple(_C._run_backward(outs, gs, retain, create_graph, ins, allow_unused))


# ---------------------------------------------------------------------------- forward mode


def _as_tensor(x: Any, what: str, op: str = "jvp") -> Tensor:
    import opforge

    if isinstance(x, Tensor):
        return x
    if hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__"):
        return opforge.tensor(x)
    if isinstance(x, (int, float)):
        return opforge.tensor(x, dtype="float32" if isinstance(x, float) else None)
    raise TypeError(f"[{op}] {what} must be opforge Tensors or arrays, got {type(x).__name__}")


def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any],
        has_aux: bool = False) -> tuple[Any, ...]:
    """Forward mode, like ``torch.func.jvp``: ``(fn(*primals), J·tangents)``, the outputs and their
    tangents (the directional derivative of fn at primals along tangents), in one pass.

    Each op computes its outputs' tangents with its spec's ``jvp`` formulas (derived for
    elementwise ops); an op without one raises a RuntimeError naming it. fn returns a Tensor or a
    tuple of Tensors (then the tangents are a tuple too); an output that does not depend on the
    primals has a zero tangent. Tangents have their primals' shapes (and are cast to their dtypes).
    Reverse mode over forward mode works (``grad`` of a function calling ``jvp``: Hessian-vector
    products); forward over reverse (``jvp`` of ``grad``) and nested ``jvp`` raise."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError("[jvp] primals and tangents must be tuples (one entry per argument of fn)")
    if len(primals) != len(tangents):
        raise ValueError(f"[jvp] {len(primals)} primals but {len(tangents)} tangents")
    duals = [_C._make_dual(_as_tensor(p, "primals"), _as_tensor(t, "tangents")) for p, t in zip(primals, tangents)]
    value = fn(*duals)
    aux: Any = None
    if has_aux:
        if not isinstance(value, tuple) or len(value) != 2:
            raise TypeError("[jvp] with has_aux=True the function must return (output, aux)")
        value, aux = value
    outs = value if isinstance(value, tuple) else (value,)
    for o in outs:
        if not isinstance(o, Tensor):
            raise TypeError(f"[jvp] the function must return opforge Tensors, got {type(o).__name__}")
    tangent_outs = []
    for o in outs:
        t = _C._tangent(o)
        tangent_outs.append(t if t is not None else _C._zeros_like(o))
        _C._drop_tangent(o)  # (ours: made from the duals; the primal is returned without it)
    for d in duals:
        _C._drop_tangent(d)
    result = (value, tuple(tangent_outs) if isinstance(value, tuple) else tangent_outs[0])
    return (*result, aux) if has_aux else result


def jacfwd(fn: Callable[..., Any], argnums: Union[int, Sequence[int]] = 0) -> Callable[..., Any]:
    """The Jacobian of fn (one Tensor output) with respect to the arguments at ``argnums`` by forward
    mode, like ``torch.func.jacfwd``: shape ``output.shape + input.shape``, one jvp per input element."""
    import numpy as np

    import opforge

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        positions = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        for p in positions:
            if not isinstance(p, int) or not -len(args) <= p < len(args):
                raise IndexError(f"[jacfwd] argnums {p!r} is out of range for {len(args)} arguments")
        jacobians = []
        for p in positions:
            k = p % len(args)
            x = _as_tensor(args[k], "arguments", "jacfwd")

            def only(xk: Any, _k: int = k) -> Any:
                return fn(*args[:_k], xk, *args[_k + 1:])

            columns = []
            for e in range(x.size):  # one jvp per basis vector of x
                basis = np.zeros(x.size)
                basis[e] = 1.0
                out, t = jvp(only, (x,), (opforge.tensor(basis.reshape(x.shape), dtype=x.dtype),))
                if not isinstance(out, Tensor):
                    raise TypeError("[jacfwd] the function must return one Tensor")
                columns.append(t.numpy())
            out_shape = tuple(columns[0].shape) if columns else tuple(only(x).shape)
            jac = np.stack(columns, axis=-1) if columns else np.zeros(out_shape + (0,), dtype=x.numpy().dtype)
            jacobians.append(opforge.tensor(np.ascontiguousarray(jac.reshape(out_shape + tuple(x.shape)))))
        return jacobians[0] if isinstance(argnums, int) else tuple(jacobians)

    return wrapper
