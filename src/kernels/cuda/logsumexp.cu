// Kernel of op `logsumexp` on cuda: max + log(sum(exp(x - max))) over the reduced axes in one pass
// over each row (reduce_common.cuh's rows, CUB): partial results (m, s) = (the running max, the sum
// of exp(x - m)) combine associatively, so CUB's reductions apply; float accumulation for 16-bit
// inputs, as on the cpu.
#include "logsumexp.h"

#include "reduce_common.cuh"

namespace opforge::kernels::cuda {

namespace {

template <typename C>
__host__ __device__ __forceinline__ C lse_exp(C v) {
  if constexpr (std::is_same_v<C, float>) return ::expf(v);
  else return ::exp(v);
}

template <typename C>
__host__ __device__ __forceinline__ C lse_log(C v) {
  if constexpr (std::is_same_v<C, float>) return ::logf(v);
  else return ::log(v);
}

template <typename C>
struct LsePart {
  C m, s;
};

// (m1, s1) + (m2, s2) = (max, s1 * exp(m1 - max) + s2 * exp(m2 - max)), NaN winning; a part whose
// max is -inf (nothing yet, or only -inf) adds nothing.
struct LseCombine {
  template <typename C>
  __host__ __device__ __forceinline__ LsePart<C> operator()(const LsePart<C>& a, const LsePart<C>& b) const {
    if (a.m != a.m) return a;
    if (b.m != b.m) return b;
    if (a.m == -INFINITY) return b;
    if (b.m == -INFINITY) return a;
    return a.m >= b.m ? LsePart<C>{a.m, a.s + b.s * lse_exp(b.m - a.m)} : LsePart<C>{b.m, b.s + a.s * lse_exp(a.m - b.m)};
  }
};

template <typename T>
struct LoadPart {
  __host__ __device__ __forceinline__ LsePart<compute_t<T>> operator()(T v) const {
    return {convert<compute_t<T>>(v), compute_t<T>(1)};
  }
};

// out = m + log(s); an infinite max is the result (+inf, or -inf for a row of -inf or no elements).
template <typename T>
__global__ void finish_lse(int64_t rows, const LsePart<compute_t<T>>* parts, T* out) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += int64_t(blockDim.x) * gridDim.x) {
    const LsePart<compute_t<T>> p = parts[r];
    out[r] = convert<T>(isinf(p.m) ? p.m : p.m + lse_log(p.s));
  }
}

}  // namespace

template <typename T>
void logsumexp(const TensorPtr& x, const TensorPtr& out, const LogsumexpAttrs& attrs) {
  using C = compute_t<T>;
  constexpr const char* kOp = "logsumexp";
  const int64_t rows = out->numel();
  if (rows == 0) return;
  const Shape kept = reduce_shape(kOp, x->shape(), attrs.axis, true);
  const int64_t n = x->numel() / rows;
  const TensorPtr src = reduced_last(x, kept);
  const Device device = x->device();
  const TensorPtr parts = ::opforge::cuda::scratch(device, static_cast<size_t>(rows) * sizeof(LsePart<C>));
  auto* pp = static_cast<LsePart<C>*>(parts->raw_data());
  const auto in = thrust::make_transform_iterator(src->data<T>(), LoadPart<T>{});
  ::opforge::cuda::reduce_rows(kOp, device, in, rows, n, pp, LseCombine{},
                               LsePart<C>{-std::numeric_limits<C>::infinity(), C(0)});
  ::opforge::cuda::DeviceGuard guard(kOp, device.index);
  finish_lse<T><<<::opforge::cuda::detail::blocks_for(rows), ::opforge::cuda::kThreads, 0,
                  ::opforge::cuda::current_stream(kOp, device)>>>(rows, pp, out->data<T>());
  ::opforge::cuda::check(kOp, cudaGetLastError());
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LOGSUMEXP_CUDA
