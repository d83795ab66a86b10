"""Concurrency and memory: mixed op calls from 8 threads, concurrent backward, RSS growth.

The fast tests run a few hundred calls per thread; the slow ones are issue 12's figures
(8 threads x 10,000 calls; RSS growth under 1 MB over 1,000,000 calls and over 100,000
forward+backward steps): ``pytest tests/stress -m slow -s`` prints the measured growth.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import opforge
from opforge import ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))

import opfuzz  # noqa: E402
from cases import to_inputs  # noqa: E402

THREADS = 8


def prepared_calls(n: int) -> list[tuple]:
    """n valid calls (op function, inputs, attrs) from the op fuzzer's spec cases, all ops."""
    out, seed = [], 0
    while len(out) < n:
        rng = np.random.default_rng(seed)
        seed += 1
        name, data, attrs, case = opfuzz._valid(rng)
        out.append((getattr(ops, name), to_inputs(case.op, case.dtype, data), attrs))
    return out


def results(out) -> list[np.ndarray]:
    outs = out if isinstance(out, tuple) else (out,)
    return [o.astype("float64").numpy() if o.dtype == "bfloat16" else o.numpy() for o in outs]


def run_threads(work, n: int = THREADS) -> None:
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def mixed_calls_agree(calls_per_thread: int) -> None:
    calls = prepared_calls(300)
    expected = [results(fn(*args, **attrs)) for fn, args, attrs in calls]

    def work(i: int) -> None:
        for k in range(calls_per_thread):
            j = (k * 7 + i * 31) % len(calls)
            fn, args, attrs = calls[j]
            for got, want in zip(results(fn(*args, **attrs)), expected[j]):
                np.testing.assert_array_equal(got, want, err_msg=f"call {j}")

    run_threads(work)


def test_mixed_op_calls_from_8_threads_match_single_threaded() -> None:
    mixed_calls_agree(300)


@pytest.mark.slow
def test_8_threads_x_10000_mixed_op_calls_match_single_threaded() -> None:
    mixed_calls_agree(10_000)


def graph(x):
    return ops.sum(ops.mul(ops.exp(x), x))  # d/dx = exp(x) * (x + 1)


def concurrent_shared_backward(rounds: int) -> None:
    x = opforge.tensor(np.linspace(-1, 1, 64), requires_grad=True)
    y = graph(x)

    def work(i: int) -> None:
        for _ in range(rounds):
            y.backward(retain_graph=True)

    run_threads(work)
    want = np.exp(np.linspace(-1, 1, 64)) * (np.linspace(-1, 1, 64) + 1) * THREADS * rounds
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-9)  # summed in any order


def concurrent_separate_backward(rounds: int) -> None:
    leaves = [opforge.tensor(np.linspace(-1, 1, 64) + i, requires_grad=True) for i in range(THREADS)]

    def work(i: int) -> None:
        for _ in range(rounds):
            graph(leaves[i]).backward()

    run_threads(work)
    for i, x in enumerate(leaves):
        v = np.linspace(-1, 1, 64) + i
        np.testing.assert_allclose(x.grad.numpy(), np.exp(v) * (v + 1) * rounds, rtol=1e-9)


def test_concurrent_backward_on_one_shared_graph() -> None:
    concurrent_shared_backward(200)


def test_concurrent_backward_on_separate_graphs() -> None:
    concurrent_separate_backward(200)


@pytest.mark.slow
def test_concurrent_backward_long() -> None:
    concurrent_shared_backward(5000)
    concurrent_separate_backward(5000)


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def rss_growth_calls(n: int) -> int:
    calls = prepared_calls(300)
    for k in range(max(n // 10, 3000)):  # warm-up: allocator pools, caches, lazy imports
        fn, args, attrs = calls[k % len(calls)]
        fn(*args, **attrs)
    before = rss_kb()
    for k in range(n):
        fn, args, attrs = calls[k % len(calls)]
        fn(*args, **attrs)
    return rss_kb() - before


def rss_growth_steps(n: int) -> int:
    x = opforge.tensor(np.linspace(-1, 1, 32), requires_grad=True)
    w = opforge.tensor(np.ones(32), requires_grad=True)
    for _ in range(max(n // 10, 2000)):
        ops.sum(ops.mul(ops.tanh(ops.mul(x, w)), x)).backward()
        x.grad = None
        w.grad = None
    before = rss_kb()
    for _ in range(n):
        ops.sum(ops.mul(ops.tanh(ops.mul(x, w)), x)).backward()
        x.grad = None
        w.grad = None
    return rss_kb() - before


@pytest.mark.slow
def test_rss_growth_over_1000000_calls_under_1mb() -> None:
    growth = rss_growth_calls(1_000_000)
    print(f"RSS growth over 1,000,000 op calls: {growth} kB")
    assert growth < 1024


@pytest.mark.slow
def test_rss_growth_over_100000_forward_backward_steps_under_1mb() -> None:
    growth = rss_growth_steps(100_000)
    print(f"RSS growth over 100,000 forward+backward steps: {growth} kB")
    assert growth < 1024
