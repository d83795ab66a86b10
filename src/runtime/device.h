// Devices: where a tensor's memory lives, and the runtime a build links for each device type.
//
// The device types are the compiled rows of the target table (codegen/targets.py: cpu, cuda). A
// build that compiles a target's kernels links that target's runtime (src/runtime/cuda/ for
// cuda), which registers itself when the library loads; in a build without it (the cpu wheel)
// asking for the device says which wheel has it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace opforge {

class Tensor;
struct Storage;

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
constexpr int kDeviceTypes = 2;

const char* device_type_name(DeviceType type);  // "cpu", "cuda": the target table's device_type
// The targets whose kernels this build compiled: "cpu" or "cpu, cuda" (the wheel's BUILDS row).
const char* built_targets();

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the ordinal among the type's devices (0 for the cpu)
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0"
};

// "cpu", "cuda", "cuda:N" (a bare "cuda" is the current CUDA device); ValueError naming op otherwise.
// Says nothing about whether the device exists: see device_runtime().
Device parse_device(const char* op, const std::string& text);

// What the core needs of a device type's runtime. Device indices given to it are checked
// (device_runtime()); errors are RuntimeError naming op. Streams are opaque handles (cudaStream_t);
// each thread has a current stream per device (initially the device's default stream).
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Devices present (0 without a driver or a device: the reason is unavailable_reason()). Never throws.
  virtual int device_count() = 0;
  virtual std::string unavailable_reason() = 0;
  virtual int current_device() = 0;
  // Waits for all work queued on the device.
  virtual void synchronize(const char* op, int index) = 0;
  // "CUDA runtime 13000, driver 13000" style facts for error messages and opforge.cuda.
  virtual std::string version() = 0;

  // Memory: nbytes > 0 on device index, ordered on the current stream (returned in *stream),
  // cached by the runtime (freed blocks are reused; no driver allocation per call).
  virtual void* allocate(const char* op, int index, size_t nbytes, void** stream) = 0;
  // Frees p (from allocate, with the stream it returned) once the work queued so far on that
  // stream and on the streams of used_on (other streams work on p was queued on) is done.
  virtual void deallocate(int index, void* p, size_t nbytes, void* stream, const std::vector<void*>& used_on) noexcept = 0;
  virtual size_t memory_allocated(int index) = 0;  // bytes held by live allocations
  virtual void empty_cache() = 0;                  // returns cached, unused blocks to the driver
  // Copies nbytes between this type's device memory and the host, or within/between devices, on
  // the current stream of the device involved; returns once host memory it writes is complete.
  virtual void copy(const char* op, void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes) = 0;
  // Sets count elements of itemsize (1, 2, 4 or 8) bytes at p to the bytes of pattern.
  virtual void fill(const char* op, int index, void* p, int64_t count, size_t itemsize, const void* pattern) = 0;

  // What the core's helpers (copies with conversion, gradient accumulation, sums to a shape) need
  // on the device. Tensors are on one device of this type; outputs are fresh and contiguous.
  // dst[i] = src[i] converted to dst's dtype (src strided or broadcast to dst's shape).
  virtual void copy_convert(const char* op, const Tensor& dst, const Tensor& src) = 0;
  // out = a + b (same dtype and shape).
  virtual void add(const char* op, const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // out[r] = scale * sum of the R elements of row r of x (contiguous, rows * R elements), each
  // converted to out's dtype; accumulated in float (16-bit and 32-bit floats), double or int64.
  virtual void sum_rows(const char* op, const Tensor& x, int64_t R, const Tensor& out, double scale) = 0;

  // Whether p points into memory of one of this type's devices (memory from any allocator: a
  // host's buffers given to an AOT entry point); if so, *device receives it. Never throws.
  virtual bool locate(const void* p, Device* device) noexcept = 0;

  // Streams.
  virtual void* current_stream(int index) = 0;
  virtual void set_current_stream(int index, void* stream) = 0;
  virtual void* create_stream(const char* op, int index) = 0;
  virtual void destroy_stream(int index, void* stream) noexcept = 0;
  virtual void synchronize_stream(const char* op, int index, void* stream) = 0;
  // Work queued on waiter from now on waits for the work queued on waitee so far, on the device
  // (no host wait). Handles 1 and 2 are the legacy and per-thread default streams, as in CUDA.
  virtual void stream_wait(const char* op, int index, void* waiter, void* waitee) = 0;

  // Graphs (CUDA graphs; the default implementations raise RuntimeError naming op). A graph is an
  // opaque handle on one device. capture_begin records the work this thread then queues on its
  // current stream on that device (not the legacy default stream) instead of running it; memory
  // allocated meanwhile comes from the graph's own blocks (reused within the capture once freed,
  // never given to anything else while the graph lives, so replays write where the capture's
  // tensors point), and the graph keeps alive every storage the captured work touches (see
  // CaptureKeeper). capture_end makes it replayable; replay launches it on this thread's current
  // stream. release frees it once no capture is under way: its blocks still held by tensors go
  // back when those tensors do.
  virtual void* graph_create(const char* op, int index);
  virtual void graph_capture_begin(const char* op, void* graph);
  // discard: end the capture, if one is under way, and drop what it recorded (an exception inside
  // the capture). A capture ends on the thread that began it (RuntimeError otherwise).
  virtual void graph_capture_end(const char* op, void* graph, bool discard);
  virtual bool graph_capturing(void* graph);
  virtual void graph_replay(const char* op, void* graph);
  virtual void graph_release(void* graph) noexcept;
  // Bytes of device memory held by graphs' blocks on device index (in use or not).
  virtual size_t graph_memory(int index);
};

