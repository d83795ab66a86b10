// The CUDA runtime of opforge (device.h's DeviceRuntime for DeviceType::CUDA), linked into builds
// whose targets include cuda (the cu130 wheel). It registers itself when libopforge.so loads.
//
// libcudart loads without a driver (it opens libcuda lazily): on a machine without one every query
// returns an error code, which becomes device_count() == 0 and a reason, never a crash or a hang.
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "runtime/device.h"
#include "runtime/errors.h"

namespace opforge::cuda {

namespace {

std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() override {
    probe();
    return count_;
  }
  std::string unavailable_reason() override {
    probe();
    return reason_;
  }
  int current_device() override {
    int d = 0;
    check("current_device", cudaGetDevice(&d));
    return d;
  }
  void synchronize(const char* op, int index) override {
    int previous = 0;
    check(op, cudaGetDevice(&previous));
    if (previous != index) check(op, cudaSetDevice(index));
    const cudaError_t e = cudaDeviceSynchronize();
    if (previous != index) cudaSetDevice(previous);
    check(op, e);
  }
  std::string version() override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);  // 0 without a driver
    return "CUDA runtime " + std::to_string(runtime) + ", driver " +
           (driver ? std::to_string(driver) : std::string("none"));
  }

 private:
  // The first query decides, once per process (as torch.cuda does): devices do not come and go.
  void probe() {
    std::call_once(once_, [this] {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        cudaGetLastError();  // (clears the sticky-free error so later calls start clean)
        count_ = 0;
        reason_ = error_text(e) + "; " + version();
      } else {
        count_ = n;
        reason_ = n ? "" : "no CUDA device; " + version();
      }
    });
  }
  static void check(const char* op, cudaError_t e) {
    if (e != cudaSuccess) fail<RuntimeError>(op, "CUDA error ", error_text(e));
  }

  std::once_flag once_;
  int count_ = 0;
  std::string reason_;
};

CudaRuntime runtime;
[[maybe_unused]] const bool registered = (register_device_runtime(DeviceType::CUDA, &runtime), true);

}  // namespace

}  // namespace opforge::cuda
