// Shape rules, the reduction kernel and the runtime's own differentiable helper functions.
#include "runtime/functional.h"

#include <algorithm>

#include "runtime/autograd.h"
#include "runtime/elementwise.h"

namespace opforge {

Shape broadcast_shapes(const char* op, std::initializer_list<const Tensor*> inputs,
                       std::initializer_list<const char*> names) {
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

std::vector<int64_t> normalize_axes(const char* op, const Axes& axes, int64_t ndim) {
  std::vector<int64_t> out;
  if (!axes || axes->empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : *axes) {
    if (a < -ndim || a >= std::max<int64_t>(ndim, 1) || (ndim == 0 && a != 0 && a != -1)) {
      fail<IndexError>(op, "axis ", a, " is out of range for a tensor of rank ", ndim);
    }
    if (ndim == 0) continue;
    const int64_t n = a < 0 ? a + ndim : a;
    if (std::find(out.begin(), out.end(), n) != out.end()) fail<ValueError>(op, "axis ", a, " is repeated");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
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
  if (k1 != k2) fail<ValueError>(op, "matmul inner dimensions differ: ", shape_str(a), " @ ", shape_str(b));
  Shape ba(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const size_t nd = std::max(ba.size(), bb.size());
  Shape batch(nd, 1);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t x = i + ba.size() >= nd ? ba[i + ba.size() - nd] : 1;
    const int64_t y = i + bb.size() >= nd ? bb[i + bb.size() - nd] : 1;
    if (x != y && x != 1 && y != 1) fail<ValueError>(op, "matmul batch dimensions cannot be broadcast: ", shape_str(a), " @ ", shape_str(b));
    batch[i] = std::max(x, y);
  }
  if (a.size() > 1) batch.push_back(a2[a2.size() - 2]);
  if (b.size() > 1) batch.push_back(b2[b2.size() - 1]);
  return batch;
}

void sum_into(const char* op, const TensorPtr& x_in, const Axes& axes, const TensorPtr& out, double scale) {
  const Shape kept = reduce_shape(op, x_in->shape(), axes, true);
  const TensorPtr x = contiguous(x_in);
  const int64_t nout = shape_numel(kept);
  const Shape ks = contiguous_strides(kept);  // output strides over x's dims (unused on reduced dims)
  const Shape& shape = x->shape();
  const int64_t nd = x->dim();
  visit_dtype(x->dtype(), [&](auto in_tag) {
    using In = decltype(in_tag);
    using Acc = acc_t<compute_t<In>>;
    std::vector<Acc> acc(static_cast<size_t>(nout), Acc(0));
    const In* p = x->data<In>();
    const int64_t n = x->numel();
    if (n > 0) {
      std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
      int64_t o = 0;
      for (int64_t i = 0; i < n; ++i) {
        acc[static_cast<size_t>(o)] += static_cast<Acc>(convert<compute_t<In>>(p[i]));
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
    }
    visit_dtype(out->dtype(), [&](auto out_tag) {
      using Out = decltype(out_tag);
      Out* q = out->data<Out>();
      for (int64_t i = 0; i < nout; ++i) {
        if constexpr (std::is_floating_point_v<Acc>) {
          q[i] = convert<Out>(acc[i] * scale);
        } else {
          q[i] = convert<Out>(scale == 1.0 ? acc[i] : static_cast<Acc>(static_cast<double>(acc[i]) * scale));
        }
      }
    });
  });
}

TensorPtr sum_kernel(const char* op, const TensorPtr& x, const Axes& axes, bool keepdims, DType out_dtype,
                     double scale) {
  auto out = empty(out_dtype, reduce_shape(op, x->shape(), axes, keepdims), x->format());
  sum_into(op, x, axes, out, scale);
  return out;
}

// ---------------------------------------------------------------------------- helper functions

namespace {

struct CastFn : Function<CastFn> {
  static constexpr const char* kName = "cast";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, DType dtype) {
    if (x->dtype() == dtype) return detach(x);
    auto out = empty(dtype, x->shape(), x->format());
    copy_into(out, x);
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? cast(g[0], ctx->input_meta(0).dtype) : nullptr};
  }
};

struct SumToFn : Function<SumToFn> {
  static constexpr const char* kName = "sum_to";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, const Shape& shape) {
    const Shape& s = x->shape();
    if (s.size() < shape.size()) {
      fail<RuntimeError>("sum_to", "cannot reduce ", shape_str(s), " to ", shape_str(shape));
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
};

struct BroadcastToFn : Function<BroadcastToFn> {
  static constexpr const char* kName = "broadcast_to";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& x, const Shape& shape) {
    if (x->shape() == shape) return detach(x);
    auto out = empty(x->dtype(), shape, x->format());
    // a stride-0 view of x over `shape`, copied densely
    auto view = std::make_shared<Tensor>(x->storage(), x->dtype(), shape, broadcast_strides(*x, shape),
                                         x->offset(), x->format());
    copy_into(out, view);
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? sum_to(g[0], ctx->input_meta(0).shape) : nullptr};
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
};

struct AddGradFn : Function<AddGradFn> {
  static constexpr const char* kName = "add_grad";
  static TensorPtr Forward(AutogradContext*, const TensorPtr& a, const TensorPtr& b) {
    if (a->shape() != b->shape() || a->dtype() != b->dtype()) {
      fail<RuntimeError>("autograd", "cannot accumulate gradients of ", shape_str(a->shape()), " ",
                         dtype_name(a->dtype()), " and ", shape_str(b->shape()), " ", dtype_name(b->dtype()));
    }
    auto out = empty(a->dtype(), a->shape(), a->format());
    visit_dtype(a->dtype(), [&](auto tag) {
      using T = decltype(tag);
      elementwise<T, T, T>(*out, [](auto x, auto y) { return x + y; }, {a.get(), b.get()});
    });
    return out;
  }
  static TensorList Backward(AutogradContext* ctx, TensorList g) {
    return {ctx->NeedsInputGrad(0) ? g[0] : nullptr, ctx->NeedsInputGrad(1) ? g[0] : nullptr};
  }
};

}  // namespace

TensorPtr cast(const TensorPtr& x, DType dtype) { return CastFn::Apply(x, dtype); }
TensorPtr sum_to(const TensorPtr& x, const Shape& shape) { return SumToFn::Apply(x, shape); }
TensorPtr broadcast_to(const TensorPtr& x, const Shape& shape) { return BroadcastToFn::Apply(x, shape); }
TensorPtr reshape(const TensorPtr& x, const Shape& shape) { return ReshapeFn::Apply(x, shape); }
TensorPtr add_grad(const TensorPtr& a, const TensorPtr& b) { return AddGradFn::Apply(a, b); }

TensorPtr expand_reduced(const TensorPtr& dout, const TensorPtr& x, const Axes& axes, bool keepdims) {
  const Shape kept = reduce_shape("expand_reduced", x->shape(), axes, true);
  TensorPtr g = keepdims ? dout : reshape(dout, kept);
  return broadcast_to(g, x->shape());
}

TensorPtr zeros_like(const TensorPtr& x) { return full(x->dtype(), x->shape(), 0.0, x->format()); }
TensorPtr ones_like(const TensorPtr& x) { return full(x->dtype(), x->shape(), 1.0, x->format()); }
TensorPtr scalar_like(double value, const TensorPtr& like) { return full(like->dtype(), {}, value); }
double numel(const TensorPtr& x) { return static_cast<double>(x->numel()); }

}  // namespace opforge
