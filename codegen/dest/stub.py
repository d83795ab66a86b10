"""``ops.pyi``: type stubs of a module's ops, one function per op spec."""

from __future__ import annotations

from typing import Sequence

from .. import api, escape
from ..model import OpSpec
from .render import Rendered, banner, render


def render_stub(ops: Sequence[OpSpec], sources: Sequence[str], module: str = "opforge.ops") -> Rendered:
    stubs = [{"sig": api.py_signature(op), "doc": escape.py_docstring(op.doc)} for op in ops]
    stubs += [{"sig": api.py_signature(op, inplace=True), "doc": escape.py_docstring(f"{op.name}, in place: writes the result into {op.inputs[0].name}.")}
              for op in ops if op.inplace]
    text = render("ops.pyi.j2", banner=banner("#", f"{len(sources)} specs", "ops.pyi.j2"), ops=stubs, module=module)
    return Rendered("ops.pyi", text)
