#!/usr/bin/env bash
# The GPU verification of the cuda wheel, on a machine with a CUDA device (the device tool's H100/H200):
#
#   bash tools/gpu_run.sh setup build test bench sanitize     (any subset, in order)
#   (steps: setup build test bench breakdown jax profile tune rows graphs sanitize)
#
# setup:    installs the build's Python requirements that machine lacks from wheels carried in .whl/
#           (cerberus, scipy-openblas32, meson-python, pyproject-metadata, meson, pybind11, expecttest:
#           `bash tools/gpu_wheels.sh` downloads them on the CPU machine) into /tmp/site;
# build:    meson build of the cuda backend with the machine's nvcc (tools/dev.sh, OPFORGE_BACKEND=cuda);
# test:     the fast test suite against that build (GPU tests included), junit and log to $OUT;
# bench:    benchmarks/cuda.py $BENCH_ARGS, to $OUT/cuda.md;
# breakdown: benchmarks/cuda_breakdown.py $BREAKDOWN_ARGS, to $OUT/breakdown.md: for the figures that
#           miss (the MLP step, cross_entropy, the 16-bit rows), each kernel's device time per step through
#           opforge.torch and through torch's built-ins, the device's idle time and the host's
#           synchronizing calls (torch.profiler; seconds, where Nsight Compute takes minutes);
# jax:      opforge.jax on XLA's CUDA devices (the JAX tests with JAX's CUDA plugin, no preallocation);
# profile:  Nsight Compute over benchmarks/cuda_profile.py (the row ops that miss their targets, beside
#           torch's kernels): speed of light, memory, occupancy, launch and warp-state sections as
#           CSV to $OUT/profile.csv, the report to $OUT/profile.ncu-rep;
# tune:     benchmarks/cuda_rows_tune.cu: the row kernels under other launch shapes (threads per row,
#           rows per block, blocks per SM of __launch_bounds__) and the column sums with more row
#           chunks: registers, occupancy, time and share of the copy's bandwidth, as CSV to
#           $OUT/tune.csv, summed up in $OUT/tune.md; with TUNE_BASE=<dir holding another tree's src/>
#           the same kernels of that tree too (a column says which), to compare two trees; binaries
#           that `tools/gpu_prepare.sh` built on the CPU machine (.gpu_scratch/tune/) are run as they
#           are when its stamp matches these sources and architecture, so the device spends no time
#           in nvcc;
# rows:     the row kernels' tests alone (softmax, norms, cross_entropy: tests/cuda/test_cuda_row_ops.py
#           and those ops' cases in test_cuda_ops.py), for a change to them only;
# graphs:   compute-sanitizer's memcheck over tests/cuda/test_cuda_graphs.py (standalone CUDA graphs:
#           the allocator's capture paths, the memory a graph keeps, replays after frees);
# sanitize: compute-sanitizer's memcheck over the CUDA op tests of every reduction path and edge shape,
#           the row kernels (warp and block rows), out-of-range indices and labels, gathers and scatters.
# Logs go to $OUT (default /tmp/opforge-gpu-out); each step's seconds to $OUT/steps.txt. The whole run
# keeps within $GPU_RUN_BUDGET seconds (default 540): a step gets what is left, and a step that
# would start with under a minute left is skipped and says so (a device session is short).
set -uo pipefail
OUT=${OUT:-/tmp/opforge-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPFORGE_BACKEND=cuda
export OPFORGE_BUILD_DIR=${OPFORGE_BUILD_DIR:-$PWD/build/cuda}
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
ARCH=${OPFORGE_CUDA_ARCH:-9.0}
# The distribution's compilers, not another GCC that comes first on PATH: the device image's
# /opt/gcc links libstdc++ statically (no libstdc++.so beside it), which put a copy of libstdc++ in
# each of opforge's two libraries, and number formatting (every error message with a shape) then
# crashed in the copy (2026-11-25, see benchmarks/results/cuda-tests.md).
[ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++ CC=/usr/bin/gcc
T0=$(date +%s)
DEADLINE=$((T0 + ${GPU_RUN_BUDGET:-540}))
left() { echo $((DEADLINE - $(date +%s))); }
# a step's limit: its own, or what is left (at least 1 s: `timeout 0` would mean no limit)
cap() { local l; l=$(left); l=$(( $1 < l ? $1 : l )); echo $(( l > 1 ? l : 1 )); }
run_py() { PYTHONPATH=$OPFORGE_BUILD_DIR/python:$PYTHONPATH "$@"; }

step_setup() {
  if [ -f /tmp/site/.opforge-setup ]; then echo "setup: done already on this machine"; return 0; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  touch /tmp/site/.opforge-setup
  { nvidia-smi; which nvcc; nvcc --version; g++ --version | head -1; meson --version; nproc
    python3 -c 'import sys, numpy, torch, pybind11; print(sys.version); print("numpy", numpy.__version__, "pybind11", pybind11.__version__); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  } > "$OUT/env.txt" 2>&1
  tail -4 "$OUT/env.txt"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}
# What the build was made from (content hashes: no git on the device's copy)
src_stamp() { find src op_specs codegen pkg meson.build meson.options -type f -not -path '*/__pycache__/*' -print0 2>/dev/null | sort -z | xargs -0 cat | sha1sum | cut -c1-16; }
step_build() {
  OPFORGE_MESON_ARGS="-Dops_cuda_arch=$ARCH" timeout "$(cap 400)" tools/dev.sh build > "$OUT/build.log" 2>&1 \
    || { grep -m 40 -B 3 -A 12 -E 'error|Error' "$OUT/build.log"; tail -5 "$OUT/build.log"; return 1; }
  src_stamp > "$OPFORGE_BUILD_DIR/.opforge-src-stamp"
  run_py python3 -c \
    'import opforge, opforge.cuda as c; print(opforge.__version__, opforge.backend, c.is_available(), c.device_count(), c.runtime_version())' \
    | tee "$OUT/smoke.txt"
  for lib in "$OPFORGE_BUILD_DIR"/libopforge.so "$OPFORGE_BUILD_DIR"/_C*.so; do
    readelf -d "$lib" | grep -q 'NEEDED.*libstdc++' \
      || { echo "$lib does not load libstdc++.so: the C++ compiler (${CXX:-c++}) linked it statically"; return 1; }
  done
}
# The steps that import opforge: on a machine without the build (a fresh one, after the warm one
# went back), or with a build of other sources (a fix between two calls), setup and build first
# rather than fail on the import or measure the old code.
ensure_built() {
  if [ -d "$OPFORGE_BUILD_DIR/python/opforge" ]; then
    [ "$(src_stamp)" = "$(cat "$OPFORGE_BUILD_DIR/.opforge-src-stamp" 2>/dev/null)" ] && return 0
    echo "the build here is of other sources: building again"
  else
    echo "no build on this machine (a fresh one): setup and build first"
  fi
  step_setup && step_build
}
step_test() {
  ensure_built || return 1
  local xdist=""
  python3 -c 'import xdist' 2>/dev/null && xdist="-n 12"
  run_py timeout "$(cap 300)" python3 -m pytest tests/cuda tests/runtime tests/ops -q -p no:cacheprovider $xdist \
    -m 'not slow' -W ignore::DeprecationWarning -W ignore::UserWarning -rfE \
    --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
  local rc=$?
  grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -60
  tail -3 "$OUT/pytest.log"
  return 0  # later steps still run; the counts are in pytest.log and junit.xml
}
step_bench() {
  ensure_built || return 1
  # shellcheck disable=SC2086
  run_py timeout "$(cap 200)" python3 benchmarks/cuda.py ${BENCH_ARGS:-} --out "$OUT/cuda.md" > "$OUT/bench.log" 2>&1
  cat "$OUT/cuda.md" 2>/dev/null || tail -30 "$OUT/bench.log"
  return 0
}
step_breakdown() {
  ensure_built || return 1
  # shellcheck disable=SC2086
  run_py timeout "$(cap 200)" python3 benchmarks/cuda_breakdown.py ${BREAKDOWN_ARGS:-} --out "$OUT/breakdown.md" \
    > "$OUT/breakdown.log" 2>&1
  echo "breakdown rc $?"; grep -E '^###|^\| (opforge|torch) \| [0-9]' "$OUT/breakdown.md" 2>/dev/null || tail -20 "$OUT/breakdown.log"
  return 0
}
step_jax() {
  ensure_built || return 1
  run_py env XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(cap 200)" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 8 \
    tests/frameworks/test_jax_ops.py tests/frameworks/test_jax_models.py -rfE -W ignore::DeprecationWarning \
    --junitxml="$OUT/junit-jax.xml" > "$OUT/jax.log" 2>&1
  run_py python3 -c 'import jax; print(jax.__version__, jax.devices())' >> "$OUT/jax.log" 2>&1
  grep -E '^(FAILED|ERROR)' "$OUT/jax.log" | head -30
  tail -3 "$OUT/jax.log"
  return 0
}
step_profile() {
  ensure_built || return 1
  run_py timeout "$(cap 300)" ncu --clock-control none --target-processes all \
    --kernel-name regex:'softmax|layer_norm|norm_rows|rows|cunn|vectorized_layer_norm' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis \
    -f -o "$OUT/profile" python3 benchmarks/cuda_profile.py ${PROFILE_ARGS:-} > "$OUT/profile.log" 2>&1
  echo "ncu rc $?"; tail -5 "$OUT/profile.log"
  ncu --import "$OUT/profile.ncu-rep" --csv --page details > "$OUT/profile.csv" 2>/dev/null
  wc -l "$OUT/profile.csv"
  return 0
}
# shellcheck source=tools/tune_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/tune_lib.sh"  # tune_compile, tune_stamp
step_tune() {
  local d=/tmp/opforge-tune names=(here) roots=("$PWD") pids=() r k pre=.gpu_scratch/tune
  [ -n "${TUNE_BASE:-}" ] && { names+=(base); roots+=("$TUNE_BASE"); }
  mkdir -p "$d"
  for r in "${!roots[@]}"; do
    # binaries prebuilt on the CPU machine, when they were built from exactly these sources
    if [ -f "$pre/tune_${names[$r]}_6" ] && grep -qxF "$(tune_stamp "${names[$r]}" "${roots[$r]}")" "$pre/stamp" 2>/dev/null; then
      for k in 0 1 2 3 4 5 6; do cp "$pre/tune_${names[$r]}_$k" "$d/tune_${r}_$k" && chmod +x "$d/tune_${r}_$k"; done
      echo "tune: ${names[$r]}: prebuilt binaries"
      continue
    fi
    [ -d "$pre" ] && echo "tune: ${names[$r]}: the prebuilt binaries are of other sources; compiling"
    for k in 0 1 2 3 4 5 6; do  # (one binary per op, built in parallel: each is minutes of nvcc)
      ARCH=$ARCH timeout "$(cap 300)" bash -c 'source tools/tune_lib.sh && tune_compile "$@"' _ "${roots[$r]}" "$k" \
        "$d/tune_${r}_$k" > "$d/build_${r}_$k.log" 2>&1 &
      pids+=($!)
    done
  done
  for k in "${pids[@]}"; do wait "$k"; done
  { echo "tree,op,dtype,shape,group,threads,min_blocks,registers,blocks_per_sm,ms,GB/s,share_of_copy,today"
    for r in "${!roots[@]}"; do
      for k in 0 1 2 3 4 5 6; do
        if [ -x "$d/tune_${r}_$k" ]; then
          timeout "$(cap 120)" "$d/tune_${r}_$k" --no-header 2> "$d/run_${r}_$k.err" | sed "s/^/${names[$r]},/"
          [ "${PIPESTATUS[0]}" -eq 0 ] || echo "${names[$r]},run of op $k failed: $(head -c 300 "$d/run_${r}_$k.err" | tr '\n,' '  ')"
        else echo "${names[$r]},build of op $k failed: $(grep -m 3 error "$d/build_${r}_$k.log" | tr '\n,' '  ')"; fi
      done
    done
  } > "$OUT/tune.csv"
  wc -l "$OUT/tune.csv"; grep failed "$OUT/tune.csv" | head -5
  python3 benchmarks/tune_summary.py "$OUT/tune.csv" > "$OUT/tune.md" && cat "$OUT/tune.md"
  return 0
}
step_rows() {
  ensure_built || return 1
  run_py timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider -n 12 -m 'not slow' -rfE \
    tests/cuda/test_cuda_row_ops.py tests/cuda/test_cuda_ops.py -k 'softmax or norm or cross_entropy or rows' \
    > "$OUT/rows.log" 2>&1
  grep -E '^(FAILED|ERROR)' "$OUT/rows.log" | head -30
  tail -3 "$OUT/rows.log"
  return 0
}
step_graphs() {
  ensure_built || return 1
  # (API errors not reported: two tests make CUDA calls fail on purpose, a copy to the host inside a
  # capture and a reset from another thread; the memory checks stay, and failed calls raise in the tests;
  # one process: a file's tests need no workers, each of which would start CUDA under the sanitizer)
  run_py timeout "$(cap 240)" compute-sanitizer --tool memcheck --target-processes all --leak-check no --error-exitcode 9 \
    --report-api-errors no \
    python3 -m pytest -p no:benchmark -n 0 tests/cuda/test_cuda_graphs.py -q -p no:cacheprovider -rfE \
    -W ignore::DeprecationWarning -W ignore::UserWarning \
    > "$OUT/graphs.log" 2>&1
  echo "compute-sanitizer rc $?"; grep -m 30 -E '=========|passed|failed|^(FAILED|ERROR)' "$OUT/graphs.log"
  return 0
}
# (one line: pytest refuses a -k expression with a newline in it)
SANITIZE_K='edge_shapes or every_layout or max_min or logsumexp or strided or double_backward or out_of_range or embedding or take_and_scatter or column_sums or bias_add or (rows and (1025 or 7) and float32) or (affine_backward and float32 and (4096 or 64)) or affine_backward_unaligned'
step_sanitize() {
  ensure_built || return 1
  run_py timeout "$(cap 150)" compute-sanitizer --tool memcheck --target-processes all --leak-check no --error-exitcode 9 \
    python3 -m pytest -p no:benchmark tests/cuda/test_cuda_ops.py tests/cuda/test_cuda_row_ops.py -q -p no:cacheprovider -x \
    -k "$SANITIZE_K" \
    > "$OUT/sanitize.log" 2>&1
  echo "compute-sanitizer rc $?"; grep -m 20 -E '=========|passed|failed' "$OUT/sanitize.log"
  return 0
}
for s in "$@"; do  # (every name checked before any step runs: a typo costs no device time)
  declare -F "step_$s" > /dev/null || { echo "no step '$s' (steps: setup build test bench breakdown jax profile tune rows graphs sanitize)"; exit 2; }
done
for s in "$@"; do
  if [ "$(left)" -lt 60 ]; then echo "step $s skipped: $(left) s left of the budget" | tee -a "$OUT/steps.txt"; continue; fi
  t=$(date +%s); echo "== $s"
  "step_$s"; rc=$?
  echo "$s rc=$rc $(( $(date +%s) - t ))s" | tee -a "$OUT/steps.txt"
  [ $rc -eq 0 ] || exit $rc
done
