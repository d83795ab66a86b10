// NumPy matmul layouts that the cpu and cuda linalg kernels share (plain C++: no BLAS, OpenMP or
// CUDA): a product's batch dims, matrix sizes and per-dim matrix strides of every operand, and the
// batch simplification the cuda kernels use to map a batch onto strided-batched GEMMs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/functional.h"
#include "runtime/tensor.h"

namespace opforge::kernels::linalg {

// Elements between consecutive matrices of a tensor along each dim of `batch`: the tensor has
// batch dims `tbatch` (right-aligned to `batch`, size 1 or equal) and matrices of `mat` elements;
// 0 where one matrix serves the whole dim (broadcast, or reduced when it is an output).
inline Shape batch_strides(const Shape& tbatch, const Shape& batch, int64_t mat) {
  Shape st(batch.size(), 0);
  int64_t s = mat;
  for (size_t i = tbatch.size(); i-- > 0;) {
    if (tbatch[i] != 1) st[batch.size() - tbatch.size() + i] = s;
    s *= tbatch[i];
  }
  return st;
}

// matmul(a, b) with NumPy semantics as a batch of row-major products (m x k) @ (k x n): a 1-D a is
// a (1, k) matrix, a 1-D b a (k, 1) one (the same memory), batch dims broadcast.
struct MatmulLayout {
  Shape batch;               // broadcast batch dims
  int64_t m = 1, k = 1, n = 1;
  Shape a_st, b_st, out_st;  // matrix strides of a, b and the output over batch
  Shape out_shape;           // NumPy's matmul(a, b).shape
};

inline MatmulLayout matmul_layout(const char* op, const Shape& a, const Shape& b) {
  (void)matmul_shape(op, a, b);  // rank, inner dimension and batch checks, errors naming op
  const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  MatmulLayout l;
  l.m = a2[a2.size() - 2];
  l.k = a2.back();
  l.n = b2.back();
  const Shape ba(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const size_t nd = std::max(ba.size(), bb.size());
  l.batch.assign(nd, 1);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t x = i + ba.size() >= nd ? ba[i + ba.size() - nd] : 1;
    const int64_t y = i + bb.size() >= nd ? bb[i + bb.size() - nd] : 1;
    l.batch[i] = x == 1 ? y : x;  // a size-1 dim stretches to the other's size, 0 included
  }
  l.a_st = batch_strides(ba, l.batch, l.m * l.k);
  l.b_st = batch_strides(bb, l.batch, l.k * l.n);
  l.out_st = batch_strides(l.batch, l.batch, l.m * l.n);
  l.out_shape = l.batch;
  if (a.size() > 1) l.out_shape.push_back(l.m);
  if (b.size() > 1) l.out_shape.push_back(l.n);
  checked_numel(op, l.out_shape, DType::Float64);
  return l;
}

// One operand of a batched product: its matrices and their strides over the batch dims.
template <typename G>
struct Operand {
  const G* data;
  bool trans;    // stored transposed: op(X) = X^T
  Shape stride;  // per batch dim, in elements; 0 = the same matrix along that dim
};

// A batch with its size-1 dims dropped and neighbouring dims merged wherever every operand (and
// the output) steps across them as across one dim: stride[d - 1] == stride[d] * batch[d] for all
// three (stride-0 runs merge too, so dims the output is reduced over stay reduced). The products
// and their order are unchanged; only fewer, longer dims remain.
struct SimpleBatch {
  Shape batch, a_st, b_st, c_st;
};

inline SimpleBatch simplify_batch(const Shape& batch, const Shape& a_st, const Shape& b_st, const Shape& c_st) {
  SimpleBatch s;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    const size_t j = s.batch.size();
    if (j > 0 && s.a_st[j - 1] == a_st[d] * batch[d] && s.b_st[j - 1] == b_st[d] * batch[d] &&
        s.c_st[j - 1] == c_st[d] * batch[d]) {
      s.batch[j - 1] *= batch[d];
      s.a_st[j - 1] = a_st[d];
      s.b_st[j - 1] = b_st[d];
      s.c_st[j - 1] = c_st[d];
      continue;
    }
    s.batch.push_back(batch[d]);
    s.a_st.push_back(a_st[d]);
    s.b_st.push_back(b_st[d]);
    s.c_st.push_back(c_st[d]);
  }
  return s;
}

}  // namespace opforge::kernels::linalg
