"""Train a small classifier in PyTorch with opforge ops (linear, layer_norm, gelu, cross_entropy).

    python examples/torch_mlp.py              # eager
    python examples/torch_mlp.py --compile    # torch.compile(fullgraph=True)
    python examples/torch_mlp.py --device cuda  # on a GPU (the cuda wheel)

The data are three interleaved spirals generated here; the loss printed every few steps falls.
The ops are ``torch.ops.opforge.*``: PyTorch's autograd, optimizers and ``torch.compile`` treat
them like built-in operators.
"""

from __future__ import annotations

import argparse
import math

import torch

import opforge.torch as ot

ops = ot.ops


class MLP(torch.nn.Module):
    """linear -> layer_norm -> gelu -> linear, all opforge ops."""

    def __init__(self, features: int, hidden: int, classes: int, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def param(*shape: int, scale: float = 0.0, fill: float = 0.0) -> torch.nn.Parameter:
            if scale:
                return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype) * scale)
            return torch.nn.Parameter(torch.full(shape, fill, dtype=dtype))

        self.w1 = param(hidden, features, scale=features ** -0.5)
        self.b1 = param(hidden)
        self.norm_weight = param(hidden, fill=1.0)
        self.norm_bias = param(hidden)
        self.w2 = param(classes, hidden, scale=hidden ** -0.5)
        self.b2 = param(classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = ops.linear(x, self.w1, self.b1)
        h, _, _ = ops.layer_norm(h, self.norm_weight, self.norm_bias)  # (y, mean, rstd)
        h = ops.gelu(h)
        return ops.linear(h, self.w2, self.b2)


def loss_fn(model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return ops.cross_entropy(model(x), labels)


def spirals(n_per_class: int, classes: int = 3, seed: int = 0,
            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Points on `classes` interleaved noisy spiral arms in the plane, and their arm index."""
    g = torch.Generator().manual_seed(seed)
    r = torch.linspace(0.05, 1.0, n_per_class, dtype=torch.float64)
    xs, ys = [], []
    for c in range(classes):
        theta = 4.0 * r + 2 * math.pi * c / classes + 0.2 * torch.randn(n_per_class, generator=g, dtype=torch.float64)
        xs.append(torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.int64))
    return torch.cat(xs).to(dtype), torch.cat(ys)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) the loss")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda needs the cuda wheel and a GPU)")
    args = p.parse_args()

    torch.manual_seed(0)
    x, labels = spirals(200)
    x, labels = x.to(args.device), labels.to(args.device)
    model = MLP(2, args.hidden, 3).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step_loss = torch.compile(loss_fn, fullgraph=True) if args.compile else loss_fn
    for step in range(args.steps + 1):
        loss = step_loss(model, x, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            with torch.no_grad():
                accuracy = (model(x).argmax(1) == labels).double().mean().item()
            print(f"step {step:4d}  loss {loss.item():.4f}  accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