// While a thread captures device work into a graph, the storages that work reads and writes must
// live as long as the graph (every replay touches them again). The runtime installs the graph's
// keeper for the capturing thread; the core hands it the tensors of each op call (check_call) and
// of its own copies and sums (note_device_use), on any device but the host.
class CaptureKeeper {
 public:
  virtual ~CaptureKeeper() = default;
  virtual void keep(const std::shared_ptr<Storage>& storage) = 0;
  // the device whose work the capture records
  virtual Device device() const = 0;
};
// RuntimeError naming op when the calling thread captures an opforge graph on device (a keeper is
// installed) and stream, a caller's stream for an op call, is not the current stream of device's
// runtime rt (which the capture records).
void check_caller_stream(const char* op, DeviceRuntime& rt, Device device, void* stream);
// Installs keeper for the calling thread (null: none); returns the previous one.
CaptureKeeper* set_capture_keeper(CaptureKeeper* keeper);
// Device work on the calling thread's current stream is about to use t (read or write it); nothing
// for host tensors. A thread capturing a graph hands t's storage to its keeper; and when t's memory
// is ours and was allocated on another stream, that stream is noted in the storage (Storage::
// used_on), so that freeing the memory waits for the work queued on both (what torch's
// record_stream asks its users to do by hand). Cheap otherwise.
void note_device_use(const Tensor& t);
// The same note for a use of t on stream, another library's (a DLPack consumer's); the free waits
// for it when the stream lasts (the legacy default stream, opforge's own).
void note_stream_use(const Tensor& t, void* stream);

// Whether a device kernel that checks indices (cross_entropy's labels, embedding and its gradient,
// take/scatter along an axis) waits for the device after its work to raise IndexError naming the
// op at the call: on (the default), one host wait per such call. Off: no wait and no error; a bad
// index still reads and writes nothing (the outputs it affects hold zeros or NaN), as inside a
// CUDA graph capture. Process-wide; read once per call; the host's checks never wait and always
// raise. set_sync_index_checks returns the previous setting.
bool sync_index_checks() noexcept;
bool set_sync_index_checks(bool on) noexcept;

// Called once per type by the runtime that serves it (a static initializer of its TU).
void register_device_runtime(DeviceType type, DeviceRuntime* runtime);
// The runtime serving type, or null when this build has none.
DeviceRuntime* find_device_runtime(DeviceType type);
// The device whose memory p points into: a device of a registered runtime that claims it, else
// the host (a build without device runtimes, or no device present, answers the host at once).
Device locate_pointer(const void* p) noexcept;

// Makes stream the calling thread's current stream on device for the guard's lifetime (nothing
// for the host): how a caller's stream (an AOT host's, torch's) orders opforge's work. While the
// thread captures an opforge graph, a stream other than the current one raises RuntimeError
// naming op (check_caller_stream): the work would run at once, outside the capture, and replays
// would leave it out.
class StreamScope {
 public:
  StreamScope(const char* op, Device device, void* stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  DeviceRuntime* runtime_ = nullptr;
  int index_ = 0;
  void* previous_ = nullptr;
};

// The runtime serving device, checked: RuntimeError naming op when this build has no runtime for
// its type (naming the wheel that has one), when no device of the type is present (with the
// runtime's reason), or when the index is out of range. A bare index -1 is the current device.
DeviceRuntime& device_runtime(const char* op, Device& device);

}  // namespace opforge
