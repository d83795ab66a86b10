"""Concurrent backward: 8 threads over one shared graph (retain_graph, first-come release,
create_graph) and over separate graphs, checked against a NumPy reference; in-place ops changing a
tensor's history while other threads record ops that read it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from typing import Any, Callable

import numpy as np

import opforge
from opforge import ops

THREADS = 8
DEPTH = 6  # tanh(h * w) layers: a chain of 2 * DEPTH + 2 nodes, each saving tensors
SECOND_TIME = ("[sum] trying to backward through the graph a second time (or to read saved tensors after they "
               "were freed); pass retain_graph=True to the first backward")


def model(x: Any, w: Any) -> Any:
    h = x
    for _ in range(DEPTH):
        h = ops.tanh(ops.mul(h, w))
    return ops.sum(ops.mul(h, h))


def reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d/dx and d/dw of model(x, w), by hand."""
    hs = [x]
    for _ in range(DEPTH):
        hs.append(np.tanh(hs[-1] * w))
    g, gw = 2 * hs[-1], np.zeros_like(w)
    for k in range(DEPTH, 0, -1):
        ga = g * (1 - hs[k] ** 2)
        gw += ga * hs[k - 1]
        g = ga * w
    return g, gw


def leaves(seed: int) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xv, wv = rng.normal(size=64), rng.normal(size=64)
    return (opforge.tensor(xv, requires_grad=True), opforge.tensor(wv, requires_grad=True), xv, wv)


def in_threads(work: Callable[[int], Any]) -> list[Any]:
    """Runs work(i) for i < THREADS at once; returns each result or the exception it raised."""
    start = threading.Barrier(THREADS)
    results: list[Any] = [None] * THREADS

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except Exception as e:  # noqa: BLE001  (collected and checked by the caller)
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_backward_with_retain_graph_from_8_threads_on_one_graph() -> None:
    for rnd in range(60):
        x, w, xv, wv = leaves(rnd)
        loss = model(x, w)
        assert in_threads(lambda i: loss.backward(retain_graph=True)) == [None] * THREADS
        gx, gw = reference(xv, wv)
        np.testing.assert_allclose(x.grad.numpy(), THREADS * gx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), THREADS * gw, rtol=1e-12, atol=1e-12)


def test_backward_without_retain_graph_from_8_threads_on_one_graph() -> None:
    # the first thread through the root frees the graph as it goes; the others get a clean error
    for rnd in range(120):
        x, w, xv, wv = leaves(rnd)
        loss = model(x, w)
        results = in_threads(lambda i: loss.backward())
        errors = [r for r in results if r is not None]
        assert len(errors) == THREADS - 1, results
        for e in errors:
            assert isinstance(e, RuntimeError) and str(e) == SECOND_TIME, repr(e)
        gx, gw = reference(xv, wv)
        np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), gw, rtol=1e-12, atol=1e-12)


