// LeakyRelu (slope 0.01) as a kernel of an external shared library,
// libleaky_relu_ext.so, with MindSpore's AOT C ABI and nothing of opforge: the kernel of the aot op
// leaky_relu_ext (op_specs/leaky_relu_ext.yaml). The wheel ships this build of it; a library
// of the same name found first on OPFORGE_AOT_PATH (say one calling PyTorch's ATen) replaces it.
#include <cstdint>
#include <cstring>

namespace {

template <typename T>
void leaky_relu(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0.01) * x[i];
}

}  // namespace

// params: x, out (same shape and dtype). Returns 0, or 1 for a bad call, 2 for another dtype.
extern "C" __attribute__((visibility("default"))) int leaky_relu_ext(int nparam, void** params, int* ndims,
                                                                     int64_t** shapes, const char** dtypes,
                                                                     void* stream, void* extra) {
  (void)stream;
  (void)extra;
  if (nparam != 2 || ndims[0] != ndims[1] || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  if (std::strcmp(dtypes[0], "float32") == 0) {
    leaky_relu(static_cast<const float*>(params[0]), static_cast<float*>(params[1]), n);
  } else if (std::strcmp(dtypes[0], "float64") == 0) {
    leaky_relu(static_cast<const double*>(params[0]), static_cast<double*>(params[1]), n);
  } else {
    return 2;
  }
  return 0;
}
