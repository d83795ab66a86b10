"""``opforge new``: a commented starting spec (and, for cpp ops, a kernel file with the generated
signature; for pyfunc ops, the Python module of the function) that checks, builds and passes its
generated tests as written."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Callable, Optional

KINDS = ("expr", "cpp", "composite", "pyfunc")
NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")

_HEAD = """\
# {name}: {what}
# Edit the doc, inputs, attrs, implementation, gradient and NumPy reference, then run
#   opforge check {spec_dir}     (mistakes are reported as file:line:col: key: message)
# and rebuild (pip install .). Every key is described in op_specs/README.md of opforge.
"""

_EXPR = _HEAD + """\
{name}:
  doc: "alpha * x where x > 0, else x (a starting point: edit me)."
  inputs:
    x: T                                  # a tensor whose dtype is the type variable T
  attrs:
    alpha: {{type: float, default: 2.0, doc: scale of the positive part}}
  outputs:
    out: {{dtype: T, shape: same(x)}}       # same(x) or broadcast(x, y) for an expr op
  dtypes:
    T: [float32, float64]                 # the dtypes T may take
  # no targets: every built target, every dtype of T, formats DefaultFormat/NCHW/NHWC
  impl:
    expr: where(x > 0, alpha * x, x)      # elementwise expression (op_specs/README.md, 4.2)
  bprop:                                  # optional for an expr op: derived from the expression
    x: where(x > 0, alpha * dout, dout)   # dL/dx from dout, built from ops (so twice differentiable)
  # no jvp: forward mode is derived (this bprop is elementwise and linear in dout)
  tests:
    reference: np.where(x > 0, alpha * x, x)  # the NumPy oracle of the generated tests
    attrs: [{{}}, {{alpha: 0.5}}]               # every case runs with each attr set
"""

_COMPOSITE = _HEAD + """\
{name}:
  doc: "x * x + y, composed of existing ops (a starting point: edit me)."
  inputs:
    x: T
    y: T
  outputs:
    out: {{dtype: T, shape: "broadcast(x, y)"}}  # quoted: a comma would split the {{...}}
  dtypes:
    T: [float32, float64]
  impl:
    composite: add(mul(x, x), y)          # a formula over other ops (op_specs/README.md, 4.3)
  # no bprop: the gradient is composed from those of mul and add
  tests:
    reference: x * x + y
    shapes: [[[3, 4], [3, 4]], [[2, 3], [3]]]   # one list of input shapes per case
"""

_CPP = _HEAD + """\
{name}:
  doc: "scale * x, computed by a hand-written kernel (a starting point: edit me)."
  inputs:
    x: T
  attrs:
    scale: {{type: float, default: 1.0, doc: the factor}}
  outputs:
    out: {{dtype: T, shape: same(x)}}       # preallocated before the kernel runs
  dtypes:
    T: [float32, float64]
  impl:
    cpp: {{}}                               # kernel: {kernel}
  bprop:
    x: scale * dout
  tests:
    reference: scale * x
    attrs: [{{}}, {{scale: -0.5}}]
"""

_PYFUNC = _HEAD + """\
{name}:
  doc: "Softplus log(1 + exp(beta * x)) / beta, computed in Python (a prototype: edit me)."
  inputs:
    x: T
  attrs:
    beta: {{type: float, default: 1.0, doc: sharpness}}
  outputs:
    out: {{dtype: T, shape: same(x)}}       # the function must return exactly this dtype and shape
  dtypes:
    T: [float32, float64]
  impl:
    pyfunc: "{module}:{name}"     # module:function, called on read-only NumPy arrays (cpu only)
  bprop:
    x: dout * sigmoid(beta * x)           # the gradient is built from ops, as for any op
  tests:
    reference: np.logaddexp(0, beta * x) / beta
    attrs: [{{}}, {{beta: 2.0}}]
