"""Elementwise kernels on every input layout: the general path (broadcast and strided inputs).

Its dims are coalesced, and rows of 32 elements or more run through the same vector loop as
contiguous inputs (strided inputs gathered into spans, 16 rows at a time; stride-0 inputs read as
scalars), so a result is the contiguous call's bit for bit, whatever the layout, the row length
(below one span, several spans, a partial last span) or the number of rows (a partial last group).
"""

from __future__ import annotations

import numpy as np
import pytest

import opforge
from opforge import ops


def layouts(shape: tuple[int, ...], rng: np.random.Generator, dtype: str):  # type: ignore[no-untyped-def]
    """(name, view) pairs: views of shape ``shape`` over memory laid out in other ways."""
    def data(s):  # type: ignore[no-untyped-def]
        return rng.standard_normal(s).astype(dtype) if dtype.startswith("float") else rng.integers(-50, 50, s).astype(dtype)

    nd = len(shape)
    yield "contiguous", data(shape)
    yield "transposed", data(shape[::-1]).transpose()
    if nd == 3:
        yield "permuted", data((shape[1], shape[2], shape[0])).transpose(2, 0, 1)
    yield "sliced", data(tuple(2 * n for n in shape))[(slice(None, None, 2),) * nd]
    yield "reversed", data(shape)[..., ::-1]
    yield "row broadcast", np.broadcast_to(data(shape[-1:]), shape)
    yield "column broadcast", np.broadcast_to(data(shape[:-1] + (1,)), shape)
    if nd == 3:
        yield "middle broadcast", np.broadcast_to(data((shape[0], 1, shape[2])), shape)


SHAPES = [(37, 45), (16, 256), (5, 600), (3, 33, 40), (17, 2, 31), (4, 8, 300)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_binary_ops_on_every_pair_of_layouts_match_the_contiguous_call(shape: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(sum(shape))
    xs = list(layouts(shape, rng, dtype))
    ys = list(layouts(shape, rng, dtype))
    for op, ref in ((ops.add, np.add), (ops.mul, np.multiply), (ops.maximum, np.maximum)):
        for xname, x in xs:
            for yname, y in ys:
                got = op(x, y).numpy()
                want = op(np.ascontiguousarray(x), np.ascontiguousarray(y)).numpy()
                np.testing.assert_array_equal(got, want, err_msg=f"{op.__name__} {xname} x {yname}")
                np.testing.assert_allclose(got, ref(x, y), rtol=1e-6, err_msg=f"{op.__name__} {xname} x {yname}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_vector_math_on_every_layout_matches_the_contiguous_call(shape: tuple[int, ...], dtype: str) -> None:
    # (libmvec's vector functions may round otherwise than libm's scalar ones: strided inputs go
    # through the vector loop too, so exp of a transposed view is exp of its copy, bit for bit)
    rng = np.random.default_rng(len(shape))
    for name, x in layouts(shape, rng, dtype):
        for op in (ops.exp, ops.tanh, ops.gelu, ops.sigmoid):
            got, want = op(x).numpy(), op(np.ascontiguousarray(x)).numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{op.__name__} {name}")


def test_three_inputs_with_a_condition_broadcast_over_the_middle() -> None:
    rng = np.random.default_rng(3)
    cond = np.broadcast_to(rng.random((6, 1, 70)) > 0.5, (6, 9, 70))
    x = rng.standard_normal((70, 9, 6)).transpose()
    y = rng.standard_normal((6, 9, 140))[:, :, ::2]
    np.testing.assert_array_equal(ops.where(cond, x, y).numpy(), np.where(cond, x, y))


@pytest.mark.parametrize("n", [1, 31, 32, 257, 4099])
def test_outer_products_and_columns(n: int) -> None:
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, 1)), rng.standard_normal((1, 40))
    np.testing.assert_array_equal(ops.mul(a, b).numpy(), a * b)
    m = rng.standard_normal((40, n))
    np.testing.assert_array_equal(ops.add(m.T, b).numpy(), m.T + b)
