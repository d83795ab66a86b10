// Layout and argument checks that the cpu and cuda kernels share (plain C++: no SIMD, OpenMP or
// CUDA): which layout takes a fused path (normalized axes = trailing dims, per-row statistics,
// parameters of the normalized shape), an axis as outer x n x inner, channel axes of formats, and
// the shape checks of the normalization and cross-entropy ops, with their error messages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace opforge::kernels::layout {

// Shape of t read as broadcast against rank nd (leading ones added); t must have rank <= nd.
inline Shape padded(const Shape& s, size_t nd) {
  Shape out(nd - std::min(nd, s.size()), 1);
  out.insert(out.end(), s.end() - static_cast<std::ptrdiff_t>(std::min(nd, s.size())), s.end());
  return out;
}

inline int64_t prod(const Shape& s, size_t b, size_t e) {
  int64_t n = 1;
  for (size_t i = b; i < e; ++i) n *= s[i];
  return n;
}

// k when the (normalized, sorted) axes are exactly the trailing dims [k, nd), else -1.
inline int64_t trailing_start(const std::vector<int64_t>& ax, int64_t nd) {
  const int64_t k = nd - static_cast<int64_t>(ax.size());
  for (size_t i = 0; i < ax.size(); ++i) {
    if (ax[i] != k + static_cast<int64_t>(i)) return -1;
  }
  return k;
}

// t is absent or holds exactly the normalized block: shape [1]*k + xs[k:] (leading ones optional).
inline bool row_shaped(const TensorPtr& t, const Shape& xs, int64_t k) {
  if (!t) return true;
  if (t->dim() > static_cast<int64_t>(xs.size())) return false;
  const Shape p = padded(t->shape(), xs.size());
  for (size_t d = 0; d < xs.size(); ++d) {
    if (p[d] != (static_cast<int64_t>(d) < k ? 1 : xs[d])) return false;
  }
  return true;
}

// A norm's fused rows over x: rows (R rows of N) when the normalized axes are x's trailing dims and
// every parameter given (a null TensorPtr: absent) has the normalized shape; else rows is false.
struct NormRows {
  bool rows = false;
  int64_t R = 0, N = 0;
};
inline NormRows norm_rows(const char* op, const Shape& xs, const Axes& axes,
                          std::initializer_list<const TensorPtr*> params) {
  const int64_t nd = static_cast<int64_t>(xs.size());
  const int64_t k = trailing_start(normalize_axes(op, axes, nd), nd);
  NormRows p;
  if (k < 0) return p;
  for (const TensorPtr* t : params) {
    if (!row_shaped(*t, xs, k)) return p;
  }
  p = {true, prod(xs, 0, static_cast<size_t>(k)), prod(xs, static_cast<size_t>(k), xs.size())};
  return p;
}

// t is absent or holds one value per leading row: shape xs[:k] + [1]*(nd - k).
inline bool kept_shaped(const TensorPtr& t, const Shape& xs, int64_t k) {
  if (!t) return true;
  if (t->dim() > static_cast<int64_t>(xs.size())) return false;
  const Shape p = padded(t->shape(), xs.size());
  for (size_t d = 0; d < xs.size(); ++d) {
    if (p[d] != (static_cast<int64_t>(d) < k ? xs[d] : 1)) return false;
  }
  return true;
}

// Raises ValueError naming op unless t (absent allowed) broadcasts to shape `to`.
inline void check_broadcasts_to(const char* op, const char* name, const TensorPtr& t, const Shape& to,
                                const char* to_name) {
  if (!t) return;
  bool ok = t->dim() <= static_cast<int64_t>(to.size());
  if (ok) {
    const Shape p = padded(t->shape(), to.size());
    for (size_t d = 0; d < to.size(); ++d) ok = ok && (p[d] == to[d] || p[d] == 1);
  }
  if (!ok) {
    fail<ValueError>(op, name, " of shape ", shape_str(t->shape()), " does not broadcast to ", to_name,
                     " of shape ", shape_str(to));
  }
}

