#!/usr/bin/env bash
# Everything a GPU session needs that can be made on this (CPU) machine beforehand, so the device's
# few minutes go to running, not to downloading or compiling:
#
#   bash tools/gpu_prepare.sh [BASE_REV]
#
# - .whl/: the wheels `tools/gpu_run.sh setup` installs there (tools/gpu_wheels.sh);
# - .gpu_scratch/base/src: the source tree at BASE_REV (when given), for the tune step's A/B
#   (`TUNE_BASE=$PWD/.gpu_scratch/base`);
# - .gpu_scratch/tune/tune_<here|base>_<op>: benchmarks/cuda_rows_tune.cu compiled with this machine's
#   nvcc for $OPFORGE_CUDA_ARCH (default 9.0) against this tree's src/ and the base's, one binary per op
#   (the CUDA runtime linked statically: they need only the driver there), and a stamp of the
#   sources they were built from (gpu_run.sh runs them only while the sources match).
# The procedure of a GPU session: docs/notes/gpu-sessions.md.
# Both folders are ignored by git (.git/info/exclude); the device tool carries them with
# `carry: [".whl", ".gpu_scratch"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${OPFORGE_CUDA_ARCH:-9.0}
# shellcheck source=tools/tune_lib.sh
source tools/tune_lib.sh  # tune_compile, tune_stamp
bash tools/gpu_wheels.sh
grep -qx '/.gpu_scratch/' .git/info/exclude 2>/dev/null || echo /.gpu_scratch/ >> .git/info/exclude
rm -rf .gpu_scratch/tune .gpu_scratch/base
mkdir -p .gpu_scratch/tune
trees=(here)
if [ -n "${1:-}" ]; then
  mkdir -p .gpu_scratch/base
  git archive "$1" src | tar -x -C .gpu_scratch/base
  trees+=(base)
fi
for t in "${trees[@]}"; do
  root=$PWD; [ "$t" = base ] && root=$PWD/.gpu_scratch/base
  for k in 0 1 2 3 4 5 6; do
    tune_compile "$root" "$k" ".gpu_scratch/tune/tune_${t}_$k" || { echo "tune harness, op $k, tree $t: nvcc failed"; exit 1; }
  done
done
# the sources each set was built from (tools/gpu_run.sh tune uses a set only when they match)
{ tune_stamp here "$PWD"; if [ -d .gpu_scratch/base ]; then tune_stamp base "$PWD/.gpu_scratch/base"; fi; } \
  > .gpu_scratch/tune/stamp
cat .gpu_scratch/tune/stamp
ls -l .gpu_scratch/tune
