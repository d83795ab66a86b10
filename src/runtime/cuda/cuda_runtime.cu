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
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_utils.cuh"
#include "runtime/cuda/functional.h"
#include "runtime/device.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"

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

// A graph being captured or replayed (DeviceRuntime's graph_*). Its fields are guarded by the
// runtime's graphs_lock_.
struct CudaGraph final : CaptureKeeper {
  struct FreeBlock {
    void* ptr;
    size_t size;
    int index;            // its device
    cudaStream_t stream;  // freed on it: reused only by allocations on that stream (its order)
    bool reusable;        // false: used on another stream of the capture too, whose captured work
                          // nothing orders before a reuse on stream; freed with the graph
  };
  CudaGraph(std::mutex& lock, int device) : lock(lock), index(device) {}
  Device device() const override { return Device{DeviceType::CUDA, index}; }
  // A storage the captured work touches lives as long as the graph; the graph's own blocks need
  // not be kept (nothing else gets them while it lives).
  void keep(const std::shared_ptr<Storage>& storage) override {
    std::lock_guard<std::mutex> guard(lock);
    if (storage->capacity && own.count(storage->data)) return;
    if (kept_set.insert(storage.get()).second) kept.push_back(storage);
  }

  std::mutex& lock;
  const int index;
  cudaStream_t stream = nullptr;  // the capture's origin stream
  unsigned long long capture_id = 0;
  bool capturing = false;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::unordered_set<void*> own;     // blocks allocated during the capture (in use or free)
  std::vector<FreeBlock> free;       // those of them freed: for later allocations of the capture
  std::vector<std::pair<int, void*>> deferred;  // (device, pool block) freed on a capture's stream in the capture
  std::vector<std::shared_ptr<Storage>> kept;
  std::unordered_set<Storage*> kept_set;
};

// What a graph leaves to free once no capture is under way (freeing synchronizes the device,
// which a capture does not allow).
struct Pending {
  struct Block {
    int index;
    void* ptr;
    size_t size;
  };
  std::vector<Block> blocks;  // graph blocks: cudaFree
  std::vector<std::pair<int, void*>> deferred;  // pool blocks: cudaFreeAsync on the legacy stream
  struct Graph {
    int index;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
  };
  std::vector<Graph> graphs;
  std::vector<std::shared_ptr<Storage>> kept;
  bool empty() const { return blocks.empty() && deferred.empty() && graphs.empty() && kept.empty(); }
};

// Whether stream is part of a capture (active, or invalidated by an error and not yet ended), and
// the capture's id when it is active (CUDA gives the id only then).
cudaStreamCaptureStatus capture_status(cudaStream_t stream, unsigned long long* id) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  *id = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, id) != cudaSuccess) {
    cudaGetLastError();  // (the legacy stream beside a capture, a stream being destroyed)
    return cudaStreamCaptureStatusNone;
  }
  if (status != cudaStreamCaptureStatusActive) *id = 0;
  return status;
}

