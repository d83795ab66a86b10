// Kernel of op `log_softmax_backward` on cpu: per row s = sum(dout), then
// dx = dout - exp(out) * s (softmax_common.h); a strided axis goes column tile by column tile.
#include "log_softmax_backward.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void log_softmax_backward(const TensorPtr& dout, const TensorPtr& out, const TensorPtr& dx,
                          const LogSoftmaxBackwardAttrs& attrs) {
  using E = compute_t<T>;
  smx::check_same_shape("log_softmax_backward", "dout", dout, "y", out);
  const smx::AxisView v = smx::axis_view("log_softmax_backward", out->shape(), attrs.axis);
  const smx::Prims<E>& P = smx::prims<E>();
  smx::map_axis<T, 2>(
      {dout->data<T>(), out->data<T>()}, dx->data<T>(), v,
      [&P](const std::array<const E*, 2>& in, E* y, int64_t n, E*, const std::array<const E*, 2>& next) {
        P.log_softmax_bwd(in[0], in[1], n, P.sum(in[0], n), y, next[0], next[1]);
      },
      [&P](const std::array<const E*, 2>& in, int64_t ldx, E* y, int64_t ldy, int64_t n, int64_t w, E* scratch) {
        E* s = scratch;
        smx::col_sum_rows(P, in[0], ldx, n, w, s, scratch + w);
        for (int64_t r = 0; r < n; ++r) P.col_log_softmax_bwd(in[0] + r * ldx, in[1] + r * ldx, s, w, y + r * ldy);
      });
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LOG_SOFTMAX_BACKWARD_CPU
