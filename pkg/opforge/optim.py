"""Optimizers over opforge tensors, updating parameters in place with fused ops.

    opt = opforge.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()

Each step is one call of ``opforge.foreach`` over every parameter with a gradient (one per group
of parameters whose per-parameter constants differ, as an Adam step count does after a parameter
went without a gradient): the generated elementwise ops ``ops.sgd_step`` and ``ops.adam_step``,
declared in op_specs/ like any op with ``foreach: true``, run on each parameter with ``out=``
naming the parameter and its state, so each kernel reads every element and writes it back in one
pass: no temporaries, no extra op calls. The
arithmetic is torch.optim's, in its order (results agree with it to float32 rounding); the state
(momentum buffers, moments) is opforge tensors in ``opt.state[i]``. Parameters are updated under
``no_grad()``, which the in-place rules require of leaves that require grad.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from opforge import ops
import opforge._C as _C
from opforge._C import Tensor
from opforge._autograd import no_grad

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class Optimizer:
    """A list of parameters (opforge Tensors that require grad) and per-parameter state."""

    def __init__(self, params: Iterable[Tensor], defaults: dict[str, Any]) -> None:
        name = type(self).__name__
        if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
            raise TypeError(f"[{name}] params must be an iterable of opforge Tensors, got "
                            f"{'a Tensor (pass [tensor])' if isinstance(params, Tensor) else type(params).__name__}")
        self.params: list[Tensor] = list(params)
        if not self.params:
            raise ValueError(f"[{name}] got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"[{name}] parameter {i} must be an opforge.Tensor, got {type(p).__name__}")
            if p.dtype not in ("float32", "float64"):
                raise TypeError(f"[{name}] parameter {i} is {p.dtype}; the fused steps take float32 and float64")
        if len({id(p) for p in self.params}) != len(self.params):
            # (torch.optim's warning: each step updates such a parameter once per listing)
            warnings.warn(f"[{name}] a parameter is listed more than once: each step updates it once per listing",
                          UserWarning, stacklevel=3)
        self.defaults = defaults
        self.state: list[dict[str, Any]] = [{} for _ in self.params]

    def zero_grad(self) -> None:
        """Sets every parameter's .grad to None (as torch's set_to_none=True)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        with no_grad():
            items = [(i, p, p.grad) for i, p in enumerate(self.params) if p.grad is not None]
            if items:
                self._update(items)

    def _update(self, items: list[tuple[int, Tensor, Tensor]]) -> None:
        """Updates the parameters in items ((index, parameter, gradient)) in place."""
        raise NotImplementedError


def _run(calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]]) -> None:
    """The foreach calls of one step (op, inputs, attrs with out=): every position of every call is
    checked before the first runs, so a step that raises leaves every parameter and its state as
    they were (opforge.foreach checks its own positions so; a step has one call per group)."""
    for op, inputs, attrs in calls:
        _C._foreach_check(op, inputs, attrs)
    for op, inputs, attrs in calls:
        _C._foreach(op, inputs, attrs)  # (opforge.foreach; opforge/__init__.py imports this module)


def _zeros_like(p: Tensor) -> Tensor:
    return _C._zeros_like(p)  # (on p's device, in its dtype)


