"""Command line of the code generator, as meson runs it.

    python -m codegen outputs --specs DIR            # generated file names, one per line
    python -m codegen kernels --specs DIR            # hand-written kernel sources, one per line
    python -m codegen generate --specs DIR --out DIR # write generated sources (if changed)

--backend NAME (outputs, kernels, generate; default cpu): the wheel backend of the target table
(codegen/targets.py BUILDS) whose targets' kernels are compiled.

With --module NAME [--qualname PKG.NAME] (outputs, generate): an op module built against an
installed opforge (a package made by `opforge init`): its ops' files, NAME.module.cpp and ops.pyi;
formulas may call opforge's own ops, whose names it may not reuse.
    python -m codegen check PATHS...                 # validate specs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import SpecError, SpecErrors
from .gen import device_files, module_output_names, output_names, render_all, render_module, write_if_changed
from .load import load_specs, spec_paths
from .model import CppImpl, OpSpec
from .targets import BUILDS, TARGETS, Build


def _known(module: str | None) -> list[OpSpec]:
    """opforge's own specs, which an op module's (``module``) formulas may call, not redefine."""
    return load_specs([Path(__file__).resolve().parent.parent / "op_specs"]) if module else []


def _load(specs: Path, build: Build, known: list[OpSpec] | None = None) -> list[OpSpec]:
    return load_specs([specs], kernel_root=specs.resolve().parent, known=known or (), build=build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("outputs", "kernels", "generate"):
        p = sub.add_parser(name)
        p.add_argument("--specs", type=Path, required=True)
        if name == "generate":
            p.add_argument("--out", type=Path, required=True)
        p.add_argument("--module", default=None)
        p.add_argument("--qualname", default="")
        p.add_argument("--backend", choices=list(BUILDS), default="cpu")
    p = sub.add_parser("check")
    p.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "outputs" and args.module:
            print("\n".join(module_output_names([p.stem for p in spec_paths([args.specs])], args.module)))
        elif args.cmd == "outputs":
            build = BUILDS[args.backend]
            # (device-kernel TUs depend on the specs' impl and targets: read them only when the build has devices)
            device = device_files(_load(args.specs, build), build) if len(build.targets) > 1 else []
            print("\n".join(output_names([p.stem for p in spec_paths([args.specs])], device)))
        elif args.cmd == "kernels":
            root = args.specs.resolve().parent
            build = BUILDS[args.backend]
            for op in _load(args.specs, build, _known(args.module)):
                if isinstance(op.impl, CppImpl):
                    for t in build.targets:
                        if op.target(t) is not None:
                            print((root / TARGETS[t].kernel_path(op.name)).as_posix())
        elif args.cmd == "generate" and args.module:
            known = _known(args.module)
            build = BUILDS[args.backend]
            ops = _load(args.specs, build, known)
            args.out.mkdir(parents=True, exist_ok=True)
            sources = {op.name: f"{args.specs.resolve().name}/{op.name}.yaml" for op in ops}
            for r in render_module(ops, sources, args.module, known, args.qualname, build=build):
                write_if_changed(args.out / r.name, r.text)
        elif args.cmd == "generate":
            build = BUILDS[args.backend]
            ops = _load(args.specs, build)
            args.out.mkdir(parents=True, exist_ok=True)
            sources = {op.name: f"{args.specs.resolve().name}/{op.name}.yaml" for op in ops}
            for r in render_all(ops, sources, build):
                write_if_changed(args.out / r.name, r.text)
        else:
            load_specs(args.paths)
    except SpecErrors as exc:
        print(exc, file=sys.stderr)
        return 1
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
