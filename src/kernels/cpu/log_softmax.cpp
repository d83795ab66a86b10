// Kernel of op `log_softmax` on cpu: per row an online max / sum of exp (softmax_common.h), then
// out = (x - max) - log(sum); a strided axis goes column tile by column tile (online too).
#include "log_softmax.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void log_softmax(const TensorPtr& x, const TensorPtr& out, const LogSoftmaxAttrs& attrs) {
  using E = compute_t<T>;
  const smx::AxisView v = smx::axis_view("log_softmax", x->shape(), attrs.axis);
  const smx::Prims<E>& P = smx::prims<E>();
  smx::map_axis<T, 1>(
      {x->data<T>()}, out->data<T>(), v,
      [&P](const std::array<const E*, 1>& in, E* y, int64_t n, E*, const std::array<const E*, 1>& next) {
        const auto [m, s] = smx::row_lse_parts(P, in[0], n, next[0]);
        P.sub(in[0], n, m, std::log(s), y);
      },
      [&P](const std::array<const E*, 1>& in, int64_t ldx, E* y, int64_t ldy, int64_t n, int64_t w, E* scratch) {
        E* m = scratch;
        E* s = scratch + w;
        smx::col_lse_parts(P, in[0], ldx, n, w, m, s, scratch + 2 * w, scratch + 3 * w);
        for (int64_t j = 0; j < w; ++j) s[j] = std::log(s[j]);
        for (int64_t r = 0; r < n; ++r) P.col_sub(in[0] + r * ldx, m, s, w, y + r * ldy);
      });
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LOG_SOFTMAX_CPU
