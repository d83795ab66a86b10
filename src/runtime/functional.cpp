// Shape rules, the reduction kernel and the runtime's own differentiable helper functions.
#include "runtime/functional.h"

#include <algorithm>

#include "runtime/autograd.h"
#include "runtime/elementwise.h"

namespace opforge {

namespace {

// The broadcast of dimensions x and y into *out (a size-1 dimension takes the other, 0 included;
// an unknown one against a known n > 1 or 0 is n); false when they cannot broadcast.
bool broadcast_dim(int64_t x, int64_t y, int64_t* out) {
  if (x == y || y == 1) {
    *out = x;
  } else if (x == 1 || x == kUnknownDim) {
    *out = y;
  } else if (y == kUnknownDim) {
    *out = x;
  } else {
    return false;
  }
  return true;
}

template <typename Tensors, typename Names>
Shape broadcast_impl(const char* op, const Tensors& inputs, const Names& names) {
  const Tensor* first = *inputs.begin();
  bool same = true;  // the common case: every shape equal
  for (const Tensor* t : inputs) same = same && t->shape() == first->shape();
  if (same) return first->shape();
  size_t nd = 0;
  for (const Tensor* t : inputs) nd = std::max(nd, t->shape().size());
  Shape out(nd, 1);
  for (const Tensor* t : inputs) {
    const Shape& s = t->shape();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o == 1) {
        o = s[i];
        continue;
      }
      std::string shapes;
      auto name = names.begin();
      for (const Tensor* u : inputs) {
        shapes += std::string(shapes.empty() ? "" : ", ") + *name++ + " " + shape_str(u->shape());
      }
      fail<ValueError>(op, "shapes cannot be broadcast together: ", shapes);
    }
  }
  checked_numel(op, out, DType::Float64);
  return out;
}

}  // namespace

Shape broadcast_shapes(const char* op, std::initializer_list<const Tensor*> inputs,
                       std::initializer_list<const char*> names) {
  return broadcast_impl(op, inputs, names);
}

Shape broadcast_shapes(const char* op, const std::vector<const Tensor*>& inputs,
                       const std::vector<const char*>& names) {
  return broadcast_impl(op, inputs, names);
}

std::vector<int64_t> normalize_axes(const char* op, const Axes& axes, int64_t ndim) {
  std::vector<int64_t> out;
  if (!axes || axes->empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  check_axes(op, axes->data(), axes->size(), ndim);
  if (ndim == 0) return out;  // (a 0-d tensor's axis 0 or -1 is no axis)
  for (int64_t a : *axes) out.push_back(a < 0 ? a + ndim : a);
  std::sort(out.begin(), out.end());
  return out;
}

void check_axes(const char* op, const int64_t* axes, size_t n, int64_t ndim) {
  const auto norm = [ndim](int64_t a) { return a < 0 ? a + ndim : a; };
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = axes[i];
    if (a < -std::max<int64_t>(ndim, 1) || a >= std::max<int64_t>(ndim, 1)) {
      fail<IndexError>(op, "axis ", a, " is out of range for a tensor of rank ", ndim);
    }
    if (ndim == 0) continue;
    for (size_t j = 0; j < i; ++j) {
      if (norm(axes[j]) == norm(a)) fail<ValueError>(op, "axis ", a, " is repeated");
    }
  }
}

