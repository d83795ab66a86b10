"""opforge ops under torch.export: exported programs keep them as ``torch.ops.opforge.*`` nodes,
run and train like the eager model, take symbolic batch sizes, survive a save and a load in
another process, and compile ahead of time with AOTInductor.

The model is examples/torch_mlp.py's MLP: opforge linear, layer_norm, gelu and cross_entropy.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

from torch_mlp import MLP, spirals  # noqa: E402

import opforge.torch as ot  # noqa: E402

MODEL_OPS = {"linear", "layer_norm", "gelu", "cross_entropy"}
# torch.export's own warnings, raised inside torch (pytest's settings make warnings errors)
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*:FutureWarning"),
]


class Loss(torch.nn.Module):
    """The MLP's mean cross-entropy: the exported program's one output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ot.ops.cross_entropy(self.model(x), labels)


def loss_module(seed: int = 0) -> Loss:
    return Loss(MLP(2, 16, 3, dtype=torch.float64, seed=seed))


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x, labels = spirals(n, classes=3, seed=seed)
    return x.to(torch.float64), labels


def called_ops(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function"}


def grads_of(module: torch.nn.Module, fn, *args):  # type: ignore[no-untyped-def]
    params = list(module.parameters())
    for p in params:
        p.grad = None
    loss = fn(*args)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in params]


def test_exported_program_keeps_the_ops_and_matches_eager() -> None:
    model = loss_module()
    x, labels = data(6)
    ep = torch.export.export(model, (x, labels))
    assert {f"opforge.{op}" for op in MODEL_OPS} <= called_ops(ep.graph_module), ep.graph_module.code
    # the ops are leaves of torch's decompositions (CompositeExplicitAutograd, no decomposition)
    assert {f"opforge.{op}" for op in MODEL_OPS} <= called_ops(ep.run_decompositions().graph_module)
    # the program's module trains: its loss and gradients are the eager model's
    unlifted = ep.module()
    want_loss, want_grads = grads_of(model, model, x, labels)
    loss, grads = grads_of(unlifted, unlifted, x, labels)
    torch.testing.assert_close(loss, want_loss)
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


def test_symbolic_batch_size() -> None:
    model = loss_module(seed=1)
    batch = torch.export.Dim("batch", min=2)
    x, labels = data(4)
    ep = torch.export.export(model, (x, labels), dynamic_shapes=({0: batch}, {0: batch}))
    for n in (2, 5, 11):  # one program for every batch size (3 * n rows)
        x, labels = data(n, seed=n)
        torch.testing.assert_close(ep.module()(x, labels), model(x, labels))


def test_shape_check_of_an_exported_call_names_the_op() -> None:
    class Linear(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return ot.ops.linear(x, w)

    message = r"\[linear\] x's last dimension 5 differs from weight's in_features 3"
    with pytest.raises(ValueError, match=message):  # (export's default, non-strict: the meta rule's error)
        torch.export.export(Linear(), (torch.randn(2, 5), torch.randn(4, 3)))
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=message):  # (dynamo reports it)
        torch.export.export(Linear(), (torch.randn(2, 5), torch.randn(4, 3)), strict=True)


SAVED_RUN = """
import sys
import torch
{imports}
ep = torch.export.load(sys.argv[1])
x, labels = torch.load(sys.argv[2])
print(repr(ep.module()(x, labels).item()))
"""


def test_saved_program_runs_in_another_process(tmp_path: Path) -> None:
    model = loss_module(seed=2)
    x, labels = data(5, seed=2)
    ep = torch.export.export(model, (x, labels))
    torch.export.save(ep, tmp_path / "mlp.pt2")
    torch.save((x, labels), tmp_path / "data.pt")
    want = model(x, labels).item()

    def run(imports: str) -> subprocess.CompletedProcess[str]:
        script = tmp_path / "run.py"
        script.write_text(textwrap.dedent(SAVED_RUN.format(imports=imports)))
        return subprocess.run([sys.executable, "-W", "ignore::FutureWarning", str(script), str(tmp_path / "mlp.pt2"),
                               str(tmp_path / "data.pt")], capture_output=True, text=True, timeout=300)

    r = run("import opforge.torch  # registers torch.ops.opforge.*")
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) == want  # the same kernels on the same numbers: bit for bit
    # without the import torch cannot resolve the ops, and says which (torch's own message)
    r = run("")
    assert r.returncode != 0 and "torch.ops.opforge." in r.stderr, r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's import
@pytest.mark.filterwarnings("ignore:`torch._prims_common.check` is deprecated:FutureWarning")  # inductor's lowering
def test_aoti_package_matches_eager_and_names_the_op_on_bad_input(tmp_path: Path) -> None:
    """AOTInductor compiles the exported program to a shared library; opforge ops in it run through
    torch's dispatcher (AOTInductor's proxy executor), their native kernels and checks included."""
    model = loss_module(seed=3)
    batch = torch.export.Dim("batch", min=2)
    x, labels = data(4)
    ep = torch.export.export(model, (x, labels), dynamic_shapes=({0: batch}, {0: batch}))
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "mlp.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    for n in (2, 5, 11):
        x, labels = data(n, seed=n)
        torch.testing.assert_close(runner(x, labels), model(x, labels), rtol=1e-12, atol=1e-12)
    labels[1] = 3  # 3 classes: out of range (AOTInductor reports every failure as a RuntimeError)
    with pytest.raises(RuntimeError, match=r"\[cross_entropy\] label 3 is out of range for 3 classes"):
        runner(x, labels)


def test_matmul_relates_its_inner_dims_as_torch_matmul_does() -> None:
    """matmul's shape rule checks the inner dims on the symbolic sizes: a constraint, so an export
    with independent dims for them is refused as torch.matmul's is (before, it exported and
    failed at run time at sizes that differ), and one shared dim exports."""

    class MatMul(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return ot.ops.matmul(a, b)

    a, b = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    inner_a, inner_b = torch.export.Dim("inner_a"), torch.export.Dim("inner_b")
    with pytest.raises(torch._dynamo.exc.UserError, match=r"must always be equal"):
        torch.export.export(MatMul(), (a, b), dynamic_shapes=({1: inner_a}, {0: inner_b}))
    inner = torch.export.Dim("inner")
    ep = torch.export.export(MatMul(), (a, b), dynamic_shapes=({1: inner}, {0: inner}))
    a, b = torch.randn(4, 9, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
    torch.testing.assert_close(ep.module()(a, b), a @ b)
