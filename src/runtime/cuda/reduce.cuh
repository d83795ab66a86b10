// Row reductions on CUDA devices through CUB: out[r] = the reduction of values[r * R, (r + 1) * R)
// with an associative operator, for the core's sums (functional.cu) and the reduction kernels of
// src/kernels/cuda/. The work is shaped for the device, not hand-reduced:
//   - one row: cub::DeviceReduce over the whole device;
//   - many rows, or short ones: cub::DeviceSegmentedReduce, a block per row;
//   - few long rows (a block per row would leave most of the device idle): each row split into
//     chunks reduced as segments, then the chunks' partials reduced per row (both segmented).
// Temporary storage comes from the device allocator, on the current stream like the kernels.
#pragma once

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_utils.cuh"
#include "runtime/tensor.h"

namespace opforge::cuda {

// Temporary device memory of at least bytes (one byte when 0), from the allocator on the current
// stream: freed, stream-ordered after the work queued so far, when the tensor goes.
inline TensorPtr scratch(Device device, size_t bytes) {
  return empty(DType::UInt8, {static_cast<int64_t>(std::max<size_t>(bytes, 1))}, Format::Default, device);
}

namespace detail {

// Bound of segment s when each of the rows of R elements is split into k chunks of `chunk`
// elements (the last shorter): row s / k, chunk s % k; `end` adds one chunk (the segment's end).
struct SegmentBound {
  int64_t R, chunk, k, end;
  __host__ __device__ int64_t operator()(int64_t s) const {
    const int64_t j = s % k + end;
    return (s / k) * R + (j * chunk < R ? j * chunk : R);
  }
};

// Rows at or above this count keep the device busy with a block per row; shorter rows are not split.
constexpr int64_t kBusyRows = 1024;
constexpr int64_t kMinChunk = 8192;

}  // namespace detail

// out[r] (device memory, rows elements) = reduce over row r of values (an iterator of Acc over
// rows * R elements), starting from init (the result of an empty row). Runs on device's current
// stream; RuntimeError naming op on a CUDA error.
template <typename Acc, typename It, typename Op>
void reduce_rows(const char* op, Device device, It values, int64_t rows, int64_t R, Acc* out, Op reduce, Acc init) {
  if (rows == 0) return;
  DeviceGuard guard(op, device.index);
  const cudaStream_t stream = current_stream(op, device);
  if (rows == 1 && R > 0) {
    size_t bytes = 0;
    check(op, cub::DeviceReduce::Reduce(nullptr, bytes, values, out, R, reduce, init, stream));
    const TensorPtr temp = scratch(device, bytes);
    check(op, cub::DeviceReduce::Reduce(temp->raw_data(), bytes, values, out, R, reduce, init, stream));
    return;
  }
  const auto segmented = [&](auto in, int64_t segments, detail::SegmentBound bound, Acc* dst) {
    const auto counting = thrust::make_counting_iterator<int64_t>(0);
    const auto begins = thrust::make_transform_iterator(counting, bound);
    bound.end = 1;
    const auto ends = thrust::make_transform_iterator(counting, bound);
    size_t bytes = 0;
    check(op, cub::DeviceSegmentedReduce::Reduce(nullptr, bytes, in, dst, segments, begins, ends, reduce, init, stream));
    const TensorPtr temp = scratch(device, bytes);
    check(op, cub::DeviceSegmentedReduce::Reduce(temp->raw_data(), bytes, in, dst, segments, begins, ends, reduce,
                                                  init, stream));
  };
  int64_t k = 1;
  if (rows < detail::kBusyRows && R >= 2 * detail::kMinChunk) {
    k = std::min((detail::kBusyRows + rows - 1) / rows, R / detail::kMinChunk);
  }
  if (k <= 1) {
    segmented(values, rows, detail::SegmentBound{R, R, 1, 0}, out);
    return;
  }
  const int64_t chunk = (R + k - 1) / k;
  k = (R + chunk - 1) / chunk;
  const TensorPtr partial = scratch(device, static_cast<size_t>(rows * k) * sizeof(Acc));
  Acc* parts = static_cast<Acc*>(partial->raw_data());
  segmented(values, rows * k, detail::SegmentBound{R, chunk, k, 0}, parts);
  segmented(static_cast<const Acc*>(parts), rows, detail::SegmentBound{k, k, 1, 0}, out);
}

}  // namespace opforge::cuda
