// Kernel of op `cross_entropy_grad_scale` on cuda: row i of out (N, C) is dy (or dy[i]), divided
// for reduction mean by the rows kept (counted on the device: row_common.cuh's kept_rows); 0
// where labels[i] is ignore_index (only that is read of the labels: an out-of-range label is
// cross_entropy_backward's to refuse).
#include "cross_entropy_grad_scale.h"

#include "kernels/layout.h"
#include "row_common.cuh"

namespace opforge::kernels::cuda {

namespace {

template <typename T>
__global__ void scale_rows(int64_t rows, int64_t classes, const T* dy, bool one, const int64_t* labels,
                           int64_t ignore, const unsigned long long* kept, T* out) {
  const int64_t n = rows * classes;
  const double scale = kept ? 1.0 / static_cast<double>(*kept) : 1.0;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / classes;
    out[k] = labels[r] == ignore ? convert<T>(0.0) : convert<T>(convert<double>(dy[one ? 0 : r]) * scale);
  }
}

}  // namespace

template <typename T>
void cross_entropy_grad_scale(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& labels,
                              const TensorPtr& out, const CrossEntropyGradScaleAttrs& attrs) {
  constexpr const char* op = "cross_entropy_grad_scale";
  if (logits->dim() != 2) fail<ValueError>(op, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  layout::check_loss_grad(op, dy, rows);
  if (labels->dim() != 1 || labels->shape()[0] != rows) {
    fail<ValueError>(op, "labels must have shape (N,) = (", rows, ",) to match logits ", shape_str(logits->shape()),
                     ", got ", shape_str(labels->shape()));
  }
  const Device dev = logits->device();
  if (labels->device() != dev) {
    fail<ValueError>(op, "labels are on ", labels->device().str(), " but logits on ", dev.str());
  }
  if (rows * classes == 0) return;
  const TensorPtr kept = attrs.reduction == "mean"
                             ? rows::kept_rows(op, dev, labels->data<int64_t>(), rows, attrs.ignore_index)
                             : nullptr;
  ::opforge::cuda::DeviceGuard guard(op, dev.index);
  scale_rows<T><<<::opforge::cuda::detail::blocks_for(rows * classes), ::opforge::cuda::kThreads, 0,
                  ::opforge::cuda::current_stream(op, dev)>>>(
      rows, classes, dy->data<T>(), dy->numel() == 1, labels->data<int64_t>(), attrs.ignore_index,
      kept ? static_cast<const unsigned long long*>(kept->raw_data()) : nullptr, out->data<T>());
  ::opforge::cuda::check(op, cudaGetLastError());
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_CROSS_ENTROPY_GRAD_SCALE_CUDA
