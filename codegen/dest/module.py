"""``<module>.module.cpp``: the PyInit of an op module built against an installed opforge (``opforge.load``,
``opforge init`` packages), registering its ops through libopforge.so's create_op_module. Op names are identifiers, so no
op's file is named so, whatever the module's name."""

from __future__ import annotations

from typing import Sequence

from .. import escape
from ..model import OpSpec
from .render import Rendered, banner, render, shown_sources


def render_module_init(ops: Sequence[OpSpec], sources: Sequence[str], module: str, qualname: str) -> Rendered:
    shown = shown_sources(list(sources))
    text = render("module.cpp.j2", banner=banner("//", shown, "module.cpp.j2"), module=module,
                  qualname=qualname or module, names=[o.name for o in ops],
                  doc=escape.cpp_str(f"Ops generated from {shown}."))
    return Rendered(f"{module}.module.cpp", text)
