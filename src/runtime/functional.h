// Runtime building blocks used by generated code: shape rules, the sum-over-axes kernel and
// the differentiable helpers that bprop formulas and Backward use (cast, sum_to, broadcast_to,
// reshape, expand_reduced, zeros_like, ones_like, scalar_like, numel).
#pragma once

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace opforge {

using Axes = std::optional<std::vector<int64_t>>;

// ---- shape rules (throw ValueError / IndexError naming op)
Shape broadcast_shapes(const char* op, std::initializer_list<const Tensor*> inputs,
                       std::initializer_list<const char*> names);
Shape broadcast_shapes(const char* op, const std::vector<const Tensor*>& inputs,
                       const std::vector<const char*>& names);
// Normalized, sorted, unique axes; nullopt or empty means all axes.
std::vector<int64_t> normalize_axes(const char* op, const Axes& axes, int64_t ndim);
// normalize_axes' checks alone, allocating nothing (an op's axis attrs against each input they
// index, in every call): IndexError out of range, ValueError repeated, naming op; an absent
// (optional) axis is every axis, nothing to check
void check_axes(const char* op, const int64_t* axes, size_t n, int64_t ndim);
inline void check_axes(const char* op, const std::vector<int64_t>& axes, int64_t ndim) {
  check_axes(op, axes.data(), axes.size(), ndim);
}
inline void check_axes(const char* op, int64_t axis, int64_t ndim) { check_axes(op, &axis, 1, ndim); }
inline void check_axes(const char* op, const Axes& axes, int64_t ndim) {
  if (axes) check_axes(op, *axes, ndim);
}
inline void check_axes(const char* op, const std::optional<int64_t>& axis, int64_t ndim) {
  if (axis) check_axes(op, *axis, ndim);
}
Shape reduce_shape(const char* op, const Shape& shape, const Axes& axes, bool keepdims);
Shape matmul_shape(const char* op, const Shape& a, const Shape& b);  // unknown dimensions too
// shape expressions of specs (codegen/formula/dims.py): dim(t, i), a negative i counting from the
// end (ValueError naming op and the input when out of range); dims(t, start[, stop]) as Python's
// shape[start:stop]; list concatenation
int64_t shape_dim(const char* op, const char* input, const Shape& shape, int64_t i);
Shape shape_slice(const Shape& shape, int64_t start, int64_t stop = INT64_MAX);
Shape shape_cat(Shape a, const Shape& b);
// drop(d, i): d without dimension i, negative from the end (ValueError naming op when out of
// range; empty d with i 0 or -1 stays empty: a 0-d tensor's axis 0 is no axis)
Shape shape_drop(const char* op, Shape d, int64_t i);
// (broadcasts(d, to) of checks is runtime/tensor.h's broadcasts_to)
// + - * and unary - of dimensions (and int attrs) in shape rules and checks: ValueError naming op
// where the result would overflow int64 (a wrapped size would pass for a valid one)
int64_t shape_add(const char* op, int64_t a, int64_t b);
int64_t shape_sub(const char* op, int64_t a, int64_t b);
int64_t shape_mul(const char* op, int64_t a, int64_t b);
int64_t shape_neg(const char* op, int64_t a);
// An output's shape as its rule (an expression or an infer() function) gave it, checked: a
// negative dimension or more elements than int64 counts is a ValueError naming op and the output
Shape output_shape(const char* op, const char* output, Shape shape);

// ---- shape rules over dimensions that may be unknown: what MindSpore's Graph mode asks when it
// compiles a graph for dynamic shapes (the AOT InferShape entry points, aot/aot.h). A dimension
// is kUnknownDim where it is not known before the call; a rule gives every dimension it can, and
// one that needs an unknown value (a comparison, an index) throws UnknownShape: the output's rank
// is unknown too. Shape checks are left to the call, when every dimension is known.
inline constexpr int64_t kUnknownDim = INT64_MIN;
struct UnknownShape : std::exception {
  const char* what() const noexcept override { return "a shape rule needs a dimension that is not known yet"; }
};
// An input's dimensions, read by the generated rules as a tensor's are (->shape(), ->dim()).
struct DimsOf {
  Shape dims;
  const Shape& shape() const { return dims; }
  int64_t dim() const { return static_cast<int64_t>(dims.size()); }
};
int64_t known(int64_t d);  // d, or UnknownShape when it is unknown
int64_t dim_add(const char* op, int64_t a, int64_t b);  // unknown when either operand is; else shape_add's
int64_t dim_sub(const char* op, int64_t a, int64_t b);
int64_t dim_mul(const char* op, int64_t a, int64_t b);
int64_t dim_neg(const char* op, int64_t a);
// output_shape over dimensions that may be unknown: the known ones checked
Shape output_dims(const char* op, const char* output, Shape shape);
template <typename Compare>
bool dim_compare(int64_t a, int64_t b, Compare compare) {
  return compare(known(a), known(b));
}
// == (or !=, equal false) of two dimension lists: lists of different lengths differ; else
// UnknownShape when a dimension is unknown
bool dims_compare(const Shape& a, const Shape& b, bool equal);
// broadcast_shapes over dimensions: an unknown dimension against 1 stays unknown, against a known
// n (0 included) is n; known dimensions that cannot broadcast raise ValueError naming op
Shape broadcast_dims(const char* op, const std::vector<Shape>& shapes);

// ---- kernels (no autograd)
// out = scale * sum of x over axes; out is contiguous with x's reduced shape (keepdims or not).
void sum_into(const char* op, const TensorPtr& x, const Axes& axes, const TensorPtr& out, double scale = 1.0);
// x viewed with its kept dimensions first and its reduced ones last (kept: reduce_shape's shape
// with keepdims; reduced dimensions of size 1 count as kept), copied contiguous when that view is
// not: rows of numel(x) / numel(kept) elements, one per output element (device reductions).
TensorPtr reduced_last(const TensorPtr& x, const Shape& kept);
// The same into a new tensor of dtype out.
TensorPtr sum_kernel(const char* op, const TensorPtr& x, const Axes& axes, bool keepdims, DType out,
                     double scale = 1.0);

// ---- differentiable helpers (record autograd when grad mode is on)
TensorPtr cast(const TensorPtr& x, DType dtype);
// x cast to like's dtype (x itself when it has it): derived formulas reading a tensor of another
// type variable (a gradient of `x * n`, n int32, is `dout * cast_like(n, x)`)
TensorPtr cast_like(const TensorPtr& x, const TensorPtr& like);
// x on device (itself when already there), differentiable: gradients go back to x's device.
TensorPtr to(const TensorPtr& x, Device device);
TensorPtr sum_to(const TensorPtr& x, const Shape& shape);
TensorPtr broadcast_to(const TensorPtr& x, const Shape& shape);
TensorPtr reshape(const TensorPtr& x, const Shape& shape);
TensorPtr add_grad(const TensorPtr& a, const TensorPtr& b);
// dout (reduced over axes of x, keepdims or not) broadcast back to x's shape.
TensorPtr expand_reduced(const TensorPtr& dout, const TensorPtr& x, const Axes& axes, bool keepdims);

// forward mode: an alias of primal (gradients flow back to it) carrying tangent (cast to its
// dtype; same shape and device), what opforge.jvp feeds the function
TensorPtr make_dual(const TensorPtr& primal, const TensorPtr& tangent);

// ---- constants (never require grad)
TensorPtr zeros_like(const TensorPtr& x);
TensorPtr ones_like(const TensorPtr& x);
TensorPtr scalar_like(double value, const TensorPtr& like);
// op(t, value) for a formula's `t * 0.5` (op(num_t, num_s) takes t and value as a 0-d tensor):
// beside a 16-bit float tensor the number is a float32 and t is widened, the result rounded once
// to t's dtype, as the op's kernel computes two 16-bit tensors (not the number rounded to t's
// dtype first: 1/n in mean's gradient is subnormal in float16 past n = 16384, 0 past 2^25).
template <typename Op>
TensorPtr with_number(const TensorPtr& t, double value, Op&& op) {
  if (t->dtype() == DType::Float16 || t->dtype() == DType::BFloat16) {
    TensorPtr wide = cast(t, DType::Float32);
    return cast(op(wide, scalar_like(value, wide)), t->dtype());
  }
  return op(t, scalar_like(value, t));
}
double numel(const TensorPtr& x);
// numel(a) / numel(b), 0 when b is empty: a mean's scale numel(out) / numel(x), finite so that the
// gradient of a gradient scaled by it over an empty x is 0 (0 * inf was NaN), as torch's
double numel_ratio(const TensorPtr& a, const TensorPtr& b);
// A composite op's result against its spec's dtype and shape rule (what its meta rule, and so
// adapters' fake tensors and XLA, take): RuntimeError naming the op and output where they differ.
void check_composite_result(const char* op, const char* output, const TensorPtr& result, DType dtype,
                            const Shape& shape);

// list[int] attr values passed where a list[float] attr is expected
inline std::vector<double> to_float_list(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace opforge
