// The row kernels of src/kernels/cuda (softmax, log_softmax, layer_norm, rms_norm and backward
// ops) and the column sums (col_sums(): norm_weight_grad, bias_add_grad, sum_to_like) under other
// launch shapes than launch_rows() and col_sums() give them: threads per row group, rows per
// block and __launch_bounds__'s blocks per SM (which caps the registers ptxas may use, so more
// rows are in flight per SM). For each case: registers, resident blocks per SM, the median time
// and the bandwidth as a share of a device-to-device copy of the same bytes, as CSV. The row ops
// are the library's own (the headers), so building this against two source trees compares them:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -Isrc -o /tmp/tune benchmarks/cuda_rows_tune.cu
//   /tmp/tune > tune.csv          (tools/gpu_run.sh tune builds one binary per op, in parallel)
//
// (col_sums rows: `group` is the number of row chunks, `min_blocks` 1 marks col_sums()'s own choice.)
//
// Nothing here runs in the library: it tells which launch shape launch_rows() should pick.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/norm_rows.cuh"
#include "kernels/cuda/softmax_rows.cuh"

namespace rows = ::opforge::kernels::cuda::rows;
namespace smx = ::opforge::kernels::cuda::smx;
namespace nrm = ::opforge::kernels::cuda::norm;
using ::opforge::BFloat16;

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// row_kernel's body with the launch shape as parameters: Threads per block, G per row group; Held
// (a tree with rows::RowPath): the kernel compiles only the path rows that fit in registers take,
// else only the streamed one, as launch_rows() launches block rows (a base tree: both, per row).
template <int G, int Threads, int MinBlocks, typename Op, bool Held>
__global__ void __launch_bounds__(Threads, MinBlocks) tune_kernel(int64_t rows_, Op op) {
  static_assert(Threads % G == 0 && (G == rows::kWarp || G == Threads), "warp groups or one group per block");
  constexpr int kPerBlock = Threads / G;
  const int lane = static_cast<int>(threadIdx.x % G);
  for (int64_t r = int64_t(blockIdx.x) * kPerBlock + threadIdx.x / G; r < rows_; r += int64_t(gridDim.x) * kPerBlock) {
#ifdef OPFORGE_ROW_PATHS
    constexpr rows::RowPath kPath = G == rows::kWarp ? rows::RowPath::Any : Held ? rows::RowPath::Held : rows::RowPath::Streamed;
    op.template row<G, kPath>(r, lane);
#else
    op.template row<G>(r, lane);
#endif
  }
}

// Whether op's rows of n elements fit in the registers of a group of G (a base tree without
// row_value: the answer does not matter, its kernels decide per row).
template <int G, typename Op>
bool held_rows(int64_t n) {
#ifdef OPFORGE_ROW_PATHS
  return n <= int64_t(G) * rows::kHeld<typename Op::row_value>;
#else
  return n >= 0;
#endif
}

