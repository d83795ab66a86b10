#!/usr/bin/env python3
"""Run the code generator from the source tree (as meson does): python tools/codegen.py ..."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.__main__ import main  # noqa: E402

sys.exit(main())