"""

_FUNCTION = """\
\"\"\"The kernel of op `{name}` (impl: pyfunc in {spec}): a Python function on NumPy arrays, for
prototyping (a starting point: edit me). It must be importable as `{module}` where the op runs
(beside your script, on sys.path, or moved into your package with the spec's target updated).

opforge calls it with every input as a read-only NumPy array (None for an absent optional input)
and the attrs as keyword arguments, after checking the call against the spec; it returns one array
per output (a tuple for several) of exactly the output's dtype and shape.
\"\"\"

import numpy as np


def {name}(x: np.ndarray, *, beta: float) -> np.ndarray:
    return (np.logaddexp(0, beta * x) / beta).astype(x.dtype, copy=False)
"""

_KERNEL = """\
// Kernel of op `{name}` on cpu: out = scale * x (a starting point: edit me).
// The signature is the one opforge generates in {name}.h from the spec: every input, then every
// output, then the attrs; one template argument per type variable (T: float or double here).
#include "{name}.h"

namespace opforge::kernels::cpu {{

template <typename T>
void {name}(const TensorPtr& x, const TensorPtr& out, const {cls}Attrs& attrs) {{
  const T* in = x->data<T>();  // inputs are contiguous
  T* o = out->data<T>();       // outputs have the spec's shape and dtype, uninitialized
  for (int64_t i = 0, n = x->numel(); i < n; ++i) o[i] = static_cast<T>(attrs.scale * in[i]);
}}

}}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_{upper}_CPU  // instantiates {name}<T> for every dtype of T
"""

_WHAT = {"expr": "an elementwise op written as one expression (impl: expr)",
         "composite": "an op composed of other ops (impl: composite)",
         "cpp": "an op with a hand-written C++ kernel (impl: cpp)",
         "pyfunc": "an op computed by a Python function on NumPy arrays, for prototyping (impl: pyfunc)"}


class ScaffoldError(Exception):
    """A name, kind or path that cannot be scaffolded (nothing was written)."""


def new_op(name: str, kind: str, spec_dir: Path, check: Optional[Callable[[Path], object]] = None) -> list[Path]:
    """Writes the spec (and the kernel of a cpp op, at <spec_dir>/../src/kernels/cpu/<name>.cpp; the
    function of a pyfunc op, module <name>_impl at <spec_dir>/../<name>_impl.py); returns the files
    written. Refuses to overwrite anything. ``check`` (``opforge check``'s loading, SpecErrors on a
    mistake) reads the spec first from a scratch folder: a name the checker refuses (a keyword, an op
    of opforge, one without a letter before its digits) writes nothing."""
    if not NAME.match(name):
        raise ScaffoldError(f"'{name}' is not an op name: lowercase letters, digits and _, not starting with a digit")
    if kind not in KINDS:
        raise ScaffoldError(f"unknown kind '{kind}'; kinds: {', '.join(KINDS)}")
    spec = spec_dir / f"{name}.yaml"
    module = f"{name}_impl"
    kernel = spec_dir.resolve().parent / "src" / "kernels" / "cpu" / f"{name}.cpp"
    function = spec_dir.resolve().parent / f"{module}.py"
    files = [spec] + ([kernel] if kind == "cpp" else [function] if kind == "pyfunc" else [])
    existing = [str(f) for f in files if f.exists()]
    if existing:
        raise ScaffoldError(f"{', '.join(existing)} already exists; nothing written")
    blocked = sorted({str(d) for f in files for d in f.parents if d.exists() and not d.is_dir()})
    if blocked:
        raise ScaffoldError(f"{blocked[0]} is a file, not a folder; nothing written")
    text = {"expr": _EXPR, "composite": _COMPOSITE, "cpp": _CPP, "pyfunc": _PYFUNC}[kind].format(
        name=name, what=_WHAT[kind], spec_dir=spec_dir, kernel=f"src/kernels/cpu/{name}.cpp", module=module)
    if check is not None:
        from opforge.codegen.errors import SpecError

        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / spec.name).write_text(text)
            try:
                check(Path(scratch) / spec.name)
            except SpecError as exc:
                raise ScaffoldError(f"'{name}' cannot name an op: {exc.message}; nothing written") from None
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    if kind == "cpp":
        from opforge.codegen.names import class_name

        kernel.parent.mkdir(parents=True, exist_ok=True)
        kernel.write_text(_KERNEL.format(name=name, cls=class_name(name), upper=name.upper()))
    if kind == "pyfunc":
        function.write_text(_FUNCTION.format(name=name, module=module, spec=spec.name))
    return files