template <typename T>
__global__ void fill(T* p, int64_t n, unsigned seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = T(static_cast<float>(h % 20001u) / 5000.0f - 2.0f);
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
  }
  template <typename F>
  float median_ms(F&& f, int reps = 25) {
    f();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      CHECK(cudaEventRecord(a));
      f();
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

template <typename T>
const char* name_of() {
  return sizeof(T) == 4 ? "float32" : "bfloat16";
}

struct Buffers {
  void *x, *y, *g, *dx, *w, *b, *mean, *rstd, *dmean, *drstd;
};

template <int G_, int Threads_, int MinBlocks_>
struct Launch {
  static constexpr int G = G_, Threads = Threads_, MinBlocks = MinBlocks_;
};

// The blocks per SM launch_rows() asks for: rows::RowMinBlocks, or in a base tree from before it,
// 1 for warp rows and 2 for block rows.
template <int G, typename Op>
constexpr int today_min_blocks() {
#ifdef OPFORGE_ROW_MIN_BLOCKS
  return rows::RowMinBlocks<G, Op>::value;
#else
  return G == rows::kWarp ? 1 : 2;
#endif
}

template <typename L, typename Op>
void run_case(Timer& timer, const char* op_name, const char* dtype, int64_t R, int64_t N, double bytes, double copy_bw,
              const Op& op) {
  auto kernel = held_rows<L::G, Op>(N) ? tune_kernel<L::G, L::Threads, L::MinBlocks, Op, true>
                                       : tune_kernel<L::G, L::Threads, L::MinBlocks, Op, false>;
  cudaFuncAttributes attr{};
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, L::Threads, 0));
  constexpr int kPerBlock = L::Threads / L::G;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(int64_t(1) << 20, (R + kPerBlock - 1) / kPerBlock));
  const float ms = timer.median_ms([&] { kernel<<<blocks, L::Threads>>>(R, op); });
  CHECK(cudaGetLastError());
  const bool today = (L::G == rows::kWarp ? L::Threads == rows::kWarp * rows::kShortRows : L::Threads == rows::kLongThreads) &&
                     L::MinBlocks == today_min_blocks<L::G, Op>();
  std::printf("%s,%s,%lldx%lld,%d,%d,%d,%d,%d,%.4f,%.3f,%.2f,%d\n", op_name, dtype, static_cast<long long>(R),
              static_cast<long long>(N), L::G, L::Threads, L::MinBlocks, attr.numRegs, resident, ms, bytes / ms * 1e-6,
              bytes / ms / copy_bw, today ? 1 : 0);
  std::fflush(stdout);
}

// The launch shapes tried: a warp per row (rows of up to 1024 elements), 4 or 8 rows to a block,
// at 1 to 8 blocks per SM (5: a 96-register cap, where 16-bit softmax warp rows take 103 since
// exp_row); a block per row (longer rows). The `today` column marks what launch_rows() runs.
using ShortRows = std::tuple<Launch<32, 128, 1>, Launch<32, 128, 4>, Launch<32, 128, 5>, Launch<32, 128, 6>, Launch<32, 128, 8>,
                             Launch<32, 256, 2>, Launch<32, 256, 3>, Launch<32, 256, 4>>;
using LongRows = std::tuple<Launch<256, 256, 2>, Launch<256, 256, 3>, Launch<256, 256, 4>, Launch<512, 512, 1>,
                            Launch<512, 512, 2>, Launch<1024, 1024, 1>>;

template <typename Op, typename... L>
void run_all(std::tuple<L...>*, Timer& timer, const char* op_name, const char* dtype, int64_t R, int64_t N, double bytes,
             double copy_bw, const Op& op) {
  (run_case<L>(timer, op_name, dtype, R, N, bytes, copy_bw, op), ...);
}

// Every launch shape of one op for its row length.
template <typename Op>
void sweep(Timer& timer, const char* op_name, const char* dtype, int64_t R, int64_t N, double bytes, double copy_bw,
           const Op& op) {
  if (N <= rows::kShortRow) {
    run_all(static_cast<ShortRows*>(nullptr), timer, op_name, dtype, R, N, bytes, copy_bw, op);
  } else {
    run_all(static_cast<LongRows*>(nullptr), timer, op_name, dtype, R, N, bytes, copy_bw, op);
  }
}

