// Kernel of op `transpose` on cpu: swaps the last two dims, a copy in cache-sized tiles.
#include "transpose.h"

#include <algorithm>
#include <cstring>

namespace opforge::kernels::cpu {

template <typename T>
void transpose(const TensorPtr& x, const TensorPtr& out, const TransposeAttrs&) {
  const int64_t n = x->numel();
  if (n == 0) return;
  const Shape& s = x->shape();
  const int64_t rows = s[s.size() - 2], cols = s[s.size() - 1];
  const T* src = x->data<T>();
  T* dst = out->data<T>();
  if (rows == 1 || cols == 1) {  // the same memory order
    std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), static_cast<size_t>(n) * sizeof(T));
    return;
  }
  constexpr int64_t kTile = 32;
  const int64_t batch = n / (rows * cols);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
#pragma omp parallel for if (n >= kParallelThreshold) schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t / (row_tiles * col_tiles);
    const int64_t r0 = (t / col_tiles) % row_tiles * kTile, c0 = t % col_tiles * kTile;
    const int64_t r1 = std::min(r0 + kTile, rows), c1 = std::min(c0 + kTile, cols);
    const T* in = src + b * rows * cols;
    T* o = dst + b * rows * cols;
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t r = r0; r < r1; ++r) o[c * rows + r] = in[r * cols + c];
    }
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_TRANSPOSE_CPU