Shape reduce_shape(const char* op, const Shape& shape, const Axes& axes, bool keepdims) {
  const auto ax = normalize_axes(op, axes, static_cast<int64_t>(shape.size()));
  Shape out;
  for (size_t i = 0; i < shape.size(); ++i) {
    const bool reduced = std::binary_search(ax.begin(), ax.end(), static_cast<int64_t>(i));
    if (!reduced) out.push_back(shape[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

Shape matmul_shape(const char* op, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) fail<ValueError>(op, "matmul needs inputs of rank >= 1, got ", shape_str(a), " and ", shape_str(b));
  Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  const int64_t k1 = a2[a2.size() - 1], k2 = b2[b2.size() - 2];
  if (k1 != k2 && k1 != kUnknownDim && k2 != kUnknownDim) {
    fail<ValueError>(op, "matmul inner dimensions differ: ", shape_str(a), " @ ", shape_str(b));
  }
  Shape ba(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const size_t nd = std::max(ba.size(), bb.size());
  Shape batch(nd, 1);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t x = i + ba.size() >= nd ? ba[i + ba.size() - nd] : 1;
    const int64_t y = i + bb.size() >= nd ? bb[i + bb.size() - nd] : 1;
    if (!broadcast_dim(x, y, &batch[i])) {
      fail<ValueError>(op, "matmul batch dimensions cannot be broadcast: ", shape_str(a), " @ ", shape_str(b));
    }
  }
  if (a.size() > 1) batch.push_back(a2[a2.size() - 2]);
  if (b.size() > 1) batch.push_back(b2[b2.size() - 1]);
  // (a product of big operands may have more elements than any tensor: checked as a broadcast's
  // result is, on the dimensions known)
  Shape known;
  for (int64_t d : batch) {
    if (d != kUnknownDim) known.push_back(d);
  }
  checked_numel(op, known, DType::Float64);
  return batch;
}

namespace {

// acc * scale as an Acc: exact when scale is 1 (an int64 sum above 2^53 is not rounded through a
// double); integer sums wrap around in two's complement, as NumPy's (fn::add).
template <typename Acc>
Acc scaled(Acc acc, double scale) {
  return scale == 1.0 ? acc : convert<Acc>(static_cast<double>(acc) * scale);
}

// out[k1, k2] = scale * sum_r x[k1, r, k2] for contiguous x viewed as (K1, R, K2).
template <typename In, typename Out>
void sum_block(const In* x, Out* out, int64_t K1, int64_t R, int64_t K2, double scale) {
  // floats accumulate in their compute type across many independent partial sums (vectorized,
  // like NumPy's and PyTorch's float32 sums), flushed into a double every block (a float32 sum of
  // 2^24 ones stalled at 2^24, as NumPy's column sums do; PyTorch's cascade does not); integers
  // in int64
  using C = compute_t<In>;
  using Acc = std::conditional_t<std::is_floating_point_v<C>, C, acc_t<C>>;
  using Total = std::conditional_t<std::is_integral_v<Acc>, Acc, double>;  // exact int64 sums
  if (K2 == 1) {
    // each output sums one contiguous row; 16 independent partial sums vectorize, flushed every
    // kFlush elements
    constexpr int64_t kFlush = 4096;
    parallel_for(K1, std::max<int64_t>(1, kParallelThreshold / std::max<int64_t>(R, 1)), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const In* row = x + k * R;
        const int64_t full = R - R % 16;
        Total total = 0;
        for (int64_t b0 = 0; b0 < full; b0 += kFlush) {
          Acc part[16] = {};
          const int64_t b1 = std::min(full, b0 + kFlush);
          for (int64_t r = b0; r < b1; r += 16) {
            for (int j = 0; j < 16; ++j) part[j] = fn::add(part[j], static_cast<Acc>(convert<C>(row[r + j])));
          }
          for (int j = 0; j < 16; ++j) total = fn::add(total, static_cast<Total>(part[j]));
        }
        for (int64_t r = full; r < R; ++r) total = fn::add(total, static_cast<Total>(convert<C>(row[r])));
        out[k] = convert<Out>(scaled(total, scale));
      }
    });
    return;
  }
  // columns: accumulate R rows of K2 contiguous values (vectorized over k2), kRows rows at a time
  // flushed into the totals
  constexpr int64_t kRows = 128;
  const int64_t blocks = K1 * ((K2 + 1023) / 1024);
  parallel_for(blocks, std::max<int64_t>(1, kParallelThreshold / std::max<int64_t>(R * 1024, 1)),
               [&](int64_t b, int64_t e) {
    std::vector<Acc> acc(1024);
    std::vector<Total> total(1024);
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t k1 = blk / ((K2 + 1023) / 1024);
      const int64_t c0 = (blk % ((K2 + 1023) / 1024)) * 1024;
      const int64_t width = std::min<int64_t>(1024, K2 - c0);
      std::fill(total.begin(), total.begin() + width, Total(0));
      for (int64_t r0 = 0; r0 < R; r0 += kRows) {
        std::fill(acc.begin(), acc.begin() + width, Acc(0));
        for (int64_t r = r0, r1 = std::min(R, r0 + kRows); r < r1; ++r) {
          const In* row = x + (k1 * R + r) * K2 + c0;
          for (int64_t c = 0; c < width; ++c) acc[c] = fn::add(acc[c], static_cast<Acc>(convert<C>(row[c])));
        }
        for (int64_t c = 0; c < width; ++c) total[c] = fn::add(total[c], static_cast<Total>(acc[c]));
      }
      Out* o = out + k1 * K2 + c0;
      for (int64_t c = 0; c < width; ++c) o[c] = convert<Out>(scaled(total[c], scale));
    }
  });
}

}  // namespace

