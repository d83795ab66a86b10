// The peer of opforge.jax in the benchmark: what a JAX user writes by hand today to call an
// opforge kernel from JAX, a typed XLA FFI handler for one op and one dtype (float32 mul, no
// broadcasting) calling opforge's C++ API, its result written into XLA's buffer. Built by
// benchmarks/jax_peers.py against the installed jaxlib's FFI headers and opforge's library.
#include <cstring>
#include <vector>

#include "ops/mul.h"
#include "runtime/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

opforge::TensorPtr view(void* data, ffi::Span<const int64_t> dims, bool readonly) {
  auto storage = std::make_shared<opforge::Storage>();
  opforge::Shape shape(dims.begin(), dims.end());
  storage->nbytes = static_cast<size_t>(opforge::shape_numel(shape)) * sizeof(float);
  storage->data = storage->nbytes ? data : nullptr;
  storage->external = true;
  storage->readonly = readonly;
  opforge::Shape strides = opforge::contiguous_strides(shape);
  return std::make_shared<opforge::Tensor>(std::move(storage), opforge::DType::Float32, std::move(shape),
                                           std::move(strides), 0);
}

ffi::Error mul_f32(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> y, ffi::ResultBuffer<ffi::F32> z) {
  if (x.element_count() != y.element_count()) return ffi::Error::InvalidArgument("mul_f32: sizes differ");
  try {
    std::vector<opforge::BufferOffer> offers{
        {z->untyped_data(), opforge::DType::Float32, opforge::Shape(z->dimensions().begin(), z->dimensions().end()),
         opforge::Device{}}};
    opforge::BufferOfferScope scope(&offers);
    opforge::TensorPtr out = opforge::ops::mul(view(x.untyped_data(), x.dimensions(), true),
                                               view(y.untyped_data(), y.dimensions(), true));
    if (out->raw_data() != z->untyped_data()) std::memcpy(z->untyped_data(), out->raw_data(), z->size_bytes());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeerMulF32, mul_f32,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
