// What CUDA code of opforge shares: error checks, the device guard, and the current stream of a
// tensor's device (the DeviceRuntime's, so kernels, copies and allocations are ordered alike).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "runtime/device.h"
#include "runtime/errors.h"

namespace opforge::cuda {

inline std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// RuntimeError naming op on a CUDA error (cleared first, so that the next call starts clean).
inline void check(const char* op, cudaError_t e) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail<RuntimeError>(op, "CUDA error ", error_text(e));
  }
}

// Makes index the calling thread's current device for the guard's lifetime.
class DeviceGuard {
 public:
  DeviceGuard(const char* op, int index) {
    check(op, cudaGetDevice(&previous_));
    if (previous_ != index) check(op, cudaSetDevice(index));
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The calling thread's current stream on a CUDA device.
inline cudaStream_t current_stream(const char* op, Device device) {
  return static_cast<cudaStream_t>(device_runtime(op, device).current_stream(device.index));
}

}  // namespace opforge::cuda
