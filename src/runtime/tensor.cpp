// Tensor storage, construction and data movement helpers.
#include "runtime/tensor.h"

#include "runtime/borrowed.h"

#include <cstring>

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "runtime/autograd.h"
#include "runtime/elementwise.h"

namespace opforge {

namespace {
const char* const kDTypeNames[] = {"bool", "uint8", "int8", "int16", "int32", "int64",
                                   "float16", "bfloat16", "float32", "float64"};
const size_t kItemsize[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
const char* const kFormatNames[] = {"DefaultFormat", "NCHW", "NHWC"};

#ifdef _OPENMP
// libgomp's thread pool does not survive fork(): in the child, the forking thread's first parallel
// region waits for pool threads that no longer exist (multiprocessing's default 'fork' start
// method, after the parent ran an op big enough to split, hung on its first such op). The child's
// forking thread runs opforge's kernels on one thread, as torch's DataLoader workers run torch's
// (threads the child starts later get pools of their own).
const bool kOneThreadAfterFork = [] {
  pthread_atfork(nullptr, nullptr, [] { omp_set_num_threads(1); });
  return true;
}();
#endif
}  // namespace

const char* dtype_name(DType d) { return kDTypeNames[static_cast<int>(d)]; }
const char* format_name(Format f) { return kFormatNames[static_cast<int>(f)]; }
size_t itemsize(DType d) { return kItemsize[static_cast<int>(d)]; }

bool dtype_from_name(std::string_view name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == std::string_view(kDTypeNames[i])) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

bool format_from_name(const std::string& name, Format* out) {
  for (int i = 0; i < 3; ++i) {
    if (name == kFormatNames[i]) {
      *out = static_cast<Format>(i);
      return true;
    }
  }
  return false;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {
// (wrap_borrowed's pool: a wrapper's storage is a plain Storage, marked external)
constexpr size_t kPooledBorrowed = 16;
struct BorrowedPool {
  TensorPtr items[kPooledBorrowed];
  size_t n = 0;
};
thread_local BorrowedPool t_borrowed;
}  // namespace

TensorPtr wrap_borrowed(void* data, size_t nbytes, DType dtype, const int64_t* shape, size_t ndim, Device device,
                        bool readonly) {
  int64_t small[8];
  std::vector<int64_t> large(ndim > 8 ? ndim : 0);
  int64_t* strides = ndim > 8 ? large.data() : small;
  int64_t step = 1;
  for (size_t i = ndim; i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  TensorPtr t;
  if (t_borrowed.n > 0) {
    t = std::move(t_borrowed.items[--t_borrowed.n]);
    t->rebind(dtype, shape, strides, ndim);
  } else {
    auto storage = std::make_shared<Storage>();
    storage->external = true;
    t = std::make_shared<Tensor>(std::move(storage), dtype, Shape(shape, shape + ndim), Shape(strides, strides + ndim), 0);
  }
  Storage& st = *t->storage();
  st.data = nbytes ? data : nullptr;
  st.nbytes = nbytes;
  st.readonly = readonly;
  st.device = device;
  return t;
}

void recycle_borrowed(TensorPtr& t) {
  TensorPtr mine = std::move(t);
  if (!mine || mine.use_count() != 1 || mine->storage().use_count() != 1 || t_borrowed.n == kPooledBorrowed) return;
  Storage& st = *mine->storage();
  if (st.capacity != 0 || st.owner || !st.external) return;  // (memory someone owns: never a borrowed wrapper)
  st.data = nullptr;  // (a pooled wrapper points at nothing)
  st.nbytes = 0;
  st.used_on.clear();
  st.version.store(0, std::memory_order_relaxed);
  t_borrowed.items[t_borrowed.n++] = std::move(mine);
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

namespace {
// Whether strides lay a shape out densely in row-major order (size-1 and empty dims aside).
bool row_major(const Shape& shape, const Shape& strides, int64_t numel) {
  if (numel == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, int64_t offset,
               Format format)
    : storage_(std::move(storage)), dtype_(dtype), format_(format), shape_(std::move(shape)),
      strides_(std::move(strides)), offset_(offset) {
  numel_ = shape_numel(shape_);
  contiguous_ = row_major(shape_, strides_, numel_);
}

Tensor::~Tensor() {
  if (grad_fn_) detail::release_node(std::move(grad_fn_));
}

void Tensor::rebind(DType dtype, const int64_t* shape, const int64_t* strides, size_t ndim) {
  dtype_ = dtype;
  format_ = Format::Default;
  shape_.assign(shape, shape + ndim);
  strides_.assign(strides, strides + ndim);
  offset_ = 0;
  numel_ = shape_numel(shape_);
  contiguous_ = row_major(shape_, strides_, numel_);
  requires_grad_.store(false, std::memory_order_relaxed);
  grad_.reset();
  grad_fn_.reset();
  output_nr_ = 0;
  grad_accumulator_.reset();
  fw_grad_.reset();
}

void Tensor::set_requires_grad(bool r) {
  if (!is_leaf()) {
    throw RuntimeError("requires_grad can only be changed on leaf tensors; use detach() first");
  }
  if (r && !is_floating(dtype_)) {
    throw TypeError(std::string("only floating-point tensors can require gradients, got ") + dtype_name(dtype_));
  }
  requires_grad_.store(r, std::memory_order_relaxed);
}

std::shared_ptr<Node> Tensor::grad_accumulator(const TensorPtr& self) {
  {
    MetaLock lock(meta_lock_);
    if (auto acc = grad_accumulator_.lock()) return acc;
  }
  auto made = std::make_shared<AccumulateGrad>(self);  // (made unlocked, installed locked)
  MetaLock lock(meta_lock_);
  if (auto acc = grad_accumulator_.lock()) return acc;  // (another thread's came first)
  grad_accumulator_ = made;
  return made;
}

int64_t checked_numel(const char* op, const Shape& shape, DType dtype) {
  // The product of the nonzero dimensions must fit, as NumPy checks it: with a zero dimension the
  // tensor is empty, but its strides are products of the other dimensions, (0, 2**62, 2**62)'s
  // first one overflowing int64
  int64_t n = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) fail<ValueError>(op, "negative dimension in shape ", shape_str(shape));
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(n, d, &n)) fail<ValueError>(op, "shape ", shape_str(shape), " has too many elements");
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(itemsize(dtype)), &bytes) || bytes > (int64_t(1) << 62)) {
    fail<ValueError>(op, "shape ", shape_str(shape), " has too many elements");
  }
  return empty ? 0 : n;
}

// ---------------------------------------------------------------------------- allocation
//
// Large blocks are kept after use and handed out again for the same size: a fresh block of
// hundreds of MB costs a page fault per 4 KiB on first touch, which would dominate a large
// elementwise op (NumPy allocating pays it; `out=` does not). Small blocks go to malloc.

namespace {

constexpr size_t kCacheMinBytes = size_t(1) << 20;   // cache blocks of 1 MiB and more
constexpr size_t kCacheMaxBytes = size_t(1) << 31;   // keep at most 2 GiB cached

struct BlockCache {
  std::mutex lock;
  std::vector<std::pair<size_t, void*>> free;  // (capacity, block), most recent last
  size_t bytes = 0;
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: storages may outlive statics
  return *c;
}

size_t round_capacity(size_t nbytes) {
  if (nbytes < kCacheMinBytes) return ((nbytes + 63) / 64) * 64;
  const size_t page = size_t(1) << 21;  // 2 MiB: huge-page friendly, few distinct sizes
  return ((nbytes + page - 1) / page) * page;
}

void* allocate(size_t capacity) {
  if (capacity >= kCacheMinBytes) {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> guard(c.lock);
    for (size_t i = c.free.size(); i-- > 0;) {
      if (c.free[i].first == capacity) {
        void* p = c.free[i].second;
        c.bytes -= capacity;
        c.free.erase(c.free.begin() + static_cast<std::ptrdiff_t>(i));
        return p;
      }
    }
  }
  // tiny blocks: plain malloc (16-byte aligned) is much cheaper than an aligned allocation
  void* p = capacity <= 256 ? std::malloc(capacity)
                            : std::aligned_alloc(capacity >= kCacheMinBytes ? (size_t(1) << 21) : 64, capacity);
  if (!p) fail<MemoryError>(current_op(), "out of memory allocating ", capacity, " bytes");
#ifdef MADV_HUGEPAGE
  if (capacity >= kCacheMinBytes) madvise(p, capacity, MADV_HUGEPAGE);
#endif
  return p;
}

void deallocate(void* p, size_t capacity) {
  if (capacity >= kCacheMinBytes && capacity <= kCacheMaxBytes) {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> guard(c.lock);
    while (!c.free.empty() && c.bytes + capacity > kCacheMaxBytes) {  // drop the oldest
      std::free(c.free.front().second);
      c.bytes -= c.free.front().first;
      c.free.erase(c.free.begin());
    }
    c.free.emplace_back(capacity, p);
    c.bytes += capacity;
    return;
  }
  std::free(p);
}

}  // namespace

Storage::~Storage() {
  if (!capacity) return;
  if (device.type == DeviceType::CPU) {
    deallocate(data, capacity);
  } else if (DeviceRuntime* rt = find_device_runtime(device.type)) {
    rt->deallocate(device.index, data, capacity, stream, used_on);
  }
}

namespace {
thread_local std::vector<BufferOffer>* t_offers = nullptr;
}  // namespace

BufferOfferScope::BufferOfferScope(std::vector<BufferOffer>* offers) : previous_(t_offers) { t_offers = offers; }
BufferOfferScope::~BufferOfferScope() { t_offers = previous_; }

TensorPtr empty(DType dtype, const Shape& shape, Format format, Device device) {
  if (t_offers) {
    for (BufferOffer& o : *t_offers) {
      if (o.taken || o.dtype != dtype || o.shape != shape || o.device != device) continue;
      o.taken = true;
      auto storage = std::make_shared<Storage>();
      storage->data = o.data;
      storage->nbytes = static_cast<size_t>(shape_numel(shape)) * itemsize(dtype);
      storage->external = true;
      storage->device = device;
      return std::make_shared<Tensor>(std::move(storage), dtype, shape, contiguous_strides(shape), 0, format);
    }
  }
  if (device.type != DeviceType::CPU) {
    DeviceRuntime& rt = device_runtime(current_op() ? current_op() : "empty", device);
    const int64_t n = checked_numel("allocate", shape, dtype);
    auto storage = std::make_shared<Storage>();
    storage->device = device;
    storage->nbytes = static_cast<size_t>(n) * itemsize(dtype);
    if (storage->nbytes) {
      storage->data = rt.allocate(current_op() ? current_op() : "empty", device.index, storage->nbytes, &storage->stream);
      storage->capacity = storage->nbytes;
    }
    return std::make_shared<Tensor>(std::move(storage), dtype, shape, contiguous_strides(shape), 0, format);
  }
  const int64_t n = checked_numel("allocate", shape, dtype);
  auto storage = std::make_shared<Storage>();
  const size_t nbytes = static_cast<size_t>(n) * itemsize(dtype);
  if (nbytes) {
    storage->capacity = round_capacity(nbytes);
    storage->data = allocate(storage->capacity);
  }
  storage->nbytes = nbytes;
  return std::make_shared<Tensor>(std::move(storage), dtype, shape, contiguous_strides(shape), 0, format);
}

TensorPtr full(DType dtype, const Shape& shape, double value, Format format, Device device) {
  auto t = empty(dtype, shape, format, device);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = convert<T>(value);
    if (device.type != DeviceType::CPU) {
      device_runtime("full", device).fill("full", device.index, t->raw_data(), t->numel(), sizeof(T), &v);
      return;
    }
    T* p = t->data<T>();
    for (int64_t i = 0, n = t->numel(); i < n; ++i) p[i] = v;
  });
  return t;
}

void check_on_host(const char* op, const Tensor& t) {
  if (!t.on_host()) {
    fail<TypeError>(op, "the tensor is on ", t.device().str(), ": its memory cannot be read from the host; "
                    "copy it there first with .cpu()");
  }
}

TensorPtr to_device(const char* op, const TensorPtr& t, Device device) {
  if (device.type != DeviceType::CPU) device_runtime(op, device);  // (checks it, resolves a bare index)
  if (t->device() == device) return t;
  const TensorPtr src = contiguous(t);  // (on its own device)
  note_device_use(*src);
  auto out = empty(src->dtype(), src->shape(), src->format(), device);
  Device other = src->on_host() ? device : src->device();
  device_runtime(op, other).copy(op, out->raw_data(), device, src->raw_data(), src->device(),
                                                      static_cast<size_t>(src->numel()) * itemsize(src->dtype()));
  return out;
}

TensorPtr detach(const TensorPtr& t) {
  return std::make_shared<Tensor>(t->storage(), t->dtype(), t->shape(), t->strides(), t->offset(), t->format());
}

void copy_into(const TensorPtr& dst, const TensorPtr& src) {
  if (!dst->on_host() || !src->on_host()) {
    note_device_use(*dst);
    note_device_use(*src);
    if (dst->dtype() == src->dtype() && dst->shape() == src->shape() && dst->is_contiguous() && src->is_contiguous()) {
      Device d = dst->on_host() ? src->device() : dst->device();
      device_runtime("copy", d).copy(current_op() ? current_op() : "copy", dst->raw_data(), dst->device(),
                                     src->raw_data(), src->device(),
                                     static_cast<size_t>(src->numel()) * itemsize(src->dtype()));
      return;
    }
    const char* op = current_op() ? current_op() : "copy";
    if (dst->device() == src->device() && dst->is_contiguous()) {  // conversion, strides, broadcast
      Device d = dst->device();
      device_runtime(op, d).copy_convert(op, *dst, *src);
      return;
    }
    fail<RuntimeError>(op, "converting or strided copies between ", src->device().str(), " and ",
                       dst->device().str(), " are not supported: copy to the device first, then convert");
  }
  if (!dst->is_contiguous()) {
    // (the elementwise loop writes contiguous outputs only) a contiguous copy of src in dst's
    // dtype and shape, then element by element through dst's strides
    TensorPtr c = src;
    if (src->dtype() != dst->dtype() || src->shape() != dst->shape() || !src->is_contiguous()) {
      c = empty(dst->dtype(), dst->shape(), dst->format());
      copy_into(c, src);
    }
    const size_t item = itemsize(dst->dtype());
    const Shape& shape = dst->shape();
    const Shape& strides = dst->strides();
    const int64_t nd = dst->dim(), n = dst->numel();
    const char* from = static_cast<const char*>(c->raw_data());
    char* to = static_cast<char*>(dst->raw_data());
    Shape index(static_cast<size_t>(nd), 0);
    int64_t at = 0;  // dst's element offset of index
    for (int64_t k = 0; k < n; ++k) {
      std::memcpy(to + at * static_cast<int64_t>(item), from + k * static_cast<int64_t>(item), item);
      for (int64_t d = nd - 1; d >= 0; --d) {  // next index, last dimension fastest
        if (++index[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) {
          at += strides[static_cast<size_t>(d)];
          break;
        }
        at -= (shape[static_cast<size_t>(d)] - 1) * strides[static_cast<size_t>(d)];
        index[static_cast<size_t>(d)] = 0;
      }
    }
    return;
  }
  visit_dtype(dst->dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(src->dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      elementwise<Out, In>(*dst, [](auto v) { return v; }, {src.get()});
    });
  });
}

