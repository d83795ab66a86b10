"""opforge codegen: YAML op specs -> validated model -> generated C++ and stubs.

Layers: ``load`` (YAML with locations, schema), ``model`` (frozen dataclasses and their
invariants), ``formula`` (expression parser and checker), ``emit`` (jinja2 rendering).
"""

from .errors import SpecError, SpecErrors
from .load import load_specs, load_spec_file
from .model import OpSpec

__all__ = ["SpecError", "SpecErrors", "OpSpec", "load_specs", "load_spec_file"]
