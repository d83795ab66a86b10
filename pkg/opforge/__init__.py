"""opforge: tensor operators generated from YAML specs, with their own autograd.

    import numpy as np, opforge
    x = opforge.tensor(np.array([1.0, 4.0, 9.0], np.float32), requires_grad=True)
    y = opforge.ops.sum(opforge.ops.square(x))
    y.backward()
    x.grad.numpy()  # [2, 8, 18]
"""

from __future__ import annotations

import atexit
import functools
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

# OpenBLAS (matmul, linear): importing scipy_openblas32 loads its libscipy_openblas.so with
# RTLD_GLOBAL, so the extension's dependency on that library resolves to it wherever pip put it.
import scipy_openblas32  # noqa: F401  (before opforge._C)

from opforge import _build_info as _build_info  # (as: the generated modules, which mypy cannot see,
from opforge import _formulas as _formulas  # stay importable from opforge by name)


def _load_runtime_libs() -> None:
    """Loads the libraries of this wheel's runtime dependencies (the cu130 wheel: libcudart.so.13
    of nvidia-cuda-runtime, libcublasLt.so.13 and libcublas.so.13 of nvidia-cublas) with
    RTLD_GLOBAL before opforge._C, as torch does: the extension's rpath finds them beside opforge
    in site-packages, this wherever pip put them (--target, PYTHONPATH). A library not found is
    left to the dynamic loader."""
    import ctypes
    import importlib

    for entry in _formulas.BUILDS[_build_info.BACKEND].runtime_libs:
        package, rel = entry.split(":", 1)
        try:
            folders = list(importlib.import_module(package).__path__)
        except ImportError:
            continue
        for folder in folders:
            if (Path(folder) / rel).is_file():
                ctypes.CDLL(str(Path(folder) / rel), mode=ctypes.RTLD_GLOBAL)
                break


_load_runtime_libs()
try:
    from opforge import _C
except ImportError as exc:
    _requires = _formulas.BUILDS[_build_info.BACKEND].runtime_requires
    if not _requires or "cannot open shared object file" not in str(exc):
        raise
    raise ImportError(f"opforge {_build_info.VERSION} cannot load its runtime dependencies ({exc}): "
                      f"pip install {' '.join(repr(r) for r in _requires)}") from exc
from opforge._C import Tensor, from_dlpack, from_numpy, is_grad_enabled, list_ops

# Before the interpreter finalizes, op calls running Python code on other (daemon) threads finish
# and later ones park: CPython before 3.14 ends such a thread by an unwind through opforge's C++
# frames (src/python/gil.h)
atexit.register(_C._drain_at_exit)
from opforge import cuda, ops, optim
from opforge._autograd import enable_grad, grad, gradients, jacfwd, jvp, no_grad, set_grad_enabled, value_and_grad
from opforge._build_info import VERSION as _VERSION
from opforge.jit import load

__version__: str = _VERSION

__all__ = [
    "Tensor", "tensor", "from_numpy", "from_dlpack", "ops", "op_info", "list_ops", "spec", "backend",
    "no_grad", "enable_grad", "grad", "value_and_grad", "gradients", "jvp", "jacfwd", "is_grad_enabled",
    "set_grad_enabled", "foreach",
    "DTYPES", "load", "LIBRARY", "cuda", "optim",
]

#: The wheel backend this opforge was built as: "cpu", or "cuda" (the cu130 wheel, whose targets
#: are cpu and cuda: ``opforge.cuda``)
backend: str = _build_info.BACKEND

#: libopforge.so: the runtime and every op, shared by opforge._C and by op modules built against
#: it (``opforge.load``, packages made with ``opforge init``); it exports the ops' AOT entry points.
LIBRARY: str = str(Path(_C.__file__).with_name("libopforge.so"))

DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def tensor(data: Any, dtype: Optional[Any] = None, requires_grad: bool = False,
           format: Optional[str] = None, device: str = "cpu") -> Tensor:
    """A new tensor holding a copy of data (a Tensor, array, DLPack producer, list or scalar).

    ``dtype`` defaults to data's own (NumPy's inference for lists and scalars); ``format`` tags
    the layout (``DefaultFormat``, ``NCHW``, ``NHWC``) that registration tables check; ``device``
    is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (RuntimeError, with the reason, where no such device
    is available: see :mod:`opforge.cuda`).
    """
    where = _C._check_device("tensor", str(device))  # (first: a missing device fails before any copy)
    if isinstance(data, Tensor):
        src = data
    elif hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        src = from_dlpack(data)
    else:
        arr = np.asarray(data)
        if arr.dtype.kind not in "biuf?":
            raise TypeError(f"[tensor] cannot make a tensor from {type(data).__name__} "
                            f"(NumPy dtype {arr.dtype}); supported dtypes: {', '.join(DTYPES)}")
        src = from_numpy(arr)
    if src.device != "cpu":
        src = _C._to(src, "cpu")  # (conversions run on the host for now)
    out = _C._convert(src, src.dtype if dtype is None else dtype)
    if format is not None:
        out = out.with_format(format)
    if where != "cpu":
        out = _C._to(out, where)
    if requires_grad:
        out.requires_grad = True
    return out


