"""The peers of opforge.torch in the benchmark: what a user writes by hand today.

Each op is a ``torch.library.custom_op`` with ``register_fake`` and ``register_autograd``,
running the same opforge kernels through the public DLPack API (``opforge.from_dlpack``,
``torch.from_dlpack``), with its backward calling the opforge backward kernels the same way.
"""

from __future__ import annotations

import torch

import opforge
from opforge import ops

Tensor = torch.Tensor


def _of(t: Tensor) -> opforge.Tensor:
    return opforge.from_dlpack(t.detach())


def _pt(t: opforge.Tensor) -> Tensor:
    return torch.from_dlpack(t)


@torch.library.custom_op("bench_peer::mul", mutates_args=())
def mul(x: Tensor, y: Tensor) -> Tensor:
    return _pt(ops.mul(_of(x), _of(y)))


@mul.register_fake
def _(x: Tensor, y: Tensor) -> Tensor:
    return x.new_empty(torch.broadcast_shapes(x.shape, y.shape))


def _mul_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _mul_backward(ctx, g: Tensor):
    x, y = ctx.saved_tensors
    return mul(g, y), mul(g, x)


mul.register_autograd(_mul_backward, setup_context=_mul_setup)


@torch.library.custom_op("bench_peer::gelu", mutates_args=())
def gelu(x: Tensor) -> Tensor:
    return _pt(ops.gelu(_of(x)))


@gelu.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def _x_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _gelu_backward(ctx, g: Tensor):
    (x,) = ctx.saved_tensors
    return _pt(ops.gelu_backward(_of(g), _of(x)))


gelu.register_autograd(_gelu_backward, setup_context=_x_setup)


@torch.library.custom_op("bench_peer::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return _pt(ops.linear(_of(x), _of(weight), _of(bias)))


@linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])


def _linear_backward(ctx, g: Tensor):
    x, weight = ctx.saved_tensors
    og = _of(g)
    return (_pt(ops.matmul(og, _of(weight))), _pt(ops.linear_backward_weight(og, _of(x))),
            _pt(ops.sum(og, axis=list(range(g.dim() - 1)))))


linear.register_autograd(_linear_backward, setup_context=_linear_setup)


@torch.library.custom_op("bench_peer::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return _pt(ops.cross_entropy(_of(logits), _of(labels)))


@cross_entropy.register_fake
def _(logits: Tensor, labels: Tensor) -> Tensor:
    return logits.new_empty(())


def _ce_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _ce_backward(ctx, g: Tensor):
    logits, labels = ctx.saved_tensors
    return _pt(ops.cross_entropy_backward(_of(g), _of(logits), _of(labels))), None


cross_entropy.register_autograd(_ce_backward, setup_context=_ce_setup)
