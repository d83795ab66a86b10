// Kernel of op `take_along_axis` on cpu: validate indices, then gather along the axis, one
// (outer, position) row of lanes at a time (rows in parallel when large).
#include "take_along_axis.h"

#include "elem_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void take_along_axis(const TensorPtr& x, const TensorPtr& indices, const TensorPtr& out,
                     const TakeAlongAxisAttrs& attrs) {
  constexpr const char* op = "take_along_axis";
  const int64_t axis = elem::single_axis(op, attrs.axis, x->dim());
  const int64_t k = elem::lanes_k(op, x->shape(), indices->shape(), axis, attrs.keepdims);
  const elem::AxisView v(x->shape(), axis);
  const std::vector<int64_t> owned = elem::checked_indices(
      op, indices, v.size, "axis " + std::to_string(attrs.axis) + " of size " + std::to_string(v.size));
  const int64_t* idx = owned.data();
  const T* xp = x->data<T>();
  T* o = out->data<T>();
  const int64_t rows = v.outer * k, inner = v.inner;
#pragma omp parallel for if (indices->numel() >= kParallelThreshold) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* lane = xp + (r / k) * v.size * inner;
    const int64_t* ir = idx + r * inner;
    T* orow = o + r * inner;
    for (int64_t j = 0; j < inner; ++j) orow[j] = lane[ir[j] * inner + j];
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_TAKE_ALONG_AXIS_CPU
