// What the linalg kernels of cuda share (matmul, matmul_backward_a/b, linear, linear_backward_weight):
// every product is a cuBLAS / cuBLASLt call (PyPI's nvidia-cublas, libcublas.so.13), over the NumPy
// matmul layouts of src/kernels/linalg_layout.h (shared with the cpu kernels). No hand-written GEMM.
//
// Row-major data, column-major cuBLAS: a row-major (r x c) matrix is the column-major (c x r) one,
// so C = op(A) @ op(B) is computed as C^T = op(B)^T @ op(A)^T with the operands swapped; nothing is
// copied or transposed.
//
// Precision (torch's defaults): float16 and bfloat16 inputs and outputs with float accumulation
// (CUBLAS_COMPUTE_32F, tensor cores, CUBLAS_GEMM_DEFAULT; the handle's default math mode lets cuBLAS
// use reduced-precision split-K reductions as torch's allow_{fp16,bf16}_reduced_precision_reduction
// = True do); float32 in full float32 (CUBLAS_COMPUTE_32F, never TF32: torch's default
// torch.backends.cuda.matmul.allow_tf32 = False); float64 in float64 (CUBLAS_COMPUTE_64F).
//
// Handles: one cuBLAS handle per (device, thread), made on first use; a thread's handles go back to
// a process-wide pool when it ends and are never destroyed (cublasDestroy during process exit can
// run after the CUDA context is gone). cuBLASLt runs on the same handle (a cublasHandle_t is a valid
// cublasLtHandle_t). Each call binds the handle to the current stream of the tensors' device and
// gives it a workspace from opforge's stream-ordered allocator (cublasSetWorkspace), so cuBLAS never
// allocates memory itself: the calls can be captured into a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/linalg_layout.h"
#include "runtime/cuda/cuda_utils.cuh"
#include "runtime/cuda/reduce.cuh"
#include "runtime/runtime.h"

namespace opforge::kernels::cuda::linalg {

using ::opforge::kernels::linalg::matmul_layout;
using ::opforge::kernels::linalg::MatmulLayout;
using ::opforge::kernels::linalg::Operand;
using ::opforge::kernels::linalg::simplify_batch;
using ::opforge::kernels::linalg::SimpleBatch;

// ---- types: storage type, compute type and the type of alpha/beta per opforge dtype

template <typename T>
struct BlasTypes;
template <>
struct BlasTypes<Half> {
  static constexpr cudaDataType_t data = CUDA_R_16F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr cudaDataType_t scale = CUDA_R_32F;
  using Scale = float;
};
template <>
struct BlasTypes<BFloat16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr cudaDataType_t scale = CUDA_R_32F;
  using Scale = float;
};
template <>
struct BlasTypes<float> {  // (not CUBLAS_COMPUTE_32F_FAST_TF32: torch's allow_tf32 is False by default)
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr cudaDataType_t scale = CUDA_R_32F;
  using Scale = float;
};
template <>
struct BlasTypes<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  static constexpr cudaDataType_t scale = CUDA_R_64F;
  using Scale = double;
};

template <typename C>
constexpr cudaDataType_t data_type() {
  return BlasTypes<C>::data;
}

// RuntimeError naming op for a cuBLAS status other than success.
inline void check(const char* op, cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    fail<RuntimeError>(op, "cuBLAS ", call, " failed: ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
  }
}

// ---- handles and workspaces

namespace detail {

constexpr int kMaxDevices = 64;  // (the CUDA runtime's limit: cuda_runtime.cu)
constexpr size_t kAlign = 256;   // cublasSetWorkspace's alignment

// Handles no thread holds, per device. Never destroyed (see the file's header).
struct HandlePool {
  std::mutex lock;
  std::array<std::vector<cublasHandle_t>, kMaxDevices> free;
};

inline HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool();  // leaked on purpose: outlives every thread's handles
  return *pool;
}

