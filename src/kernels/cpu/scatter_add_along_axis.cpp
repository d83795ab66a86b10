// Kernel of op `scatter_add_along_axis` on cpu: validate, zero the output, then add src along the
// axis. Each thread owns whole lanes (an outer index and a block of inner positions), so repeated
// positions never race, and sums run in a fixed order (float for 16-bit floats).
#include "scatter_add_along_axis.h"

#include "elem_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void scatter_add_along_axis(const TensorPtr& src, const TensorPtr& indices, const TensorPtr& x, const TensorPtr& out,
                            const ScatterAddAlongAxisAttrs& attrs) {
  constexpr const char* op = "scatter_add_along_axis";
  const int64_t axis = elem::single_axis(op, attrs.axis, x->dim());
  const int64_t k = elem::lanes_k(op, x->shape(), indices->shape(), axis, attrs.keepdims);
  if (src->shape() != indices->shape()) {
    fail<ValueError>(op, "src of shape ", shape_str(src->shape()), " must have the shape of indices ",
                     shape_str(indices->shape()));
  }
  const elem::AxisView v(x->shape(), axis);
  const std::vector<int64_t> owned = elem::checked_indices(
      op, indices, v.size, "axis " + std::to_string(attrs.axis) + " of size " + std::to_string(v.size));
  const int64_t* idx = owned.data();
  using S = elem::sum_t<T>;
  const T* s = src->data<T>();
  T* o = out->data<T>();
  const int64_t inner = v.inner, lane_len = v.size * inner;
  constexpr int64_t kBlock = 512;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  const bool parallel = out->numel() + src->numel() >= kParallelThreshold;
#pragma omp parallel if (parallel)
  {
    std::vector<S> acc(std::is_same_v<S, T> ? 0 : static_cast<size_t>(v.size * std::min(kBlock, inner)));
#pragma omp for schedule(static)
    for (int64_t ob = 0; ob < v.outer * blocks; ++ob) {
      const int64_t oi = ob / blocks, j0 = (ob % blocks) * kBlock;
      const int64_t len = std::min(kBlock, inner - j0);
      // the accumulator for lanes j0 .. j0 + len of this outer index: out itself, or floats
      S* a;
      int64_t a_stride;
      if constexpr (std::is_same_v<S, T>) {
        a = o + oi * lane_len + j0;
        a_stride = inner;
      } else {
        a = acc.data();
        a_stride = len;
      }
      for (int64_t i = 0; i < v.size; ++i) {
        for (int64_t j = 0; j < len; ++j) a[i * a_stride + j] = S(0);
      }
      for (int64_t p = 0; p < k; ++p) {
        const int64_t* ir = idx + (oi * k + p) * inner + j0;
        const T* sr = s + (oi * k + p) * inner + j0;
        for (int64_t j = 0; j < len; ++j) a[ir[j] * a_stride + j] = fn::add(a[ir[j] * a_stride + j], static_cast<S>(sr[j]));
      }
      if constexpr (!std::is_same_v<S, T>) {
        T* orow = o + oi * lane_len + j0;
        for (int64_t i = 0; i < v.size; ++i) {
          for (int64_t j = 0; j < len; ++j) orow[i * inner + j] = T(a[i * a_stride + j]);
        }
      }
    }
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_SCATTER_ADD_ALONG_AXIS_CPU
