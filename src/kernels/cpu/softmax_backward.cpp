// Kernel of op `softmax_backward` on cpu: per row d = sum(dout * out), then
// dx = out * (dout - d) (softmax_common.h); a strided axis goes column tile by column tile.
#include "softmax_backward.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void softmax_backward(const TensorPtr& dout, const TensorPtr& out, const TensorPtr& dx,
                      const SoftmaxBackwardAttrs& attrs) {
  using E = compute_t<T>;
  smx::check_same_shape("softmax_backward", "dout", dout, "y", out);
  const smx::AxisView v = smx::axis_view("softmax_backward", out->shape(), attrs.axis);
  const smx::Prims<E>& P = smx::prims<E>();
  smx::map_axis<T, 2>(
      {dout->data<T>(), out->data<T>()}, dx->data<T>(), v,
      [&P](const std::array<const E*, 2>& in, E* y, int64_t n, E*, const std::array<const E*, 2>& next) {
        P.softmax_bwd(in[0], in[1], n, P.dot(in[0], in[1], n), y, next[0], next[1]);
      },
      [&P](const std::array<const E*, 2>& in, int64_t ldx, E* y, int64_t ldy, int64_t n, int64_t w, E* scratch) {
        E* d = scratch;
        smx::col_dot_rows(P, in[0], in[1], ldx, n, w, d, scratch + w);
        for (int64_t r = 0; r < n; ++r) P.col_softmax_bwd(in[0] + r * ldx, in[1] + r * ldx, d, w, y + r * ldy);
      });
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_SOFTMAX_BACKWARD_CPU
