#!/usr/bin/env bash
# Downloads, on this (CPU) machine, the wheels `tools/gpu_run.sh setup` installs on the GPU machine,
# which has no network and lacks them (Python 3.12 there): into .whl/ at the repository root, which
# git ignores (the device tool's `carry: [".whl"]` takes it along). About 10 MB.
#
#   bash tools/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux2014_x86_64)
# the build's requirements the device image lacks (pyproject.toml's build-system and test extra)
python3 -m pip download -q "${P[@]}" cerberus==1.3.8 scipy-openblas32==0.3.34.481.3 meson-python==0.22.1 \
  pyproject-metadata==0.12.1 meson==1.12.1 pybind11==3.1.0 expecttest
ls -1 .whl
