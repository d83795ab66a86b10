// The core's tensor helpers on CUDA devices (functional.cu), called by the CUDA DeviceRuntime.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace opforge::cuda {

void copy_convert(const char* op, const Tensor& dst, const Tensor& src);
void add(const char* op, const Tensor& out, const Tensor& a, const Tensor& b);
void sum_rows(const char* op, const Tensor& x, int64_t R, const Tensor& out, double scale);

}  // namespace opforge::cuda
