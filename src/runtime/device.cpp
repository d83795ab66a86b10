// Device names and the table of device runtimes (device.h).
#include "runtime/device.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "runtime/errors.h"
#include "runtime/tensor.h"

// meson defines it from the target table (tools/version.py --build)
#ifndef OPFORGE_BUILT_TARGETS
#error "OPFORGE_BUILT_TARGETS (the build's targets) is not defined"
#endif

namespace opforge {

const char* built_targets() { return OPFORGE_BUILT_TARGETS; }

namespace {

std::array<std::atomic<DeviceRuntime*>, kDeviceTypes>& runtimes() {
  static std::array<std::atomic<DeviceRuntime*>, kDeviceTypes> table{};
  return table;
}

}  // namespace

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
  }
  return "?";
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return std::string(device_type_name(type)) + (index < 0 ? "" : ":" + std::to_string(index));
}

Device parse_device(const char* op, const std::string& text) {
  if (text == "cpu") return Device{DeviceType::CPU, 0};
  const std::string cuda = device_type_name(DeviceType::CUDA);
  if (text == cuda) return Device{DeviceType::CUDA, -1};
  if (text.size() > cuda.size() + 1 && text.compare(0, cuda.size() + 1, cuda + ":") == 0) {
    const std::string digits = text.substr(cuda.size() + 1);
    bool ok = digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos;
    if (ok) return Device{DeviceType::CUDA, std::atoi(digits.c_str())};
  }
  fail<ValueError>(op, "unknown device '", text, "': one of 'cpu', 'cuda', 'cuda:N'");
}

void register_device_runtime(DeviceType type, DeviceRuntime* runtime) {
  runtimes()[static_cast<size_t>(type)].store(runtime);
}

DeviceRuntime* find_device_runtime(DeviceType type) { return runtimes()[static_cast<size_t>(type)].load(); }

DeviceRuntime& device_runtime(const char* op, Device& device) {
  DeviceRuntime* rt = find_device_runtime(device.type);
  if (!rt) {
    fail<RuntimeError>(op, "device '", device.str(), "': this opforge was built without ", device_type_name(device.type),
                       " (its wheel's targets: ", built_targets(), ")");
  }
  const int count = rt->device_count();
  if (count == 0) {
    fail<RuntimeError>(op, "device '", device.str(), "': no ", device_type_name(device.type), " device is available (",
                       rt->unavailable_reason(), ")");
  }
  if (device.index < 0) device.index = rt->current_device();
  if (device.index >= count) {
    fail<RuntimeError>(op, "device '", device.str(), "' does not exist: ", count, " ", device_type_name(device.type),
                       " device", count == 1 ? " is" : "s are", " present (indices 0..", count - 1, ")");
  }
  return *rt;
}

Device locate_pointer(const void* p) noexcept {
  for (int t = 0; t < kDeviceTypes; ++t) {
    DeviceRuntime* rt = find_device_runtime(static_cast<DeviceType>(t));
    Device d;
    if (rt && static_cast<DeviceType>(t) != DeviceType::CPU && rt->device_count() > 0 && rt->locate(p, &d)) return d;
  }
  return Device{};
}

StreamScope::StreamScope(const char* op, Device device, void* stream) {
  if (device.type == DeviceType::CPU) return;
  runtime_ = &device_runtime(op, device);
  index_ = device.index;
  check_caller_stream(op, *runtime_, device, stream);
  previous_ = runtime_->current_stream(index_);
  runtime_->set_current_stream(index_, stream);
}

StreamScope::~StreamScope() {
  if (runtime_) runtime_->set_current_stream(index_, previous_);
}

// ---- graphs: runtimes without them
void* DeviceRuntime::graph_create(const char* op, int index) {
  (void)index;
  fail<RuntimeError>(op, "graph capture is not supported on this device");
}
void DeviceRuntime::graph_capture_begin(const char* op, void*) {
  fail<RuntimeError>(op, "graph capture is not supported on this device");
}
void DeviceRuntime::graph_capture_end(const char* op, void*, bool) {
  fail<RuntimeError>(op, "graph capture is not supported on this device");
}
void DeviceRuntime::graph_replay(const char* op, void*) {
  fail<RuntimeError>(op, "graph capture is not supported on this device");
}
bool DeviceRuntime::graph_capturing(void*) { return false; }
void DeviceRuntime::graph_release(void*) noexcept {}
size_t DeviceRuntime::graph_memory(int) { return 0; }

namespace {
thread_local CaptureKeeper* t_keeper = nullptr;
}  // namespace

void check_caller_stream(const char* op, DeviceRuntime& rt, Device device, void* stream) {
  if (t_keeper && t_keeper->device() == device && stream != rt.current_stream(device.index)) {
    fail<RuntimeError>(op, "this thread is capturing an opforge graph (opforge.cuda.graph), but the call runs on its "
                           "caller's stream (torch's, XLA's or a host's current stream), which the capture does not "
                           "record: inside opforge.cuda.graph call opforge's ops on opforge tensors; capture a "
                           "framework's ops with its own graph (torch.cuda.graph)");
  }
}

namespace {
std::atomic<bool> g_sync_index_checks{true};
}  // namespace

bool sync_index_checks() noexcept { return g_sync_index_checks.load(std::memory_order_relaxed); }
bool set_sync_index_checks(bool on) noexcept { return g_sync_index_checks.exchange(on); }

CaptureKeeper* set_capture_keeper(CaptureKeeper* keeper) {
  CaptureKeeper* previous = t_keeper;
  t_keeper = keeper;
  return previous;
}

void note_stream_use(const Tensor& t, void* stream) {
  Storage& s = *t.storage();
  if (t.on_host() || !s.capacity || stream == s.stream) return;  // (capacity 0: another library's memory)
  static std::mutex lock;  // (rare: a use on another stream than the allocation's)
  std::lock_guard<std::mutex> guard(lock);
  if (std::find(s.used_on.begin(), s.used_on.end(), stream) == s.used_on.end()) s.used_on.push_back(stream);
}

void note_device_use(const Tensor& t) {
  if (t.on_host()) return;
  if (t_keeper) t_keeper->keep(t.storage());
  if (!t.storage()->capacity) return;
  if (DeviceRuntime* rt = find_device_runtime(t.device().type)) note_stream_use(t, rt->current_stream(t.device().index));
}

}  // namespace opforge