TensorPtr reduced_last(const TensorPtr& x, const Shape& kept) {
  Shape shape, strides;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k = 0; k < x->dim(); ++k) {
      const bool reduced = kept[static_cast<size_t>(k)] == 1 && x->shape()[static_cast<size_t>(k)] != 1;
      if (reduced == (pass == 1)) {
        shape.push_back(x->shape()[static_cast<size_t>(k)]);
        strides.push_back(x->strides()[static_cast<size_t>(k)]);
      }
    }
  }
  return contiguous(std::make_shared<Tensor>(x->storage(), x->dtype(), shape, strides, x->offset(), x->format()));
}

// sum_into on a device: rows of x's reduced elements (reduced_last), summed row by row.
static void sum_on_device(const char* op, const TensorPtr& x, const Shape& kept, const TensorPtr& out, double scale) {
  Device d = x->device();
  DeviceRuntime& rt = device_runtime(op, d);
  note_device_use(*x);
  note_device_use(*out);
  const int64_t R = x->numel() / std::max<int64_t>(1, shape_numel(kept));
  if (x->numel() == 0) {  // an empty sum is 0 (times scale: NaN for mean)
    visit_dtype(out->dtype(), [&](auto tag) {
      using Out = decltype(tag);
      const Out zero = convert<Out>(0.0 * scale);
      rt.fill(op, d.index, out->raw_data(), out->numel(), sizeof(Out), &zero);
    });
    return;
  }
  rt.sum_rows(op, *reduced_last(x, kept), R, *out, scale);
}

void sum_into(const char* op, const TensorPtr& x_in, const Axes& axes, const TensorPtr& out, double scale) {
  const Shape kept = reduce_shape(op, x_in->shape(), axes, true);
  if (!x_in->on_host()) {
    sum_on_device(op, x_in, kept, out, scale);
    return;
  }
  const TensorPtr x = contiguous(x_in);
  const Shape& shape = x->shape();
  const int64_t nd = x->dim();
  // Collapse x into (K1, R, K2) when the reduced dims (ignoring size-1 dims) are adjacent.
  int64_t K1 = 1, R = 1, K2 = 1;
  int phase = 0;  // 0: before the reduced block, 1: inside it, 2: after it
  bool simple = true;
  for (int64_t d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    const bool reduced = kept[d] == 1;
    if (reduced && phase == 2) simple = false;
    if (reduced) phase = 1;
    else if (phase == 1) phase = 2;
    (reduced ? R : (phase == 0 ? K1 : K2)) *= shape[d];
  }
  if (x->numel() == 0) {
    visit_dtype(out->dtype(), [&](auto out_tag) {  // an empty sum is 0 (times scale: NaN for mean)
      using Out = decltype(out_tag);
      Out* q = out->data<Out>();
      for (int64_t i = 0, n = out->numel(); i < n; ++i) q[i] = convert<Out>(0.0 * scale);
    });
    return;
  }
  visit_dtype(x->dtype(), [&](auto in_tag) {
    using In = decltype(in_tag);
    visit_dtype(out->dtype(), [&](auto out_tag) {
      using Out = decltype(out_tag);
      if (simple) {
        sum_block<In, Out>(x->data<In>(), out->data<Out>(), K1, R, K2, scale);
        return;
      }
      // general layout: walk x once with an index counter
      using Acc = acc_t<compute_t<In>>;
      const int64_t nout = shape_numel(kept);
      const Shape ks = contiguous_strides(kept);
      std::vector<Acc> acc(static_cast<size_t>(nout), Acc(0));
      const In* p = x->data<In>();
      std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
      int64_t o = 0;
      for (int64_t i = 0, n = x->numel(); i < n; ++i) {
        acc[static_cast<size_t>(o)] = fn::add(acc[static_cast<size_t>(o)], static_cast<Acc>(convert<compute_t<In>>(p[i])));
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t step = kept[d] == 1 ? 0 : ks[d];
          if (++idx[d] < shape[d]) {
            o += step;
            break;
          }
          o -= step * (shape[d] - 1);
          idx[d] = 0;
        }
      }
      Out* q = out->data<Out>();
      for (int64_t i = 0; i < nout; ++i) q[i] = convert<Out>(scaled(acc[i], scale));
    });
  });
}

