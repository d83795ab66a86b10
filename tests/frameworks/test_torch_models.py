"""opforge ops in PyTorch models: torch.compile without graph breaks, and DistributedDataParallel.

The model is examples/torch_mlp.py's MLP: opforge linear, layer_norm, gelu and cross_entropy.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

from torch_mlp import MLP, loss_fn, spirals  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL_OPS = {"linear", "layer_norm", "gelu", "cross_entropy"}


def loss_and_grads(model: torch.nn.Module, fn, x: torch.Tensor, labels: torch.Tensor):
    model.zero_grad()
    loss = fn(model, x, labels)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's import
def test_compile_fullgraph_matches_eager() -> None:
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)  # inductor, as torch.compile's default

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)  # a graph break raises
    model = MLP(2, 32, 3)
    for n in (48, 48, 30):  # the second call reuses the graph; the third has another batch size
        x, labels = spirals(n // 3, seed=n)
        eager_loss, eager_grads = loss_and_grads(model, loss_fn, x, labels)
        loss, grads = loss_and_grads(model, compiled, x, labels)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        for g, e in zip(grads, eager_grads):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert 1 <= len(graphs) <= 2
    called = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {f"opforge.{name}" for name in MODEL_OPS} <= called, called


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_distributed_data_parallel_matches_one_process(tmp_path: Path) -> None:
    steps, world = 4, 2
    out = tmp_path / "ddp.pt"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "ddp_worker.py"), str(rank), str(world), str(port),
                               str(steps), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)

    # one process, the whole batch: the mean loss over both shards (equal sizes)
    x, labels = spirals(32, dtype=torch.float64)
    model = MLP(2, 16, 3, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for _ in range(steps):
        loss = loss_fn(model, x, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ddp = torch.load(out)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ddp[name], value, rtol=1e-12, atol=1e-12)
        assert not torch.equal(value, initial[name]) or name == "norm_bias", name  # training moved it


def test_example_trains_with_a_falling_loss() -> None:
    r = subprocess.run([sys.executable, str(HERE.parent.parent / "examples" / "torch_mlp.py"), "--steps", "100"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[0] > 1.0 and losses[-1] < 0.5 * losses[0], r.stdout


def test_dynamic_batch_compiles_once() -> None:
    """Shape rules as data: the MLP (linear's and cross_entropy's shapes are spec expressions,
    evaluated on torch's symbolic sizes) compiles one graph for three batch sizes with
    dynamic=True, and gradients match eager."""
    torch.manual_seed(0)
    model = MLP(2, 16, 3, dtype=torch.float64)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # aot_eager-like: the traced graph itself

    compiled = torch.compile(lambda x, y: loss_fn(model, x, y), backend=backend, dynamic=True, fullgraph=True)
    for n in (5, 7, 12):
        x, labels = spirals(n, classes=3)
        x = x.to(torch.float64)
        torch.testing.assert_close(compiled(x, labels), loss_fn(model, x, labels))
    assert len(graphs) == 1


def test_mark_dynamic_batch_dim() -> None:
    torch.manual_seed(1)
    model = MLP(2, 8, 3, dtype=torch.float64)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda x, y: loss_fn(model, x, y), backend=backend, fullgraph=True)
    for n in (4, 6, 9):
        x, labels = spirals(n, classes=3)
        x = x.to(torch.float64)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(labels, 0)
        torch.testing.assert_close(compiled(x, labels), loss_fn(model, x, labels))
    assert len(graphs) == 1


@pytest.mark.parametrize("how", ["eager", "fake", "compile"])
def test_shape_checks_raise_the_same_message(how: str) -> None:
    import re

    import opforge.torch as ot
    from torch._subclasses.fake_tensor import FakeTensorMode

    message = re.escape("[linear] x's last dimension 5 differs from weight's in_features 3: x (2, 5), weight (4, 3)")

    def call(x, w):
        return ot.ops.linear(x, w)

    x, w = torch.randn(2, 5), torch.randn(4, 3)
    if how == "compile":  # (dynamo reports the ValueError its fake-tensor run raised)
        with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"got ValueError\(\"" + message):
            torch.compile(call, backend="eager", fullgraph=True, dynamic=True)(x, w)
        return
    with pytest.raises(ValueError, match=message):
        if how == "eager":
            call(x, w)
        else:
            with FakeTensorMode() as mode:
                call(mode.from_tensor(x), mode.from_tensor(w))


def test_transformer_block_matches_the_builtin_one() -> None:
    """examples/torch_transformer.py's block (embedding, layer_norm, linear, attention by matmul +
    softmax, gelu, cross_entropy) trained with opforge ops and with torch's built-ins: the same
    loss curve (float64 here; the GPU tests run it in float32 on CUDA)."""
    from torch_transformer import BUILTIN, OPFORGE, train

    mine = train(OPFORGE, 8, "cpu", dtype=torch.float64)
    theirs = train(BUILTIN, 8, "cpu", dtype=torch.float64)
    assert mine[-1] < mine[0]
    torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=1e-10, atol=0)


@pytest.mark.parametrize("how", ["mark_dynamic", "dynamic"])
def test_a_dynamic_batch_equal_to_a_broadcast_size_stays_dynamic(how: str) -> None:
    """mul of (B, 5) by (5,), both requiring grad: the gradient's reduction to (5,) compared shapes
    as tuples, asking B == 5 of the symbolic batch while AOTAutograd traced the backward, a guard
    that specialized B = 5 (mark_dynamic raised ConstraintViolationError; dynamic=True compiled
    B = 5 apart). torch.mul compiles one graph, and so does opforge's."""
    import opforge.torch as ot
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # (aot_eager: AOTAutograd traces the backward, as inductor's default does, without compiling)
    compiled = torch.compile(lambda a, b: ot.ops.mul(a, b).sum(), backend="aot_eager", fullgraph=True,
                             dynamic=True if how == "dynamic" else None)
    for n in ((5,) if how == "mark_dynamic" else (3, 5, 6)):
        a = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
        b = torch.randn(5, dtype=torch.float64, requires_grad=True)
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(a, 0)
        compiled(a, b).backward()
        torch.testing.assert_close(b.grad, a.detach().sum(0))
        torch.testing.assert_close(a.grad, b.detach().expand(n, 5))
    assert counters["stats"]["unique_graphs"] == 1