def foreach(op: Any, *inputs: Any, out: Any = None, **attrs: Any) -> list[Any]:
    """Run ``op`` (an ``opforge.ops`` function whose spec declares ``foreach: true``) over lists of
    tensors in one call, PyTorch's ``_foreach`` idea: each input is a list of N values, or one
    value that every position shares; attrs are one value each; ``out=`` is a list of N tensors
    (one output) or a tuple of such lists, one per output, written in place (``opforge.optim``
    updates all of a model's parameters so). Position i is the op's own call on the i-th values,
    with its checks and ``out=`` rules; the lists' lengths are checked before anything runs.
    Returns the N results (with ``out=``: the tensors written)."""
    result: list[Any] = _C._foreach(op, inputs, {**attrs, "out": out})
    return result


def op_info(op: Any) -> list[dict[str, Any]]:
    """The op's registration entries, one per target, shaped like MindSpore's
    ``CustomRegOp(...).get_op_info()``: op_name, inputs, outputs, attr, dtype_format, target.
    ``op``: a name (the latest registration of that name), or an op function (``opforge.ops.mul``,
    ``mypkg.ops.my_op``: its own op, where two modules define ops of one name)."""
    info: list[dict[str, Any]] = _C.op_info(op) if isinstance(op, str) else _C._op_info_of(op)
    return info


@functools.lru_cache(maxsize=None)
def _specs() -> dict[str, Any]:
    from opforge.codegen import load_specs

    return {op.name: op for op in load_specs([Path(__file__).parent / "op_specs"])}


def spec(name: str) -> Any:
    """The parsed spec of an op (``opforge.codegen.model.OpSpec``): inputs, attrs, targets,
    shape rules and bprop formulas, for framework adapters and tools."""
    specs = _specs()
    if name not in specs:
        raise ValueError(f"[spec] unknown op '{name}'; known ops: {', '.join(sorted(specs))}")
    return specs[name]


# ---------------------------------------------------------------------------- Tensor methods


def _binary(op: Any, reflected: bool = False) -> Any:
    if reflected:
        return lambda self, other: op(other, self)
    return lambda self, other: op(self, other)


def _repr(self: Tensor) -> str:
    data = _C._to(self.detach(), "cpu")
    if data.dtype == "bfloat16":
        data = data.astype("float32")
    body = np.array2string(data.numpy(), separator=", ", prefix="tensor(")
    extra = f", dtype={self.dtype}"
    if self.device != "cpu":
        extra += f", device='{self.device}'"
    if self.format != "DefaultFormat":
        extra += f", format={self.format}"
    if self.grad_fn is not None:
        extra += f", grad_fn={self.grad_fn}"
    elif self.requires_grad:
        extra += ", requires_grad=True"
    return f"tensor({body}{extra})"


_OPERATORS = (  # (method, op, reflected)
    ("__add__", "add", False), ("__radd__", "add", True),
    ("__sub__", "sub", False), ("__rsub__", "sub", True),
    ("__mul__", "mul", False), ("__rmul__", "mul", True),
    ("__truediv__", "div", False), ("__rtruediv__", "div", True),
    ("__matmul__", "matmul", False), ("__rmatmul__", "matmul", True),
    ("__gt__", "greater", False), ("__lt__", "less", False),
    ("__ge__", "greater_equal", False), ("__le__", "less_equal", False),
)
# The ops Tensor's operators and methods call: opforge does not import without them (a build of
# fewer specs, as tests/test_cli.py's scaffold test makes, keeps them and what their formulas call).
_TENSOR_OPS = frozenset({op for _, op, _ in _OPERATORS} | {"neg", "sum", "mean"})
for _name, _op, _refl in _OPERATORS:
    setattr(Tensor, _name, _binary(getattr(ops, _op), _refl))
Tensor.__neg__ = lambda self: ops.neg(self)


def _to(self: Tensor, device: str) -> Tensor:
    """This tensor on device ("cpu", "cuda", "cuda:N"): itself when already there, else a copy
    (ordered on the device's current stream; a copy to the host returns once it is complete).
    Differentiable, as torch's: the gradient of the copy goes back to this tensor's device."""
    return _C._to(self, str(device))


Tensor.to = _to
Tensor.cpu = lambda self: _to(self, "cpu")
Tensor.__repr__ = _repr
Tensor.sum = lambda self, axis=None, keepdims=False: ops.sum(self, axis, keepdims)
Tensor.mean = lambda self, axis=None, keepdims=False: ops.mean(self, axis, keepdims)
del _name, _op, _refl
# Tensor's methods are all there: from here on the type is immutable, as numpy.ndarray (no
# attribute set on it, no __class__ assignment to or from it, which would read one C++ object as
# another)
_C._seal_tensor_type()
