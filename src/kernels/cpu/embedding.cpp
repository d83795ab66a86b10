// Kernel of op `embedding` on cpu: validate every index, then copy one weight row per index
// (rows in parallel when the output is large).
#include "embedding.h"

#include "elem_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void embedding(const TensorPtr& indices, const TensorPtr& weight, const TensorPtr& out,
               const EmbeddingAttrs& /*attrs*/) {
  const int64_t rows = weight->shape()[0], dim = weight->shape()[1];
  const int64_t n = indices->numel();
  const std::vector<int64_t> owned = elem::checked_indices("embedding", indices, rows,
                                                           "weight with " + std::to_string(rows) + " rows");
  const int64_t* idx = owned.data();
  if (dim == 0 || n == 0) return;
  const T* w = weight->data<T>();
  T* o = out->data<T>();
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(T);
#pragma omp parallel for if (n * dim >= kParallelThreshold) schedule(static)
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * dim, w + idx[i] * dim, row_bytes);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_EMBEDDING_CPU