TensorPtr sum_kernel(const char* op, const TensorPtr& x, const Axes& axes, bool keepdims, DType out_dtype,
                     double scale) {
  auto out = empty(out_dtype, reduce_shape(op, x->shape(), axes, keepdims), x->format(), x->device());
  sum_into(op, x, axes, out, scale);
  return out;
}

int64_t shape_dim(const char* op, const char* input, const Shape& shape, int64_t i) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (i < -rank || i >= rank) {
    fail<ValueError>(op, "dimension ", i, " of ", input, " is out of range for its shape ", shape_str(shape));
  }
  return shape[static_cast<size_t>(i < 0 ? i + rank : i)];
}

Shape shape_slice(const Shape& shape, int64_t start, int64_t stop) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  auto clamp = [rank](int64_t k) { return std::clamp(k < 0 ? k + rank : k, int64_t{0}, rank); };
  const int64_t lo = clamp(start), hi = clamp(stop);
  return lo < hi ? Shape(shape.begin() + lo, shape.begin() + hi) : Shape{};
}

Shape shape_cat(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Shape shape_drop(const char* op, Shape d, int64_t i) {
  const int64_t rank = static_cast<int64_t>(d.size());
  if (rank == 0 && (i == 0 || i == -1)) return d;
  if (i < -rank || i >= rank) fail<ValueError>(op, "dimension ", i, " is out of range for dimensions ", shape_str(d));
  d.erase(d.begin() + (i < 0 ? i + rank : i));
  return d;
}

int64_t known(int64_t d) {
  if (d == kUnknownDim) throw UnknownShape();
  return d;
}

namespace {

[[noreturn]] void shape_overflow(const char* op, int64_t a, const char* sign, int64_t b) {
  fail<ValueError>(op, "shape rule arithmetic overflows int64: ", a, sign, b);
}

void check_output_dims(const char* op, const char* output, const Shape& shape, bool dynamic) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (dynamic && d == kUnknownDim) continue;
    if (d < 0) {
      fail<ValueError>(op, "output '", output, "' would have shape ", shape_str(shape),
                       " by the op's shape rule: dimensions must be >= 0");
    }
    // (zero dimensions left out of the product, as checked_numel does)
    if (d != 0 && __builtin_mul_overflow(n, d, &n)) {
      fail<ValueError>(op, "output '", output, "' would have shape ", shape_str(shape),
                       " by the op's shape rule: too many elements");
    }
  }
}

}  // namespace

int64_t shape_add(const char* op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) shape_overflow(op, a, " + ", b);
  return r;
}

int64_t shape_sub(const char* op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) shape_overflow(op, a, " - ", b);
  return r;
}

