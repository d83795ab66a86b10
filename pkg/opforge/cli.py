"""The ``opforge`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence


def _check(args: argparse.Namespace) -> int:
    from opforge.codegen import SpecError, SpecErrors, load_specs

    paths = args.paths or [Path(__file__).parent / "op_specs"]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        for p in missing:
            print(f"{p}: no such file or directory", file=sys.stderr)
        return 2
    try:
        ops = load_specs(paths, kernel_root=args.kernel_root)
    except SpecErrors as exc:
        print(exc, file=sys.stderr)
        print(f"{len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''}", file=sys.stderr)
        return 1
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{len(ops)} op spec{'s' if len(ops) != 1 else ''} OK")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description="Build tensor ops from YAML specs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate op specs",
                       description="Validate op specs (files or directories of *.yaml); "
                                   "errors are printed as path:line:col: key: message. "
                                   "Exit status: 0 valid, 1 invalid specs, 2 bad usage.")
    p.add_argument("paths", nargs="*", type=Path, help="spec files or directories (default: the installed specs)")
    p.add_argument("--kernel-root", type=Path, default=None,
                   help="project root holding src/kernels/<target>/<op>.cpp for cpp ops (checked when given)")
    p.set_defaults(func=_check)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
