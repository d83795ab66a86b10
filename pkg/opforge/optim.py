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
from typing import Any, Iterable, Optional, Sequence

from opforge import ops
import opforge._C as _C
from opforge._C import Tensor
from opforge._autograd import no_grad

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class Optimizer:
    """A list of parameters (opforge Tensors that require grad) and per-parameter state."""

    def __init__(self, params: Iterable[Tensor], defaults: dict[str, Any]) -> None:
        self.params: list[Tensor] = list(params)
        if not self.params:
            raise ValueError(f"[{type(self).__name__}] got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"[{type(self).__name__}] parameter {i} must be an opforge.Tensor, got "
                                f"{type(p).__name__}")
            if p.dtype not in ("float32", "float64"):
                raise TypeError(f"[{type(self).__name__}] parameter {i} is {p.dtype}; the fused steps take "
                                f"float32 and float64")
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


def _foreach(op: Any, *inputs: Any, **attrs: Any) -> None:
    _C._foreach(op, inputs, attrs)  # (opforge.foreach; opforge/__init__.py imports this module)


def _zeros_like(p: Tensor) -> Tensor:
    return _C._zeros_like(p)  # (on p's device, in its dtype)


def _check(name: str, **values: float) -> None:
    for key, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"[{name}] {key} must be a finite number >= 0, got {v!r}")


class SGD(Optimizer):
    """torch.optim.SGD: lr, momentum, dampening, weight_decay, nesterov (which needs momentum > 0
    and dampening 0). With momentum, each parameter's buffer is ``state[i]["momentum_buffer"]``."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        _check("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("[SGD] nesterov needs momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def _update(self, items: list[tuple[int, Tensor, Tensor]]) -> None:
        d = self.defaults
        groups: dict[bool, list[tuple[Tensor, Tensor, Tensor]]] = {}
        for i, p, g in items:
            state = self.state[i]
            first = "momentum_buffer" not in state
            if first:
                # (without momentum the buffer is d itself each step: a scratch tensor reused)
                state["momentum_buffer"] = _zeros_like(p)
            groups.setdefault(first or d["momentum"] == 0, []).append((p, g, state["momentum_buffer"]))
        for first, group in groups.items():
            ps, gs, bufs = (list(t) for t in zip(*group))
            _foreach(ops.sgd_step, ps, gs, bufs, lr=d["lr"], momentum=d["momentum"], dampening=d["dampening"],
                     weight_decay=d["weight_decay"], nesterov=d["nesterov"], first=first, out=(ps, bufs))


class Adam(Optimizer):
    """torch.optim.Adam: lr, betas, eps, weight_decay (an L2 term added to the gradient).
    ``state[i]`` holds ``step``, ``exp_avg`` and ``exp_avg_sq``."""

    _decoupled = False

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        name = type(self).__name__
        _check(name, lr=lr, eps=eps, weight_decay=weight_decay)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(f"[{name}] betas must be two numbers in [0, 1), got {betas!r}")
        super().__init__(params, dict(lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                                      weight_decay=weight_decay))

    def _update(self, items: list[tuple[int, Tensor, Tensor]]) -> None:
        d = self.defaults
        groups: dict[int, list[tuple[Tensor, Tensor, Tensor, Tensor]]] = {}  # by step count
        for i, p, g in items:
            state = self.state[i]
            if not state:
                state.update(step=0, exp_avg=_zeros_like(p), exp_avg_sq=_zeros_like(p))
            state["step"] += 1
            groups.setdefault(state["step"], []).append((p, g, state["exp_avg"], state["exp_avg_sq"]))
        beta1, beta2 = d["betas"]
        wd = d["weight_decay"]
        for step, group in groups.items():
            ps, gs, m1, m2 = (list(t) for t in zip(*group))
            _foreach(ops.adam_step, ps, gs, m1, m2,
                     step_size=d["lr"] / (1 - beta1 ** step), bias_correction2_sqrt=math.sqrt(1 - beta2 ** step),
                     exp_avg_weight=1 - beta1, beta2=beta2, exp_avg_sq_weight=1 - beta2, eps=d["eps"],
                     weight_decay=0.0 if self._decoupled else wd,
                     param_scale=1 - d["lr"] * wd if self._decoupled else 1.0, out=(ps, m1, m2))


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (param scaled by 1 - lr * weight_decay
    before the step; default weight_decay 0.01)."""

    _decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
