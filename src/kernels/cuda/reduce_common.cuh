// What the reduction kernels of cuda share: an input's rows of reduced elements
// (runtime/functional.h's reduced_last) reduced by runtime/cuda/reduce.cuh (CUB), and the
// arg-reduction of max and min.
#pragma once

#include <cub/util_type.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cmath>
#include <limits>

#include "runtime/cuda/elementwise.cuh"
#include "runtime/cuda/reduce.cuh"
#include "runtime/runtime.h"

namespace opforge::kernels::cuda {

namespace detail {

template <typename C>
using Best = cub::KeyValuePair<int64_t, C>;  // a flat position in the rows and its value

template <typename C>
__host__ __device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return v != v;
  else return false;
}

// The better of two candidates, as the cpu kernel and numpy.argmax choose: NaN wins, then the
// larger (kMax) or smaller value, then the earlier position. Associative and commutative.
template <bool kMax, typename C>
struct ArgBetter {
  __host__ __device__ __forceinline__ Best<C> operator()(const Best<C>& a, const Best<C>& b) const {
    const bool an = is_nan(a.value), bn = is_nan(b.value);
    if (an || bn) return (an && bn) ? (b.key < a.key ? b : a) : (an ? a : b);
    if (kMax ? b.value > a.value : b.value < a.value) return b;
    return (b.value == a.value && b.key < a.key) ? b : a;
  }
};

template <typename T>
struct LoadBest {
  const T* x;
  __host__ __device__ __forceinline__ Best<compute_t<T>> operator()(int64_t i) const {
    return {i, convert<compute_t<T>>(x[i])};
  }
};

// values[r] = x[best.key] (the element itself: -0.0 stays -0.0), indices[r] = its position in row r.
template <typename T, typename C>
__global__ void finish_arg(int64_t rows, int64_t n, const Best<C>* best, const T* x, T* values, int64_t* indices) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += int64_t(blockDim.x) * gridDim.x) {
    const int64_t k = best[r].key;
    values[r] = x[k];
    indices[r] = k - r * n;
  }
}

}  // namespace detail

// The first position of the largest (kMax) or smallest element along one axis, and that element,
// NaN winning (the first NaN): the cpu kernel's contract (elem_common.h's arg_reduce).
template <bool kMax, typename T>
void arg_reduce(const char* op, const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices,
                int64_t axis_attr) {
  using C = compute_t<T>;
  // (a 0-d x, axis 0 or -1 as the reduce rule allows, is one row of one element)
  const std::vector<int64_t> axes = normalize_axes(op, std::vector<int64_t>{axis_attr}, x->dim());
  const int64_t n = axes.empty() ? 1 : x->shape()[static_cast<size_t>(axes[0])];
  if (n == 0) fail<ValueError>(op, "cannot take the ", kMax ? "max" : "min", " over axis ", axis_attr, " of size 0");
  const int64_t rows = values->numel();
  if (rows == 0) return;
  const TensorPtr src = axes.empty() ? x : reduced_last(x, reduce_shape(op, x->shape(), axes, true));
  const Device device = x->device();
  const TensorPtr best = ::opforge::cuda::scratch(device, static_cast<size_t>(rows) * sizeof(detail::Best<C>));
  auto* bp = static_cast<detail::Best<C>*>(best->raw_data());
  const C worst = kMax ? (std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                                 : std::numeric_limits<C>::lowest())
                       : (std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                                 : std::numeric_limits<C>::max());
  const auto in = thrust::make_transform_iterator(thrust::make_counting_iterator<int64_t>(0),
                                                  detail::LoadBest<T>{src->data<T>()});
  ::opforge::cuda::reduce_rows(op, device, in, rows, n, bp, detail::ArgBetter<kMax, C>{},
                               detail::Best<C>{std::numeric_limits<int64_t>::max(), worst});
  ::opforge::cuda::DeviceGuard guard(op, device.index);
  detail::finish_arg<T, C><<<::opforge::cuda::detail::blocks_for(rows), ::opforge::cuda::kThreads, 0,
                             ::opforge::cuda::current_stream(op, device)>>>(
      rows, n, bp, src->data<T>(), values->data<T>(), indices->data<int64_t>());
  ::opforge::cuda::check(op, cudaGetLastError());
}

}  // namespace opforge::kernels::cuda
