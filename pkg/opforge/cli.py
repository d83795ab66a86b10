"""The ``opforge`` command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from opforge import _build_info, _formulas
from opforge._scaffold import KINDS


EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EPILOG = "Exit status: 0 success, 1 invalid specs (or a failed step), 2 bad usage (path, op, backend)."


class _Usage(Exception):
    """A usage error: printed, exit status 2."""


def _spec_paths(paths: Sequence[Path]) -> list[Path]:
    paths = list(paths) or [Path(__file__).parent / "op_specs"]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise _Usage("\n".join(f"{p}: no such file or directory" for p in missing))
    return paths


def _project_name(root: Path) -> str:
    """The project name in root/pyproject.toml ("" without one)."""
    import tomllib

    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return ""
    try:
        return str(tomllib.loads(pyproject.read_text()).get("project", {}).get("name", ""))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _Usage(f"{pyproject}: cannot read the project's name: {exc}") from exc


def _opforge_folder(folder: Path) -> bool:
    """Whether the (resolved) folder holds opforge's own specs: the installed package's op_specs/
    or the op_specs/ of a checkout of opforge."""
    return (folder == (Path(__file__).parent / "op_specs").resolve()
            or (folder.name == "op_specs" and _project_name(folder.parent) == "opforge"))


def _load(paths: Sequence[Path], kernel_root: Optional[Path] = None, backend: str = "cpu",
          opforge_ops: bool = True) -> list[Any]:
    """The specs under paths (SpecErrors propagate: main prints them, exit status 1), with the
    kernel files of the wheel backend's targets. With ``opforge_ops``, their formulas may call this
    opforge's ops, as in ``opforge.load`` and op packages: all of them but those whose own spec
    files are among paths (which are checked as they are now), and a spec of another project
    taking one's name is an error."""
    from opforge import jit
    from opforge.codegen import load_specs
    from opforge.codegen.load import spec_paths
    from opforge.codegen.targets import BUILDS

    files = _spec_paths(paths)
    known: list[Any] = []
    if opforge_ops:
        found = spec_paths(files)
        own_folders = {f for f in {p.resolve().parent for p in found} if _opforge_folder(f)}
        own = {p.stem for p in found if p.resolve().parent in own_folders}
        known = [s for s in jit._opforge_signatures() if s.name not in own]
    specs: list[Any] = load_specs(files, kernel_root=kernel_root, known=known, build=BUILDS[backend])
    return specs


def _check(args: argparse.Namespace) -> int:
    ops = _load(args.paths, args.kernel_root)
    print(f"{len(ops)} op spec{'s' if len(ops) != 1 else ''} OK")
    return EXIT_OK


