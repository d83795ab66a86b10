"""opforge ops in PyTorch models on CUDA (issue 15, items 3 and 4): examples/torch_mlp.py's MLP
and examples/torch_transformer.py's block trained on the GPU against the same models built from
torch's built-ins, and a whole training step (forward, backward, optimizer) captured in a CUDA
graph and replayed. Skipped without a CUDA device for opforge and torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import opforge.cuda  # noqa: E402

pytestmark = pytest.mark.skipif(not (opforge.cuda.is_available() and torch.cuda.is_available()),
                                reason="no CUDA device for opforge and torch: "
                                       f"{opforge.cuda.unavailable_reason() or 'torch has no CUDA'}")

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

from torch_mlp import MLP, loss_fn, spirals  # noqa: E402
from torch_transformer import BUILTIN, OPFORGE, train  # noqa: E402

F = torch.nn.functional


def builtin_loss(model: MLP, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The MLP's forward from torch's built-ins, on the same parameters."""
    h = F.linear(x, model.w1, model.b1)
    h = F.gelu(F.layer_norm(h, h.shape[-1:], model.norm_weight, model.norm_bias, 1e-5))
    return F.cross_entropy(F.linear(h, model.w2, model.b2), labels)


def adam_losses(fn, steps: int = 40) -> list[float]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    x, labels = spirals(200)
    x, labels = x.cuda(), labels.cuda()
    model = MLP(2, 64, 3).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        loss = fn(model, x, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_mlp_on_cuda_matches_the_builtin_model() -> None:
    mine, theirs = adam_losses(loss_fn), adam_losses(builtin_loss)
    assert mine[-1] < 0.7 * mine[0]
    torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=1e-4, atol=1e-5)


def test_mlp_example_trains_on_cuda() -> None:
    r = subprocess.run([sys.executable, str(EXAMPLES / "torch_mlp.py"), "--steps", "100", "--device", "cuda"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], r.stdout


def test_transformer_block_on_cuda_matches_the_builtin_one() -> None:
    mine = train(OPFORGE, 40, "cuda")
    theirs = train(BUILTIN, 40, "cuda")
    assert mine[-1] < 0.7 * mine[0]
    torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=1e-3, atol=1e-4)


def test_training_step_replays_in_a_cuda_graph() -> None:
    """Forward, backward and SGD step of the MLP captured by torch.cuda.graph: results in torch's
    graph pool (the device kernels' out=), opforge's temporaries as graph allocation nodes, no host
    synchronization during capture (label checks are skipped while capturing). Replays match eager
    steps of a twin model."""
    torch.manual_seed(0)
    x, labels = spirals(100)
    x, labels = x.cuda(), labels.cuda()
    models = [MLP(2, 32, 3).cuda() for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]

    def step(k: int) -> torch.Tensor:
        loss = loss_fn(models[k], x, labels)
        loss.backward()
        opts[k].step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's recipe asks
        for _ in range(3):
            opts[0].zero_grad(set_to_none=False)
            step(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opts[0].zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_loss = step(0)
    replayed = []
    for _ in range(5):
        opts[0].zero_grad(set_to_none=False)
        graph.replay()
        replayed.append(static_loss.item())
    eager = []
    for i in range(3 + 5):  # capture records the step without running it: replay k is eager step 3 + k
        opts[1].zero_grad(set_to_none=False)
        loss = step(1)
        if i >= 3:
            eager.append(loss.item())
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-5, atol=1e-6)
    assert replayed[-1] < replayed[0]
