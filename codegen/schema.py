"""The one list of allowed spec keys: a cerberus schema for one op's YAML mapping (checked by
``load`` before the model is built)."""

from __future__ import annotations

from typing import Any

from .model import AttrType, DType, Format
from .targets import Backend

# the closed vocabularies are the model's enums, in their order (messages list them so)
DTYPES = [str(d) for d in DType]
FORMATS = [str(f) for f in Format]
TARGETS = [str(b) for b in Backend]
ATTR_TYPES = [str(t) for t in AttrType]

IDENT = {"type": "string", "regex": r"[a-z_][a-z0-9_]*\Z"}
LET_KEY = r"[a-z_][a-z0-9_]*(\s*,\s*[a-z_][a-z0-9_]*)*\Z"  # one name, or several comma-separated
PYFUNC = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z"  # module:function
# how error messages show a regex
REGEX_SHOWN = {LET_KEY: "[a-z_][a-z0-9_]* (or several, comma-separated)",
               PYFUNC: "'module:function' (an importable, possibly dotted, module; a colon; a function name)"}
INPLACE = r"[a-z][a-z0-9_]*_\Z"
REGEX_SHOWN[INPLACE] = "a name ending in '_' (PyTorch's: add_, mul_)"
TYPEVAR = {"type": "string", "regex": r"[A-Z][A-Za-z0-9_]*\Z"}
FORMULA = {"type": "string", "empty": False}
DOC = {"type": "string"}
NUMBER = {"type": "number"}
TOLERANCE = {"type": "list", "minlength": 2, "maxlength": 2, "schema": NUMBER}

INPUT: dict[str, Any] = {
    "dtype": {"type": "string", "required": True},
    "optional": {"type": "boolean"},
    "differentiable": {"type": "boolean"},
    "shape_only": {"type": "boolean"},
    "doc": DOC,
}

OUTPUT: dict[str, Any] = {
    "dtype": {"type": "string", "required": True},
    "shape": {"type": "string", "required": True},
    "differentiable": {"type": "boolean"},
    "doc": DOC,
}

ATTR: dict[str, Any] = {
    "type": {"type": "string", "required": True, "allowed": ATTR_TYPES},
    "default": {"nullable": True},
    "required": {"type": "boolean"},
    "choices": {"type": "list", "empty": False},
    "min": NUMBER,
    "max": NUMBER,
    # the inputs whose dimensions an int or list[int] attr indexes, the one whose rank normalizes
    # a negative axis first (batching rules shift it)
    "axis_of": {"type": "list", "empty": False, "schema": IDENT},
    "doc": DOC,
}

TARGET: dict[str, Any] = {
    "dtypes": {"type": "dict", "keysrules": TYPEVAR,
               "valuesrules": {"type": "list", "empty": False,
                               "schema": {"type": "string", "allowed": DTYPES}}},
    "formats": {"type": "list", "empty": False,
                "schema": {"type": "string", "allowed": FORMATS}},
}

IMPL: dict[str, Any] = {  # one key per ImplKind
    # one formula, or for any number of outputs a mapping output -> formula
    "expr": {"type": ["string", "dict"], "empty": False, "keysrules": IDENT, "valuesrules": FORMULA},
    "composite": FORMULA,
    "cpp": {"type": "dict", "nullable": True, "schema": {}},
    # a kernel in an external shared library with MindSpore's AOT C ABI
    "aot": {"type": "dict", "schema": {
        "library": {"type": "string", "required": True, "empty": False},
        "symbol": {"type": "string", "required": True, "regex": r"[A-Za-z_][A-Za-z0-9_]*\Z"},
    }},
    # a Python function on NumPy arrays, "module:function" (for prototyping)
    "pyfunc": {"type": "string", "regex": PYFUNC},
}

BPROP: dict[str, Any] = {
    "type": "dict",
    # a let key is a name, or several (`y, mean, rstd: layer_norm(x)`) bound to a call's outputs
    "schema": {"let": {"type": "dict", "valuesrules": FORMULA,
                       "keysrules": {"type": "string", "regex": LET_KEY}}},
    "allow_unknown": FORMULA,
    "keysrules": IDENT,
}

TESTS: dict[str, Any] = {
    "reference": {"type": "string", "required": True, "empty": False},
    "domain": {"type": "dict", "keysrules": IDENT,
               "valuesrules": {"type": "list", "minlength": 2, "maxlength": 2, "schema": NUMBER}},
    "attrs": {"type": "list", "empty": False, "schema": {"type": "dict"}},
    "shapes": {"type": "list", "empty": False,
               "schema": {"type": "list", "schema": {"type": "list", "nullable": True,
                                                    "schema": {"type": "integer", "min": 0}}}},
    "tolerance": {"type": "dict", "keysrules": {"type": "string", "allowed": DTYPES},
                  "valuesrules": TOLERANCE},
    "grad_tolerance": TOLERANCE,
}

OP: dict[str, Any] = {
    "doc": {"type": "string", "required": True, "empty": False},
    "inputs": {"type": "dict", "required": True, "keysrules": IDENT,
               "valuesrules": {"type": "dict", "schema": INPUT}},
    "outputs": {"type": "dict", "required": True, "empty": False, "keysrules": IDENT,
                "valuesrules": {"type": "dict", "schema": OUTPUT}},
    "attrs": {"type": "dict", "keysrules": IDENT, "valuesrules": {"type": "dict", "schema": ATTR}},
    # conditions on the inputs' shapes and attrs, each with the ValueError message when false
    "checks": {"type": "list", "schema": {"type": "dict", "schema": {
        "require": {**FORMULA, "required": True}, "error": {"type": "string", "required": True, "empty": False}}}},
    "dtypes": {"type": "dict", "keysrules": TYPEVAR,
               "valuesrules": {"type": "list", "empty": False,
                               "schema": {"type": "string", "allowed": DTYPES}}},
    "targets": {"type": "dict", "empty": False,  # absent: the host target (targets.HOST)
                "keysrules": {"type": "string", "allowed": TARGETS},
                "valuesrules": {"type": "dict", "nullable": True, "schema": TARGET}},
    "impl": {"type": "dict", "required": True, "schema": IMPL},
    "bprop": BPROP,
    "jvp": BPROP,
    # inputs whose leading dimensions the op maps independently (vmap batches them natively)
    "batch_inputs": {"type": "list", "empty": False, "schema": IDENT},
    # the name of the op's in-place variant (PyTorch's: add_, mul_, clamp_): writes its one output
    # into its first input
    "inplace": {"type": "string", "regex": INPLACE},
    "foreach": {"type": "boolean"},
    # under a framework's autocast: lower (the autocast dtype), float32, promote (the widest input's)
    "autocast": {"type": "string", "allowed": ["lower", "float32", "promote"]},  # the same shape: lets, then one formula per differentiable output
    "tests": {"type": "dict", "schema": TESTS},
}