def test_gradients_with_create_graph_from_8_threads_on_one_graph() -> None:
    x, w, xv, wv = leaves(7)
    loss = model(x, w)
    (want_gg,) = opforge.gradients(ops.sum(opforge.gradients(loss, x, create_graph=True)[0]), x, retain_graph=True)

    def work(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        gx, gw = opforge.gradients(loss, [x, w], create_graph=True)
        assert gx.requires_grad and gw.requires_grad
        (gg,) = opforge.gradients(ops.sum(gx), x, retain_graph=True)  # through the shared graph again
        return gx.numpy(), gw.numpy(), gg.numpy()

    for _ in range(10):
        results = in_threads(work)
        rx, rw = reference(xv, wv)
        for r in results:
            assert isinstance(r, tuple), repr(r)
            np.testing.assert_allclose(r[0], rx, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(r[1], rw, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(r[2], want_gg.numpy())
    assert x.grad is None and w.grad is None


def test_backward_from_8_threads_on_separate_graphs_over_shared_leaves() -> None:
    x, w, xv, wv = leaves(3)

    def work(i: int) -> None:
        for _ in range(20):
            model(x, w).backward()

    assert in_threads(work) == [None] * THREADS
    gx, gw = reference(xv, wv)
    np.testing.assert_allclose(x.grad.numpy(), THREADS * 20 * gx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(w.grad.numpy(), THREADS * 20 * gw, rtol=1e-10, atol=1e-10)


def test_second_backward_error_reads_as_before() -> None:
    x, w, _, _ = leaves(0)
    loss = model(x, w)
    loss.backward()
    with np.testing.assert_raises_regex(RuntimeError, re.escape(SECOND_TIME)):
        loss.backward()


READ_GRAD_WHILE_ACCUMULATING = """
import threading
import numpy as np
import opforge
from opforge import ops

x = opforge.tensor(np.ones(1 << 20), requires_grad=True)
done = threading.Event()

def read() -> None:
    while not done.is_set():
        x.grad  # holds the GIL while it takes x's grad lock

reader = threading.Thread(target=read)
reader.start()
for _ in range(20):
    x.grad = np.zeros(1 << 20)  # NumPy's memory: freeing it takes the GIL
    ops.sum(x).backward()      # runs without the GIL, replaces .grad under x's grad lock
done.set()
reader.join()
assert float(x.grad.numpy()[0]) == 1.0
print("no deadlock")
"""


def test_accumulating_into_a_grad_held_by_numpy_while_another_thread_reads_it() -> None:
    # the old .grad (a NumPy array's memory) was freed under the grad lock; freeing took the GIL,
    # which the reading thread held while it waited for that lock: a deadlock
    r = subprocess.run([sys.executable, "-c", READ_GRAD_WHILE_ACCUMULATING], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "no deadlock" in r.stdout, r.stdout + r.stderr


def test_in_place_ops_give_a_tensor_new_history_while_other_threads_record_ops_on_it() -> None:
    # the in-place op sets x's history (its grad_fn and output number) with the GIL held, while the
    # readers' ops, large enough to run without it, read that history to record their own nodes:
    # the pair was read and written unlocked (ThreadSanitizer: a data race on a shared_ptr, so a
    # torn read could take one node's pointer with another's reference count). Every reader's
    # backward must still reach a, through whatever history x had when it was read.
    n = 1 << 15  # (ops on more elements than python.h's kReleaseGilElements release the GIL)
    a = opforge.tensor(np.ones(n, np.float32), requires_grad=True)
    x = ops.mul(a, 2.0)
    done = threading.Event()
    start = threading.Barrier(3)
    calls = [0] * 3

    def work(i: int) -> None:
        start.wait()
        if i == 0:
            try:
                for _ in range(1000):
                    ops.add_(x, 1.0)  # (x's old history goes to a copy that the new node takes)
            finally:
                done.set()
            return
        while not done.is_set():
            # d/da = 3 * 2 through any length of history (retained: the readers share its nodes)
            ops.sum(ops.mul(x, 3.0)).backward(retain_graph=True)
            calls[i] += 1

    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errors.append(e)
            done.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(calls) > 0
    np.testing.assert_array_equal(x.numpy(), np.full(n, 1002.0, np.float32))
    np.testing.assert_array_equal(a.grad.numpy(), np.full(n, 6.0 * sum(calls), np.float32))


OWN_VALUE_AS_GRADIENT = """
import warnings, numpy as np, opforge
x = opforge.tensor(np.arange(3.0), requires_grad=True)
x.grad = opforge.tensor(np.ones(3))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x.backward(x, create_graph=True)
assert any("reference cycle" in str(w.message) for w in caught), caught
np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
assert x.grad.grad_fn is not None  # (the sum was recorded: create_graph)
x.grad = None
print("no deadlock")
"""


def test_backward_into_a_tensor_with_its_own_value_as_the_gradient() -> None:
    # backward(x) of x itself with create_graph: accumulating into x.grad holds x's grad lock while
    # the sum records an op whose input is x, reading x's accumulator; that took the same lock (a
    # deadlock, hence the subprocess)
    r = subprocess.run([sys.executable, "-c", OWN_VALUE_AS_GRADIENT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "no deadlock" in r.stdout, r.stdout + r.stderr
