// The peers of opforge.mindspore in the benchmark: what a MindSpore user writes by hand today,
// an aot Custom kernel with MindSpore's AOT C ABI (float32 only, no broadcasting, no checks beyond
// the dtype). Built by benchmarks/ms_peers.py with g++ -O2.
#include <cstdint>
#include <cstring>

extern "C" int mul_f32(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                       void* stream, void* extra) {
  if (nparam != 3 || std::strcmp(dtypes[0], "float32") != 0) return 1;
  const float* x = static_cast<const float*>(params[0]);
  const float* y = static_cast<const float*>(params[1]);
  float* z = static_cast<float*>(params[2]);
  int64_t n = 1;
  for (int i = 0; i < ndims[2]; ++i) n *= shapes[2][i];
  for (int64_t i = 0; i < n; ++i) z[i] = x[i] * y[i];
  return 0;
}

extern "C" int leaky_relu_f32(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                              void* stream, void* extra) {
  if (nparam != 2 || std::strcmp(dtypes[0], "float32") != 0) return 1;
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  int64_t n = 1;
  for (int i = 0; i < ndims[1]; ++i) n *= shapes[1][i];
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.01f * x[i];
  return 0;
}
