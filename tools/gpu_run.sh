#!/usr/bin/env bash
# The GPU verification of the cuda wheel, on a machine with a CUDA device (the device tool's H100):
#
#   bash tools/gpu_run.sh setup build test bench     (any subset, in order)
#
# setup: installs the build's Python requirements that machine lacks from wheels carried in .whl/
#        (cerberus, scipy-openblas32, meson-python, pyproject-metadata, meson: see
#        docs/notes/cuda-backend-research.md §3.2 for the download command) into /tmp/site;
# build: meson build of the cuda backend with the machine's nvcc (tools/dev.sh, OPFORGE_BACKEND=cuda);
# test:  the fast test suite against that build (GPU tests included), junit and log to $OUT;
# bench: benchmarks/cuda.py, to $OUT/cuda.md.
# Logs go to $OUT (default /tmp/opforge-gpu-out).
set -uo pipefail
OUT=${OUT:-/tmp/opforge-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPFORGE_BACKEND=cuda
export OPFORGE_BUILD_DIR=${OPFORGE_BUILD_DIR:-$PWD/build/cuda}
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
ARCH=${OPFORGE_CUDA_ARCH:-9.0}

step_setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  { nvidia-smi; which nvcc; nvcc --version; g++ --version | head -1; meson --version
    python3 -c 'import sys, torch; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  } > "$OUT/env.txt" 2>&1
  tail -4 "$OUT/env.txt"
}
step_build() {
  OPFORGE_MESON_ARGS="-Dops_cuda_arch=$ARCH" tools/dev.sh build > "$OUT/build.log" 2>&1 \
    || { grep -m 40 -B 3 -A 12 -E 'error|Error' "$OUT/build.log"; return 1; }
  PYTHONPATH=$OPFORGE_BUILD_DIR/python:$PYTHONPATH python3 -c \
    'import opforge, opforge.cuda as c; print(opforge.__version__, opforge.backend, c.is_available(), c.device_count(), c.runtime_version())' \
    | tee "$OUT/smoke.txt"
}
step_test() {
  local xdist=""
  python3 -c 'import xdist' 2>/dev/null && xdist="-n 8"
  PYTHONPATH=$OPFORGE_BUILD_DIR/python:$PYTHONPATH timeout 540 python3 -m pytest tests/cuda tests/runtime tests/ops -q \
    -p no:cacheprovider $xdist -m 'not slow' -W ignore::DeprecationWarning -W ignore::UserWarning \
    --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
  local rc=$?
  tail -25 "$OUT/pytest.log"
  return $rc
}
step_bench() {
  PYTHONPATH=$OPFORGE_BUILD_DIR/python:$PYTHONPATH timeout 420 python3 benchmarks/cuda.py --out "$OUT/cuda.md" \
    > "$OUT/bench.log" 2>&1
  local rc=$?
  cat "$OUT/cuda.md" 2>/dev/null || tail -30 "$OUT/bench.log"
  return $rc
}
for s in "$@"; do "step_$s" || exit $?; done