def _find(ops: list[Any], name: str) -> Any:
    for op in ops:
        if op.name == name:
            return op
    import difflib

    close = difflib.get_close_matches(name, [o.name for o in ops], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise _Usage(f"unknown op '{name}'{hint}; `opforge list` shows the {len(ops)} ops")


def _list(args: argparse.Namespace) -> int:
    ops = _load(args.specs)
    width = max(len(o.name) for o in ops)
    for op in ops:
        ins = ", ".join(i.name + ("?" if i.optional else "") for i in op.inputs)
        outs = ", ".join(o.name for o in op.outputs)
        print(f"{op.name:<{width}}  {op.impl.kind:<9}  ({ins}) -> ({outs})")
    return EXIT_OK


def _info(args: argparse.Namespace) -> int:
    from opforge.codegen.api import docstring
    from opforge.codegen.model import AotImpl, PyfuncImpl

    op = _find(_load(args.specs), args.op)
    print(docstring(op))
    impl = op.impl.kind + (f" (function {op.impl.symbol} of {op.impl.library})" if isinstance(op.impl, AotImpl)
                           else f" (Python function {op.impl.function})" if isinstance(op.impl, PyfuncImpl) else "")
    print(f"Impl: {impl}")
    diff = [i.name for i in op.inputs if i.differentiable]
    print(f"Differentiable inputs: {', '.join(diff) or 'none'}")
    print("Registration table (dtype x format per target):")
    tvars = [v for v, _ in op.typevars]
    for t in op.targets:
        for binding, fmt in t.rows():
            cols = [f"{i.name}={binding.get(i.dtype, i.dtype)}" for i in op.inputs]
            cols += [f"{o.name}={binding.get(o.dtype, o.dtype)}" for o in op.outputs]
            print(f"    {t.name:<5} {fmt:<13} {' '.join(cols)}")
    if not tvars:
        print("    (concrete dtypes only)")
    return EXIT_OK


def _backend(name: str) -> None:
    """Usage error unless this project can build the wheel backend `name` (the target table's BUILDS)."""
    if not _formulas.BUILDS[name].available:
        usable = ", ".join(b for b, build in _formulas.BUILDS.items() if build.available)
        raise _Usage(f"backend {name} is not available yet; use --backend {usable}")


def _installed(name: str) -> None:
    """Usage error unless `name` is this opforge's own wheel backend (op modules link against it)."""
    _backend(name)
    if name != _build_info.BACKEND:
        mine = _formulas.BUILDS[_build_info.BACKEND]
        wanted = _formulas.BUILDS[name]
        raise _Usage(f"backend {name}: this opforge is the {mine.backend} wheel (opforge+{mine.wheel_label}, targets "
                     f"{', '.join(mine.targets)}); op modules for {name} build against the {name} wheel "
                     f"(opforge+{wanted.wheel_label})")


def _out_folder(out: Path) -> None:
    """Makes the output folder --out names (a usage error where it, or a folder above it, is a file)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise _Usage(f"--out {out}: {exc.strerror.lower() if exc.strerror else exc}: give a folder") from exc


def _gen(args: argparse.Namespace) -> int:
    from opforge.codegen.gen import render_all, write_if_changed

    from opforge.codegen.targets import BUILDS

    _backend(args.backend)
    specs = _spec_paths([args.specs])[0]
    ops = _load([specs], args.kernel_root, backend=args.backend, opforge_ops=False)  # (opforge's own build's files)
    sources = {op.name: f"{Path(specs).resolve().name}/{op.name}.yaml" for op in ops}
    _out_folder(args.out)
    files = render_all(ops, sources, BUILDS[args.backend])
    changed = sum(write_if_changed(args.out / r.name, r.text) for r in files)
    print(f"{len(files)} files for {len(ops)} ops in {args.out} ({changed} written, {len(files) - changed} unchanged)")
    return EXIT_OK


def _docs(args: argparse.Namespace) -> int:
    from opforge.codegen.dest.docs import render_docs
    from opforge.codegen.gen import write_if_changed

    specs = _spec_paths([args.specs])[0]
    ops = _load([specs])
    sources = {op.name: f"{Path(specs).resolve().name}/{op.name}.yaml" for op in ops}
    _out_folder(args.out)
    pages = render_docs(ops, sources)
    for r in pages:
        write_if_changed(args.out / r.name, r.text)
    print(f"{len(pages) - 1} op pages and index.md in {args.out}")
    return EXIT_OK


def _new(args: argparse.Namespace) -> int:
    from opforge._scaffold import ScaffoldError, new_op

    try:
        files = new_op(args.name, args.kind, args.dir, check=lambda spec: _load([spec]))
    except ScaffoldError as exc:
        raise _Usage(str(exc)) from exc
    for f in files:
        print(f"wrote {f}")
    print(f"next: opforge check {args.dir}" + (f" --kernel-root {args.dir.resolve().parent}" if args.kind == "cpp"
                                               else "") + ", then rebuild")
    return EXIT_OK


def _config(args: argparse.Namespace) -> int:
    from opforge import _native

    _installed(args.backend)
    try:
        _native.check_toolchain(tuple(_native.compiler()))
    except _native.BuildError as exc:
        print(f"opforge config: {exc}", file=sys.stderr)
        return EXIT_FAILED
    kinds = [k for k in ("includes", "cflags", "ldflags") if getattr(args, k)] or ["cflags", "ldflags"]
    flags = {"includes": [f"-I{d}" for d in _native.include_dirs()], "cflags": _native.cflags(),
             "ldflags": _native.ldflags()}
    for k in kinds:
        for f in flags[k]:
            print(f"{k[:-1]} {f}" if len(kinds) > 1 else f)
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    from opforge._package import ScaffoldError, init_package

    name = args.name or args.dir.resolve().name
    try:
        files = init_package(args.dir, name)
    except ScaffoldError as exc:
        raise _Usage(str(exc)) from exc
    for f in files:
        print(f"wrote {f}")
    print(f"next: cd {shlex.quote(str(args.dir))} && opforge build --specs op_specs --backend cpu --out dist "
          f"(or pip install --no-build-isolation .), then pytest")
    return EXIT_OK


def _build(args: argparse.Namespace) -> int:
    import re
    import subprocess

    import opforge

    _backend(args.backend)
    specs = _spec_paths([args.specs])[0]
    if not Path(specs).is_dir():
        raise _Usage(f"{specs}: --specs must be a project's spec directory (its parent holds pyproject.toml)")
    root = Path(specs).resolve().parent
    if not (root / "pyproject.toml").is_file():
        raise _Usage(f"{root / 'pyproject.toml'}: no such file; --specs must be the op_specs/ of a project "
                     "(opforge init makes one)")
    project = _project_name(root)
    if project == "opforge" and Path(specs).resolve() != root / "op_specs":
        raise _Usage("opforge's own build takes its specs from its op_specs/")
    if project != "opforge":
        _installed(args.backend)  # (an op package links this opforge)
    # spec mistakes are reported here, before any compiler runs
    _load([specs], root, backend=args.backend)
    out = (args.out or root / "dist").resolve()
    cmd = [sys.executable, "-m", "pip", "wheel", str(root), "--no-deps", "-w", str(out), "-v",
           f"--config-settings=setup-args=-Dops_backend={args.backend}"]  # (-C: pip >= 23.1 only)
    if project != "opforge":
        # an op package links this opforge's libopforge.so: build it here, not in a fresh environment
        cmd.append("--no-build-isolation")
    print(f"building the {args.backend} wheel of {project or root.name} ({root}) into {out}", flush=True)
    progress = re.compile(r"^\[\d+/\d+\] ")
    log: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            if progress.match(line.strip()):
                print("  " + line.strip()[:160], flush=True)
    if proc.returncode != 0:
        print("".join(log[-60:]), file=sys.stderr, end="")
        print(f"opforge build: building {project or root.name} failed", file=sys.stderr)
        return EXIT_FAILED
    wheels = sorted(out.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    print(f"built {wheels[-1] if wheels else out} (opforge {opforge.__version__})")
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description="Build tensor ops from YAML specs.", epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    installed = "(default: the installed specs)"

    p = sub.add_parser("check", help="validate op specs", epilog=EPILOG,
                       description="Validate op specs (files or directories of *.yaml); "
                                   "errors are printed as path:line:col: key: message.")
    p.add_argument("paths", nargs="*", type=Path, help=f"spec files or directories {installed}")
    p.add_argument("--kernel-root", type=Path, default=None,
                   help="project root holding src/kernels/<target>/<op>.cpp for cpp ops (checked when given)")
    p.set_defaults(func=_check)

    p = sub.add_parser("new", help="write a commented starting spec", epilog=EPILOG,
                       description="Write DIR/NAME.yaml, a commented spec of the given kind that checks, builds "
                                   "and passes its generated tests as written; for --kind cpp also the kernel "
                                   "DIR/../src/kernels/cpu/NAME.cpp with the generated signature, for --kind "
                                   "pyfunc the function's module DIR/../NAME_impl.py. Never overwrites a file.")
    p.add_argument("name", help="the op's name (lowercase, digits, _)")
    p.add_argument("--kind", choices=list(KINDS), default="expr", help="how it is computed")
    p.add_argument("--dir", type=Path, default=Path("op_specs"), help="spec directory (default: ./op_specs)")
    p.set_defaults(func=_new)

    p = sub.add_parser("list", help="list the ops of a spec directory", epilog=EPILOG,
                       description="One line per op: name, impl kind, (inputs; ? = optional) -> (outputs).")
    p.add_argument("--specs", type=Path, action="append", default=[], help=f"spec file or directory {installed}")
    p.set_defaults(func=_list)

    p = sub.add_parser("info", help="print an op's registration table", epilog=EPILOG,
                       description="An op's signature, inputs, attrs with defaults, outputs, dtypes per target, "
                                   "gradient formulas, impl kind, differentiable inputs and every registration "
                                   "row (dtype x format per target).")
    p.add_argument("op", help="the op's name")
    p.add_argument("--specs", type=Path, action="append", default=[], help=f"spec file or directory {installed}")
    p.set_defaults(func=_info)

    p = sub.add_parser("gen", help="run codegen only", epilog=EPILOG,
                       description="Generate the C++ sources, registry, stubs and op table of a spec directory "
                                   "(files are rewritten only when their text changes).")
    p.add_argument("--specs", type=Path, required=True, help="spec directory")
    p.add_argument("--backend", choices=list(_formulas.BUILDS), default="cpu", help="backend to generate for")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--kernel-root", type=Path, default=None,
                   help="project root holding src/kernels/<target>/<op>.cpp (checked when given)")
    p.set_defaults(func=_gen)

    p = sub.add_parser("docs", help="write the op reference", epilog=EPILOG,
                       description="One Markdown page per op (signature, attrs, dtypes per target, gradient "
                                   "formulas, an example) and an index, from the specs.")
    p.add_argument("--specs", type=Path, default=Path(__file__).parent / "op_specs",
                   help=f"spec directory {installed}")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.set_defaults(func=_docs)

    p = sub.add_parser("build", help="build a project's wheel for a backend", epilog=EPILOG,
                       description="Build the wheel of the project whose spec directory is --specs (opforge "
                                   "itself, or a package made by `opforge init`, built against this opforge "
                                   "without build isolation), showing the compiler's progress.")
    p.add_argument("--specs", type=Path, default=Path("op_specs"), help="the project's spec directory (default: "
                   "./op_specs)")
    p.add_argument("--backend", choices=list(_formulas.BUILDS), required=True, help="backend to build for")
    p.add_argument("--out", type=Path, default=None, help="where the wheel goes (default: <project>/dist)")
    p.set_defaults(func=_build)

    p = sub.add_parser("init", help="start an op package of your own", epilog=EPILOG,
                       description="Write a separate op package into DIR (missing or empty): pyproject.toml, "
                                   "meson.build, op_specs/ with one op, the Python package and its tests. It "
                                   "builds against the installed opforge; its ops import as NAME.ops.<op> and "
                                   "share opforge's Tensor and autograd.")
    p.add_argument("dir", type=Path, help="the new project's directory")
    p.add_argument("--name", default=None, help="the Python package's name (default: DIR's name)")
    p.set_defaults(func=_init)

    p = sub.add_parser("config", help="compiler flags for code built against opforge", epilog=EPILOG,
                       description="Print the include paths, compile flags or link flags that an op module "
                                   "needs, one per line (prefixed by its kind when several are asked for), "
                                   "after checking the compiler against opforge's own build.")
    p.add_argument("--backend", choices=list(_formulas.BUILDS), default=_build_info.BACKEND,
                   help="backend to build for (default: this opforge's)")
    p.add_argument("--includes", action="store_true", help="-I paths")
    p.add_argument("--cflags", action="store_true", help="compile flags (with the -I paths)")
    p.add_argument("--ldflags", action="store_true", help="link flags")
    p.set_defaults(func=_config)

    args = parser.parse_args(argv)
    from opforge.codegen import SpecError, SpecErrors

    try:
        return int(args.func(args))
    except _Usage as exc:
        print(f"opforge {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SpecErrors as exc:
        print(exc, file=sys.stderr)
        print(f"{len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''}", file=sys.stderr)
        return EXIT_FAILED
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
