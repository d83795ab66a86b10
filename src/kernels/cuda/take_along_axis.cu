// Kernel of op `take_along_axis` on cuda: a thread per output element gathers x along the axis.
// Indices are checked on the device (row_common.cuh's IndexCheck): a bad index reads nothing (its
// output is zero) and the call raises IndexError naming the op.
#include "take_along_axis.h"

#include "kernels/cpu/elem_common.h"
#include "row_common.cuh"

namespace opforge::kernels::cuda {

namespace {

// out[o, p, j] = x[o, idx[o, p, j], j] for the (outer, k, inner) index layout
template <typename T>
__global__ void gather_along(int64_t total, int64_t k, int64_t size, int64_t inner, const int64_t* idx, const T* x,
                             T* out, unsigned long long* bad) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / (k * inner), j = e % inner;
    const int64_t i = idx[e];
    out[e] = rows::index_ok(i, size, e, bad) ? x[(o * size + i) * inner + j] : T();
  }
}

}  // namespace

template <typename T>
void take_along_axis(const TensorPtr& x, const TensorPtr& indices, const TensorPtr& out,
                     const TakeAlongAxisAttrs& attrs) {
  constexpr const char* op = "take_along_axis";
  namespace elem = ::opforge::kernels::cpu::elem;
  const int64_t axis = elem::single_axis(op, attrs.axis, x->dim());
  const int64_t k = elem::lanes_k(op, x->shape(), indices->shape(), axis, attrs.keepdims);
  const elem::AxisView v(x->shape(), axis);
  const Device dev = x->device();
  if (indices->device() != dev) fail<ValueError>(op, "indices are on ", indices->device().str(), " but x on ", dev.str());
  const int64_t total = indices->numel();
  if (total == 0) return;
  const rows::IndexCheck chk(op, dev);
  {
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    gather_along<T><<<::opforge::cuda::detail::blocks_for(total), ::opforge::cuda::kThreads, 0,
                      ::opforge::cuda::current_stream(op, dev)>>>(total, k, v.size, v.inner, indices->data<int64_t>(),
                                                                  x->data<T>(), out->data<T>(), chk.flag());
    ::opforge::cuda::check(op, cudaGetLastError());
  }
  chk.raise_if_bad(indices->data<int64_t>(),
                   "axis " + std::to_string(attrs.axis) + " of size " + std::to_string(v.size));
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_TAKE_ALONG_AXIS_CUDA
