"""Which opforge op answers to which of PyTorch's OpInfos, how a sample's arguments become the
opforge op's, and the documented differences a sample may be excluded for: data for
test_torch_conformance.py (issue 16).

An adapter takes a SampleInput (``input``, ``args``, ``kwargs``) and returns the opforge op's
arguments (tensors, then attrs by name), or raises ``NotMapped(key)`` when the sample is outside
opforge's signature or semantics; ``key`` must then be one of the op's ``DIFFERENCES``, whose
reasons are the documented semantics (op_specs/README.md, "Whose semantics").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch


class NotMapped(Exception):
    """The sample is outside opforge's signature or semantics: args[0] names the difference."""


@dataclass(frozen=True)
class Counterpart:
    op: str                    # the opforge op
    torch: str                 # its OpInfo's name
    variant: str = ""          # and variant_test_name
    adapt: Callable[[Any], tuple[list[Any], dict[str, Any]]] = field(default=None)  # type: ignore[assignment]
    outputs: Optional[Callable[[Any], Any]] = None  # torch's result -> opforge's outputs' layout
    mine: Optional[Callable[[Any], Any]] = None     # opforge's outputs -> those torch's op returns


def _operands(sample: Any) -> list[Any]:
    return [sample.input, *sample.args]


def _check_tensors(values: list[Any]) -> None:
    """Tensors of one dtype, and at most one Python number (real: opforge has no complex dtypes),
    which torch.ops.opforge's scalar_<input> overloads take."""
    numbers = [v for v in values if not isinstance(v, torch.Tensor)]
    if any(isinstance(v, complex) for v in numbers):
        raise NotMapped("complex number")
    if len(numbers) > 1:
        raise NotMapped("two python numbers")
    if len({v.dtype for v in values if isinstance(v, torch.Tensor)}) > 1:
        raise NotMapped("mixed dtypes")


