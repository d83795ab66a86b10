// Kernel of op `cross_entropy` on cuda: per row (softmax_rows.cuh's groups) the online
// log-sum-exp of the logits, minus (1 - e) times the label's logit and, for a label_smoothing
// e > 0, e times the row's mean, in double per row as on the cpu; the rows' losses then summed
// by CUB (mean: divided on the device by the rows kept, row_common.cuh's kept_rows; sum) or
// stored (none). A row whose label is ignore_index is not read (loss 0). Labels are checked on
// the device: a row with a label outside [0, C) reads nothing through it (its loss is NaN) and
// the call raises IndexError naming the op (row_common.cuh's IndexCheck).
#include "cross_entropy.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

template <typename T>
struct LossRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks; not tuned)
  static constexpr int kWarpBlocks16 = 1, kBlockBlocks16 = 2;
  static constexpr bool kOnePath = true;  // (row_lse streams every row: no held path)
  const T* x;
  const int64_t* labels;
  double* loss;
  int64_t classes;
  int64_t ignore;
  double smoothing;
  bool vec;
  unsigned long long* bad;
  template <int G, rows::RowPath = rows::RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const int64_t l = labels[r];
    if (l == ignore) {  // (the whole group returns: every lane read the same label)
      if (lane == 0) loss[r] = 0;
      return;
    }
    const auto p = smx::row_lse<G>(x + r * classes, classes, lane, vec);
    double total = 0;  // (in double, as the cpu's: a row of float32 values near their largest stays finite)
    if (smoothing > 0) {
      rows::visit<G, T>(classes, lane, vec, [&](int64_t, C v) { total += static_cast<double>(v); }, x + r * classes);
      total = rows::group_reduce<G>(total, rows::Add{});
    }
    if (lane != 0) return;
    if (!rows::index_ok(l, classes, r, bad)) {
      loss[r] = std::numeric_limits<double>::quiet_NaN();
      return;
    }
    const double picked = (1 - smoothing) * convert<double>(x[r * classes + l]), m = static_cast<double>(p.m);
    loss[r] = isinf(m) ? m - picked : (m - picked) + ::log(static_cast<double>(p.s));
    if (smoothing > 0) loss[r] -= smoothing * (total / static_cast<double>(classes));
  }
};

struct Plus {
  __host__ __device__ double operator()(double a, double b) const { return a + b; }
};

// The loss, divided by the rows kept for mean (kept null: sum; none kept: 0 / 0, NaN as torch).
template <typename T>
__global__ void store_total(const double* total, const unsigned long long* kept, T* out) {
  out[0] = convert<T>(kept ? total[0] / static_cast<double>(*kept) : total[0]);
}

}  // namespace

template <typename T>
void cross_entropy(const TensorPtr& logits, const TensorPtr& labels, const TensorPtr& out,
                   const CrossEntropyAttrs& attrs) {
  constexpr const char* op = "cross_entropy";
  layout::check_logits_labels(op, logits, labels);
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  const Device dev = logits->device();
  if (labels->device() != dev) {
    fail<ValueError>(op, "labels are on ", labels->device().str(), " but logits on ", dev.str());
  }
  const rows::IndexCheck chk(op, dev);
  const TensorPtr loss = ::opforge::cuda::scratch(dev, static_cast<size_t>(std::max<int64_t>(rows, 1)) * sizeof(double));
  double* lp = static_cast<double*>(loss->raw_data());
  rows::launch_rows(op, dev, rows, classes,
                    LossRow<T>{logits->data<T>(), labels->data<int64_t>(), lp, classes, attrs.ignore_index,
                               attrs.label_smoothing, rows::vec_ok<T>(classes, {logits->raw_data()}), chk.flag()});
  if (attrs.reduction == "none") {
    if (rows > 0) {
      ::opforge::cuda::DeviceGuard guard(op, dev.index);
      rows::store_cols<T, double><<<::opforge::cuda::detail::blocks_for(rows), ::opforge::cuda::kThreads, 0,
                                    ::opforge::cuda::current_stream(op, dev)>>>(rows, lp, out->data<T>());
      ::opforge::cuda::check(op, cudaGetLastError());
    }
  } else {
    const TensorPtr total = ::opforge::cuda::scratch(dev, sizeof(double));
    double* tp = static_cast<double*>(total->raw_data());
    ::opforge::cuda::reduce_rows(op, dev, static_cast<const double*>(lp), 1, rows, tp, Plus{}, 0.0);
    const TensorPtr kept = attrs.reduction == "mean"
                               ? rows::kept_rows(op, dev, labels->data<int64_t>(), rows, attrs.ignore_index)
                               : nullptr;
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    store_total<T><<<1, 1, 0, ::opforge::cuda::current_stream(op, dev)>>>(
        tp, kept ? static_cast<const unsigned long long*>(kept->raw_data()) : nullptr, out->data<T>());
    ::opforge::cuda::check(op, cudaGetLastError());
  }
  chk.raise_if_bad(labels->data<int64_t>(), std::to_string(classes) + " classes", "label");
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_CROSS_ENTROPY_CUDA