// The same for a tensor target, with the runtime's message when the shapes do not broadcast at all.
inline void check_broadcasts_to(const char* op, const char* name, const TensorPtr& t, const TensorPtr& x,
                                const char* x_name) {
  if (t && broadcast_shapes(op, {x.get(), t.get()}, {x_name, name}) != x->shape()) {
    fail<ValueError>(op, name, " of shape ", shape_str(t->shape()), " does not broadcast to ", x_name,
                     " of shape ", shape_str(x->shape()));
  }
}

inline void check_shape(const char* op, const char* name, const TensorPtr& t, const Shape& want,
                        const char* what) {
  if (t && t->shape() != want) {
    fail<ValueError>(op, name, " of shape ", shape_str(t->shape()), " must have shape ", shape_str(want), " (",
                     what, ")");
  }
}

// The tensor's shape as outer x n x inner around `axis` (IndexError naming op when out of range;
// a 0-d tensor is one element, with axis 0 or -1).
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisView axis_view(const char* op, const Shape& s, int64_t axis) {
  const int64_t nd = static_cast<int64_t>(s.size());
  if (axis < -std::max<int64_t>(nd, 1) || axis >= std::max<int64_t>(nd, 1)) {
    fail<IndexError>(op, "axis ", axis, " is out of range for a tensor of rank ", nd);
  }
  AxisView v;
  if (nd == 0) return v;
  const int64_t a = axis < 0 ? axis + nd : axis;
  for (int64_t i = 0; i < nd; ++i) {
    if (i < a) v.outer *= s[i];
    else if (i > a) v.inner *= s[i];
  }
  v.n = s[a];
  return v;
}

// The channel axis of a tensor of shape s in `format` (NCHW | NHWC); ValueError naming op when
// the rank is below 2.
inline int64_t channel_axis(const char* op, const char* name, const Shape& s, const std::string& format) {
  if (s.size() < 2) {
    fail<ValueError>(op, name, " must have rank >= 2 (a batch axis and a channel axis), got shape ", shape_str(s));
  }
  return format == "NHWC" ? static_cast<int64_t>(s.size()) - 1 : 1;
}

// ValueError naming op when t is tagged with the other layout than `format`.
inline void check_tag(const char* op, const char* name, const TensorPtr& t, const std::string& format) {
  if (t && t->format() != Format::Default && format != format_name(t->format())) {
    fail<ValueError>(op, name, " is tagged ", format_name(t->format()), " but format is ", format,
                     "; pass format=\"", format_name(t->format()), "\"");
  }
}

// Checks that two inputs have the same shape.
inline void check_same_shape(const char* op, const char* a, const TensorPtr& x, const char* b, const TensorPtr& y) {
  if (x->shape() != y->shape()) {
    fail<ValueError>(op, a, " of shape ", shape_str(x->shape()), " and ", b, " of shape ", shape_str(y->shape()),
                     " must have the same shape");
  }
}

