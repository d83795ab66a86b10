// The core's tensor helpers on CUDA devices (DeviceRuntime::copy_convert, add, sum_rows): the
// elementwise loop of runtime/cuda/elementwise.cuh, and row sums through CUB (runtime/cuda/reduce.cuh).
#include <thrust/iterator/transform_iterator.h>

#include "runtime/cuda/elementwise.cuh"
#include "runtime/cuda/functional.h"
#include "runtime/cuda/reduce.cuh"

namespace opforge::cuda {

namespace {

struct Identity {
  template <typename T>
  OPFORGE_HD OPFORGE_INLINE T operator()(T v) const { return v; }
};

struct Plus {  // (integers wrap around, as NumPy's: fn::add)
  template <typename T>
  OPFORGE_HD OPFORGE_INLINE T operator()(T a, T b) const { return static_cast<T>(fn::add(a, b)); }
};

template <typename Acc>
struct Scale {
  double scale;
  OPFORGE_HD OPFORGE_INLINE Acc operator()(Acc v) const {
    return scale == 1.0 ? v : convert<Acc>(static_cast<double>(v) * scale);
  }
};

// The type a row sum accumulates in on the device: float for 16/32-bit floats (as torch), double,
// int64 for integers and bool.
template <typename T> struct device_acc { using type = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>; };
template <> struct device_acc<Half> { using type = float; };
template <> struct device_acc<BFloat16> { using type = float; };

template <typename In, typename Acc>
struct ToAcc {
  __host__ __device__ Acc operator()(In v) const { return static_cast<Acc>(convert<compute_t<In>>(v)); }
};

}  // namespace

void copy_convert(const char* op, const Tensor& dst, const Tensor& src) {
  visit_dtype(dst.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(src.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      CurrentOpScope scope(op);
      ::opforge::cuda::elementwise<Out, In>(dst, Identity{}, {&src});
    });
  });
}

void add(const char* op, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    CurrentOpScope scope(op);
    ::opforge::cuda::elementwise<T, T, T>(out, Plus{}, {&a, &b});
  });
}

void sum_rows(const char* op, const Tensor& x, int64_t R, const Tensor& out, double scale) {
  const int64_t rows = out.numel();
  if (rows == 0) return;
  const Device device = x.device();
  visit_dtype(x.dtype(), [&](auto in_tag) {
    using In = decltype(in_tag);
    using Acc = typename device_acc<In>::type;
    TensorPtr acc = empty(dtype_of<Acc>::value, out.shape(), Format::Default, device);  // (out's shape: rows in its order)
    const auto values = thrust::make_transform_iterator(static_cast<const In*>(x.raw_data()), ToAcc<In, Acc>{});
    reduce_rows(op, device, values, rows, R, acc->data<Acc>(), Plus{}, Acc(0));
    visit_dtype(out.dtype(), [&](auto out_tag) {
      using Out = decltype(out_tag);
      CurrentOpScope scope(op);
      ::opforge::cuda::elementwise<Out, Acc>(out, Scale<Acc>{scale}, {acc.get()});
    });
  });
}

}  // namespace opforge::cuda
