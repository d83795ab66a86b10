// Kernel of op `embedding_backward` on cpu: positions bucketed by row (a stable counting sort),
// then every table row sums its dout rows in ascending position order. Rows are independent,
// so they run in parallel without atomics, and the result does not depend on the thread count.
#include "embedding_backward.h"

#include "elem_common.h"
#include "kernels/layout.h"

namespace opforge::kernels::cpu {

template <typename T>
void embedding_backward(const TensorPtr& dout, const TensorPtr& indices, const TensorPtr& weight,
                        const TensorPtr& grad_weight, const EmbeddingBackwardAttrs& /*attrs*/) {
  constexpr const char* op = "embedding_backward";
  layout::check_embedding_grad(op, dout, indices, weight);
  const int64_t rows = weight->shape()[0], dim = weight->shape()[1];
  const int64_t n = indices->numel();
  const std::vector<int64_t> owned = elem::checked_indices(op, indices, rows, "weight with " + std::to_string(rows) + " rows");
  const int64_t* idx = owned.data();
  if (rows == 0 || dim == 0) return;

  // start[r] .. start[r + 1]: the positions i with idx[i] == r, ascending
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++start[idx[i] + 1];
  for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
  std::vector<int64_t> order(static_cast<size_t>(n));
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[idx[i]]++] = i;
  }

  using S = elem::sum_t<T>;
  const T* g = dout->data<T>();
  T* out = grad_weight->data<T>();
  const bool parallel = (rows + n) * dim >= kParallelThreshold;
#pragma omp parallel if (parallel)
  {
    std::vector<S> acc(std::is_same_v<S, T> ? 0 : static_cast<size_t>(dim));  // 16-bit floats: sum in float
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* orow = out + r * dim;
      const int64_t b = start[r], e = start[r + 1];
      if constexpr (std::is_same_v<S, T>) {
        if (b == e) {
          std::memset(static_cast<void*>(orow), 0, static_cast<size_t>(dim) * sizeof(T));
          continue;
        }
        std::memcpy(static_cast<void*>(orow), g + order[b] * dim, static_cast<size_t>(dim) * sizeof(T));
        for (int64_t p = b + 1; p < e; ++p) {
          const T* grow = g + order[p] * dim;
          for (int64_t j = 0; j < dim; ++j) orow[j] += grow[j];
        }
      } else {
        S* a = acc.data();
        for (int64_t j = 0; j < dim; ++j) a[j] = S(0);
        for (int64_t p = b; p < e; ++p) {
          const T* grow = g + order[p] * dim;
          for (int64_t j = 0; j < dim; ++j) a[j] += static_cast<S>(grow[j]);
        }
        for (int64_t j = 0; j < dim; ++j) orow[j] = T(a[j]);
      }
    }
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_EMBEDDING_BACKWARD_CPU