int64_t shape_mul(const char* op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) shape_overflow(op, a, " * ", b);
  return r;
}

int64_t shape_neg(const char* op, int64_t a) { return shape_sub(op, 0, a); }

Shape output_shape(const char* op, const char* output, Shape shape) {
  check_output_dims(op, output, shape, false);
  return shape;
}

int64_t dim_add(const char* op, int64_t a, int64_t b) {
  return a == kUnknownDim || b == kUnknownDim ? kUnknownDim : shape_add(op, a, b);
}
int64_t dim_sub(const char* op, int64_t a, int64_t b) {
  return a == kUnknownDim || b == kUnknownDim ? kUnknownDim : shape_sub(op, a, b);
}
int64_t dim_mul(const char* op, int64_t a, int64_t b) {
  return a == kUnknownDim || b == kUnknownDim ? kUnknownDim : shape_mul(op, a, b);
}
int64_t dim_neg(const char* op, int64_t a) { return a == kUnknownDim ? kUnknownDim : shape_neg(op, a); }

Shape output_dims(const char* op, const char* output, Shape shape) {
  check_output_dims(op, output, shape, true);
  return shape;
}

bool dims_compare(const Shape& a, const Shape& b, bool equal) {
  if (a.size() != b.size()) return !equal;
  bool unknown = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == kUnknownDim || b[i] == kUnknownDim) {
      unknown = true;
    } else if (a[i] != b[i]) {
      return !equal;
    }
  }
  if (unknown) throw UnknownShape();
  return equal;
}

Shape broadcast_dims(const char* op, const std::vector<Shape>& shapes) {
  size_t nd = 0;
  for (const Shape& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (const Shape& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      if (!broadcast_dim(o, s[i], &o)) {
        std::string text;
        for (const Shape& u : shapes) {
          std::string dims;
          for (int64_t d : u) dims += (dims.empty() ? "" : ", ") + (d == kUnknownDim ? std::string("?") : std::to_string(d));
          text += std::string(text.empty() ? "(" : ", (") + dims + (u.size() == 1 ? ",)" : ")");
        }
        fail<ValueError>(op, "shapes cannot be broadcast together: ", text);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------- helper functions

namespace {

struct CastFn : Function<CastFn> {
  static constexpr const char* kName = "cast";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, DType dtype) {
    if (x->dtype() == dtype) return detach(x);
    auto out = empty(dtype, x->shape(), x->format(), x->device());
    copy_into(out, x);
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? cast(g[0], ctx->input_meta(0).dtype) : nullptr};
  }
  // these helpers are linear: the tangent goes through the same function
  static TensorList Jvp(const TensorList& t, const TensorList&, const TensorPtr&, DType dtype) {
    return {cast(t[0], dtype)};
  }
};

// A copy to another device, differentiable (as torch's .to()): the gradient goes back to the
// input's device, the tangent comes along.
struct ToFn : Function<ToFn> {
  static constexpr const char* kName = "to";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, Device device) { return to_device("to", x, device); }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? to(g[0], ctx->input_meta(0).device) : nullptr};
  }
  static TensorList Jvp(const TensorList& t, const TensorList&, const TensorPtr&, Device device) {
    return {to(t[0], device)};
  }
};

struct SumToFn : Function<SumToFn> {
  static constexpr const char* kName = "sum_to";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, const Shape& shape) {
    const Shape& s = x->shape();
    if (!broadcasts_to(shape, s)) {
      fail<ValueError>("sum_to", "cannot reduce ", shape_str(s), " to ", shape_str(shape),
                       " (the target shape must broadcast to the tensor's)");
    }
    const size_t lead = s.size() - shape.size();
    std::vector<int64_t> axes;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i < lead || (shape[i - lead] == 1 && s[i] != 1)) axes.push_back(static_cast<int64_t>(i));
    }
    if (axes.empty()) return reshape_data(x, shape);
    return reshape_data(sum_kernel("sum_to", x, axes, true, x->dtype()), shape);
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? broadcast_to(g[0], ctx->input_meta(0).shape) : nullptr};
  }
  static TensorList Jvp(const TensorList& t, const TensorList&, const TensorPtr&, const Shape& shape) {
    return {sum_to(t[0], shape)};
  }
};