constexpr size_t kGraphBlockAlign = 512;

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
    if (captures_.load(std::memory_order_acquire) > 0) {
      if (CudaGraph* g = capturing_graph(s)) return graph_allocate(op, *g, index, nbytes, s, stream);
    }
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, nbytes, s);
    if (e == cudaErrorMemoryAllocation) {  // give cached blocks back and try once more
      cudaGetLastError();
      // (waiting for frees in flight; not while s or one of our graphs is being captured, where a
      // synchronization is refused and invalidates the capture: the trim alone then)
      unsigned long long id = 0;
      if (captures_.load(std::memory_order_acquire) == 0 && capture_status(s, &id) == cudaStreamCaptureStatusNone) {
        cudaDeviceSynchronize();
        cudaGetLastError();
      }
      cudaMemPoolTrimTo(pool, 0);
      e = cudaMallocAsync(&p, nbytes, s);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        fail<MemoryError>(op, "CUDA out of memory: tried to allocate ", nbytes, " bytes on cuda:", index, " (",
                           free_bytes, " of ", total, " bytes free; ", allocated_[index].load(),
                           " allocated by opforge)");
      }
    }
    check(op, e);
    allocated_[index] += nbytes;
    *stream = s;
    return p;
  }
  void deallocate(int index, void* p, size_t nbytes, void* stream, const std::vector<void*>& used_on) noexcept override {
    const auto s = static_cast<cudaStream_t>(stream);
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;  // (the runtime is shutting down)
    if (previous != index) cudaSetDevice(index);
    if (!used_on.empty()) join_uses(s, used_on);
    if ((graph_blocks_.load(std::memory_order_acquire) > 0 || captures_.load(std::memory_order_acquire) > 0) &&
        graph_deallocate(index, p, nbytes, s, used_on)) {
      if (previous != index) cudaSetDevice(previous);
      return;
    }
    if (cudaFreeAsync(p, s) != cudaSuccess) cudaGetLastError();
    if (previous != index) cudaSetDevice(previous);
    allocated_[index] -= nbytes;
  }
  // Whether stream outlives every tensor: the legacy default stream or one of ours (another
  // library's stream may be destroyed before memory used on it is freed, and is not touched then;
  // the per-thread default stream's handle names the freeing thread's own, not the user's).
  bool lasting_stream(cudaStream_t stream) {
    if (!stream || stream == cudaStreamLegacy) return true;
    std::lock_guard<std::mutex> lock(streams_lock_);
    return made_streams_.count(stream) != 0;
  }
  // Orders a free on stream after the work queued so far on the other streams that used the
  // memory (used_on): an event recorded on each, waited for by stream (on the device). The pool
  // may hand a freed block to another stream as soon as the free's stream gets past it, so without
  // this a kernel still reading the memory on another stream would see it overwritten. Not across
  // a capture's boundary (a wait between a captured and an uncaptured stream would invalidate the
  // capture) and not on a thread that captures (what it may call is restricted): memory a capture
  // uses is its graph's to keep (note_device_use). graphs_lock_ is held from the streams' checks to
  // the wait, as graph_capture_begin holds it around cudaStreamBeginCapture: a capture of ours
  // cannot begin on either stream in between. (Another library's capture can: its streams are not
  // ours to lock.)
  void join_uses(cudaStream_t stream, const std::vector<void*>& used_on) noexcept {
    if (captures_.load(std::memory_order_acquire) > 0 && this_thread_captures()) return;
    std::lock_guard<std::mutex> lock(graphs_lock_);
    unsigned long long id = 0;
    if (capture_status(stream, &id) != cudaStreamCaptureStatusNone) return;
    for (void* u : used_on) {
      const auto other = static_cast<cudaStream_t>(u);
      if (!lasting_stream(other) || capture_status(other, &id) != cudaStreamCaptureStatusNone) continue;
      cudaEvent_t e = nullptr;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      if (cudaEventRecord(e, other) != cudaSuccess || cudaStreamWaitEvent(stream, e, 0) != cudaSuccess) {
        cudaGetLastError();
      }
      cudaEventDestroy(e);  // (its resources go once the recorded work completes)
    }
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
    if (dst_host || src_host) {
      check(op, cudaStreamSynchronize(s));
    } else if (src_device.index != dst_device.index) {
      // the copy reads src on the destination's stream: src's device's stream waits for it, so
      // that src freed there (after that stream's work, note_device_use) is not reused before
      unsigned long long id = 0;
      if (capture_status(s, &id) != cudaStreamCaptureStatusNone) return;
      cudaEvent_t e = nullptr;
      check(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      const cudaError_t recorded = cudaEventRecord(e, s);
      cudaError_t waited = cudaSuccess;
      if (recorded == cudaSuccess) {
        try {
          DeviceGuard other(op, src_device.index);
          waited = cudaStreamWaitEvent(t_streams[src_device.index], e, 0);
        } catch (...) {
          cudaEventDestroy(e);
          throw;
        }
      }
      cudaEventDestroy(e);  // (its resources go once the recorded work completes)
      check(op, recorded);
      check(op, waited);
    }
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
    std::lock_guard<std::mutex> lock(streams_lock_);
    made_streams_.insert(s);
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

  // ---- graphs
  // Capture is thread-local (cudaStreamCaptureModeThreadLocal): other threads' work and
  // allocations go on as usual. During a capture, allocations on the capture's streams come from
  // the graph's blocks (cudaMalloc'd, the capture mode relaxed around the call), which stay the
  // graph's: a block freed during the capture is reused by a later allocation of the capture on
  // the same stream (ordered after its last use there) unless another stream used it too, one
  // freed later only waits for the graph's release. A pool block freed on a capture's stream
  // during the capture would record its cudaFreeAsync into the graph: it is kept until the
  // graph's release instead.
  void* graph_create(const char* op, int index) override {
    DeviceGuard guard(op, index);
    return new CudaGraph(graphs_lock_, index);
  }
  void graph_capture_begin(const char* op, void* handle) override {
    CudaGraph& g = *static_cast<CudaGraph*>(handle);
    DeviceGuard guard(op, g.index);
    if (g.capturing) fail<RuntimeError>(op, "the graph is already capturing");
    if (g.exec) fail<RuntimeError>(op, "the graph holds a capture already: reset() it before capturing again");
    cudaStream_t s = t_streams[g.index];
    if (!s) {
      fail<RuntimeError>(op, "cannot capture the legacy default stream: capture on another stream (`with "
                             "opforge.cuda.graph(g):` makes one, as does `with opforge.cuda.Stream():`)");
    }
    unsigned long long id = 0;
    if (capture_status(s, &id) != cudaStreamCaptureStatusNone) {
      fail<RuntimeError>(op, "the current stream is already being captured");
    }
    CaptureKeeper* keeper = set_capture_keeper(nullptr);
    set_capture_keeper(keeper);
    if (keeper) fail<RuntimeError>(op, "this thread is capturing another graph: end that capture first");
    // (held from before the capture begins: join_uses on another thread sees s captured or not
    // captured for the whole of its checks and wait)
    std::lock_guard<std::mutex> lock(graphs_lock_);
    by_capture_.reserve(by_capture_.size() + 1);  // (no rehash below once the capture began)
    by_stream_.reserve(by_stream_.size() + 1);
    check(op, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    capture_status(s, &id);
    by_capture_[id] = &g;
    by_stream_[s] = &g;
    captures_.fetch_add(1, std::memory_order_acq_rel);
    g.stream = s;
    g.capture_id = id;
    g.capturing = true;
    set_capture_keeper(&g);
  }
  void graph_capture_end(const char* op, void* handle, bool discard) override {
    CudaGraph& g = *static_cast<CudaGraph*>(handle);
    DeviceGuard guard(op, g.index);
    if (!g.capturing) {
      if (discard) return;  // (already ended: a reset() inside the capture's block)
      fail<RuntimeError>(op, "the graph is not capturing");
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(g.stream, &graph);
    if (e == cudaErrorStreamCaptureWrongThread) {
      cudaGetLastError();
      fail<RuntimeError>(op, "a capture ends on the thread that began it");
    }
    if (e != cudaSuccess) cudaGetLastError();
    end_capture(g);
    if (e != cudaSuccess || discard) {
      if (graph) cudaGraphDestroy(graph);
      if (discard) return;
      fail<RuntimeError>(op, "the capture failed: ", error_text(e), " (inside a capture: no host synchronization, "
                         "no copy to or from the host, and other streams' work must join the capture's stream)");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    if (ie != cudaSuccess) {
      cudaGetLastError();
      cudaGraphDestroy(graph);
      fail<RuntimeError>(op, "the captured graph could not be instantiated: ", error_text(ie));
    }
    std::lock_guard<std::mutex> lock(graphs_lock_);
    g.graph = graph;
    g.exec = exec;
  }
  bool graph_capturing(void* handle) override { return static_cast<CudaGraph*>(handle)->capturing; }
  void graph_replay(const char* op, void* handle) override {
    CudaGraph& g = *static_cast<CudaGraph*>(handle);
    if (g.capturing) fail<RuntimeError>(op, "the graph is still capturing: end the capture first");
    if (!g.exec) fail<RuntimeError>(op, "the graph holds no capture: capture it first");
    DeviceGuard guard(op, g.index);
    check(op, cudaGraphLaunch(g.exec, t_streams[g.index]));
  }
  void graph_release(void* handle) noexcept override {
    auto* g = static_cast<CudaGraph*>(handle);
    if (!g) return;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;  // (the runtime is shutting down)
    if (previous != g->index) cudaSetDevice(g->index);
    if (g->capturing) {  // (released inside its capture: the capture ends, discarded)
      cudaGraph_t graph = nullptr;
      const cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
      cudaGetLastError();
      if (e == cudaErrorStreamCaptureWrongThread) {  // (only its thread may end it: the graph stays)
        cudaSetDevice(previous);
        return;
      }
      if (graph) cudaGraphDestroy(graph);
      end_capture(*g);
    }
    Pending release;
    {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      if (g->graph || g->exec) release.graphs.push_back(Pending::Graph{g->index, g->graph, g->exec});
      for (const CudaGraph::FreeBlock& b : g->free) release.blocks.push_back(Pending::Block{b.index, b.ptr, b.size});
      release.deferred = std::move(g->deferred);
      release.kept = std::move(g->kept);
      // blocks still held by tensors go back when they do (graph_deallocate: owner null)
      for (void* p : g->own) {
        auto it = blocks_.find(p);
        if (it != blocks_.end()) it->second.owner = nullptr;
      }
      for (const CudaGraph::FreeBlock& b : g->free) forget_block_locked(b.ptr);
      if (captures_.load(std::memory_order_acquire) > 0) {
        append(pending_, std::move(release));
        release = Pending{};
      }
    }
    delete g;
    free_now(std::move(release));
    cudaSetDevice(previous);
  }
  size_t graph_memory(int index) override {
    return index >= 0 && index < kMaxDevices ? graph_bytes_[index].load() : 0;
  }

 private:
  // The graph of ours whose capture s is part of (null: none); graphs_lock_ held. An invalidated
  // capture has no id: its origin stream tells (the work that failed ran there).
  CudaGraph* capturing_graph_locked(cudaStream_t s) {
    unsigned long long id = 0;
    const cudaStreamCaptureStatus status = capture_status(s, &id);
    if (status == cudaStreamCaptureStatusActive) {
      auto it = by_capture_.find(id);
      return it == by_capture_.end() ? nullptr : it->second;
    }
    if (status == cudaStreamCaptureStatusInvalidated) {
      auto it = by_stream_.find(s);
      return it == by_stream_.end() ? nullptr : it->second;
    }
    return nullptr;
  }
  CudaGraph* capturing_graph(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(graphs_lock_);
    return capturing_graph_locked(s);
  }
  void* graph_allocate(const char* op, CudaGraph& g, int index, size_t nbytes, cudaStream_t s, void** stream) {
    const size_t size = (nbytes + kGraphBlockAlign - 1) / kGraphBlockAlign * kGraphBlockAlign;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      auto best = g.free.end();
      for (auto it = g.free.begin(); it != g.free.end(); ++it) {
        // (a block at most twice the size asked for: a GEMM's 32 MiB workspace is not taken by a
        // small output, which would make the next GEMM allocate another)
        if (it->reusable && it->stream == s && it->size >= size && it->size / 2 <= size &&
            (best == g.free.end() || it->size < best->size)) {
          best = it;
        }
      }
      if (best != g.free.end()) {
        p = best->ptr;
        g.free.erase(best);
      }
    }
    if (!p) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // (cudaMalloc is not stream work)
      cudaThreadExchangeStreamCaptureMode(&mode);
      cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaErrorMemoryAllocation) {  // the pool's cached, unused blocks back to the driver; once more
        cudaGetLastError();
        if (pools_[index]) cudaMemPoolTrimTo(pools_[index], 0);
        e = cudaMalloc(&p, size);
      }
      cudaThreadExchangeStreamCaptureMode(&mode);
      if (e == cudaErrorMemoryAllocation) {  // (MemoryError, as the eager allocator's)
        cudaGetLastError();
        fail<MemoryError>(op, "CUDA out of memory: tried to allocate ", nbytes, " bytes on cuda:", index,
                          " for a graph being captured (", graph_bytes_[index].load(), " bytes held by graphs)");
      }
      if (e != cudaSuccess) {
        cudaGetLastError();
        fail<RuntimeError>(op, error_text(e).c_str(), ": tried to allocate ", nbytes, " bytes on cuda:", index,
                           " for a graph being captured (", graph_bytes_[index].load(), " bytes held by graphs)");
      }
      std::lock_guard<std::mutex> lock(graphs_lock_);
      blocks_[p] = GraphBlock{&g, size, index};
      g.own.insert(p);
      graph_blocks_.fetch_add(1, std::memory_order_acq_rel);
      graph_bytes_[index] += size;
    }
    allocated_[index] += nbytes;
    *stream = s;
    return p;
  }
  // Frees p if it is a graph's block or a pool block freed inside one of our captures (true);
  // false: an ordinary pool block, for cudaFreeAsync. A graph's block that work on another stream
  // used (used_on) is not reused by the capture: join_uses orders nothing inside a capture, and a
  // later kernel of the capture's stream writing it would race, at each replay, with the other
  // stream's captured kernel still reading it (torch's allocator defers such blocks to the
  // capture's end likewise).
  bool graph_deallocate(int index, void* p, size_t nbytes, cudaStream_t stream,
                        const std::vector<void*>& used_on) noexcept {
    std::unique_lock<std::mutex> lock(graphs_lock_);
    auto it = blocks_.find(p);
    if (it != blocks_.end()) {
      allocated_[index] -= nbytes;
      if (CudaGraph* g = it->second.owner) {
        const bool elsewhere =
            std::any_of(used_on.begin(), used_on.end(), [stream](void* u) { return u != stream; });
        g->free.push_back(CudaGraph::FreeBlock{p, it->second.size, it->second.index, stream, !elsewhere});
        return true;
      }
      const Pending::Block block{it->second.index, p, it->second.size};
      forget_block_locked(p);  // (its graph is released)
      if (captures_.load(std::memory_order_acquire) > 0) {
        pending_.blocks.push_back(block);
        return true;
      }
      lock.unlock();
      Pending now;
      now.blocks.push_back(block);
      free_now(std::move(now));
      return true;
    }
    if (captures_.load(std::memory_order_acquire) == 0) return false;
    if (CudaGraph* g = stream ? capturing_graph_locked(stream) : nullptr) {
      g->deferred.emplace_back(index, p);
      allocated_[index] -= nbytes;
      return true;
    }
    // A block the capturing thread frees outside the capture (eager work before it: a gradient that
    // zero_grad() drops inside a captured step, a block of the legacy stream): its cudaFreeAsync
    // would be an unsafe call there, which invalidates the capture (thread-local mode: other
    // threads free as usual). It waits in pending_ for the end of the last capture (free_now:
    // after a device synchronization, on the legacy stream).
    if (this_thread_captures()) {
      pending_.deferred.emplace_back(index, p);
      allocated_[index] -= nbytes;
      return true;
    }
    return false;
  }
  static bool this_thread_captures() noexcept {
    CaptureKeeper* keeper = set_capture_keeper(nullptr);
    set_capture_keeper(keeper);
    return keeper != nullptr;
  }
  void forget_block_locked(void* p) {
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return;
    blocks_.erase(it);
    graph_blocks_.fetch_sub(1, std::memory_order_acq_rel);
  }
  // Ends g's capture in the runtime's books (its CUDA capture already ended); frees what
  // released graphs left once no capture is under way.
  void end_capture(CudaGraph& g) noexcept {
    Pending flush;
    {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      by_capture_.erase(g.capture_id);
      by_stream_.erase(g.stream);
      g.capturing = false;
      g.capture_id = 0;
      if (captures_.fetch_sub(1, std::memory_order_acq_rel) == 1) std::swap(flush, pending_);
    }
    CaptureKeeper* keeper = set_capture_keeper(nullptr);  // (the capturing thread's: CUDA ends it there)
    if (keeper != &g) set_capture_keeper(keeper);
    free_now(std::move(flush));
  }
  static void append(Pending& to, Pending&& from) {
    to.blocks.insert(to.blocks.end(), from.blocks.begin(), from.blocks.end());
    to.deferred.insert(to.deferred.end(), from.deferred.begin(), from.deferred.end());
    to.graphs.insert(to.graphs.end(), from.graphs.begin(), from.graphs.end());
    for (auto& k : from.kept) to.kept.push_back(std::move(k));
  }
  // Frees what a released graph held, after its replays in flight: called with no capture of ours
  // under way. A synchronization or cudaFree the runtime refuses (another library's capture under
  // way in global mode, as torch.cuda.graph's, which the refused call invalidates: that capture
  // then fails at its end) frees nothing of it now: it waits in pending_ for the next call (a
  // graph released, a released graph's block returned, a capture of ours ended), so no memory a
  // replay may still use is freed early.
  void free_now(Pending&& what) noexcept {
    {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      if (captures_.load(std::memory_order_acquire) == 0 && !pending_.empty()) {
        append(what, std::move(pending_));
        pending_ = Pending{};
      }
    }
    if (what.empty()) return;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    std::unordered_set<int> devices;
    for (const auto& b : what.blocks) devices.insert(b.index);
    for (const auto& d : what.deferred) devices.insert(d.first);
    for (const auto& g : what.graphs) devices.insert(g.index);
    for (const auto& k : what.kept) devices.insert(k->device.index);
    bool synced = true;
    for (int d : devices) {  // (replays of the graph may still read or write its memory)
      cudaSetDevice(d);
      synced = cudaDeviceSynchronize() == cudaSuccess && synced;
    }
    cudaGetLastError();
    cudaSetDevice(previous);
    if (!synced) {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      append(pending_, std::move(what));
      return;
    }
    for (const Pending::Graph& g : what.graphs) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      if (g.graph) cudaGraphDestroy(g.graph);
    }
    std::vector<Pending::Block> refused;
    for (const Pending::Block& b : what.blocks) {
      cudaSetDevice(b.index);
      if (cudaFree(b.ptr) == cudaSuccess) {
        graph_bytes_[b.index] -= b.size;
      } else {
        cudaGetLastError();
        refused.push_back(b);
      }
    }
    if (!refused.empty()) {
      std::lock_guard<std::mutex> lock(graphs_lock_);
      pending_.blocks.insert(pending_.blocks.end(), refused.begin(), refused.end());
    }
    for (const auto& [index, p] : what.deferred) {  // (on the legacy stream, which no capture records)
      cudaSetDevice(index);
      cudaFreeAsync(p, nullptr);
    }
    cudaGetLastError();
    cudaSetDevice(previous);
    what.kept.clear();  // (storages the graph kept: freed as usual, on their streams, after the synchronization)
  }

  struct GraphBlock {
    CudaGraph* owner;  // null once its graph is released
    size_t size;
    int index;         // its device
  };

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
  std::unordered_set<cudaStream_t> made_streams_;  // every stream create_stream made (never destroyed)
  // graphs
  std::mutex graphs_lock_;
  std::atomic<int> captures_{0};           // our captures under way
  std::atomic<size_t> graph_blocks_{0};    // blocks_.size()
  std::unordered_map<unsigned long long, CudaGraph*> by_capture_;  // active captures by id
  std::unordered_map<cudaStream_t, CudaGraph*> by_stream_;         // and by origin stream
  std::unordered_map<void*, GraphBlock> blocks_;
  std::array<std::atomic<size_t>, kMaxDevices> graph_bytes_{};
  Pending pending_;
};

// never destroyed: tensors freed during interpreter shutdown still find it
[[maybe_unused]] const bool registered = (register_device_runtime(DeviceType::CUDA, new CudaRuntime()), true);

}  // namespace

}  // namespace opforge::cuda
