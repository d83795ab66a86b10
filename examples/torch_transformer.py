"""Train a small transformer block in PyTorch with opforge ops, and the same block built from
torch's built-ins, side by side: the two loss curves agree to float32 rounding.

    python examples/torch_transformer.py                    # cpu
    python examples/torch_transformer.py --device cuda      # the cuda wheel on a GPU

The block: token embedding, pre-norm single-head attention (layer_norm, linear, matmul of the
queries with the transposed keys, softmax, matmul with the values), a gelu MLP, residual adds,
and a next-token cross_entropy over a vocabulary; the task is a fixed set of token sequences.
Every op of the opforge model is ``torch.ops.opforge.*``, so torch's autograd and optimizer train it.
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace
from typing import Any

import torch

import opforge.torch as ot

# The two implementations, with one calling convention (opforge's: layer_norm returns (y, mean, rstd)).
OPFORGE = SimpleNamespace(
    embedding=ot.ops.embedding, layer_norm=ot.ops.layer_norm, linear=ot.ops.linear, gelu=ot.ops.gelu,
    matmul=ot.ops.matmul, transpose=ot.ops.transpose, softmax=ot.ops.softmax, add=ot.ops.add, mul=ot.ops.mul,
    cross_entropy=ot.ops.cross_entropy)
BUILTIN = SimpleNamespace(
    embedding=lambda idx, w: torch.nn.functional.embedding(idx, w),
    layer_norm=lambda x, w, b: (torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5), None, None),
    linear=torch.nn.functional.linear, gelu=torch.nn.functional.gelu, matmul=torch.matmul,
    transpose=lambda x: x.transpose(-1, -2), softmax=lambda x: torch.softmax(x, -1), add=torch.add, mul=torch.mul,
    cross_entropy=torch.nn.functional.cross_entropy)


class Block(torch.nn.Module):
    """embedding -> x + attention(layer_norm(x)) -> x + mlp(layer_norm(x)) -> layer_norm -> logits."""

    def __init__(self, vocab: int, dim: int, hidden: int, impl: Any, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> None:
        super().__init__()
        self.impl = impl
        g = torch.Generator().manual_seed(seed)

        def param(*shape: int, scale: float = 0.0, fill: float = 0.0) -> torch.nn.Parameter:
            if scale:
                return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype) * scale)
            return torch.nn.Parameter(torch.full(shape, fill, dtype=dtype))

        self.embed = param(vocab, dim, scale=1.0)
        self.ln1_w, self.ln1_b = param(dim, fill=1.0), param(dim)
        self.qkv_w, self.qkv_b = param(3 * dim, dim, scale=dim ** -0.5), param(3 * dim)
        self.out_w, self.out_b = param(dim, dim, scale=dim ** -0.5), param(dim)
        self.ln2_w, self.ln2_b = param(dim, fill=1.0), param(dim)
        self.up_w, self.up_b = param(hidden, dim, scale=dim ** -0.5), param(hidden)
        self.down_w, self.down_b = param(dim, hidden, scale=hidden ** -0.5), param(dim)
        self.lnf_w, self.lnf_b = param(dim, fill=1.0), param(dim)
        self.head_w = param(vocab, dim, scale=dim ** -0.5)
        self.scale = torch.tensor(dim ** -0.5, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = self.impl
        x = f.embedding(tokens, self.embed)                                   # (B, T, D)
        h, _, _ = f.layer_norm(x, self.ln1_w, self.ln1_b)
        q, k, v = f.linear(h, self.qkv_w, self.qkv_b).chunk(3, dim=-1)
        scores = f.mul(f.matmul(q, f.transpose(k)), self.scale.to(x.device))  # (B, T, T)
        x = f.add(x, f.linear(f.matmul(f.softmax(scores), v), self.out_w, self.out_b))
        h, _, _ = f.layer_norm(x, self.ln2_w, self.ln2_b)
        x = f.add(x, f.linear(f.gelu(f.linear(h, self.up_w, self.up_b)), self.down_w, self.down_b))
        h, _, _ = f.layer_norm(x, self.lnf_w, self.lnf_b)
        return f.linear(h, self.head_w)                                       # (B, T, vocab)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self(tokens[:, :-1])
        return self.impl.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def sequences(batch: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Token sequences that count up from a random start by a random step (mod vocab): the next
    token follows from the previous two."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    step = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + step * torch.arange(length)) % vocab


def train(impl: Any, steps: int, device: str, dtype: torch.dtype = torch.float32, lr: float = 0.05,
          vocab: int = 32, dim: int = 32, hidden: int = 64, batch: int = 16, length: int = 17) -> list[float]:
    """Losses of `steps` SGD steps of a Block built from `impl` (same initial weights and data for
    every impl)."""
    torch.manual_seed(0)
    model = Block(vocab, dim, hidden, impl, dtype).to(device)
    tokens = sequences(batch, length, vocab).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = model.loss(tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda needs the cuda wheel and a GPU)")
    args = p.parse_args()
    mine = train(OPFORGE, args.steps, args.device)
    theirs = train(BUILTIN, args.steps, args.device)
    for step in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {step:4d}  loss opforge {mine[step]:.5f}  built-in {theirs[step]:.5f}")
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mine, theirs))
    print(f"largest relative difference of the loss curves: {worst:.2e}")
    ok = mine[-1] < 0.5 * mine[0] and worst < 1e-3 and all(math.isfinite(v) for v in mine)
    print("ok" if ok else "FAILED: the loss did not fall or the curves differ")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