def tensors(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """Every argument a tensor of one dtype, no keyword arguments."""
    if sample.kwargs:
        raise NotMapped("keyword " + ",".join(sorted(sample.kwargs)))
    values = _operands(sample)
    _check_tensors(values)
    return values, {}


def _axes(dim: Any) -> Optional[list[int]]:
    if dim is None:
        return None
    return [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]


def reduction(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """sum/mean(x, dim=None, keepdim=False), logsumexp(x, dim, keepdim)."""
    kwargs = dict(sample.kwargs)
    if "dtype" in kwargs:
        raise NotMapped("keyword dtype")
    args = list(sample.args)
    dim = args.pop(0) if args else kwargs.pop("dim", None)
    keep = args.pop(0) if args else kwargs.pop("keepdim", False)
    if args or kwargs:
        raise NotMapped("keyword " + ",".join(sorted(kwargs)))
    return [sample.input], {"axis": _axes(dim), "keepdims": bool(keep)}


def arg_reduction(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """max/min(x, dim, keepdim=False) -> (values, indices)."""
    args = list(sample.args)
    return [sample.input], {"axis": int(args[0]), "keepdims": bool(args[1]) if len(args) > 1 else False}


def along_axis(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """softmax/log_softmax(x, dim)."""
    if sample.kwargs:
        raise NotMapped("keyword " + ",".join(sorted(sample.kwargs)))
    return [sample.input], {"axis": int(sample.args[0])}


def clamp(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    bounds = list(sample.args) + [None] * (2 - len(sample.args))
    if any(isinstance(b, torch.Tensor) for b in bounds):
        raise NotMapped("tensor bounds")
    return [sample.input], {"min": bounds[0], "max": bounds[1]}


def where(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """OpInfo's where(self, condition, other) is torch.where(condition, self, other)."""
    cond, other = sample.args
    values = [sample.input, other]
    _check_tensors(values)
    return [cond, sample.input, other], {}


def gelu(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    return [sample.input], {"approximate": sample.kwargs.get("approximate", "none")}


def leaky_relu(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    slope = sample.args[0] if sample.args else sample.kwargs.get("negative_slope", 0.01)
    return [sample.input], {"alpha": float(slope)}


def _normalized_axes(sample: Any) -> list[int]:
    shape = sample.args[0] if sample.args else sample.kwargs["normalized_shape"]
    n = 1 if isinstance(shape, int) else len(shape)
    return list(range(-n, 0))


def _arg(sample: Any, index: int, name: str, default: Any) -> Any:
    return sample.args[index] if len(sample.args) > index else sample.kwargs.get(name, default)


def layer_norm(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """F.layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5) -> y."""
    return ([sample.input, _arg(sample, 1, "weight", None), _arg(sample, 2, "bias", None)],
            {"axis": _normalized_axes(sample), "eps": float(_arg(sample, 3, "eps", 1e-5))})


def rms_norm(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """F.rms_norm(x, normalized_shape, weight=None, eps=None) -> y (eps None: the dtype's epsilon)."""
    eps = _arg(sample, 2, "eps", None)
    return ([sample.input, _arg(sample, 1, "weight", None)],
            {"axis": _normalized_axes(sample), "eps": float(torch.finfo(sample.input.dtype).eps if eps is None else eps)})


def linear(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """F.linear(x, weight, bias=None)."""
    return [sample.input, sample.args[0], _arg(sample, 1, "bias", None)], {}


def transpose(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """torch.transpose(x, d0, d1) when it swaps the last two dims."""
    n = sample.input.dim()
    dims = {d % n if n else d for d in sample.args[:2]}
    if n < 2 or dims != {n - 2, n - 1}:
        raise NotMapped("dims other than the last two")
    return [sample.input], {}


def take_along_axis(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """torch.take_along_dim(x, indices, dim) with indices of x's shape but along dim."""
    indices = sample.args[0]
    dim = _arg(sample, 1, "dim", None)
    if dim is None:
        raise NotMapped("no dim (flattened)")
    x = sample.input
    other = [i for i in range(x.dim()) if i != dim % x.dim()]
    if indices.dim() != x.dim() or any(indices.shape[i] != x.shape[i] for i in other):
        raise NotMapped("broadcast indices")
    return [x, indices], {"axis": int(dim), "keepdims": True}


def embedding(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """OpInfo's embedding(weight, indices, padding_idx=None, max_norm=None, ...) is
    F.embedding(indices, weight, ...)."""
    if any(v is not None and v is not False for v in sample.kwargs.values()):
        raise NotMapped("padding_idx, max_norm, scale_grad_by_freq or sparse")
    return [sample.args[0], sample.input], {}


def cross_entropy(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """F.cross_entropy(logits, target, reduction=..., ignore_index=..., label_smoothing=...) with
    class labels of 2-D logits."""
    target = sample.args[0]
    if sample.input.dim() != 2 or target.dtype != torch.int64:
        raise NotMapped("not (N, C) logits with class labels")
    mapped = {"reduction", "ignore_index", "label_smoothing"}
    if {k for k in sample.kwargs if k not in mapped} or sample.kwargs.get("weight") is not None:
        raise NotMapped("weight")
    return [sample.input, target], {k: v for k, v in sample.kwargs.items() if k in mapped}


def softmax_backward(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """_softmax_backward_data(grad_output, output, dim, input_dtype)."""
    output, dim, input_dtype = sample.args
    if input_dtype != sample.input.dtype:
        raise NotMapped("input_dtype other than the gradient's")
    return [sample.input, output], {"axis": int(dim)}


def slope_001(sample: Any) -> tuple[list[Any], dict[str, Any]]:
    """leaky_relu_ext is leaky_relu with its slope fixed at 0.01 (torch's default)."""
    slope = sample.args[0] if sample.args else sample.kwargs.get("negative_slope", 0.01)
    if slope != 0.01:
        raise NotMapped("a slope other than 0.01")
    return [sample.input], {}


def _first(outs: Any) -> Any:
    return outs[0]


UNARY = ["abs", "exp", "log", "erf", "neg", "rsqrt", "sigmoid", "sign", "sqrt", "square", "tanh"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "pow"]
COMPARISONS = {"equal": "eq", "not_equal": "ne", "greater": "gt", "greater_equal": "ge", "less": "lt",
               "less_equal": "le"}

COUNTERPARTS: list[Counterpart] = [
    *(Counterpart(n, n, adapt=tensors) for n in UNARY),
    *(Counterpart(n, n, adapt=tensors) for n in BINARY),
    Counterpart("div", "div", "no_rounding_mode", adapt=tensors),
    *(Counterpart(n, t, adapt=tensors) for n, t in COMPARISONS.items()),
    Counterpart("relu", "nn.functional.relu", adapt=tensors),
    Counterpart("silu", "nn.functional.silu", adapt=tensors),
    Counterpart("leaky_relu", "nn.functional.leaky_relu", adapt=leaky_relu),
    Counterpart("gelu", "nn.functional.gelu", adapt=gelu),
    Counterpart("clamp", "clamp", adapt=clamp),
    Counterpart("where", "where", adapt=where),
    Counterpart("sum", "sum", adapt=reduction),
    Counterpart("mean", "mean", adapt=reduction),
    Counterpart("logsumexp", "logsumexp", adapt=reduction),
    Counterpart("max", "max", "reduction_with_dim", adapt=arg_reduction, outputs=tuple),
    Counterpart("min", "min", "reduction_with_dim", adapt=arg_reduction, outputs=tuple),
    Counterpart("softmax", "softmax", adapt=along_axis),
    Counterpart("log_softmax", "log_softmax", adapt=along_axis),
    Counterpart("matmul", "matmul", adapt=tensors),
    Counterpart("linear", "nn.functional.linear", adapt=linear),
    Counterpart("layer_norm", "nn.functional.layer_norm", adapt=layer_norm, mine=_first),
    Counterpart("rms_norm", "nn.functional.rms_norm", adapt=rms_norm, mine=_first),
    Counterpart("transpose", "transpose", adapt=transpose),
    Counterpart("take_along_axis", "take_along_dim", adapt=take_along_axis),
    Counterpart("embedding", "nn.functional.embedding", adapt=embedding),
    Counterpart("cross_entropy", "nn.functional.cross_entropy", adapt=cross_entropy),
    Counterpart("softmax_backward", "_softmax_backward_data", adapt=softmax_backward),
    Counterpart("leaky_relu_ext", "nn.functional.leaky_relu", adapt=slope_001),
]

# (op, key) -> why opforge differs: the documented semantics (op_specs/README.md). A key is a
# NotMapped key, or "values: <what>" for samples whose values differ as documented (VALUE_RULES).
_NO_PROMOTION = ("opforge has no type promotion: operands of one type variable share a dtype "
                 "(TypeError naming the op), where torch promotes")
_COMPLEX = "opforge has no complex dtypes"
DIFFERENCES: dict[tuple[str, str], str] = {
    **{(n, "mixed dtypes"): _NO_PROMOTION for n in [*COMPARISONS, "where"]},
    **{(n, "complex number"): _COMPLEX for n in ["where"]},
    **{(n, "two python numbers"): "a call takes at most one Python number: with no tensor operand there "
                                  "is no dtype to give it (torch computes such a call as a 0-d tensor)"
       for n in ["add", "sub", "mul", "div", "where"]},
    ("add", "keyword alpha"): "opforge's add has no alpha (write add(x, mul(y, alpha)))",
    ("sub", "keyword alpha"): "opforge's sub has no alpha (write sub(x, mul(y, alpha)))",
    ("clamp", "tensor bounds"): "clamp's bounds are float attrs, not tensors (use maximum/minimum)",
    ("sign", "values: sign of NaN"): "sign(NaN) is NaN, as in NumPy; torch gives 0",
    **{(n, "values: negative eps"): f"{n}'s eps must be >= 0 (ValueError naming the op): a negative eps can "
                                    "make the normalizer imaginary; torch accepts any float"
       for n in ("layer_norm", "rms_norm")},
    ("transpose", "dims other than the last two"): "opforge's transpose swaps the last two dims (no dim "
                                                   "arguments: NumPy's swapaxes(x, -1, -2))",
    ("take_along_axis", "no dim (flattened)"): "take_along_axis needs an axis (no flattened form)",
    ("take_along_axis", "broadcast indices"): "indices must match x's shape on every other axis, as "
                                              "documented (no broadcasting)",
    ("take_along_axis", "values: negative indices"): "an index outside [0, size) raises IndexError naming "
                                                     "the op; torch and NumPy count negative ones from the end",
    ("embedding", "padding_idx, max_norm, scale_grad_by_freq or sparse"):
        "opforge's embedding is the plain lookup: no padding_idx, max_norm, scale_grad_by_freq or sparse",
    ("cross_entropy", "not (N, C) logits with class labels"):
        "opforge's cross_entropy takes (N, C) logits and int64 class labels (no K-dimensional logits, no "
        "class-probability targets)",
    ("cross_entropy", "weight"):
        "opforge's cross_entropy has reduction, ignore_index and label_smoothing (no per-class weight)",
}


def _has_nan(values: list[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() and bool(torch.isnan(v).any()) for v in values)


def _negative_indices(values: list[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.int64 and bool((v < 0).any()) for v in values)


# op -> (key, predicate on the opforge arguments and attrs): samples whose values differ as documented
VALUE_RULES: dict[str, list[tuple[str, Callable[[list[Any], dict[str, Any]], bool]]]] = {
    "sign": [("values: sign of NaN", lambda t, a: _has_nan(t))],
    "layer_norm": [("values: negative eps", lambda t, a: a["eps"] < 0)],
    "rms_norm": [("values: negative eps", lambda t, a: a["eps"] < 0)],
    "take_along_axis": [("values: negative indices", lambda t, a: _negative_indices(t))],
}
