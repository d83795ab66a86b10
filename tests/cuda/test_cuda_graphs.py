"""Standalone CUDA graphs (opforge.cuda.CUDAGraph and graph, issue 15 item 3): ops and a whole
training step (forward, backward, SGD) captured and replayed with the eager results; the graph's
memory (blocks freed in the capture reused by it, none left after reset, every tensor the capture
read kept alive while the graph lives); and the errors. Skipped without a CUDA device (CI has none:
tests/runtime/test_device.py checks the error there; GPU runs are recorded in
benchmarks/results/cuda-tests.md)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

pytestmark = pytest.mark.skipif(not opforge.cuda.is_available(),
                                reason=f"no CUDA device: {opforge.cuda.unavailable_reason()}")


def cuda(x: np.ndarray, **kw: object) -> opforge.Tensor:
    return opforge.tensor(x, device="cuda", **kw)  # type: ignore[arg-type]


def rng_array(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def settle() -> None:
    gc.collect()
    opforge.cuda.synchronize()


def test_replays_compute_the_ops_on_the_inputs_current_contents() -> None:
    x = cuda(rng_array(0, 64, 130))
    ops.softmax(ops.mul(x, x))  # (warm-up)
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        y = ops.softmax(ops.add(ops.mul(x, x), x), axis=-1)
    for seed in (1, 2, 3):
        a = rng_array(seed, 64, 130)
        x.copy_(a)
        g.replay()
        eager = ops.softmax(ops.add(ops.mul(cuda(a), cuda(a)), cuda(a)), axis=-1)
        np.testing.assert_array_equal(y.cpu().numpy(), eager.cpu().numpy())


def mlp_params(seed: int) -> list[opforge.Tensor]:
    shapes = [(32, 2), (32,), (3, 32), (3,)]
    return [cuda(rng_array(seed + i, *s) * 0.5, requires_grad=True) for i, s in enumerate(shapes)]


def mlp_step(params: list[opforge.Tensor], opt: opforge.optim.Optimizer, x: opforge.Tensor,
             labels: opforge.Tensor) -> opforge.Tensor:
    w1, b1, w2, b2 = params
    loss = ops.cross_entropy(ops.linear(ops.gelu(ops.linear(x, w1, b1)), w2, b2), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def batches(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    r = np.random.default_rng(7)
    return [(r.standard_normal((128, 2)).astype(np.float32), r.integers(0, 3, 128)) for _ in range(n)]


def test_a_training_step_replays_as_eager_steps() -> None:
    data = batches(8)
    eager_params = mlp_params(10)
    eager_opt = opforge.optim.SGD(eager_params, lr=0.1, momentum=0.9)
    eager = [mlp_step(eager_params, eager_opt, cuda(x), cuda(t)).item() for x, t in data]

    params = mlp_params(10)
    opt = opforge.optim.SGD(params, lr=0.1, momentum=0.9)
    x, t = data[0]
    losses = [mlp_step(params, opt, cuda(x), cuda(t)).item()]  # (warm-up: the momentum buffers exist)
    static_x, static_t = cuda(data[1][0]), cuda(data[1][1])
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        static_loss = mlp_step(params, opt, static_x, static_t)
    for x, t in data[1:]:
        static_x.copy_(x)
        static_t.copy_(t)
        g.replay()
        losses.append(static_loss.item())
    np.testing.assert_allclose(losses, eager, rtol=1e-6, atol=1e-7)
    assert losses[-1] < losses[0]
    for mine, theirs in zip(params, eager_params):
        np.testing.assert_allclose(mine.detach().cpu().numpy(), theirs.detach().cpu().numpy(), rtol=1e-6, atol=1e-7)


def test_a_tensor_made_before_the_capture_may_be_freed_inside_it() -> None:
    # (its block belongs to the eager stream: freeing it there while the thread captures would be
    # an unsafe call, invalidating the capture; zero_grad() does this in a captured training step)
    settle()
    before = opforge.cuda.memory_allocated()
    x = cuda(rng_array(0, 64, 130))
    eager = [ops.mul(x, x) for _ in range(3)]
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        del eager[:]
        gc.collect()
        y = ops.add(x, x)
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), 2 * x.cpu().numpy())
    del g, y, x
    settle()
    assert opforge.cuda.memory_allocated() == before


def test_blocks_freed_in_the_capture_are_reused_and_none_outlive_the_graph() -> None:
    settle()
    before_bytes, before_graphs = opforge.cuda.memory_allocated(), opforge.cuda.graph_memory()
    x = cuda(rng_array(0, 256, 1024))  # 1 MiB
    nbytes = 256 * 1024 * 4
    one, two, three = (cuda(np.float32(v)) for v in (1, 2, 3))
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        # x * 2 is freed once (x * 2) + 1 exists: the third result takes its block
        y = ops.mul(ops.add(ops.mul(x, two), one), three)
    assert opforge.cuda.graph_memory() - before_graphs == 2 * nbytes
    g.replay()
    np.testing.assert_allclose(y.cpu().numpy(), (x.cpu().numpy() * 2 + 1) * 3, rtol=1e-6)
    g.reset()  # y still holds its block
    settle()
    assert opforge.cuda.graph_memory() - before_graphs == nbytes
    del y
    settle()
    assert opforge.cuda.graph_memory() == before_graphs
    del x, one, two, three
    settle()
    assert opforge.cuda.memory_allocated() == before_bytes


def test_the_graph_keeps_the_tensors_its_capture_read() -> None:
    a = rng_array(3, 512, 512)
    x = cuda(a)
    ops.mul(x, x)
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        y = ops.mul(x, x)
    del x  # the graph still reads it: its memory must not go to the next tensor
    settle()
    others = [cuda(np.full((512, 512), 100.0, np.float32)) for _ in range(4)]
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), a * a)
    del others


def test_the_graph_keeps_the_tensors_its_capture_wrote_through_out() -> None:
    x = cuda(rng_array(8, 512, 512))
    out = cuda(np.zeros((512, 512), np.float32))
    ops.mul(x, x, out=out)
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        ops.mul(x, x, out=out)
        out2 = ops.add(out, out)
    del out  # the replays still write it: its memory must not go to the next tensor
    settle()
    others = [cuda(np.full((512, 512), 100.0, np.float32)) for _ in range(4)]
    g.replay()
    a = x.cpu().numpy()
    np.testing.assert_array_equal(out2.cpu().numpy(), 2 * (a * a))
    for o in others:
        np.testing.assert_array_equal(o.cpu().numpy(), np.full((512, 512), 100.0, np.float32))


def test_copy_of_a_scalar_fills_on_the_device_inside_a_capture() -> None:
    x = cuda(rng_array(9, 1000))
    acc = cuda(np.zeros(1000, np.float32))
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        acc.copy_(1.5)
        ops.add(acc, x, out=acc)
    x.copy_(np.arange(1000, dtype=np.float32))
    g.replay()
    g.replay()  # (the fill is part of the graph: no accumulation across replays)
    np.testing.assert_array_equal(acc.cpu().numpy(), np.arange(1000, dtype=np.float32) + 1.5)


def test_a_tensor_of_the_capture_stream_freed_in_the_capture_is_kept_for_the_graph() -> None:
    # torch's warm-up pattern: warm up on the side stream, then capture there, rebinding the result
    s = opforge.cuda.Stream()
    x = cuda(rng_array(4, 1000))
    with s:
        y = ops.mul(x, x)
    s.synchronize()
    settle()
    before = opforge.cuda.memory_allocated()
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g, stream=s):
        y = ops.mul(x, x)  # frees the warm-up's y on the capture's stream
    for _ in range(3):
        g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy() ** 2)
    g.reset()
    del y
    settle()
    assert opforge.cuda.memory_allocated() == before - 4000


def test_streams_fork_and_join_in_a_capture_and_blocks_they_share_are_not_reused() -> None:
    # a is the capture stream's block, read by the side stream's captured add: freed on the
    # capture's stream, it must not go to c, whose kernel nothing orders after that add in the
    # graph (each replay would race); so c takes a block of its own
    settle()
    before = opforge.cuda.graph_memory()
    x = cuda(rng_array(13, 256, 1024))  # 1 MiB
    nbytes = 256 * 1024 * 4
    ops.add(ops.mul(x, x), x)  # (warm-up)
    side, g = opforge.cuda.Stream(), opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        main = opforge.cuda.current_stream()
        a = ops.mul(x, x)
        side.wait_stream(main)  # fork
        with side:
            b = ops.add(a, x)
        main.wait_stream(side)  # join
        del a
        c = ops.mul(x, x)
    assert opforge.cuda.graph_memory() - before == 3 * nbytes
    for seed in (14, 15):
        new = rng_array(seed, 256, 1024)
        x.copy_(new)
        g.replay()
        opforge.cuda.synchronize()
        np.testing.assert_array_equal(b.cpu().numpy(), new * new + new)
        np.testing.assert_array_equal(c.cpu().numpy(), new * new)
    g.reset()
    del b, c
    settle()
    assert opforge.cuda.graph_memory() == before


def test_other_threads_allocate_and_run_during_a_capture() -> None:
    x = cuda(rng_array(5, 4096))
    ops.mul(x, x)
    results: list[np.ndarray] = []

    def worker() -> None:
        z = cuda(np.arange(4096, dtype=np.float32))
        results.append(ops.add(z, z).cpu().numpy())

    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):
        y = ops.mul(x, x)
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    g.replay()
    np.testing.assert_array_equal(results[0], 2 * np.arange(4096, dtype=np.float32))
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy() ** 2)


def test_capture_errors_name_what_to_do() -> None:
    x = cuda(rng_array(6, 100))
    g = opforge.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"\[replay\] the graph holds no capture"):
        g.replay()
    with pytest.raises(RuntimeError, match=r"\[capture_begin\] cannot capture the legacy default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match=r"capture|operation not permitted"):  # (a copy to the host waits)
        with opforge.cuda.graph(g):
            ops.mul(x, x).cpu()
    settle()
    with opforge.cuda.graph(g):  # and the graph captures again
        y = ops.mul(x, x)
    with pytest.raises(RuntimeError, match=r"reset\(\) it before capturing again"):
        with opforge.cuda.graph(g):
            pass
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy() ** 2)
    g.reset()
    with opforge.cuda.graph(g):  # after reset() too
        ops.add(x, x)
    g.replay()
    inner, side = opforge.cuda.CUDAGraph(), opforge.cuda.Stream()
    with opforge.cuda.graph(opforge.cuda.CUDAGraph()):
        with side:
            with pytest.raises(RuntimeError, match=r"this thread is capturing another graph"):
                inner.capture_begin()
    g.reset()
    with pytest.raises(RuntimeError, match=r"\[capture_end\] the graph is not capturing"):
        with opforge.cuda.graph(g):  # a reset() in the block discards the capture
            ops.mul(x, x)
            g.reset()
    with pytest.raises(KeyError, match="mine"):  # (and an exception of the block is the one raised)
        with opforge.cuda.graph(g):
            g.reset()
            raise KeyError("mine")
    with pytest.raises(RuntimeError, match=r"\[replay\] the graph holds no capture"):
        g.replay()


def test_reset_from_another_thread_during_a_capture_is_refused() -> None:
    x = cuda(rng_array(10, 100))
    g = opforge.cuda.CUDAGraph()
    errors: list[BaseException] = []

    def reset() -> None:
        try:
            g.reset()
        except RuntimeError as e:
            errors.append(e)

    try:
        with opforge.cuda.graph(g):
            ops.mul(x, x)
            t = threading.Thread(target=reset)
            t.start()
            t.join()
    except RuntimeError as e:  # (if CUDA invalidates a capture that another thread tried to end)
        assert "the capture failed" in str(e)
    assert len(errors) == 1 and "a capture ends on the thread that began it" in str(errors[0])
    g.reset()  # and nothing is left wedged: the graph captures and replays again
    with opforge.cuda.graph(g):
        y = ops.mul(x, x)
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy() ** 2)


def test_a_small_result_does_not_take_a_freed_gemm_workspace() -> None:
    # each matmul's cuBLAS workspace (32 MiB on Hopper, 8 MiB before) is a block freed inside the
    # capture; a 16 KB result must not take it, or every later matmul allocates a workspace again
    a, b = cuda(rng_array(11, 64, 64)), cuda(rng_array(12, 64, 64))
    ops.matmul(a, b)  # (cuBLAS's handle made before the capture)
    settle()

    def captured(n: int) -> tuple[opforge.cuda.CUDAGraph, int, list[opforge.Tensor]]:
        before = opforge.cuda.graph_memory()
        g, outs = opforge.cuda.CUDAGraph(), []
        with opforge.cuda.graph(g):
            for _ in range(n):
                outs.append(ops.mul(ops.matmul(a, b), a))
        return g, opforge.cuda.graph_memory() - before, outs

    g1, one, _ = captured(1)
    g4, four, outs = captured(4)
    assert four - one < 2 * 2**20, (one, four)  # three more matmuls: a few 16 KB results, no workspace
    g4.replay()
    expect = (a.cpu().numpy() @ b.cpu().numpy()) * a.cpu().numpy()
    for o in outs:
        np.testing.assert_allclose(o.cpu().numpy(), expect, rtol=1e-5, atol=1e-5)
    g1.reset()
    g4.reset()


def test_ops_through_torch_inside_an_opforge_capture_raise() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import opforge.torch as ot

    t = torch.ones(8, device="cuda")
    ot.ops.mul(t, t)  # (loaded before the capture)
    g = opforge.cuda.CUDAGraph()
    # torch's current stream is not the capture's: the call would run at once, outside the graph
    with pytest.raises(RuntimeError, match=r"\[mul\] this thread is capturing an opforge graph.*torch\.cuda\.graph"):
        with opforge.cuda.graph(g):
            ot.ops.mul(t, t)
    settle()
    np.testing.assert_array_equal(ot.ops.mul(t, t).cpu().numpy(), np.ones(8, np.float32))  # and outside it runs