struct BroadcastToFn : Function<BroadcastToFn> {
  static constexpr const char* kName = "broadcast_to";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, const Shape& shape) {
    if (x->shape() == shape) return detach(x);
    auto out = empty(x->dtype(), shape, x->format(), x->device());
    // a stride-0 view of x over `shape`, copied densely
    auto view = std::make_shared<Tensor>(x->storage(), x->dtype(), shape, broadcast_strides(*x, shape),
                                         x->offset(), x->format());
    copy_into(out, view);
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? sum_to(g[0], ctx->input_meta(0).shape) : nullptr};
  }
  static TensorList Jvp(const TensorList& t, const TensorList&, const TensorPtr&, const Shape& shape) {
    return {broadcast_to(t[0], shape)};
  }
};

struct ReshapeFn : Function<ReshapeFn> {
  static constexpr const char* kName = "reshape";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, const Shape& requested) {
    // one dimension may be -1: inferred from the others, as in NumPy
    Shape shape = requested;
    int64_t known = 1;
    int infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == -1 && infer < 0) {
        infer = static_cast<int>(i);
      } else if (shape[i] < 0) {
        fail<ValueError>("reshape", "invalid dimension ", shape[i], " in shape ", shape_str(requested));
      } else if (__builtin_mul_overflow(known, shape[i], &known)) {
        fail<ValueError>("reshape", "shape ", shape_str(requested), " has too many elements");
      }
    }
    if (infer >= 0 && known > 0 && x->numel() % known == 0) shape[static_cast<size_t>(infer)] = x->numel() / known;
    if (shape_numel(shape) != x->numel() || (infer >= 0 && shape[static_cast<size_t>(infer)] < 0)) {
      fail<ValueError>("reshape", "cannot reshape ", shape_str(x->shape()), " to ", shape_str(requested));
    }
    return reshape_data(x, shape);
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? reshape(g[0], ctx->input_meta(0).shape) : nullptr};
  }
  static TensorList Jvp(const TensorList& t, const TensorList& out, const TensorPtr&, const Shape&) {
    return {reshape(t[0], out[0]->shape())};
  }
};

struct AddGradFn : Function<AddGradFn> {
  static constexpr const char* kName = "add_grad";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& a, const TensorPtr& b) {
    if (a->shape() != b->shape() || a->dtype() != b->dtype()) {
      fail<RuntimeError>("autograd", "cannot accumulate gradients of ", shape_str(a->shape()), " ",
                         dtype_name(a->dtype()), " and ", shape_str(b->shape()), " ", dtype_name(b->dtype()));
    }
    if (a->device() != b->device()) {
      fail<RuntimeError>("autograd", "cannot accumulate gradients on ", a->device().str(), " and ", b->device().str());
    }
    auto out = empty(a->dtype(), a->shape(), a->format(), a->device());
    if (!a->on_host()) {
      Device d = a->device();
      note_device_use(*a);
      note_device_use(*b);
      device_runtime("add_grad", d).add("add_grad", *out, *a, *b);
      return out;
    }
    visit_dtype(a->dtype(), [&](auto tag) {
      using T = decltype(tag);
      elementwise<T, T, T>(*out, [](auto x, auto y) { return x + y; }, {a.get(), b.get()});
    });
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? g[0] : nullptr, ctx->NeedsInputGrad(1) ? g[0] : nullptr};
  }
  static TensorList Jvp(const TensorList& t, const TensorList&, const TensorPtr&, const TensorPtr&) {
    if (!t[0] || !t[1]) return {t[0] ? t[0] : t[1]};
    return {add_grad(t[0], t[1])};
  }
};

// The primal of a dual tensor: an alias of x (the same memory) whose gradient flows back to x.
struct MakeDualFn : Function<MakeDualFn> {
  static constexpr const char* kName = "make_dual";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x) { return detach(x); }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? g[0] : nullptr};
  }
};

}  // namespace