// Cross-entropy inputs: logits (N, C), labels (N,) (each in [0, C) or ignore_index: the kernels check it).
inline void check_logits_labels(const char* op, const TensorPtr& logits, const TensorPtr& labels) {
  if (logits->dim() != 2) {
    fail<ValueError>(op, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  }
  if (labels->dim() != 1 || labels->shape()[0] != logits->shape()[0]) {
    fail<ValueError>(op, "labels must have shape (N,) = (", logits->shape()[0], ",) to match logits ",
                     shape_str(logits->shape()), ", got ", shape_str(labels->shape()));
  }
}
// dy of a cross-entropy gradient: shape () or (1,) (one value for all rows) or (N,).
inline void check_loss_grad(const char* op, const TensorPtr& dy, int64_t rows) {
  const bool one = dy->dim() == 0 || (dy->dim() == 1 && dy->shape()[0] == 1);
  if (!one && !(dy->dim() == 1 && dy->shape()[0] == rows)) {
    fail<ValueError>(op, "dy must have shape () or (N,) = (", rows, ",), got ", shape_str(dy->shape()));
  }
}
// The factor of each row's gradient: 1 / (the rows kept: not ignore_index) for reduction mean,
// else 1. (No row kept: inf, which no row then reads.)
inline double reduction_scale(const std::string& reduction, int64_t kept) {
  return reduction == "mean" ? 1.0 / static_cast<double>(kept) : 1.0;
}

// The weight gradient dy * (x - mean) * rstd of norm_weight_grad and norm_affine_grad: the shape
// the product broadcasts to (weight must broadcast to it: ValueError naming op), and whether the
// fused column sum applies (dy and x of that shape, rstd and mean absent or one value per leading
// row, weight the trailing block from dim k): then R rows of N.
struct WeightGradShape {
  Shape full;
  bool rows = false;
  int64_t k = 0, R = 0, N = 0;
};
inline WeightGradShape weight_grad_shape(const char* op, const TensorPtr& dy, const TensorPtr& x,
                                         const TensorPtr& rstd, const TensorPtr& weight, const TensorPtr& mean) {
  std::vector<const Tensor*> ins{dy.get(), x.get(), rstd.get()};
  std::vector<const char*> names{"dy", "x", "rstd"};
  if (mean) {
    ins.push_back(mean.get());
    names.push_back("mean");
  }
  WeightGradShape w;
  w.full = broadcast_shapes(op, ins, names);
  check_broadcasts_to(op, "weight", weight, w.full, "dy * (x - mean) * rstd");
  const Shape& xs = x->shape();
  if (dy->shape() != xs || w.full != xs) return w;
  const Shape pw = padded(weight->shape(), xs.size());
  while (w.k < static_cast<int64_t>(xs.size()) && pw[static_cast<size_t>(w.k)] == 1) ++w.k;
  w.rows = row_shaped(weight, xs, w.k) && kept_shaped(rstd, xs, w.k) && kept_shaped(mean, xs, w.k);
  if (w.rows) {
    w.R = prod(xs, 0, static_cast<size_t>(w.k));
    w.N = prod(xs, static_cast<size_t>(w.k), xs.size());
  }
  return w;
}

// The shapes a norm's backward op takes (layer_norm_backward, rms_norm_backward): dy shaped like x,
// each statistic (mean, rstd and their gradients) x reduced over axes with kept dims, weight
// (absent allowed) broadcasting to x. Returns the kept shape; ValueError naming op otherwise.
inline Shape check_norm_backward(const char* op, const TensorPtr& dy, const TensorPtr& x,
                                 std::initializer_list<std::pair<const char*, const TensorPtr*>> stats,
                                 const TensorPtr& weight, const Axes& axes) {
  const Shape kept = reduce_shape(op, x->shape(), axes, true);
  check_shape(op, "dy", dy, x->shape(), "the shape of x");
  for (const auto& [name, t] : stats) check_shape(op, name, *t, kept, "x reduced over axis, kept dims");
  check_broadcasts_to(op, "weight", weight, x, "x");
  return kept;
}

// embedding_backward's inputs: weight 2-D, dout shaped indices.shape + (embedding_dim,).
inline void check_embedding_grad(const char* op, const TensorPtr& dout, const TensorPtr& indices,
                                 const TensorPtr& weight) {
  if (weight->dim() != 2) {
    fail<ValueError>(op, "weight must be 2-D (num_embeddings, embedding_dim), got shape ", shape_str(weight->shape()));
  }
  Shape expect = indices->shape();
  expect.push_back(weight->shape()[1]);
  if (dout->shape() != expect) {
    fail<ValueError>(op, "dout of shape ", shape_str(dout->shape()), " does not match indices of shape ",
                     shape_str(indices->shape()), " and embedding_dim ", weight->shape()[1], ": expected ",
                     shape_str(expect));
  }
}

}  // namespace opforge::kernels::layout
