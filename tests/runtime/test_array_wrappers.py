"""NumPy arrays passed to ops are wrapped without copies, and the wrappers are recycled per thread
(src/python/python.cpp, from_ndarray): a recycled wrapper must never keep an array alive, nor carry
over anything of the array it wrapped before (shape, strides, dtype, read-only flag, history)."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import opforge
from opforge import ops


def test_the_pool_keeps_no_array_alive() -> None:
    a = np.arange(1000, dtype=np.float32)
    ref = weakref.ref(a)
    ops.mul(a, a)
    del a
    gc.collect()
    assert ref() is None


def test_a_recycled_wrapper_takes_the_next_arrays_shape_strides_and_dtype() -> None:
    rng = np.random.default_rng(0)
    arrays = [np.float32(3.0) * np.ones(1, np.float32),
              rng.standard_normal((4, 5, 6)),                    # float64, 3-d
              rng.standard_normal((6, 8)).astype(np.float32)[::2, ::-3],  # strided, negative stride
              np.arange(12, dtype=np.int64).reshape(3, 4).T,     # transposed int64
              np.array(2.5),                                     # 0-d
              np.zeros((0, 3), np.float32)]                      # empty
    for _ in range(3):  # (later rounds run on recycled wrappers)
        for x in arrays:
            np.testing.assert_array_equal(ops.mul(x, x).numpy(), x * x)
            np.testing.assert_array_equal(ops.add(x, 1).numpy(), x + np.asarray(1, x.dtype))


def test_results_sharing_an_arrays_memory_keep_it_and_the_wrapper_is_not_reused() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = ops.transpose(x)  # (may be a view on x's memory)
    for _ in range(20):
        ops.mul(np.ones(7, np.float32), np.ones(7, np.float32))
    np.testing.assert_array_equal(t.numpy(), x.T)


def test_read_only_is_per_array() -> None:
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    out = opforge.tensor(np.zeros(3, np.float32))
    ops.mul(ro, ro, out=out)  # (a read-only input is fine)
    np.testing.assert_array_equal(out.numpy(), np.ones(3))
    rw = np.full(3, 2.0, np.float32)
    np.testing.assert_array_equal(ops.mul(rw, rw).numpy(), [4.0, 4.0, 4.0])
    with pytest.raises(ValueError, match="read-only"):
        ops.mul_(opforge.from_numpy(ro), 2.0)


def test_an_array_saved_for_backward_is_not_recycled_under_it() -> None:
    w = opforge.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    a = np.array([4.0, 5.0, 6.0], np.float32)
    y = ops.mul(w, a)  # (a's wrapper is saved for w's gradient)
    for _ in range(20):
        ops.mul(np.zeros(3, np.float32), np.zeros(3, np.float32))
    y.backward(opforge.tensor(np.ones(3, np.float32)))
    np.testing.assert_array_equal(w.grad.numpy(), a)


def test_threads_each_recycle_their_own() -> None:
    errors: list[str] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(500):
            x = rng.standard_normal(int(rng.integers(1, 50))).astype(np.float32)
            if not np.array_equal(ops.mul(x, x).numpy(), x * x):
                errors.append(f"thread {k}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
