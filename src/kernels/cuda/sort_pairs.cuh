// Stable sorts of (key, value) pairs on the device, for the kernels that sum runs of equal keys in
// a fixed order (embedding_backward, scatter_add_along_axis): deterministic, no atomics.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <cstdint>

#include "runtime/cuda/reduce.cuh"

namespace opforge::kernels::cuda::rows {

// keys[0, n) sorted with their values, stably (CUB's radix sort over all 64 bits), on stream; the
// scratch CUB asks for is the device allocator's.
inline void sort_pairs(const char* op, Device device, cudaStream_t stream, const int64_t* keys_in, int64_t* keys,
                       const int64_t* values_in, int64_t* values, int64_t n) {
  size_t bytes = 0;
  ::opforge::cuda::check(op, cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys, values_in, values, n, 0,
                                                             64, stream));
  const TensorPtr temp = ::opforge::cuda::scratch(device, bytes);
  ::opforge::cuda::check(op, cub::DeviceRadixSort::SortPairs(temp->raw_data(), bytes, keys_in, keys, values_in, values,
                                                             n, 0, 64, stream));
}

}  // namespace opforge::kernels::cuda::rows
