// Kernel of op `scatter_add_along_axis` on cuda: a thread per lane (an outer index and an inner
// position) zeroes its lane, then adds src along the axis in position order, so repeated positions
// never race and sums run in a fixed order (in float for 16-bit floats, then stored): deterministic,
// as on the cpu. Few long lanes (a 1-D scatter is one lane: one thread for all of it) go another
// way with the same sums: the (lane, index) key of every source element sorted with its position
// (CUB's stable radix sort), then a thread per output element sums its run in position order.
// Indices are checked on the device (row_common.cuh's IndexCheck): a bad index adds nothing and
// the call raises IndexError naming the op.
#include "scatter_add_along_axis.h"

#include "kernels/cpu/elem_common.h"
#include "row_common.cuh"
#include "sort_pairs.cuh"

namespace opforge::kernels::cuda {

namespace {

template <typename T, typename A>
__global__ void scatter_lanes(int64_t outer, int64_t k, int64_t size, int64_t inner, const int64_t* idx, const T* src,
                              A* acc, unsigned long long* bad) {
  const int64_t lanes = outer * inner;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lanes; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = t / inner, j = t % inner;
    A* lane = acc + o * size * inner + j;
    for (int64_t i = 0; i < size; ++i) lane[i * inner] = A(0);
    for (int64_t p = 0; p < k; ++p) {
      const int64_t e = (o * k + p) * inner + j;
      const int64_t i = idx[e];
      if (rows::index_ok(i, size, e, bad)) {
        lane[i * inner] = fn::add(lane[i * inner], static_cast<A>(convert<compute_t<T>>(src[e])));  // (ints wrap)
      }
    }
  }
}

// Source element e = (o * k + p) * inner + j: its key, (o * inner + j) * size + i for its index i
// (the lane's run of output element (o, i, j)), or the largest int64 for a bad index (never an
// output's), and its position e.
__global__ void lane_keys(int64_t n, int64_t k, int64_t size, int64_t inner, const int64_t* idx, int64_t* keys,
                          int64_t* pos, unsigned long long* bad) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / (k * inner), j = e % inner;
    const int64_t i = idx[e];
    keys[e] = rows::index_ok(i, size, e, bad) ? (o * inner + j) * size + i : INT64_MAX;
    pos[e] = e;
  }
}

// out[(o * size + i) * inner + j] = the sum of src over the run of its key in the sorted keys, in
// position order (the lanes kernel's order)
template <typename T, typename A>
__global__ void sum_runs(int64_t total, int64_t size, int64_t inner, int64_t n, const int64_t* keys, const int64_t* pos,
                         const T* src, T* out) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = t % inner, oi = t / inner;
    const int64_t i = oi % size, o = oi / size;
    const int64_t key = (o * inner + j) * size + i;
    // (the run's end found first: the loop's loads then no longer wait on keys[p], and several
    // positions' gathers are in flight at once; the sum's order, and so its bits, are unchanged)
    const int64_t b = rows::lower_bound(keys, n, key), e = b + rows::lower_bound(keys + b, n - b, key + 1);
    A acc = A(0);
#pragma unroll 4
    for (int64_t p = b; p < e; ++p) {
      acc = fn::add(acc, static_cast<A>(convert<compute_t<T>>(src[pos[p]])));  // (ints wrap)
    }
    out[t] = convert<T>(acc);
  }
}

}  // namespace

template <typename T>
void scatter_add_along_axis(const TensorPtr& src, const TensorPtr& indices, const TensorPtr& x, const TensorPtr& out,
                            const ScatterAddAlongAxisAttrs& attrs) {
  constexpr const char* op = "scatter_add_along_axis";
  namespace elem = ::opforge::kernels::cpu::elem;
  const int64_t axis = elem::single_axis(op, attrs.axis, x->dim());
  const int64_t k = elem::lanes_k(op, x->shape(), indices->shape(), axis, attrs.keepdims);
  if (src->shape() != indices->shape()) {
    fail<ValueError>(op, "src of shape ", shape_str(src->shape()), " must have the shape of indices ",
                     shape_str(indices->shape()));
  }
  const elem::AxisView v(x->shape(), axis);
  const Device dev = out->device();
  if (indices->device() != dev) fail<ValueError>(op, "indices are on ", indices->device().str(), " but src on ", dev.str());
  // (an empty out with indices: an axis of size 0, where every index is out of range; the lanes
  // run to check them, as the cpu does, and write nothing)
  if (out->numel() == 0 && indices->numel() == 0) return;
  using A = compute_t<T>;
  constexpr bool kSame = std::is_same_v<A, T>;
  const rows::IndexCheck chk(op, dev);
  const int64_t lanes = v.outer * v.inner, n = indices->numel();
  if (lanes < 8192 && v.size + k >= 1024 && out->numel() > 0) {  // few long lanes: sorted runs
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    const cudaStream_t stream = ::opforge::cuda::current_stream(op, dev);
    const size_t nn = static_cast<size_t>(std::max<int64_t>(n, 1));
    const TensorPtr buf = ::opforge::cuda::scratch(dev, 4 * nn * sizeof(int64_t));
    int64_t* keys_in = static_cast<int64_t*>(buf->raw_data());
    int64_t* pos_in = keys_in + nn;
    int64_t* keys = pos_in + nn;
    int64_t* pos = keys + nn;
    if (n > 0) {
      lane_keys<<<::opforge::cuda::detail::blocks_for(n), ::opforge::cuda::kThreads, 0, stream>>>(
          n, k, v.size, v.inner, indices->data<int64_t>(), keys_in, pos_in, chk.flag());
      ::opforge::cuda::check(op, cudaGetLastError());
      rows::sort_pairs(op, dev, stream, keys_in, keys, pos_in, pos, n);
    }
    sum_runs<T, A><<<::opforge::cuda::detail::blocks_for(out->numel()), ::opforge::cuda::kThreads, 0, stream>>>(
        out->numel(), v.size, v.inner, n, keys, pos, src->data<T>(), out->data<T>());
    ::opforge::cuda::check(op, cudaGetLastError());
    chk.raise_if_bad(indices->data<int64_t>(),
                     "axis " + std::to_string(attrs.axis) + " of size " + std::to_string(v.size));
    return;
  }
  {
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    const cudaStream_t stream = ::opforge::cuda::current_stream(op, dev);
    const TensorPtr acc = kSame || out->numel() == 0
                              ? out
                              : ::opforge::cuda::scratch(dev, static_cast<size_t>(out->numel()) * sizeof(A));
    A* ap = static_cast<A*>(acc->raw_data());
    scatter_lanes<T, A><<<::opforge::cuda::detail::blocks_for(v.outer * v.inner), ::opforge::cuda::kThreads, 0, stream>>>(
        v.outer, k, v.size, v.inner, indices->data<int64_t>(), src->data<T>(), ap, chk.flag());
    ::opforge::cuda::check(op, cudaGetLastError());
    if constexpr (!kSame) {
      if (out->numel() > 0) {
        rows::store_cols<T, A><<<::opforge::cuda::detail::blocks_for(out->numel()), ::opforge::cuda::kThreads, 0,
                                 stream>>>(out->numel(), ap, out->data<T>());
        ::opforge::cuda::check(op, cudaGetLastError());
      }
    }
  }
  chk.raise_if_bad(indices->data<int64_t>(),
                   "axis " + std::to_string(attrs.axis) + " of size " + std::to_string(v.size));
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_SCATTER_ADD_ALONG_AXIS_CUDA