// A thread's handles, one per device, back to the pool when the thread ends.
struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> h{};
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> guard(pool.lock);
    for (int i = 0; i < kMaxDevices; ++i) {
      if (h[i]) pool.free[i].push_back(h[i]);
    }
  }
};

}  // namespace detail

// The calling thread's cuBLAS handle on device index (the current device: the caller's guard).
inline cublasHandle_t thread_handle(const char* op, int index) {
  static thread_local detail::ThreadHandles mine;
  if (index < 0 || index >= detail::kMaxDevices) fail<RuntimeError>(op, "cuBLAS: device index ", index, " out of range");
  cublasHandle_t& h = mine.h[index];
  if (!h) {
    detail::HandlePool& pool = detail::handle_pool();
    {
      std::lock_guard<std::mutex> guard(pool.lock);
      if (!pool.free[index].empty()) {
        h = pool.free[index].back();
        pool.free[index].pop_back();
      }
    }
    if (!h) check(op, cublasCreate(&h), "cublasCreate");
  }
  return h;
}

// Workspace bytes per call, torch's defaults: 32 MiB on Hopper and newer (compute capability >= 9),
// else 8 MiB + 128 KiB (CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8). Read once per device.
inline size_t workspace_bytes(const char* op, int index) {
  static std::array<std::atomic<size_t>, detail::kMaxDevices> known{};
  size_t bytes = known[index].load(std::memory_order_relaxed);
  if (bytes == 0) {
    int major = 0;
    ::opforge::cuda::check(op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    bytes = major >= 9 ? size_t(32) << 20 : (size_t(8) << 20) + (size_t(128) << 10);
    known[index].store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

// One kernel call's cuBLAS context: the tensors' device made current, the thread's handle bound to
// that device's current stream, and a workspace from opforge's allocator on that stream (freed,
// stream-ordered, when the call's products are queued). Make it once the call has products to run.
class Blas {
 public:
  Blas(const char* op_name, Device device) : op(op_name), guard_(op_name, device.index) {
    stream = ::opforge::cuda::current_stream(op, device);
    handle = thread_handle(op, device.index);
    check(op, cublasSetStream(handle, stream), "cublasSetStream");  // (it resets the workspace: set that after)
    workspace_size = workspace_bytes(op, device.index);
    ws_ = ::opforge::cuda::scratch(device, workspace_size + detail::kAlign);
    const uintptr_t p = reinterpret_cast<uintptr_t>(ws_->raw_data());
    workspace = reinterpret_cast<void*>((p + detail::kAlign - 1) / detail::kAlign * detail::kAlign);
    check(op, cublasSetWorkspace(handle, workspace, workspace_size), "cublasSetWorkspace");
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  const char* op;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;

 private:
  ::opforge::cuda::DeviceGuard guard_;
  TensorPtr ws_;
};

// t's elements set to zero on the current stream of its device (the empty products: k == 0).
inline void fill_zero(const char* op, const TensorPtr& t) {
  if (t->numel() == 0) return;
  const Device device = t->device();
  ::opforge::cuda::DeviceGuard guard(op, device.index);
  ::opforge::cuda::check(op, cudaMemsetAsync(t->raw_data(), 0, static_cast<size_t>(t->numel()) * itemsize(t->dtype()),
                                             ::opforge::cuda::current_stream(op, device)));
}

// ---- products

// C_i (m x n, row-major, ldc = n) = op(A_i) @ op(B_i) (+ C_i when accumulate) for i < count, matrix i
// of X at X + i * x_stride (stride 0: one matrix for all i); A stored m x k (k x m when ta), B k x n
// (n x k when tb), dense row-major; m, n, k > 0. C's type TC is T, or float for 16-bit T (a sum of
// several products kept in float). cuBLAS's 64-bit API where a size exceeds int.
template <typename T, typename TC>
void gemm(const Blas& blas, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t a_stride,
          const T* b, int64_t b_stride, bool accumulate, TC* c, int64_t c_stride, int64_t count) {
  using Ty = BlasTypes<T>;
  static_assert(std::is_same_v<TC, T> || std::is_same_v<TC, float>, "C is T or float");
  const typename Ty::Scale alpha = 1, beta = accumulate ? 1 : 0;
  const cudaDataType_t ct = std::is_same_v<TC, T> ? Ty::data : CUDA_R_32F;
  // cuBLAS's (m', n', k) = (n, m, k), its A our B, its B our A (C^T = op(B)^T op(A)^T)
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t ldb = tb ? k : n, lda = ta ? m : k, ldc = n;
  const bool small = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                     count <= INT_MAX;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if (count == 1) {
    check(blas.op,
          small ? cublasGemmEx(blas.handle, op_b, op_a, i(n), i(m), i(k), &alpha, b, Ty::data, i(ldb), a, Ty::data,
                               i(lda), &beta, c, ct, i(ldc), Ty::compute, CUBLAS_GEMM_DEFAULT)
                : cublasGemmEx_64(blas.handle, op_b, op_a, n, m, k, &alpha, b, Ty::data, ldb, a, Ty::data, lda, &beta,
                                  c, ct, ldc, Ty::compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  } else {
    check(blas.op,
          small ? cublasGemmStridedBatchedEx(blas.handle, op_b, op_a, i(n), i(m), i(k), &alpha, b, Ty::data, i(ldb),
                                             b_stride, a, Ty::data, i(lda), a_stride, &beta, c, ct, i(ldc), c_stride,
                                             i(count), Ty::compute, CUBLAS_GEMM_DEFAULT)
                : cublasGemmStridedBatchedEx_64(blas.handle, op_b, op_a, n, m, k, &alpha, b, Ty::data, ldb, b_stride,
                                                a, Ty::data, lda, a_stride, &beta, c, ct, ldc, c_stride, count,
                                                Ty::compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  }
}

namespace detail {

// Adds to oa, ob, oc the element offsets of the batch index `idx` over the dims `dims` of s.
inline void offsets(const SimpleBatch& s, const std::vector<size_t>& dims, int64_t idx, int64_t& oa, int64_t& ob,
                    int64_t& oc) {
  for (size_t j = dims.size(); j-- > 0;) {
    const size_t d = dims[j];
    const int64_t i = idx % s.batch[d];
    idx /= s.batch[d];
    oa += i * s.a_st[d];
    ob += i * s.b_st[d];
    oc += i * s.c_st[d];
  }
}

// The rows of every A_i against one B (a batch of matrices or vectors times a shared matrix): one
// GEMM of nb * m rows, as torch folds them. (Dense A and C with a shared B merge into one dim.)
template <typename T>
bool folds_into_rows(const SimpleBatch& s, int64_t m, int64_t n, int64_t k, const Operand<T>& A) {
  return s.batch.size() == 1 && !A.trans && s.a_st[0] == m * k && s.b_st[0] == 0 && s.c_st[0] == m * n;
}

// sum_r A_r^T @ B_r over a trailing dim C is reduced along, where A and B are dense: the stacked
// matrices make one product with an inner dim of R * k (the weight gradient of a batched product).
template <typename T>
void fold_reduction(SimpleBatch& s, int64_t m, int64_t n, int64_t& k, const Operand<T>& A, const Operand<T>& B) {
  const size_t nd = s.batch.size();
  if (nd >= 1 && A.trans && !B.trans && s.c_st[nd - 1] == 0 && s.a_st[nd - 1] == k * m && s.b_st[nd - 1] == k * n) {
    k *= s.batch[nd - 1];
    for (Shape* v : {&s.batch, &s.a_st, &s.b_st, &s.c_st}) v->pop_back();
  }
}

// The products over what remains of the batch, into c of type TC. The independent dim (C stride
// != 0) with the most products is one strided-batched call; the other dims loop: independent ones
// give separate calls, reduced ones (C stride 0) add into the same C matrices in turn (beta 1 after
// the first).
template <typename T, typename TC>
void run_batch(const Blas& blas, const SimpleBatch& s, int64_t m, int64_t n, int64_t k, const Operand<T>& A,
               const Operand<T>& B, TC* c, bool accumulate) {
  const size_t nd = s.batch.size();
  int best = -1;
  for (size_t d = 0; d < nd; ++d) {
    if (s.c_st[d] != 0 && (best < 0 || s.batch[d] > s.batch[static_cast<size_t>(best)])) best = static_cast<int>(d);
  }
  const size_t bd = static_cast<size_t>(best);
  const int64_t count = best < 0 ? 1 : s.batch[bd];
  const int64_t as = best < 0 ? 0 : s.a_st[bd], bs = best < 0 ? 0 : s.b_st[bd], cs = best < 0 ? 0 : s.c_st[bd];
  std::vector<size_t> outer, inner;
  for (size_t d = 0; d < nd; ++d) {
    if (static_cast<int>(d) != best) (s.c_st[d] == 0 ? inner : outer).push_back(d);
  }
  int64_t n_outer = 1, n_inner = 1;
  for (size_t d : outer) n_outer *= s.batch[d];
  for (size_t d : inner) n_inner *= s.batch[d];
  for (int64_t o = 0; o < n_outer; ++o) {
    int64_t oa = 0, ob = 0, oc = 0;
    offsets(s, outer, o, oa, ob, oc);
    for (int64_t r = 0; r < n_inner; ++r) {
      int64_t ia = oa, ib = ob, ic = oc;
      offsets(s, inner, r, ia, ib, ic);
      gemm<T, TC>(blas, A.trans, B.trans, m, n, k, A.data + ia, as, B.data + ib, bs, accumulate || r > 0, c + ic, cs,
                  count);
    }
  }
}

}  // namespace detail

// For every index i of `batch`: C_i (m x n) = op(A_i) @ op(B_i), where output matrices shared by
// several i (C stride 0 on a dim of size > 1) receive the sum of their products, and every C
// matrix starts from zero (from its current content when accumulate): the cpu kernels' batched_gemm
// (cpu/linalg_common.h), on out's device and current stream. out is dense; cst its matrix strides.
// float16/bfloat16 sums that take several GEMMs accumulate in a float copy of out, rounded once.
template <typename T>
void batched_gemm(const char* op, const Shape& batch, int64_t m, int64_t n, int64_t k, const Operand<T>& A,
                  const Operand<T>& B, const TensorPtr& out, const Shape& cst, bool accumulate = false) {
  if (out->numel() == 0) return;
  if (shape_numel(batch) == 0 || k == 0) {  // empty sums
    if (!accumulate) fill_zero(op, out);
    return;
  }
  SimpleBatch s = simplify_batch(batch, A.stride, B.stride, cst);
  const bool rows = detail::folds_into_rows(s, m, n, k, A);
  if (!rows) detail::fold_reduction(s, m, n, k, A, B);
  bool sums = false;  // whether C matrices receive several GEMMs' products (a loop over a reduced dim)
  for (size_t d = 0; d < s.batch.size(); ++d) sums = sums || s.c_st[d] == 0;
  const Blas blas(op, out->device());
  if (rows) {
    gemm<T, T>(blas, false, B.trans, s.batch[0] * m, n, k, A.data, 0, B.data, 0, accumulate, out->data<T>(), 0, 1);
    return;
  }
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    if (sums && !accumulate) {
      const TensorPtr acc = empty(DType::Float32, out->shape(), Format::Default, out->device());
      detail::run_batch<T, float>(blas, s, m, n, k, A, B, acc->data<float>(), false);
      copy_into(out, acc);  // (the device runtime's converting copy, on the same stream)
      return;
    }
  }
  detail::run_batch<T, T>(blas, s, m, n, k, A, B, out->data<T>(), accumulate);
}

// ---- linear's bias in the GEMM's epilogue

namespace detail {

template <typename H, cublasStatus_t (*Destroy)(H)>
struct LtOwned {  // a cuBLASLt descriptor, destroyed with its owner
  H h = nullptr;
  LtOwned() = default;
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
  ~LtOwned() {
    if (h) Destroy(h);
  }
};

inline uint32_t alignment(const void* p) {  // of a pointer, in bytes, up to 256 (what the heuristic assumes)
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

}  // namespace detail

// out (rows x n_out, row-major) = x (rows x n_in) @ w^T + bias (n_out) through cuBLASLt, the bias
// added by the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS, torch's addmm path): no pass over out
// besides the GEMM's. Column-major: D (n_out x rows) = w' ^T @ x' where w' (n_in x n_out) and
// x' (n_in x rows) are w and x as stored, and the bias runs along D's rows, as the epilogue adds it.
// Returns false when cuBLASLt offers no algorithm for it (the caller adds the bias apart).
template <typename T>
bool linear_bias_lt(const Blas& blas, int64_t rows, int64_t n_out, int64_t n_in, const T* x, const T* w,
                    const T* bias, T* out) {
  using Ty = BlasTypes<T>;
  const char* op = blas.op;
  // (no alignment preference covers the epilogue's bias pointer, and its kernels may load the bias
  // 16 bytes at a time: a bias view at another offset, as a torch slice through DLPack, takes the
  // plain GEMM and a bias pass rather than risk a misaligned-address fault, as PyTorch does)
  if (reinterpret_cast<uintptr_t>(bias) % 16 != 0) return false;
  const auto lt = reinterpret_cast<cublasLtHandle_t>(blas.handle);  // (a cuBLAS handle is a cuBLASLt one)
  detail::LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  check(op, cublasLtMatmulDescCreate(&desc.h, Ty::compute, Ty::scale), "cublasLtMatmulDescCreate");
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
    check(op, cublasLtMatmulDescSetAttribute(desc.h, attr, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);  // its A: w, stored (n_in x n_out) column-major
  set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);  // its B: x, stored (n_in x rows) column-major
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  detail::LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> a_desc, b_desc, d_desc;
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  check(op, cublasLtMatrixLayoutCreate(&a_desc.h, Ty::data, u(n_in), u(n_out), n_in), "cublasLtMatrixLayoutCreate");
  check(op, cublasLtMatrixLayoutCreate(&b_desc.h, Ty::data, u(n_in), u(rows), n_in), "cublasLtMatrixLayoutCreate");
  check(op, cublasLtMatrixLayoutCreate(&d_desc.h, Ty::data, u(n_out), u(rows), n_out), "cublasLtMatrixLayoutCreate");
  detail::LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
  check(op, cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    check(op, cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &value, sizeof(value)),
          "cublasLtMatmulPreferenceSetAttribute");
  };
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, blas.workspace_size);
  // (tensors may start anywhere in their storage: algorithms that need more alignment are left out)
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, detail::alignment(w));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, detail::alignment(x));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, detail::alignment(out));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, detail::alignment(out));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(lt, desc.h, a_desc.h, b_desc.h, d_desc.h, d_desc.h, pref.h,
                                                          1, &result, &found);
  // (any refusal of the heuristic: the plain GEMM then a bias pass. PyTorch keeps cuBLASLt away
  // from matrices with a dimension of 1, for which the heuristic answered CUBLAS_STATUS_INVALID_VALUE)
  if (h != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  const typename Ty::Scale alpha = 1, beta = 0;
  const cublasStatus_t r = cublasLtMatmul(lt, desc.h, &alpha, w, a_desc.h, x, b_desc.h, &beta, out, d_desc.h, out,
                                          d_desc.h, &result.algo, blas.workspace, blas.workspace_size, blas.stream);
  if (r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE) return false;  // (nothing launched)
  check(op, r, "cublasLtMatmul");
  return true;
}

}  // namespace opforge::kernels::cuda::linalg
