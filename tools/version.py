#!/usr/bin/env python3
"""Print the package version with the backend as its local label: 0.1.0+cpu, 0.1.0+cu130.

meson's project() runs this before options are readable, so the backend is read from the
`-Dops_backend=` argument of the meson command that runs us (default cpu); meson.build checks
that the label and get_option('ops_backend') agree, so a wheel is never mislabelled.

    tools/version.py                   the version, labelled
    tools/version.py --build BACKEND   BACKEND's label, "available" or "unavailable", and its
                                       targets joined by commas (cu130 available cpu,cuda)

The labels and what is available come from codegen/targets.py (the target table), loaded on its
own: the codegen package's other modules need the build requirements, not yet there for meson's
project().
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

VERSION = "0.1.0"


def _target_table():
    path = Path(__file__).resolve().parent.parent / "codegen" / "targets.py"
    spec = importlib.util.spec_from_file_location("_opforge_targets", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up while the class is made)
    spec.loader.exec_module(module)
    return module


BUILDS = _target_table().BUILDS
LABELS = {name: build.wheel_label for name, build in BUILDS.items()}


def backend_from_parent() -> str:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return os.environ.get("OPFORGE_BACKEND", "cpu")
    backend = os.environ.get("OPFORGE_BACKEND", "cpu")
    for i, a in enumerate(args):
        text = a.decode(errors="replace")
        m = re.fullmatch(r"-Dops_backend=(\w+)", text)
        if m:
            backend = m.group(1)
        elif text == "-D" and i + 1 < len(args):
            m = re.fullmatch(r"ops_backend=(\w+)", args[i + 1].decode(errors="replace"))
            if m:
                backend = m.group(1)
    return backend


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        build = BUILDS.get(sys.argv[2])
        if build is None:
            sys.exit(f"unknown backend {sys.argv[2]!r}; one of: {', '.join(BUILDS)}")
        sys.stdout.write(f"{build.wheel_label} {'available' if build.available else 'unavailable'} "
                         f"{','.join(build.targets)}\n")
    else:
        backend = backend_from_parent()
        sys.stdout.write(f"{VERSION}+{LABELS.get(backend, backend)}\n")
