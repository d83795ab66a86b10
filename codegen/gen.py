"""Generate: assemble every output file of a set of ops from the dest modules, name the outputs
before generation (meson needs the list) and write files only when their content changes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping, Sequence

from . import api
from .dest import aot, binding, function, registry
from .dest.module import render_module_init
from .dest.op_table import render_formulas
from .dest.registry import render_registry
from .dest.render import Rendered, banner, render
from .dest.stub import render_stub
from .model import OpSpec
from .targets import BUILDS, HOST, TARGETS, Backend, Build

__all__ = ["Rendered", "render_op", "render_registry", "render_stub", "render_formulas", "render_all",
           "render_module", "write_if_changed", "output_names", "module_output_names"]


def write_if_changed(path: Path, text: str) -> bool:
    """Write text to path unless it already holds exactly that; returns whether it wrote."""
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def render_op(op: OpSpec, table: Mapping[str, api.Callee], spec_source: str, build: Build = BUILDS["cpu"],
              aot_entry_points: bool = True) -> list[Rendered]:
    """The op's header and TU in ``build``; its formulas may call the ops of table.
    ``aot_entry_points``: with the exported C ABI entry points (MindSpore's
    ``ops.Custom(func_type="aot")`` calls them)."""
    lowered = api.lower_formulas(op, table)
    header = function.header_context(op, build)
    tu = {**registry.context(op, build), **function.context(op, lowered, build), **binding.context(op),
          **aot.context(op, aot_entry_points)}
    out = [Rendered(op.name + ".h", render("op.h.j2", banner=banner("//", spec_source, "op.h.j2"), **header)),
           Rendered(op.name + ".cpp", render("op.cpp.j2", banner=banner("//", spec_source, "op.cpp.j2"), **tu))]
    for t in api.generated_device_targets(op, build):
        out.append(Rendered(device_file(op, t), render("op_device.cu.j2", banner=banner("//", spec_source, "op_device.cu.j2"),
                                                       **function.device_kernel_context(op, t))))
    return out


def device_file(op: OpSpec, target: Backend) -> str:
    """The generated TU of op's kernel on a device target: <op>.cu for cuda (the target's suffix)."""
    return op.name + TARGETS[target].kernel_suffix


def device_files(ops: Sequence[OpSpec], build: Build) -> list[str]:
    """Every generated device-kernel TU of ops in build (the outputs meson must know of)."""
    return [device_file(op, t) for op in ops for t in api.generated_device_targets(op, build)]


def render_all(ops: Sequence[OpSpec], sources: Mapping[str, str], build: Build = BUILDS["cpu"]) -> list[Rendered]:
    """Every generated file for ops in ``build``; `sources` maps op name -> spec path shown in banners."""
    table: dict[str, api.Callee] = {o.name: o for o in ops}
    out: list[Rendered] = []
    for op in ops:
        out.extend(render_op(op, table, sources[op.name], build))
    names = [sources[o.name] for o in ops]
    out.append(render_registry(ops, names))
    out.append(render_stub(ops, names))
    out.append(render_formulas(ops, names, build=build))
    return out


def render_module(ops: Sequence[OpSpec], sources: Mapping[str, str], module: str,
                  known: Sequence[api.Callee] = (), qualname: str = "",
                  aot_entry_points: bool = True, build: Build = BUILDS["cpu"],
                  device_kernels: bool = False) -> list[Rendered]:
    """Every generated file of an op module built against an installed opforge (``opforge.load``,
    ``opforge init`` packages): per-op header/TU (and with ``device_kernels``, the device kernels of
    build's device targets, ``<op>.cu``, which the caller compiles with that target's compiler),
    ``<module>.module.cpp`` (its PyInit), ``ops.pyi`` and
    ``_formulas.py`` (its op table, which ``opforge.torch.register_module`` reads). Formulas may
    call ``known`` ops (opforge's own, as specs or signatures), whose headers opforge ships."""
    # (without device_kernels, the device rows of expr and cpp ops are registered but not run:
    # opforge init packages, which compile with the C++ compiler only)
    build = dataclasses.replace(build, device_kernels=device_kernels)
    table: dict[str, api.Callee] = {o.name: o for o in known}
    table.update({o.name: o for o in ops})
    out: list[Rendered] = []
    for op in ops:
        out.extend(render_op(op, table, sources[op.name], build, aot_entry_points))
    names = [sources[o.name] for o in ops]
    out.append(render_module_init(ops, names, module, qualname))
    out.append(render_stub(ops, names, qualname or module))
    out.append(render_formulas(ops, names, table, build))  # for framework adapters (opforge.torch)
    return out


def module_output_names(op_names: Sequence[str], module: str) -> list[str]:
    """render_module's file names, known before generation."""
    names = []
    for n in sorted(op_names):
        names += [f"{n}.h", f"{n}.cpp"]
    return names + [f"{module}.module.cpp", "ops.pyi", "_formulas.py"]


def output_names(op_names: Sequence[str], device: Sequence[str] = ()) -> list[str]:
    """The generated file names, known before generation (meson needs the list); ``device``: the
    device-kernel TUs (device_files), which only builds with device targets have."""
    names = []
    for n in sorted(op_names):
        names += [f"{n}.h", f"{n}.cpp"]
    return names + sorted(device) + ["ops_registry.cpp", "ops.pyi", "_formulas.py"]
