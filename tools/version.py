#!/usr/bin/env python3
"""Print the package version with the backend as its local label: 0.1.0+cpu, 0.1.0+cu130.

meson's project() runs this before options are readable, so the backend is read from the
`-Dops_backend=` argument of the meson command that runs us (default cpu); meson.build checks
that the label and get_option('ops_backend') agree, so a wheel is never mislabelled.
"""

import os
import re
import sys

VERSION = "0.1.0"
LABELS = {"cpu": "cpu", "cuda": "cu130"}


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
    backend = backend_from_parent()
    sys.stdout.write(f"{VERSION}+{LABELS.get(backend, backend)}\n")