// The column sums (norm_weight_grad, bias_add_grad, sum_to_like: out[j] = sum over the rows of
// x[r, j]) split into more row chunks than col_sums() picks (more blocks in flight, a longer
// second stage): its two kernels as col_sums() launches them, chunk counts c, 2c, 4c and 8c.
template <typename T>
void col_sums_sweep(Timer& timer, const Buffers& buf, int64_t R, int64_t N, double bytes, double copy_bw) {
  using A = rows::acc_t<T>;
  using F = nrm::ReadAt<T, A>;
  const F f{static_cast<const T*>(buf.x), N};
  const int64_t col_blocks = (N + rows::kColTile - 1) / rows::kColTile;
  const int64_t want = std::max<int64_t>(1, 512 / col_blocks);  // (as col_sums() computes it)
  const int64_t today = std::clamp<int64_t>((R + rows::kColRows * 64 - 1) / (rows::kColRows * 64), 1, want);
  A* part = nullptr;
  A* total = nullptr;
  CHECK(cudaMalloc(&part, static_cast<size_t>(8 * today * N) * sizeof(A)));
  CHECK(cudaMalloc(&total, static_cast<size_t>(N) * sizeof(A)));
  cudaFuncAttributes attr{};
  CHECK(cudaFuncGetAttributes(&attr, rows::col_partial_kernel<A, F>));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, rows::col_partial_kernel<A, F>,
                                                      rows::kColTile * rows::kColRows, 0));
  for (int64_t chunks : {today, 2 * today, 4 * today, 8 * today}) {
    if (chunks > R) break;
    const int64_t chunk = (R + chunks - 1) / chunks;
    const dim3 block(rows::kColTile, rows::kColRows);
    const float ms = timer.median_ms([&] {
      rows::col_partial_kernel<A, F><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks)), block>>>(
          R, N, chunk, f, part);
      if (chunks > 1) {
        rows::col_partial_kernel<A, rows::ReadPart<A>><<<dim3(static_cast<unsigned>(col_blocks), 1), block>>>(
            chunks, N, chunks, rows::ReadPart<A>{part, N}, total);
      }
      rows::store_cols<T, A><<<static_cast<unsigned>((N + 255) / 256), 256>>>(N, chunks > 1 ? total : part,
                                                                               static_cast<T*>(buf.y));
    });
    CHECK(cudaGetLastError());
    std::printf("col_sums,%s,%lldx%lld,%lld,%d,%d,%d,%d,%.4f,%.3f,%.2f,%d\n", name_of<T>(), static_cast<long long>(R),
                static_cast<long long>(N), static_cast<long long>(chunks), rows::kColTile * rows::kColRows,
                chunks == today ? 1 : 0, attr.numRegs, resident, ms, bytes / ms * 1e-6, bytes / ms / copy_bw,
                chunks == today ? 1 : 0);
    std::fflush(stdout);
  }
  CHECK(cudaFree(part));
  CHECK(cudaFree(total));
}

// TUNE_OP=k builds only the k-th op of run_dtype() (the script builds the six in parallel: each
// takes minutes of nvcc); -1 (the default) all of them.
#ifndef TUNE_OP
#define TUNE_OP -1
#endif
constexpr int kOp = TUNE_OP;

