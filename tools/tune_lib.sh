# Shared by tools/gpu_run.sh (tune step) and tools/gpu_prepare.sh: how the row-kernel tune harness
# (benchmarks/cuda_rows_tune.cu) is built, and the stamp of what a build was made from. Sourced, in
# the repository root, with ARCH set (9.0).

# tune_compile ROOT OP OUT: the harness for op OP against ROOT/src, to the executable OUT
tune_compile() {
  nvcc -O3 -std=c++17 -arch="sm_${ARCH/./}" --expt-relaxed-constexpr -I"$1/src" -DTUNE_OP="$2" -o "$3" \
    benchmarks/cuda_rows_tune.cu
}

# tune_stamp NAME ROOT: one line naming what NAME's binaries are built from: ROOT's src/ and the
# harness (content hashes: no git needed on the device) and the architecture
tune_stamp() {
  local tree
  tree=$(cd "$2" && find src -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
  echo "$1 src=$tree harness=$(sha256sum benchmarks/cuda_rows_tune.cu | cut -c1-16) arch=$ARCH"
}
