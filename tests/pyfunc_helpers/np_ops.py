"""NumPy kernels of the tests' pyfunc ops, and functions that break the pyfunc contract on purpose."""

from __future__ import annotations

from typing import Any

import numpy as np

CALLS: list[dict[str, Any]] = []  # what the last calls received (inputs' flags, attrs)


def softplus(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    CALLS.append({"writeable": x.flags.writeable, "beta": beta, "type": type(beta)})
    return (np.log1p(np.exp(beta * x.astype(np.float64))) / beta).astype(x.dtype)


def wrong_dtype(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    return x.astype(np.float64) if x.dtype != np.float64 else x.astype(np.float32)


def wrong_shape(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    return x.reshape(-1)[:1].copy()


def raises(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    raise ZeroDivisionError("beta is too small")


def not_an_array(x: np.ndarray, beta: float = 1.0) -> float:
    return 1.0


def keeps(x: np.ndarray, beta: float = 1.0) -> np.ndarray:
    KEPT.append(x)  # a view kept past the call: the array holds the memory
    return x.copy()


KEPT: list[np.ndarray] = []


def split(x: np.ndarray, y: np.ndarray, axis: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return x + y, (x * y).sum(axis=tuple(axis), keepdims=True)