def _real(v: Any) -> Optional[float]:
    """v as a float where it is a real number (Python's or NumPy's, not a bool), else None."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    return float(v)


def _number(v: Any) -> Any:
    """A hyperparameter as the optimizer ops take it: a NumPy number as a Python float (which takes
    the parameter's dtype; a NumPy scalar keeps its own, an lr schedule's np.float64 beside float32
    parameters was refused), anything else as it is."""
    f = _real(v)
    return v if f is None else f


def _check(name: str, **values: Any) -> dict[str, float]:
    """The hyperparameters as Python floats (NumPy numbers taken), each finite and >= 0."""
    out = {}
    for key, v in values.items():
        f = _real(v)
        if f is None:
            raise TypeError(f"[{name}] {key} must be a number, got {type(v).__name__}")
        if not (math.isfinite(f) and f >= 0):
            raise ValueError(f"[{name}] {key} must be a finite number >= 0, got {v!r}")
        out[key] = f
    return out


class SGD(Optimizer):
    """torch.optim.SGD: lr, momentum, dampening, weight_decay, nesterov (which needs momentum > 0
    and dampening 0). With momentum, each parameter's buffer is ``state[i]["momentum_buffer"]``."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        hyper = _check("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        dampening = float(dampening)
        if nesterov and (hyper["momentum"] <= 0 or dampening != 0):
            raise ValueError("[SGD] nesterov needs momentum > 0 and dampening 0")
        super().__init__(params, dict(hyper, dampening=dampening, nesterov=bool(nesterov)))

    def _update(self, items: list[tuple[int, Tensor, Tensor]]) -> None:
        d = self.defaults
        groups: dict[bool, list[tuple[int, Tensor, Tensor, Tensor]]] = {}
        for i, p, g in items:
            buf = self.state[i].get("momentum_buffer")
            first = buf is None
            if first:
                # (without momentum the buffer is d itself each step: a scratch tensor reused)
                buf = _zeros_like(p)
            groups.setdefault(first or d["momentum"] == 0, []).append((i, p, g, buf))
        calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        states: list[tuple[int, Tensor]] = []
        for first, group in groups.items():
            idx, ps, gs, bufs = (list(t) for t in zip(*group))
            calls.append((ops.sgd_step, (ps, gs, bufs, _number(d["lr"])), dict(
                momentum=d["momentum"], dampening=d["dampening"], weight_decay=d["weight_decay"],
                nesterov=d["nesterov"], first=first, out=(ps, bufs))))
            states += zip(idx, bufs)
        _run(calls)
        for i, buf in states:  # (the state only once the step ran)
            self.state[i]["momentum_buffer"] = buf


class Adam(Optimizer):
    """torch.optim.Adam: lr, betas, eps, weight_decay (an L2 term added to the gradient).
    ``state[i]`` holds ``step``, ``exp_avg`` and ``exp_avg_sq``."""

    _decoupled = False

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        name = type(self).__name__
        hyper = _check(name, lr=lr, eps=eps, weight_decay=weight_decay)
        pair = [_real(b) for b in betas] if hasattr(betas, "__len__") else []
        b1, b2 = pair if len(pair) == 2 else (None, None)
        if b1 is None or b2 is None or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"[{name}] betas must be two numbers in [0, 1), got {betas!r}")
        super().__init__(params, dict(hyper, betas=(b1, b2)))

    def _update(self, items: list[tuple[int, Tensor, Tensor]]) -> None:
        d = self.defaults
        groups: dict[int, list[tuple[int, Tensor, Tensor, Tensor, Tensor]]] = {}  # by step count
        for i, p, g in items:
            state = self.state[i]
            m1, m2 = (state["exp_avg"], state["exp_avg_sq"]) if state else (_zeros_like(p), _zeros_like(p))
            groups.setdefault(state.get("step", 0) + 1, []).append((i, p, g, m1, m2))
        beta1, beta2 = d["betas"]
        wd = d["weight_decay"]
        calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        adam_states: list[tuple[int, int, Tensor, Tensor]] = []
        for step, group in groups.items():
            idx, ps, gs, m1s, m2s = (list(t) for t in zip(*group))
            lr = d["lr"]
            scalars = tuple(_number(v) for v in (  # step_size, bias_correction2_sqrt, param_scale
                lr / (1 - beta1 ** step), math.sqrt(1 - beta2 ** step), 1 - lr * wd if self._decoupled else 1.0))
            calls.append((ops.adam_step, (ps, gs, m1s, m2s, *scalars), dict(
                exp_avg_weight=1 - beta1, beta2=beta2, exp_avg_sq_weight=1 - beta2, eps=d["eps"],
                weight_decay=0.0 if self._decoupled else wd, out=(ps, m1s, m2s))))
            adam_states += [(i, step, m1, m2) for i, m1, m2 in zip(idx, m1s, m2s)]
        _run(calls)
        for i, step, m1, m2 in adam_states:  # (the state only once the step ran)
            self.state[i].update(step=step, exp_avg=m1, exp_avg_sq=m2)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (param scaled by 1 - lr * weight_decay
    before the step; default weight_decay 0.01)."""

    _decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