TensorPtr make_dual(const TensorPtr& primal, const TensorPtr& tangent) {
  if (primal->fw_grad()) {
    fail<RuntimeError>("jvp", "the primal already carries a tangent: nested forward mode (jvp inside jvp) is "
                              "not supported; mix forward and reverse mode instead (grad of jvp)");
  }
  if (!is_floating(primal->dtype())) {
    fail<TypeError>("jvp", "only floating-point tensors have tangents, got a primal of dtype ",
                    dtype_name(primal->dtype()));
  }
  if (tangent->shape() != primal->shape()) {
    fail<ValueError>("jvp", "the tangent has shape ", shape_str(tangent->shape()), " but its primal has shape ",
                     shape_str(primal->shape()));
  }
  if (tangent->device() != primal->device()) {
    fail<ValueError>("jvp", "the tangent is on ", tangent->device().str(), " but its primal is on ",
                     primal->device().str());
  }
  TensorPtr dual = [&] {
    FwGradModeGuard off(false);
    return MakeDualFn::Apply(primal);
  }();
  dual->set_fw_grad(tangent->dtype() == primal->dtype() ? tangent : cast(tangent, primal->dtype()));
  return dual;
}

TensorPtr cast(const TensorPtr& x, DType dtype) { return CastFn::Apply(x, dtype); }
TensorPtr cast_like(const TensorPtr& x, const TensorPtr& like) {
  return x->dtype() == like->dtype() ? x : cast(x, like->dtype());
}
TensorPtr to(const TensorPtr& x, Device device) {
  if (device.type != DeviceType::CPU) device_runtime("to", device);  // (checks it, resolves a bare index)
  if (x->device() == device) return x;  // (itself, as torch's .to())
  return ToFn::Apply(x, device);
}
TensorPtr sum_to(const TensorPtr& x, const Shape& shape) { return SumToFn::Apply(x, shape); }
TensorPtr broadcast_to(const TensorPtr& x, const Shape& shape) { return BroadcastToFn::Apply(x, shape); }
TensorPtr reshape(const TensorPtr& x, const Shape& shape) { return ReshapeFn::Apply(x, shape); }
TensorPtr add_grad(const TensorPtr& a, const TensorPtr& b) { return AddGradFn::Apply(a, b); }

TensorPtr expand_reduced(const TensorPtr& dout, const TensorPtr& x, const Axes& axes, bool keepdims) {
  const Shape kept = reduce_shape("expand_reduced", x->shape(), axes, true);
  TensorPtr g = keepdims ? dout : reshape(dout, kept);
  return broadcast_to(g, x->shape());
}

TensorPtr zeros_like(const TensorPtr& x) { return full(x->dtype(), x->shape(), 0.0, x->format(), x->device()); }
TensorPtr ones_like(const TensorPtr& x) { return full(x->dtype(), x->shape(), 1.0, x->format(), x->device()); }
TensorPtr scalar_like(double value, const TensorPtr& like) {
  return full(like->dtype(), {}, value, Format::Default, like->device());
}
double numel(const TensorPtr& x) { return static_cast<double>(x->numel()); }
double numel_ratio(const TensorPtr& a, const TensorPtr& b) {
  return b->numel() == 0 ? 0.0 : static_cast<double>(a->numel()) / static_cast<double>(b->numel());
}

void check_composite_result(const char* op, const char* output, const TensorPtr& result, DType dtype,
                            const Shape& shape) {
  if (result->dtype() != dtype || result->shape() != shape) {
    fail<RuntimeError>(op, "its composite formula gives output '", output, "' of dtype ",
                       dtype_name(result->dtype()), " and shape ", shape_str(result->shape()),
                       "; its spec says dtype ", dtype_name(dtype), " and shape ", shape_str(shape),
                       " (what its meta rule gives framework adapters): fix the formula or the output's "
                       "dtype or shape rule");
  }
}

}  // namespace opforge
