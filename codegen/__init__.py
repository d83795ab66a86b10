"""opforge codegen: YAML op specs -> validated model -> generated C++ and stubs.

Layers, each importing only those before it: ``source`` (YAML with locations), ``formula``
(syntax, checking and lowering of formulas), ``model`` (frozen dataclasses and their invariants),
``schema`` (the allowed keys), ``api`` (C++ and Python types and names of model things), ``load``
(files, schema, model, cross-op and file-system checks), ``dest`` (one module per generated
artifact) and ``gen`` (assembling and writing the outputs); ``__main__`` is the command line.
"""

from .errors import SpecError, SpecErrors
from .load import load_spec_file, load_specs
from .model import OpSpec

__all__ = ["SpecError", "SpecErrors", "OpSpec", "load_specs", "load_spec_file"]