TensorPtr contiguous(const TensorPtr& t) {
  if (t->is_contiguous()) return t;
  auto out = empty(t->dtype(), t->shape(), t->format(), t->device());
  copy_into(out, t);
  return out;
}

TensorPtr reshape_data(const TensorPtr& t, const Shape& shape) {
  if (checked_numel(current_op(), shape, t->dtype()) != t->numel()) {
    fail<ValueError>(current_op(), "cannot view ", shape_str(t->shape()), " (", t->numel(), " elements) as ",
                     shape_str(shape));
  }
  auto c = contiguous(t);
  return std::make_shared<Tensor>(c->storage(), c->dtype(), shape, contiguous_strides(shape), c->offset(),
                                  c->format());
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  }
  return true;
}

void check_broadcasts_to(const char* op, const char* what, const Shape& shape, const Shape& out_shape) {
  if (!broadcasts_to(shape, out_shape)) {
    fail<ValueError>(op, what, " of shape ", shape_str(shape), " does not broadcast to the output shape ",
                     shape_str(out_shape));
  }
}

void check_input_broadcasts(const char* op, size_t index, const Shape& shape, const Shape& out_shape) {
  if (!broadcasts_to(shape, out_shape)) {
    fail<ValueError>(op, "input ", index, " of shape ", shape_str(shape), " does not broadcast to the output shape ",
                     shape_str(out_shape));
  }
}

namespace {
thread_local const char* t_current_op = "opforge";
}  // namespace

const char* current_op() { return t_current_op; }
CurrentOpScope::CurrentOpScope(const char* op) : previous_(t_current_op) { t_current_op = op; }
CurrentOpScope::~CurrentOpScope() { t_current_op = previous_; }

Shape broadcast_strides(const Tensor& t, const Shape& out_shape) {
  check_broadcasts_to(current_op(), "an input", t.shape(), out_shape);
  const size_t nd = out_shape.size();
  const size_t td = t.shape().size();
  Shape st(nd, 0);
  for (size_t i = 0; i < td; ++i) {
    const size_t o = nd - td + i;
    st[o] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return st;
}

}  // namespace opforge
