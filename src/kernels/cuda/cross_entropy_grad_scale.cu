// Kernel of op `cross_entropy_grad_scale` on cuda: row i of out (N, C) is dy (or dy[i]), divided
// by N for reduction mean: dy read as a (N, 1) (or one-element) view by the device's elementwise loop.
#include "cross_entropy_grad_scale.h"

#include "kernels/layout.h"
#include "runtime/cuda/elementwise.cuh"

namespace opforge::kernels::cuda {

namespace {

struct ScaleBy {
  double scale;
  template <typename A>
  __device__ __forceinline__ A operator()(A a) const { return static_cast<A>(static_cast<double>(a) * scale); }
};

}  // namespace

template <typename T>
void cross_entropy_grad_scale(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& out,
                              const CrossEntropyGradScaleAttrs& attrs) {
  constexpr const char* op = "cross_entropy_grad_scale";
  if (logits->dim() != 2) fail<ValueError>(op, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  const int64_t rows = logits->shape()[0];
  layout::check_loss_grad(op, dy, rows);
  TensorPtr g = dy;
  if (dy->numel() != 1) {
    g = std::make_shared<Tensor>(dy->storage(), dy->dtype(), Shape{rows, 1}, Shape{1, 1}, dy->offset(), Format::Default);
  }
  CurrentOpScope scope(op);
  ::opforge::cuda::elementwise<T, T>(*out, ScaleBy{layout::reduction_scale(attrs.reduction, rows)}, {g.get()});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_CROSS_ENTROPY_GRAD_SCALE_CUDA
