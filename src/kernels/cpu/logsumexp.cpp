// Kernel of op `logsumexp` on cpu: max + log(sum(exp(x - max))) over the reduced axes, with an
// online max / sum per row (softmax_common.h). Reduced axes that form one block of the shape are
// read in place (rows when they are the last axes, else column tiles, online down the columns);
// others are first gathered into a contiguous (kept, reduced) copy.
#include "logsumexp.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void logsumexp(const TensorPtr& x, const TensorPtr& out, const LogsumexpAttrs& attrs) {
  using E = compute_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, E>;
  const Shape& shape = x->shape();
  const auto axes = normalize_axes("logsumexp", attrs.axis, x->dim());
  const auto reduced = [&](size_t i) { return std::binary_search(axes.begin(), axes.end(), int64_t(i)); };

  // outer x n x inner when the reduced axes (ignoring size-1 axes) are one block
  smx::AxisView v;
  int state = 0;  // 0: before the reduced block, 1: in it, 2: after it
  bool block = true;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (reduced(i)) {
      block = block && state != 2;
      state = 1;
      v.n *= shape[i];
    } else if (state == 0) {
      v.outer *= shape[i];
    } else {
      state = 2;
      v.inner *= shape[i];
    }
  }
  TensorPtr src = x;
  if (!block) {  // gather: kept axes first, then reduced ones
    Shape pshape, pstrides;
    const Shape& st = x->strides();
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < shape.size(); ++i) {
        if (reduced(i) == (pass == 1)) {
          pshape.push_back(shape[i]);
          pstrides.push_back(st[i]);
        }
      }
    }
    auto view = std::make_shared<Tensor>(x->storage(), x->dtype(), pshape, pstrides, x->offset());
    src = empty(x->dtype(), pshape);
    copy_into(src, view);
    v.outer = out->numel();
    v.n = v.outer ? x->numel() / v.outer : 0;
    v.inner = 1;
  }

  const T* in = src->data<T>();
  T* o = out->data<T>();
  const smx::Prims<E>& P = smx::prims<E>();
  const int64_t n = v.n;
  if (v.outer * v.inner == 0) return;
  if (v.inner == 1) {
    const int64_t rows = v.outer;
    const int64_t grab = smx::rows_per_grab(n);
#pragma omp parallel if (smx::parallel_worth(rows * n, rows))
    {
      std::vector<E> buf(kConvert ? n : 0);
#pragma omp for schedule(dynamic, grab)
      for (int64_t r = 0; r < rows; ++r) {
        const E *row, *next;
        if constexpr (kConvert) {
          smx::load_row(in + r * n, buf.data(), n);
          row = next = buf.data();
        } else {
          row = in + r * n;
          next = in + (r + 1 < rows ? r + 1 : r) * n;
        }
        const auto [m, s] = smx::row_lse_parts(P, row, n, next);
        o[r] = convert<T>(smx::lse_finish(m, s));
      }
    }
    return;
  }
  const int64_t inner = v.inner;
  const int64_t w = smx::tile_width(v.outer, n, inner, kConvert ? 1 : 0);
  const int64_t tiles = (inner + w - 1) / w;
  const int64_t tasks = v.outer * tiles;
#pragma omp parallel if (smx::parallel_worth(v.outer * n * inner, tasks))
  {
    std::vector<E> buf(kConvert ? n * w : 0), scratch(4 * w);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t oi = t / tiles, j0 = (t % tiles) * w, wj = std::min(w, inner - j0);
      const T* base = in + oi * n * inner + j0;
      const E* tile;
      int64_t ld;
      if constexpr (kConvert) {
        for (int64_t r = 0; r < n; ++r) smx::load_row(base + r * inner, buf.data() + r * w, wj);
        tile = buf.data();
        ld = w;
      } else {
        tile = base;
        ld = inner;
      }
      E* m = scratch.data();
      E* s = m + w;
      smx::col_lse_parts(P, tile, ld, n, wj, m, s, s + w, s + 2 * w);
      for (int64_t j = 0; j < wj; ++j) o[oi * inner + j0 + j] = convert<T>(smx::lse_finish(m[j], s[j]));
    }
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LOGSUMEXP_CPU
