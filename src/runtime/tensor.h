// Tensor: shared (owner-aware) storage, dtype, shape, strides, format and autograd metadata.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/errors.h"

namespace opforge {

using Shape = std::vector<int64_t>;

// Bytes plus whatever keeps them alive: our own allocation, a NumPy array, a DLPack capsule.
struct Storage {
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
  void* data = nullptr;
  size_t nbytes = 0;
  size_t capacity = 0;    // bytes of our own allocation (0: the memory belongs to `owner`)
  std::shared_ptr<void> owner;
  bool external = false;  // memory of another library (NumPy, DLPack): never reused as ours
  bool readonly = false;  // the owner forbids writes: views handed out are read-only too
  Device device;          // where data lives (host memory unless a device runtime allocated it)
  void* stream = nullptr; // the device stream our own allocation is ordered on (freed there)
  // Other streams device work used our allocation on (note_device_use, under its lock): the free
  // waits for the work queued on them too.
  std::vector<void*> used_on;
  // Bumped by every write into existing memory (in-place ops, out=), shared by all views of it:
  // autograd compares it with the version a saved tensor had when it was saved (PyTorch's
  // version counter).
  std::atomic<uint64_t> version{0};
};

class Node;
class Tensor;
using TensorPtr = std::shared_ptr<Tensor>;
using TensorList = std::vector<TensorPtr>;

// A gradient's way into the graph: the node fn and which of its backward's inputs (which of its
// forward's outputs) the gradient is.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
};

