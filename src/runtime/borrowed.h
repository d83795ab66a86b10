// Tensors over memory another library owns, recycled per thread: what a foreign call's handler
// wraps its buffers in (opforge.jax's XLA FFI handler).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace opforge {

// A contiguous tensor of shape[0..ndim) over memory another library owns and keeps alive for the
// call (XLA's buffers in opforge.jax's handler): a wrapper from this thread's pool when one is
// free, rebound to the memory (no allocation while its shape fits), else a new one.
// recycle_borrowed(t) at the call's end puts it back when nothing else holds it or its storage
// (no view of it, no result sharing it, nothing saved): t is empty afterwards either way.
TensorPtr wrap_borrowed(void* data, size_t nbytes, DType dtype, const int64_t* shape, size_t ndim, Device device,
                        bool readonly);
void recycle_borrowed(TensorPtr& t);

}  // namespace opforge
