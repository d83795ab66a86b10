// The CUDA runtime of opforge (device.h's DeviceRuntime for DeviceType::CUDA), linked into builds
// whose targets include cuda (the cu130 wheel). It registers itself when libopforge.so loads.
//
// libcudart loads without a driver (it opens libcuda lazily): on a machine without one every query
// returns an error code, which becomes device_count() == 0 and a reason, never a crash or a hang.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_utils.cuh"
#include "runtime/cuda/functional.h"
#include "runtime/device.h"
#include "runtime/errors.h"

namespace opforge::cuda {

namespace {

constexpr int kMaxDevices = 64;

// Each thread's current stream per device; null is the device's default (legacy) stream, as in torch.
thread_local std::array<cudaStream_t, kMaxDevices> t_streams{};

template <typename W>
__global__ void fill_kernel(W* p, int64_t n, W value) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = value;
}

template <typename W>
void launch_fill(cudaStream_t s, void* p, int64_t n, const void* pattern) {
  W value;
  std::memcpy(&value, pattern, sizeof(W));
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
  fill_kernel<W><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<W*>(p), n, value);
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
    DeviceGuard guard(op, index);
    check(op, cudaDeviceSynchronize());
  }
  std::string version() override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);  // 0 without a driver
    return "CUDA runtime " + std::to_string(runtime) + ", driver " +
           (driver ? std::to_string(driver) : std::string("none"));
  }

  // Memory: the driver's stream-ordered allocator (cudaMallocAsync) on each device's default pool,
  // told to keep what is freed (release threshold: unlimited), so that blocks freed on a stream
  // are reused by later allocations on it without a cudaMalloc/cudaFree per call.
  void* allocate(const char* op, int index, size_t nbytes, void** stream) override {
    DeviceGuard guard(op, index);
    cudaMemPool_t pool = pool_of(op, index);
    cudaStream_t s = t_streams[index];
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, nbytes, s);
    if (e == cudaErrorMemoryAllocation) {  // give cached blocks back and try once more
      cudaGetLastError();
      cudaDeviceSynchronize();
      cudaMemPoolTrimTo(pool, 0);
      e = cudaMallocAsync(&p, nbytes, s);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        fail<RuntimeError>(op, "CUDA out of memory: tried to allocate ", nbytes, " bytes on cuda:", index, " (",
                           free_bytes, " of ", total, " bytes free; ", allocated_[index].load(),
                           " allocated by opforge)");
      }
    }
    check(op, e);
    allocated_[index] += nbytes;
    *stream = s;
    return p;
  }
  void deallocate(int index, void* p, size_t nbytes, void* stream) noexcept override {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;  // (the runtime is shutting down)
    if (previous != index) cudaSetDevice(index);
    if (cudaFreeAsync(p, static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
    if (previous != index) cudaSetDevice(previous);
    allocated_[index] -= nbytes;
  }
  size_t memory_allocated(int index) override { return index >= 0 && index < kMaxDevices ? allocated_[index].load() : 0; }
  void empty_cache() override {
    for (int i = 0; i < count_; ++i) {
      if (!pools_[i]) continue;
      DeviceGuard guard("empty_cache", i);
      check("empty_cache", cudaDeviceSynchronize());
      check("empty_cache", cudaMemPoolTrimTo(pools_[i], 0));
    }
  }

  void copy(const char* op, void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    const bool dst_host = dst_device.type == DeviceType::CPU, src_host = src_device.type == DeviceType::CPU;
    const int index = dst_host ? src_device.index : dst_device.index;
    if (!src_host && !dst_host && src_device.index != dst_device.index) {
      // (another device's queued writes to src come first)
      DeviceGuard other(op, src_device.index);
      check(op, cudaStreamSynchronize(t_streams[src_device.index]));
    }
    DeviceGuard guard(op, index);
    cudaStream_t s = t_streams[index];
    check(op, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
    // with host memory on either side, return only once the copy is done (torch's blocking
    // copy): the host buffer may be freed or read as soon as we return
    if (dst_host || src_host) check(op, cudaStreamSynchronize(s));
  }
  void fill(const char* op, int index, void* p, int64_t count, size_t itemsize, const void* pattern) override {
    if (count <= 0) return;
    DeviceGuard guard(op, index);
    cudaStream_t s = t_streams[index];
    const auto* bytes = static_cast<const unsigned char*>(pattern);
    bool zero = true;
    for (size_t i = 0; i < itemsize; ++i) zero = zero && bytes[i] == 0;
    if (zero) {
      check(op, cudaMemsetAsync(p, 0, static_cast<size_t>(count) * itemsize, s));
      return;
    }
    switch (itemsize) {
      case 1: launch_fill<uint8_t>(s, p, count, pattern); break;
      case 2: launch_fill<uint16_t>(s, p, count, pattern); break;
      case 4: launch_fill<uint32_t>(s, p, count, pattern); break;
      case 8: launch_fill<uint64_t>(s, p, count, pattern); break;
      default: fail<RuntimeError>(op, "fill: unsupported element size ", itemsize);
    }
    check(op, cudaGetLastError());
  }

  void copy_convert(const char* op, const Tensor& dst, const Tensor& src) override { cuda::copy_convert(op, dst, src); }
  void add(const char* op, const Tensor& out, const Tensor& a, const Tensor& b) override { cuda::add(op, out, a, b); }
  void sum_rows(const char* op, const Tensor& x, int64_t R, const Tensor& out, double scale) override {
    cuda::sum_rows(op, x, R, out, scale);
  }

  bool locate(const void* p, Device* device) noexcept override {
    if (!p) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // (memory CUDA does not know: the host's)
      return false;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return false;
    *device = Device{DeviceType::CUDA, a.device};
    return true;
  }

  // Streams made here are kept for reuse, never destroyed: memory freed on a stream is ordered
  // after its work (cudaFreeAsync), which needs the stream to exist (torch pools its streams too).
  void* current_stream(int index) override { return t_streams[index]; }
  void set_current_stream(int index, void* stream) override { t_streams[index] = static_cast<cudaStream_t>(stream); }
  void* create_stream(const char* op, int index) override {
    {
      std::lock_guard<std::mutex> lock(streams_lock_);
      if (!spare_streams_[index].empty()) {
        cudaStream_t s = spare_streams_[index].back();
        spare_streams_[index].pop_back();
        return s;
      }
    }
    DeviceGuard guard(op, index);
    cudaStream_t s = nullptr;
    check(op, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void destroy_stream(int index, void* stream) noexcept override {
    if (!stream) return;
    std::lock_guard<std::mutex> lock(streams_lock_);
    spare_streams_[index].push_back(static_cast<cudaStream_t>(stream));
  }
  void synchronize_stream(const char* op, int index, void* stream) override {
    DeviceGuard guard(op, index);
    check(op, cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  void stream_wait(const char* op, int index, void* waiter, void* waitee) override {
    if (waiter == waitee) return;
    DeviceGuard guard(op, index);
    cudaEvent_t e = nullptr;
    check(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaError_t r = cudaEventRecord(e, static_cast<cudaStream_t>(waitee));
    if (r == cudaSuccess) r = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0);
    cudaEventDestroy(e);  // (its resources go once the recorded work completes)
    check(op, r);
  }

 private:
  // The first query decides, once per process (as torch.cuda does): devices do not come and go.
  void probe() {
    std::call_once(once_, [this] {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        cudaGetLastError();
        count_ = 0;
        reason_ = error_text(e) + "; " + version();
      } else {
        count_ = std::min(n, kMaxDevices);
        reason_ = n ? "" : "no CUDA device; " + version();
      }
    });
  }
  cudaMemPool_t pool_of(const char* op, int index) {
    std::call_once(pool_once_[index], [&] {
      cudaMemPool_t pool = nullptr;
      check(op, cudaDeviceGetDefaultMemPool(&pool, index));
      uint64_t keep = UINT64_MAX;
      check(op, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
      pools_[index] = pool;
    });
    if (!pools_[index]) fail<RuntimeError>(op, "cuda:", index, ": no memory pool");
    return pools_[index];
  }

  std::once_flag once_;
  int count_ = 0;
  std::string reason_;
  std::array<std::once_flag, kMaxDevices> pool_once_;
  std::array<cudaMemPool_t, kMaxDevices> pools_{};
  std::array<std::atomic<size_t>, kMaxDevices> allocated_{};
  std::mutex streams_lock_;
  std::array<std::vector<cudaStream_t>, kMaxDevices> spare_streams_;
};

// never destroyed: tensors freed during interpreter shutdown still find it
[[maybe_unused]] const bool registered = (register_device_runtime(DeviceType::CUDA, new CudaRuntime()), true);

}  // namespace

}  // namespace opforge::cuda