class Tensor {
 public:
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, int64_t offset,
         Format format = Format::Default);
  // (frees its history through detail::release_node: a chain of any length without recursion)
  ~Tensor();
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Makes this tensor, which nothing else holds, a new one on the same storage object (whose
  // fields the caller has set), as if constructed with these fields and offset 0: its shape and
  // strides reuse their buffers, and its autograd state is cleared. For the Python face's recycled
  // wrappers of NumPy arrays (a call with array inputs then allocates nothing for them).
  void rebind(DType dtype, const int64_t* shape, const int64_t* strides, size_t ndim);

  // data
  DType dtype() const { return dtype_; }
  Format format() const { return format_; }
  void set_format(Format f) { format_ = f; }
  Device device() const { return storage_->device; }
  bool on_host() const { return storage_->device.type == DeviceType::CPU; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t offset() const { return offset_; }         // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return numel_; }
  bool is_contiguous() const { return contiguous_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  void* raw_data() const {
    return static_cast<char*>(storage_->data) + offset_ * static_cast<int64_t>(itemsize(dtype_));
  }
  template <typename T> T* data() const { return static_cast<T*>(raw_data()); }
  // The version of this tensor's memory (shared with its views); mark_written() after writing it.
  uint64_t version() const { return storage_->version.load(std::memory_order_acquire); }
  void mark_written() const { storage_->version.fetch_add(1, std::memory_order_acq_rel); }

  // autograd
  bool requires_grad() const { return requires_grad_.load(std::memory_order_relaxed); }
  void set_requires_grad(bool r);
  // .grad is read and written under a lock: backward may run in several threads at once.
  TensorPtr grad() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return grad_;
  }
  void set_grad(TensorPtr g) {
    TensorPtr previous;  // freed once the lock is let go: its memory may be a Python object
                         // (a NumPy array), whose release runs Python code that may read .grad
    {
      std::lock_guard<std::mutex> lock(mutex_);
      previous = std::exchange(grad_, std::move(g));
    }
  }
  std::mutex& grad_mutex() const { return mutex_; }
  TensorPtr& grad_unlocked() { return grad_; }
  // The node that made this tensor and which of its outputs the tensor is (no node: a leaf). An
  // in-place op gives a tensor a new history while another thread may be recording an op that
  // reads it (kernels run with the GIL released), so the pair is read and written together under
  // a lock of its own: history() reads both, as the edge a gradient of this tensor takes.
  Edge history() const {
    MetaLock lock(meta_lock_);
    return Edge{grad_fn_, output_nr_};
  }
  std::shared_ptr<Node> grad_fn() const {
    MetaLock lock(meta_lock_);
    return grad_fn_;
  }
  bool is_leaf() const {
    MetaLock lock(meta_lock_);
    return grad_fn_ == nullptr;
  }
  void set_history(std::shared_ptr<Node> fn, uint32_t output_nr) {
    {
      MetaLock lock(meta_lock_);
      grad_fn_.swap(fn);
      output_nr_ = output_nr;
    }
    requires_grad_.store(true, std::memory_order_relaxed);
  }  // (the old node, swapped into fn, is let go here, after the lock: its graph may be freed with it)
  // The node that accumulates into .grad for a leaf (created on first use, held weakly).
  std::shared_ptr<Node> grad_accumulator(const TensorPtr& self);

  // forward-mode AD: the tangent this tensor carries (opforge.jvp's dual tensors and what ops
  // compute from them), or nullptr. Set once, when the tensor is made, before others see it.
  const TensorPtr& fw_grad() const { return fw_grad_; }
  void set_fw_grad(TensorPtr t) { fw_grad_ = std::move(t); }

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_;
  Format format_;
  Shape shape_;
  Shape strides_;
  int64_t offset_;
  int64_t numel_;
  bool contiguous_;
  // The lock of the history and of the accumulator's weak pointer: a spin lock, held to copy a
  // pointer or two (a history is read once per op that takes the tensor as an input). Not .grad's
  // lock: accumulating into .grad holds that one while add_grad may record an op that reads this
  // tensor's history and accumulator (backward(x, create_graph=True) of x itself).
  class MetaLock {
   public:
    explicit MetaLock(std::atomic_flag& flag) : flag_(flag) {
      while (flag_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    }
    ~MetaLock() { flag_.clear(std::memory_order_release); }
    MetaLock(const MetaLock&) = delete;
    MetaLock& operator=(const MetaLock&) = delete;

   private:
    std::atomic_flag& flag_;
  };

  std::atomic<bool> requires_grad_{false};
  TensorPtr grad_;
  mutable std::atomic_flag meta_lock_ = ATOMIC_FLAG_INIT;
  std::shared_ptr<Node> grad_fn_;
  uint32_t output_nr_ = 0;
  std::weak_ptr<Node> grad_accumulator_;
  TensorPtr fw_grad_;
  mutable std::mutex mutex_;
};

Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

// Elements of a shape; throws ValueError naming op when negative or too large to address.
int64_t checked_numel(const char* op, const Shape& shape, DType dtype);
// A new tensor with fresh, 64-byte aligned, uninitialized contiguous storage (or, while this
// thread has buffer offers, the first untaken offer of that dtype and shape). On a device, the
// device runtime's memory, ordered on the device's current stream.
TensorPtr empty(DType dtype, const Shape& shape, Format format = Format::Default, Device device = Device{});
// TypeError naming op unless t's memory is host memory (what reading it from the CPU needs).
void check_on_host(const char* op, const Tensor& t);
// t on device: t itself when already there, else a contiguous copy (no autograd).
TensorPtr to_device(const char* op, const TensorPtr& t, Device device);

// Memory of a host (the AOT entry points' output buffers) that empty() may hand out instead of
// allocating, so an op writes its results in place. Whoever makes the offers copies the op's
// results into them afterwards when the op did not (an intermediate may have taken one).
struct BufferOffer {
  void* data;
  DType dtype;
  Shape shape;
  Device device;  // where data lives
  bool taken = false;
};
// Sets this thread's offers for the guard's lifetime.
class BufferOfferScope {
 public:
  explicit BufferOfferScope(std::vector<BufferOffer>* offers);
  ~BufferOfferScope();
  BufferOfferScope(const BufferOfferScope&) = delete;
  BufferOfferScope& operator=(const BufferOfferScope&) = delete;

 private:
  std::vector<BufferOffer>* previous_;
};
// A tensor filled with value.
TensorPtr full(DType dtype, const Shape& shape, double value, Format format = Format::Default,
               Device device = Device{});
// The same data with no autograd history (shares storage).
TensorPtr detach(const TensorPtr& t);
// t itself if contiguous, else a contiguous copy (no autograd).
TensorPtr contiguous(const TensorPtr& t);
// A view with another shape when t is contiguous, else a copy (no autograd).
TensorPtr reshape_data(const TensorPtr& t, const Shape& shape);
// Copies src into dst elementwise with conversion (same shapes; any strides).
void copy_into(const TensorPtr& dst, const TensorPtr& src);
// Whether `from` broadcasts to `to` (NumPy's rule, read from the trailing dimension; `to` keeps
// its own shape: no dimension of `to` is stretched).
bool broadcasts_to(const Shape& from, const Shape& to);
// ValueError naming op and `what` unless shape broadcasts to out_shape (O(ndim)): every kernel
// that reads an input through broadcast strides relies on it.
void check_broadcasts_to(const char* op, const char* what, const Shape& shape, const Shape& out_shape);
// The same for the elementwise loop's input number `index`.
void check_input_broadcasts(const char* op, size_t index, const Shape& shape, const Shape& out_shape);

}  // namespace opforge
