"""Index and label values written by another thread while a kernel runs (issue 12, defect 4):
every call either raises IndexError naming the op or returns exactly the result of the only valid
index values the array ever held (all zeros). A kernel that read an index twice (once to check,
once to use) could return rows of another index, garbage, or crash."""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

import numpy as np

from opforge import ops


def _race(op: str, call: Callable[[], np.ndarray], expected: np.ndarray, flipped: np.ndarray, bad: int,
          seconds: float = 1.0) -> None:
    """Runs call() in 3 threads while another thread flips flipped[0] between 0 and `bad`."""
    stop = threading.Event()
    problems: list[str] = []
    message = re.compile(re.escape(f"[{op}] "))

    def writer() -> None:
        while not stop.is_set():
            flipped[0] = bad
            flipped[0] = 0

    def caller() -> None:
        while not stop.is_set():
            try:
                got = call()
            except IndexError as exc:
                if not message.match(str(exc)):
                    problems.append(f"IndexError not naming {op}: {exc}")
                continue
            except BaseException as exc:  # noqa: BLE001 - reported below
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if not np.array_equal(got, expected):
                problems.append(f"a result of no valid index: {got!r}")

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    assert not problems, problems[:3]
    flipped[0] = 0
    np.testing.assert_array_equal(call(), expected)


def test_embedding_results_use_only_valid_indices() -> None:
    weight = np.arange(12.0).reshape(4, 3)
    idx = np.zeros(50_000, np.int64)
    _race("embedding", lambda: ops.embedding(idx, weight).numpy(), np.tile(weight[0], (idx.size, 1)), idx, 1 << 40)


def test_embedding_backward_results_use_only_valid_indices() -> None:
    weight = np.zeros((4, 3))
    idx = np.zeros(50_000, np.int64)
    dout = np.ones((idx.size, 3))
    expected = np.zeros((4, 3))
    expected[0] = idx.size
    _race("embedding_backward", lambda: ops.embedding_backward(dout, idx, weight).numpy(), expected, idx, 1 << 40)


def test_take_along_axis_results_use_only_valid_indices() -> None:
    x = np.arange(4 * 50_000, dtype=np.float64).reshape(4, 50_000)
    idx = np.zeros((1, 50_000), np.int64)
    _race("take_along_axis", lambda: ops.take_along_axis(x, idx, axis=0).numpy(), x[:1], idx.reshape(-1), 1 << 40)


def test_scatter_add_along_axis_results_use_only_valid_indices() -> None:
    x = np.zeros((4, 50_000))
    idx = np.zeros((1, 50_000), np.int64)
    src = np.ones((1, 50_000))
    expected = x.copy()
    expected[0] = 1.0
    _race("scatter_add_along_axis", lambda: ops.scatter_add_along_axis(src, idx, x, axis=0).numpy(), expected,
          idx.reshape(-1), -(1 << 40))


def test_cross_entropy_and_its_backward_use_only_valid_labels() -> None:
    logits = np.tile(np.array([0.0, 1.0, 2.0]), (50_000, 1))
    labels = np.zeros(50_000, np.int64)
    # the loss and gradient when every label is 0 (the only valid value the array ever holds)
    loss = ops.cross_entropy(logits, labels, reduction="none").numpy()
    lse = np.log(np.exp(logits[0]).sum())
    np.testing.assert_allclose(loss, np.full(labels.size, lse - 0.0))
    grad = ops.cross_entropy_backward(np.ones(labels.size), logits, labels, reduction="none").numpy()
    # the last label flips: it is checked last and used last, after the whole loss loop
    last = labels[::-1]
    _race("cross_entropy", lambda: ops.cross_entropy(logits, labels, reduction="none").numpy(), loss, last, 1 << 40)
    _race("cross_entropy_backward",
          lambda: ops.cross_entropy_backward(np.ones(labels.size), logits, labels, reduction="none").numpy(), grad,
          last, 1 << 40)