template <typename T>
void run_dtype(Timer& timer, const Buffers& buf, int64_t R, int64_t N) {
  const char* dt = name_of<T>();
  const double e = static_cast<double>(R) * static_cast<double>(N) * sizeof(T);
  // the copy anchor: bytes read + written per ms by a device-to-device copy of one tensor
  const float copy_ms = timer.median_ms([&] { CHECK(cudaMemcpyAsync(buf.y, buf.x, static_cast<size_t>(e), cudaMemcpyDeviceToDevice)); });
  const double bw = 2 * e / copy_ms;
  std::printf("copy,%s,%lldx%lld,,,,,,%.4f,%.1f,1.00\n", dt, static_cast<long long>(R), static_cast<long long>(N), copy_ms,
              bw * 1e-6);
  auto t = [](void* p) { return static_cast<T*>(p); };
  const bool vec = rows::vec_ok<T>(N, {buf.x, buf.y, buf.g, buf.dx, buf.w, buf.b});
  using C = ::opforge::compute_t<T>;
  if constexpr (kOp < 0 || kOp == 0) sweep(timer, "softmax", dt, R, N, 2 * e, bw, smx::ForwardRow<T, smx::Kind::Softmax>{t(buf.x), t(buf.y), N, vec});
  if constexpr (kOp < 0 || kOp == 1) sweep(timer, "log_softmax", dt, R, N, 2 * e, bw,
        smx::ForwardRow<T, smx::Kind::LogSoftmax>{t(buf.x), t(buf.y), N, vec});
  if constexpr (kOp < 0 || kOp == 2) sweep(timer, "softmax_backward", dt, R, N, 3 * e, bw,
        smx::BackwardRow<T, smx::Kind::Softmax>{t(buf.g), t(buf.y), t(buf.dx), N, vec});
  if constexpr (kOp < 0 || kOp == 3) sweep(timer, "layer_norm", dt, R, N, 2 * e, bw,
        nrm::LayerNormRow<T>{t(buf.x), t(buf.w), t(buf.b), t(buf.y), t(buf.mean), t(buf.rstd), N, C(1e-5), vec});
  if constexpr (kOp < 0 || kOp == 4) sweep(timer, "rms_norm", dt, R, N, 2 * e, bw,
        nrm::RmsNormRow<T>{t(buf.x), t(buf.w), t(buf.y), t(buf.rstd), N, C(1e-5), vec});
  if constexpr (kOp < 0 || kOp == 5) sweep(timer, "layer_norm_backward", dt, R, N, 3 * e, bw,
        nrm::NormBackwardRow<T, false>{t(buf.g), t(buf.x), t(buf.w), t(buf.mean), t(buf.rstd), t(buf.dmean),
                                        t(buf.drstd), t(buf.dx), N, vec});
  if constexpr (kOp < 0 || kOp == 6) col_sums_sweep<T>(timer, buf, R, N, e, bw);
}

template <typename T>
void fill_all(const Buffers& buf, int64_t R, int64_t N) {
  const int64_t e = R * N;
  fill<T><<<1024, 256>>>(static_cast<T*>(buf.x), e, 1u);
  fill<T><<<1024, 256>>>(static_cast<T*>(buf.g), e, 2u);
  fill<T><<<1024, 256>>>(static_cast<T*>(buf.y), e, 3u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.w), N, 4u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.b), N, 5u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.mean), R, 6u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.rstd), R, 7u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.dmean), R, 8u);
  fill<T><<<64, 256>>>(static_cast<T*>(buf.drstd), R, 9u);
  CHECK(cudaDeviceSynchronize());
}

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "--no-header") {
    std::printf("op,dtype,shape,group,threads,min_blocks,registers,blocks_per_sm,ms,GB/s,share_of_copy,today\n");
  }
  Timer timer;
  // (8192 x 32,000: cross_entropy's shape in benchmarks/cuda.py, rows streamed from memory)
  const int64_t shapes[3][2] = {{65536, 1024}, {8192, 8192}, {8192, 32000}};
  for (const auto& s : shapes) {
    const int64_t R = s[0], N = s[1];
    const size_t big = static_cast<size_t>(R * N) * 4, row = static_cast<size_t>(N) * 4, col = static_cast<size_t>(R) * 4;
    Buffers buf{};
    for (void** p : {&buf.x, &buf.y, &buf.g, &buf.dx}) CHECK(cudaMalloc(p, big));
    for (void** p : {&buf.w, &buf.b}) CHECK(cudaMalloc(p, row));
    for (void** p : {&buf.mean, &buf.rstd, &buf.dmean, &buf.drstd}) CHECK(cudaMalloc(p, col));
    fill_all<float>(buf, R, N);
    run_dtype<float>(timer, buf, R, N);
    fill_all<BFloat16>(buf, R, N);
    run_dtype<BFloat16>(timer, buf, R, N);
    for (void* p : {buf.x, buf.y, buf.g, buf.dx, buf.w, buf.b, buf.mean, buf.rstd, buf.dmean, buf.drstd}) CHECK(cudaFree(p));
  }
  return 0;
}
