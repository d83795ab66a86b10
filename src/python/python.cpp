// Python side of the runtime: the Tensor class, NumPy/DLPack exchange, input and attr
// conversion, autograd entry points, op_info, C++ -> Python exception mapping, and the kernel of
// pyfunc ops (python/pyfunc.h).
#include "python/python.h"

#include <pybind11/numpy.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL opforge_ARRAY_API
#include <numpy/arrayobject.h>
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>
#include <string_view>
#include <utility>

#include "aot/aot.h"
#include "runtime/autograd.h"
#include "python/dlpack.h"
#include "python/gil.h"
#include "runtime/functional.h"
#include "python/pyfunc.h"

namespace opforge::python {

namespace {

std::string type_name(py::handle obj) {
  if (obj.is_none()) return "None";
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

// ---------------------------------------------------------------------------- NumPy (buffer protocol)

// (the exporter's item size must be the dtype's: a 'd' buffer of 4-byte items would be read past
// its end)
bool dtype_from_buffer_format(const char* fmt, Py_ssize_t size, DType* out) {
  while (*fmt == '<' || *fmt == '=' || *fmt == '@' || *fmt == '|' || *fmt == '!' || *fmt == '>') {
    if (*fmt == '>' || *fmt == '!') return false;  // big-endian data is not supported
    ++fmt;
  }
  if (fmt[0] == '\0' || fmt[1] != '\0') return false;
  switch (fmt[0]) {
    case '?': *out = DType::Bool; return size == 1;
    case 'B': *out = DType::UInt8; return size == 1;
    case 'b': *out = DType::Int8; return size == 1;
    case 'h': *out = DType::Int16; return size == 2;
    case 'i': case 'l': case 'q':
      if (size == 4) { *out = DType::Int32; return true; }
      if (size == 8) { *out = DType::Int64; return true; }
      return false;
    case 'e': *out = DType::Float16; return size == 2;
    case 'f': *out = DType::Float32; return size == 4;
    case 'd': *out = DType::Float64; return size == 8;
    default: return false;
  }
}

const char* buffer_format(DType d) {
  switch (d) {
    case DType::Bool: return "?";
    case DType::UInt8: return "B";
    case DType::Int8: return "b";
    case DType::Int16: return "h";
    case DType::Int32: return "i";
    case DType::Int64: return "q";
    case DType::Float16: return "e";
    case DType::Float32: return "f";
    case DType::Float64: return "d";
    default: return nullptr;
  }
}

std::string supported_dtypes() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) s += std::string(i ? ", " : "") + dtype_name(static_cast<DType>(i));
  return s;
}

TensorPtr from_buffer(py::handle obj, const char* op, const char* arg) {
  auto* view = new Py_buffer();
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_RECORDS_RO) != 0) {
    delete view;
    PyErr_Clear();
    fail<TypeError>(op, "input '", arg, "' must be a tensor or array, got ", type_name(obj));
  }
  std::shared_ptr<Py_buffer> owner(view, [](Py_buffer* v) {
    AcquireGil gil;
    PyBuffer_Release(v);
    delete v;
  });
  DType dtype;
  if (!dtype_from_buffer_format(view->format ? view->format : "B", view->itemsize, &dtype)) {
    const char* format = view->format ? view->format : "?";
    const bool swapped = (format[0] == '>' || format[0] == '!') && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
    if (swapped && dtype_from_buffer_format(format + 1, view->itemsize, &dtype)) {
      fail<TypeError>(op, "input '", arg, "' is big-endian ('", format, "'): opforge reads native byte order; "
                      "convert it first (NumPy: a.astype(a.dtype.newbyteorder('=')))");
    }
    fail<TypeError>(op, "input '", arg, "' has unsupported element format '", format, "'; supported dtypes: ",
                    supported_dtypes());
  }
  Shape shape(view->shape, view->shape + view->ndim);
  Shape strides(static_cast<size_t>(view->ndim));
  for (int i = 0; i < view->ndim; ++i) {
    if (view->strides[i] % view->itemsize != 0) {
      fail<ValueError>(op, "input '", arg, "' has strides that are not a multiple of its item size");
    }
    strides[static_cast<size_t>(i)] = view->strides[i] / view->itemsize;
  }
  auto storage = std::make_shared<Storage>();
  storage->data = view->buf;
  storage->nbytes = static_cast<size_t>(view->len);
  storage->owner = owner;
  storage->external = true;
  storage->readonly = view->readonly != 0;
  return std::make_shared<Tensor>(std::move(storage), dtype, std::move(shape), std::move(strides), 0);
}

// ndarray fast path: read the array's fields directly (no buffer export, no format parsing).
bool dtype_from_numpy(int type_num, DType* out) {
  switch (type_num) {
    case NPY_BOOL: *out = DType::Bool; return true;
    case NPY_UINT8: *out = DType::UInt8; return true;
    case NPY_INT8: *out = DType::Int8; return true;
    case NPY_INT16: *out = DType::Int16; return true;
    case NPY_HALF: *out = DType::Float16; return true;
    case NPY_FLOAT: *out = DType::Float32; return true;
    case NPY_DOUBLE: *out = DType::Float64; return true;
    default:
      if (PyTypeNum_ISSIGNED(type_num) && !PyTypeNum_ISFLOAT(type_num)) {  // int/long/longlong by size
        const int size = PyDataType_ELSIZE(PyArray_DescrFromType(type_num));
        if (size == 4) { *out = DType::Int32; return true; }
        if (size == 8) { *out = DType::Int64; return true; }
      }
      return false;
  }
}

// The storage of a wrapped ndarray holds the array itself: one allocation with its control block
// (no separate keep-alive), releasing the array when the last tensor on it goes, with the GIL
// taken only when this thread does not hold it.
struct ArrayStorage : Storage {
  explicit ArrayStorage(PyObject* a) : array(a) { Py_INCREF(a); }
  ~ArrayStorage() {
    if (!array) return;  // (a recycled wrapper: released already)
    if (PyGILState_Check()) {
      Py_DECREF(array);
    } else {
      AcquireGil gil;
      Py_DECREF(array);
    }
  }
  PyObject* array;
};

// Recycled ndarray wrappers: a call with array inputs would allocate and free a Tensor, its
// ArrayStorage and its shape and strides for each array. When the call is over and nothing else
// holds the wrapper (nor its storage: no view, no saved tensor, no result sharing it), it goes to
// its thread's pool with the array released (the pool keeps no array alive), and the next array
// wrapped on that thread rebinds it: no allocation while the ranks fit the buffers kept.
constexpr size_t kPooledWrappers = 8;
struct WrapperPool {
  TensorPtr items[kPooledWrappers];
  size_t n = 0;
};
thread_local WrapperPool t_wrappers;

void recycle_wrapper(TensorPtr& t) {
  if (t.use_count() != 1 || t->storage().use_count() != 1 || t_wrappers.n == kPooledWrappers) return;
  auto& s = static_cast<ArrayStorage&>(*t->storage());
  PyObject* array = s.array;
  s.array = nullptr;
  s.data = nullptr;
  Py_DECREF(array);
  // (checked again: the release may have run Python code, whose op calls fill the pool too)
  if (t_wrappers.n == kPooledWrappers) return;
  t_wrappers.items[t_wrappers.n++] = std::move(t);
}

TensorPtr from_ndarray(PyObject* obj, const char* op, const char* arg) {
  auto* a = reinterpret_cast<PyArrayObject*>(obj);
  DType dtype;
  if (!PyArray_ISNBO(PyArray_DESCR(a)->byteorder) || !dtype_from_numpy(PyArray_TYPE(a), &dtype)) {
    return nullptr;  // the buffer protocol path reports the unsupported format
  }
  const int nd = PyArray_NDIM(a);
  const npy_intp* dims = PyArray_DIMS(a);
  const npy_intp* st = PyArray_STRIDES(a);
  const auto item = static_cast<npy_intp>(itemsize(dtype));
  int64_t strides[NPY_MAXDIMS];
  for (int i = 0; i < nd; ++i) {
    if (st[i] % item != 0) {
      fail<ValueError>(op, "input '", arg, "' has strides that are not a multiple of its item size");
    }
    strides[i] = st[i] / item;
  }
  static_assert(sizeof(npy_intp) == sizeof(int64_t));
  const auto* shape = reinterpret_cast<const int64_t*>(dims);
  if (t_wrappers.n > 0) {  // a recycled wrapper (nothing else holds it or its storage)
    TensorPtr t = std::move(t_wrappers.items[--t_wrappers.n]);
    auto& s = static_cast<ArrayStorage&>(*t->storage());
    Py_INCREF(obj);
    s.array = obj;
    s.data = PyArray_DATA(a);
    s.nbytes = static_cast<size_t>(PyArray_NBYTES(a));
    s.readonly = !PyArray_ISWRITEABLE(a);
    s.version.store(0, std::memory_order_relaxed);
    t->rebind(dtype, shape, strides, static_cast<size_t>(nd));
    return t;
  }
  auto storage = std::make_shared<ArrayStorage>(obj);
  storage->data = PyArray_DATA(a);
  storage->nbytes = static_cast<size_t>(PyArray_NBYTES(a));
  storage->external = true;
  storage->readonly = !PyArray_ISWRITEABLE(a);
  return std::make_shared<Tensor>(std::move(storage), dtype, Shape(shape, shape + nd), Shape(strides, strides + nd), 0);
}

// ---------------------------------------------------------------------------- DLPack

bool dtype_from_dl(DLDataType t, DType* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLBool: *out = DType::Bool; return t.bits == 8;
    case kDLUInt: if (t.bits == 8) { *out = DType::UInt8; return true; } return false;
    case kDLInt:
      switch (t.bits) {
        case 8: *out = DType::Int8; return true;
        case 16: *out = DType::Int16; return true;
        case 32: *out = DType::Int32; return true;
        case 64: *out = DType::Int64; return true;
        default: return false;
      }
    case kDLFloat:
      switch (t.bits) {
        case 16: *out = DType::Float16; return true;
        case 32: *out = DType::Float32; return true;
        case 64: *out = DType::Float64; return true;
        default: return false;
      }
    case kDLBfloat: *out = DType::BFloat16; return t.bits == 16;
    default: return false;
  }
}

DLDataType dl_from_dtype(DType d) {
  const auto bits = static_cast<uint8_t>(itemsize(d) * 8);
  switch (d) {
    case DType::Bool: return {kDLBool, 8, 1};
    case DType::UInt8: return {kDLUInt, 8, 1};
    case DType::Int8: case DType::Int16: case DType::Int32: case DType::Int64: return {kDLInt, bits, 1};
    case DType::BFloat16: return {kDLBfloat, 16, 1};
    default: return {kDLFloat, bits, 1};
  }
}

constexpr int32_t kMaxDLDims = 64;        // NumPy 2's limit
constexpr uint32_t kDLPackMajorVersion = 1;  // the DLPack ABI version this file speaks

// A tensor over a producer's DLTensor, checked before anything reads through it: device, dtype,
// rank, shape, strides (the span of the elements must fit the address space), data pointer and
// alignment. The caller takes ownership of the memory once this returns.
TensorPtr tensor_from_dl(const DLTensor& dl, const char* op, const char* arg, bool readonly) {
  Device device;  // kDLCPU, and kDLCUDAHost (pinned host memory): the host
  if (dl.device.device_type == kDLCUDA) {
    device = Device{DeviceType::CUDA, static_cast<int>(dl.device.device_id)};
    if (device.index < 0) fail<ValueError>(op, "input '", arg, "': DLPack device id ", dl.device.device_id);
    device_runtime(op, device);  // RuntimeError: a build without cuda, or no such device
  } else if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDAHost) {
    fail<TypeError>(op, "input '", arg, "' lives on DLPack device type ", dl.device.device_type,
                    "; opforge reads CPU (1), CUDA host (3) and, in builds with cuda (targets: ", built_targets(),
                    "), CUDA (2) memory");
  }
  DType dtype;
  if (!dtype_from_dl(dl.dtype, &dtype)) {
    fail<TypeError>(op, "input '", arg, "' has an unsupported DLPack dtype (code ", int(dl.dtype.code), ", ",
                    int(dl.dtype.bits), " bits, ", int(dl.dtype.lanes), " lanes); supported dtypes: ",
                    supported_dtypes());
  }
  if (dl.ndim < 0 || dl.ndim > kMaxDLDims) {
    fail<ValueError>(op, "input '", arg, "': the DLPack tensor has ndim ", dl.ndim, "; opforge takes 0 to ",
                     kMaxDLDims);
  }
  if (dl.ndim > 0 && !dl.shape) fail<ValueError>(op, "input '", arg, "': the DLPack tensor has no shape");
  Shape shape(dl.shape, dl.shape + dl.ndim);
  for (int64_t d : shape) {
    if (d < 0) fail<ValueError>(op, "input '", arg, "': the DLPack shape ", shape_str(shape), " has a negative size");
  }
  const int64_t n = checked_numel(op, shape, dtype);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  const auto item = static_cast<int64_t>(itemsize(dtype));
  char* data = static_cast<char*>(dl.data);
  if (n > 0) {
    if (!data) fail<ValueError>(op, "input '", arg, "': the DLPack tensor has a null data pointer");
    // bytes from the first element to the lowest and the highest element the strides reach
    int64_t lo = 0, hi = 0;
    bool overflow = false;
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t reach;
      overflow = overflow || __builtin_mul_overflow(strides[i], shape[i] - 1, &reach) ||
                 __builtin_mul_overflow(reach, item, &reach) ||
                 __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
    }
    const auto base = reinterpret_cast<uintptr_t>(data);
    const uintptr_t below = uintptr_t{0} - static_cast<uintptr_t>(lo);  // -lo, also for INT64_MIN
    uintptr_t first = 0, last = 0;
    overflow = overflow || __builtin_add_overflow(base, dl.byte_offset, &first) || first < below ||
               __builtin_add_overflow(first, static_cast<uintptr_t>(hi), &last) ||
               __builtin_add_overflow(last, static_cast<uintptr_t>(item), &last);
    if (overflow) {
      fail<ValueError>(op, "input '", arg, "': the DLPack strides ", shape_str(strides), " (byte offset ",
                       dl.byte_offset, ") reach outside the address space for shape ", shape_str(shape));
    }
    if (first % static_cast<uintptr_t>(item) != 0) {
      fail<ValueError>(op, "input '", arg, "': the DLPack data (byte offset ", dl.byte_offset,
                       ") is not aligned to its ", item, "-byte elements");
    }
    data += dl.byte_offset;
  }
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->nbytes = static_cast<size_t>(n) * itemsize(dtype);
  storage->external = true;
  storage->readonly = readonly;
  storage->device = device;
  return std::make_shared<Tensor>(std::move(storage), dtype, std::move(shape), std::move(strides), 0);
}

// Checks that t's memory may be written element by element (out=, in-place, copy_): not read-only,
// and no broadcast dimension whose elements share memory; ValueError naming op and `what` otherwise.
void check_writable(const char* op, const char* what, const Tensor& t) {
  if (t.storage()->readonly) fail<ValueError>(op, what, " is read-only (it wraps read-only memory)");
  for (size_t d = 0; d < t.shape().size() && t.numel() > 0; ++d) {  // (an empty tensor has no elements to share)
    if (t.strides()[d] == 0 && t.shape()[d] > 1) {
      fail<ValueError>(op, what, " has elements that share memory (a broadcast view): writing it is ambiguous");
    }
  }
}

// Whether the memory a and b span overlaps (on one device).
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  auto span = [](const Tensor& t) {
    int64_t lo = 0, hi = 0;  // element offsets from raw_data()
    for (size_t d = 0; d < t.shape().size(); ++d) {
      const int64_t reach = t.strides()[d] * (t.shape()[d] - 1);
      (reach < 0 ? lo : hi) += reach;
    }
    const auto* base = static_cast<const char*>(t.raw_data());
    const auto item = static_cast<int64_t>(itemsize(t.dtype()));
    return std::pair<const char*, const char*>(base + lo * item, base + (hi + 1) * item);
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

int64_t checked_int(const char* op, const char* arg, PyObject* p);  // (below, beside InputConverter's use)
bool int_fits(DType d, int64_t v);
TensorPtr to_tensor_of(py::handle obj, const char* op, const char* arg, bool numbers);

// A Python number (kind 'f' float, 'i' int, 'b' bool; f or i its value) as a 0-d tensor of dtype,
// checked as every face checks numbers: a float for a bool or integer dtype is a TypeError, an int
// out of the dtype's range a ValueError, both naming op (and input `arg` and the input `bound_by`
// that bound the dtype, where given); an int is exact (not through a double: 2**53 + 1 stays itself).
TensorPtr number_tensor(const char* op, const char* arg, char kind, double f, int64_t i, DType dtype,
                        const char* bound_by = nullptr) {
  const char *a0 = arg ? "input '" : "", *a1 = arg ? arg : "", *a2 = arg ? "': " : "";
  const char *b0 = bound_by ? " (bound by input '" : "", *b1 = bound_by ? bound_by : "", *b2 = bound_by ? "')" : "";
  if (kind == 'f' && !is_floating(dtype)) {
    fail<TypeError>(op, a0, a1, a2, "a Python float cannot be ", dtype_name(dtype), b0, b1, b2,
                    "; pass an array of the intended dtype");
  }
  if (kind == 'i' && !is_floating(dtype) && !int_fits(dtype, i)) {
    fail<ValueError>(op, a0, a1, a2, "the Python int ", i, " is out of range for ", dtype_name(dtype), b0, b1, b2);
  }
  auto t = empty(dtype, {});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    *t->data<T>() = kind == 'f' ? convert<T>(f) : convert<T>(i);
  });
  return t;
}

// Writes value (a host tensor of dst's dtype, of one element) into every element of dst, on dst's
// device: a fill kernel on its current stream, the value passed by argument (no copy from host
// memory, so a graph being captured records it).
void fill_on_device(const char* op, const Tensor& dst, const Tensor& value) {
  Device d = dst.device();
  device_runtime(op, d).fill(op, d.index, dst.raw_data(), dst.numel(), itemsize(dst.dtype()), value.raw_data());
}

// x.copy_(src), torch's: src (a tensor, array, DLPack producer or Python scalar), broadcast to x's shape
// and converted to x's dtype, written into x's memory from any device. Returns x.
TensorPtr copy_from(const TensorPtr& dst, py::handle value) {
  const char* op = "copy_";
  PyObject* p = value.ptr();
  const bool scalar = PyBool_Check(p) || PyLong_Check(p) || PyFloat_Check(p);
  // (given outlives the GIL's release: it may hold a Python object)
  const DType d = dst->dtype();
  const TensorPtr given = PyFloat_Check(p) ? number_tensor(op, nullptr, 'f', PyFloat_AS_DOUBLE(p), 0, d)
                          : PyBool_Check(p) ? number_tensor(op, nullptr, 'b', 0.0, p == Py_True, d)
                          : PyLong_Check(p) ? number_tensor(op, nullptr, 'i', 0.0, checked_int(op, nullptr, p), d)
                                            : to_tensor_of(value, op, "src", true);
  TensorPtr src = given;
  check_writable(op, "the tensor", *dst);
  if (broadcast_shapes(op, {dst.get(), src.get()}, {"self", "src"}) != dst->shape()) {
    fail<ValueError>(op, "src of shape ", shape_str(src->shape()), " does not broadcast to the tensor's shape ",
                     shape_str(dst->shape()));
  }
  if (GradMode::is_enabled() && (src->requires_grad() || dst->requires_grad())) {
    fail<RuntimeError>(op, "does not record gradients, but ", src->requires_grad() ? "src" : "the tensor",
                       " requires grad (call it under opforge.no_grad())");
  }
  if (!dst->on_host() && !dst->is_contiguous()) {
    fail<RuntimeError>(op, "writing a strided view on ", dst->device().str(), " is not supported: copy into a "
                       "contiguous tensor");
  }
  if (src->raw_data() == dst->raw_data() && src->dtype() == dst->dtype() && src->shape() == dst->shape() &&
      src->strides() == dst->strides()) {
    return dst;  // (itself)
  }
  ReleaseGil nogil;
  if (scalar && !dst->on_host()) {  // a fill on the device (no copy: capturable)
    note_device_use(*dst);
    fill_on_device(op, *dst, *given);
    dst->mark_written();
    return dst;
  }
  if (src->device() != dst->device()) {
    src = to_device(op, src, dst->device());
  } else if (overlap(*src, *dst)) {
    TensorPtr c = empty(src->dtype(), src->shape(), src->format(), src->device());
    copy_into(c, src);  // (overlapping memory: read all of src before writing)
    src = c;
  }
  copy_into(dst, src);
  dst->mark_written();
  return dst;
}

// A device graph (DeviceRuntime's graph_*) as opforge.cuda.CUDAGraph holds it: made on first
// capture, released by reset() or with the object.
class GraphHandle {
 public:
  explicit GraphHandle(const std::string& text) : device_(parse_device("CUDAGraph", text)) {
    if (device_.type == DeviceType::CPU) fail<ValueError>("CUDAGraph", "graphs capture device work: got ", text);
    runtime_ = &device_runtime("CUDAGraph", device_);
  }
  ~GraphHandle() { release(); }
  GraphHandle(const GraphHandle&) = delete;
  GraphHandle& operator=(const GraphHandle&) = delete;

  void capture_begin() {
    if (!graph_) graph_ = runtime_->graph_create("capture_begin", device_.index);
    runtime_->graph_capture_begin("capture_begin", graph_);
  }
  void capture_end(bool discard) {
    if (!graph_) {
      if (discard) return;
      fail<RuntimeError>("capture_end", "the graph is not capturing");
    }
    runtime_->graph_capture_end("capture_end", graph_, discard);
  }
  void replay() {
    if (!graph_) fail<RuntimeError>("replay", "the graph holds no capture: capture it first");
    runtime_->graph_replay("replay", graph_);
  }
  // reset(): a capture under way ends first, discarded (on its own thread only: RuntimeError on
  // another); the handle is taken with the GIL held, and released (which waits for the device)
  // without it, so no other call reaches the graph meanwhile.
  void reset() {
    if (!graph_) return;
    if (runtime_->graph_capturing(graph_)) runtime_->graph_capture_end("reset", graph_, true);
    void* graph = std::exchange(graph_, nullptr);
    ReleaseGil nogil;
    runtime_->graph_release(graph);
  }
  void release() noexcept {
    if (graph_) runtime_->graph_release(std::exchange(graph_, nullptr));
  }
  std::string device() const { return device_.str(); }

 private:
  Device device_;
  DeviceRuntime* runtime_ = nullptr;
  void* graph_ = nullptr;
};

// The stream argument of a producer's __dlpack__ for memory on device (the Array API's rules):
// for CUDA, the consumer's current stream (1: the legacy default stream); none for the host.
py::object dlpack_stream_for(Device device) {
  if (device.type != DeviceType::CUDA) return py::none();
  void* s = device_runtime("from_dlpack", device).current_stream(device.index);
  return s ? py::int_(reinterpret_cast<uintptr_t>(s)) : py::int_(1);
}

// Takes a DLPack capsule's tensor: checks it, then renames the capsule "used_..." (as the
// protocol asks: consumed once) and keeps the producer's memory alive as long as the tensor.
// A capsule that fails the checks is left as it was, for its producer to free.
TensorPtr from_capsule(py::handle capsule, const char* op, const char* arg) {
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    if (managed->version.major != kDLPackMajorVersion) {
      fail<ValueError>(op, "input '", arg, "': DLPack version ", managed->version.major, ".",
                       managed->version.minor, " is not supported (opforge reads version ", kDLPackMajorVersion,
                       ".x)");
    }
    TensorPtr t = tensor_from_dl(managed->dl_tensor, op, arg, (managed->flags & kDLPackFlagReadOnly) != 0);
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    t->storage()->owner = std::shared_ptr<void>(managed, [](void* p) {
      auto* m = static_cast<DLManagedTensorVersioned*>(p);
      AcquireGil gil;
      if (m->deleter) m->deleter(m);
    });
    return t;
  }
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    TensorPtr t = tensor_from_dl(managed->dl_tensor, op, arg, false);
    PyCapsule_SetName(cap, "used_dltensor");
    t->storage()->owner = std::shared_ptr<void>(managed, [](void* p) {
      auto* m = static_cast<DLManagedTensor*>(p);
      AcquireGil gil;
      if (m->deleter) m->deleter(m);
    });
    return t;
  }
  if (PyCapsule_IsValid(cap, "used_dltensor") || PyCapsule_IsValid(cap, "used_dltensor_versioned")) {
    fail<ValueError>(op, "input '", arg, "': this DLPack capsule was already consumed");
  }
  fail<TypeError>(op, "input '", arg, "': not a DLPack capsule");
}

// Asks a producer for a versioned capsule (DLPack 1.x, which can say "read-only"), and for the
// unversioned one when its __dlpack__ takes no max_version (producers from before DLPack 1.0).
TensorPtr from_dlpack_obj(py::handle obj, const char* op, const char* arg) {
  // A torch tensor with its negative bit set (a lazy negation, as of x.conj().imag) exports its
  // memory without the negation: its values resolved first
  py::object resolved;
  if (py::object is_neg = py::getattr(obj, "is_neg", py::none()); !is_neg.is_none() && is_neg().cast<bool>()) {
    resolved = obj.attr("resolve_neg")();
    obj = resolved;
  }
  py::object dlpack = obj.attr("__dlpack__");
  // a CUDA producer orders its work before our current stream's (the stream argument)
  py::object stream = py::none();
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple where = obj.attr("__dlpack_device__")();
    if (where.size() == 2 && where[0].cast<int>() == kDLCUDA) {
      stream = dlpack_stream_for(Device{DeviceType::CUDA, where[1].cast<int>()});
    }
  }
  py::object capsule;
  try {
    capsule = stream.is_none() ? dlpack(py::arg("max_version") = py::make_tuple(kDLPackMajorVersion, 0))
                               : dlpack(py::arg("stream") = stream,
                                        py::arg("max_version") = py::make_tuple(kDLPackMajorVersion, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = stream.is_none() ? dlpack() : dlpack(py::arg("stream") = stream);
  }
  if (!PyCapsule_CheckExact(capsule.ptr())) {
    fail<TypeError>(op, "input '", arg, "': __dlpack__() did not return a DLPack capsule");
  }
  return from_capsule(capsule, op, arg);
}

DLDevice dl_device_of(Device d) {
  return d.type == DeviceType::CUDA ? DLDevice{kDLCUDA, d.index} : DLDevice{kDLCPU, 0};
}

struct DLPackExport {
  TensorPtr tensor;
  Shape shape;
  Shape strides;
};

template <typename Managed>
Managed* make_managed(const TensorPtr& t) {
  auto* ctx = new DLPackExport{t, t->shape(), t->strides()};
  auto* m = new Managed();
  DLTensor& dl = m->dl_tensor;
  dl.data = t->raw_data();
  dl.device = dl_device_of(t->device());
  dl.ndim = static_cast<int32_t>(t->dim());
  dl.dtype = dl_from_dtype(t->dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  m->manager_ctx = ctx;
  m->deleter = [](Managed* self) {
    delete static_cast<DLPackExport*>(self->manager_ctx);
    delete self;
  };
  return m;
}

// The capsule __dlpack__ returns: versioned (with the read-only and copied flags) when the
// consumer's max_version allows DLPack 1.x, else the legacy struct, which cannot say "read-only":
// then read-only memory is handed out as a copy, unless the consumer said copy=False.
// __dlpack__(stream=...) of a tensor on a device: the consumer will use the memory on its stream
// (the Array API's values: None or 1 the legacy default stream, 2 the per-thread one, -1 none,
// others a cudaStream_t), so that stream must wait for our work on the tensor: the work queued on
// the stream its memory was allocated on (where the op that made it ran) and on our current
// stream. The wait is queued on the device (an event), not on the host; nothing waits when the
// consumer uses that same stream or asks for no ordering.
void order_for_consumer(const Tensor& t, py::handle stream) {
  void* consumer = nullptr;  // (our handle of the legacy default stream)
  if (!stream.is_none()) {
    if (!PyLong_Check(stream.ptr())) {
      fail<TypeError>("__dlpack__", "stream must be an int or None, got ", py::repr(stream).cast<std::string>());
    }
    const long long s = stream.cast<long long>();
    if (s == -1) return;
    if (s == 0) fail<ValueError>("__dlpack__", "stream 0 is ambiguous for CUDA: pass 1 for the legacy default stream");
    if (s < -1) fail<ValueError>("__dlpack__", "stream ", s, " is not a stream");
    if (s != 1) consumer = reinterpret_cast<void*>(static_cast<uintptr_t>(s));
  }
  Device d = t.device();
  DeviceRuntime& rt = device_runtime("__dlpack__", d);
  void* ours = rt.current_stream(d.index);
  void* made_on = t.storage()->capacity ? t.storage()->stream : ours;
  if (made_on != consumer) rt.stream_wait("__dlpack__", d.index, consumer, made_on);
  if (ours != consumer && ours != made_on) rt.stream_wait("__dlpack__", d.index, consumer, ours);
  note_stream_use(t, consumer);  // (freeing our memory then waits for the consumer's work on it)
}

py::capsule to_dlpack(const TensorPtr& t, py::handle max_version, py::handle copy) {
  bool versioned = false;
  if (!max_version.is_none()) {
    py::tuple v;
    if (py::isinstance<py::tuple>(max_version)) v = max_version.cast<py::tuple>();
    if (v.size() != 2 || !PyLong_Check(v[0].ptr()) || !PyLong_Check(v[1].ptr())) {
      fail<TypeError>("__dlpack__", "max_version must be a tuple (major, minor) of ints, got ",
                      py::repr(max_version).cast<std::string>());
    }
    versioned = py::object(v[0]) >= py::int_(kDLPackMajorVersion);
  }
  const bool must_copy = !copy.is_none() && copy.cast<bool>();
  const bool no_copy = !copy.is_none() && !copy.cast<bool>();
  TensorPtr src = t;
  if (must_copy || (!versioned && t->storage()->readonly)) {
    if (!must_copy && no_copy) {
      throw py::buffer_error("[__dlpack__] a read-only tensor can be exported without a copy only as a versioned "
                             "capsule (max_version >= (1, 0)), which can say read-only; copy=False forbids the copy");
    }
    src = empty(t->dtype(), t->shape(), t->format(), t->device());
    copy_into(src, t);
  }
  if (versioned) {
    auto* m = make_managed<DLManagedTensorVersioned>(src);
    m->version = DLPackVersion{kDLPackMajorVersion, 0};
    m->flags = (src->storage()->readonly ? kDLPackFlagReadOnly : 0) | (src != t ? kDLPackFlagIsCopied : 0);
    return py::capsule(m, "dltensor_versioned", [](PyObject* cap) {
      if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        auto* p = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
        p->deleter(p);
      }
    });
  }
  auto* m = make_managed<DLManagedTensor>(src);
  return py::capsule(m, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* p = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      p->deleter(p);
    }
  });
}

// ---------------------------------------------------------------------------- misc helpers

// t.grad = g: None, or a tensor of t's shape, dtype and device (a wrong one would make backward
// fail much later, or hand an optimizer a gradient it broadcasts silently).
void set_grad(Tensor& t, py::handle g) {
  if (g.is_none()) {
    t.set_grad(nullptr);
    return;
  }
  TensorPtr grad = to_tensor(g, "grad", "grad");
  if (grad.get() == &t) fail<ValueError>("grad", "a tensor cannot be its own grad");
  if (grad->shape() != t.shape()) {
    fail<ValueError>("grad", "assigned grad has shape ", shape_str(grad->shape()), " but the tensor has shape ",
                     shape_str(t.shape()));
  }
  if (grad->dtype() != t.dtype()) {
    fail<TypeError>("grad", "assigned grad has dtype ", dtype_name(grad->dtype()), " but the tensor has dtype ",
                    dtype_name(t.dtype()));
  }
  if (grad->device() != t.device()) fail<TypeError>("grad", "assigned grad is on another device than the tensor");
  t.set_grad(std::move(grad));
}

DType parse_dtype(py::handle d, const char* op) {
  if (py::isinstance<py::str>(d)) {
    DType out;
    if (dtype_from_name(d.cast<std::string>(), &out)) return out;
  } else if (py::hasattr(d, "name") || py::hasattr(d, "__name__")) {
    // numpy dtypes and scalar types: np.float32, np.dtype("float32")
    py::object name = py::module_::import("numpy").attr("dtype")(d).attr("name");
    DType out;
    if (dtype_from_name(name.cast<std::string>(), &out)) return out;
  }
  fail<TypeError>(op, "unknown dtype ", py::repr(d).cast<std::string>(), "; supported: ", supported_dtypes());
}

py::object numpy_view(const TensorPtr& t) {
  check_on_host("numpy", *t);
  const char* fmt = buffer_format(t->dtype());
  if (!fmt) {
    fail<TypeError>("numpy", "NumPy has no ", dtype_name(t->dtype()), " dtype; use t.astype('float32') first");
  }
  std::vector<py::ssize_t> shape(t->shape().begin(), t->shape().end());
  std::vector<py::ssize_t> strides;
  const auto item = static_cast<py::ssize_t>(itemsize(t->dtype()));
  for (int64_t s : t->strides()) strides.push_back(s * item);
  // The array's base owns a reference to the tensor, so the memory outlives the array.
  auto* holder = new TensorPtr(t);
  py::capsule base(holder, [](void* p) { delete static_cast<TensorPtr*>(p); });
  py::array arr(py::dtype(fmt), shape, strides, t->raw_data(), base);
  if (t->storage()->readonly) arr.attr("setflags")(py::arg("write") = false);
  return std::move(arr);
}

py::object item(const TensorPtr& given) {
  if (given->numel() != 1) fail<ValueError>("item", "only one-element tensors can be converted to Python scalars, got shape ", shape_str(given->shape()));
  const TensorPtr t = to_device("item", given, Device{});  // (a device's element: copied to the host)
  return visit_dtype(t->dtype(), [&](auto tag) -> py::object {
    using T = decltype(tag);
    const T v = *t->data<T>();
    if constexpr (std::is_same_v<T, bool>) return py::bool_(v);
    else if constexpr (std::is_integral_v<T>) return py::int_(static_cast<int64_t>(v));
    else return py::float_(static_cast<double>(convert<double>(v)));
  });
}

}  // namespace

// ---------------------------------------------------------------------------- public helpers

namespace {

PyTypeObject* tensor_type = nullptr;  // opforge.Tensor, set by bind_runtime

// The shared_ptr inside an opforge.Tensor object (of the class or a subclass), without a type
// lookup. Such objects are made only with a tensor inside (bind_runtime refuses Tensor.__new__);
// the check costs a branch and keeps a reader of a missing holder from ever crashing.
const TensorPtr& holder_of(PyObject* obj, const char* op, const char* arg) {
  auto* inst = reinterpret_cast<py::detail::instance*>(obj);
  const py::detail::value_and_holder v_h = inst->get_value_and_holder();
  if (!v_h.holder_constructed() || !v_h.holder<TensorPtr>()) {
    fail<TypeError>(op, "input '", arg, "' is an opforge.Tensor object holding no tensor");
  }
  return v_h.holder<TensorPtr>();
}

}  // namespace

namespace {

// to_tensor's work; ``numbers``: the caller takes Python numbers too (an op's inputs), which its
// error message then names
TensorPtr to_tensor_of(py::handle obj, const char* op, const char* arg, bool numbers) {
  if (py::isinstance<Tensor>(obj)) return holder_of(obj.ptr(), op, arg);
  if (obj.is_none()) fail<TypeError>(op, "input '", arg, "' must be a tensor, got None");
  if (PyArray_CheckExact(obj.ptr())) {
    if (TensorPtr t = from_ndarray(obj.ptr(), op, arg)) return t;
  }
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, op, arg);
  if (PyCapsule_CheckExact(obj.ptr())) return from_capsule(obj, op, arg);
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack_obj(obj, op, arg);
  fail<TypeError>(op, "input '", arg, "' must be a tensor, NumPy array, DLPack producer or capsule",
                  numbers ? ", or Python scalar" : "", ", got ", type_name(obj));
}

}  // namespace

TensorPtr to_tensor(py::handle obj, const char* op, const char* arg) { return to_tensor_of(obj, op, arg, false); }

void InputConverter::add(py::handle obj) {
  const size_t i = n_++;
  const ArgInfo& arg = info_.inputs[i];
  PyObject* p = obj.ptr();
  if (Py_TYPE(p) == tensor_type) {
    tensors_[i] = holder_of(p, info_.name, arg.name);
    elements_ += tensors_[i]->numel();
    return;
  }
  if (obj.is_none() && arg.optional) return;
  if (PyBool_Check(p)) {
    pending_[n_pending_++] = {i, 0.0, p == Py_True ? 1 : 0, 'b'};
  } else if (PyLong_Check(p)) {
    pending_[n_pending_++] = {i, 0.0, checked_int(info_.name, arg.name, p), 'i'};
  } else if (PyFloat_Check(p) && !PyArray_IsScalar(p, Generic)) {
    // (np.float64 subclasses float, but a NumPy scalar keeps its dtype: a 0-d array, below)
    pending_[n_pending_++] = {i, PyFloat_AS_DOUBLE(p), 0, 'f'};
  } else {
    if (PyArray_CheckExact(p)) {  // (before to_tensor's other checks: the common case after Tensor)
      if ((tensors_[i] = from_ndarray(p, info_.name, arg.name))) {
        wrapped_ |= 1u << i;
        elements_ += tensors_[i]->numel();
        return;
      }
    }
    tensors_[i] = to_tensor_of(obj, info_.name, arg.name, true);
    elements_ += tensors_[i]->numel();
  }
}

InputConverter::~InputConverter() {
  for (size_t i = 0; wrapped_ != 0; ++i, wrapped_ >>= 1) {
    if (wrapped_ & 1u) recycle_wrapper(tensors_[i]);
  }
}

namespace {

// A Python int as int64_t: ValueError naming op (and input arg, where given) past int64's range.
int64_t checked_int(const char* op, const char* arg, PyObject* p) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
  if (overflow) {
    fail<ValueError>(op, arg ? "input '" : "", arg ? arg : "", arg ? "': " : "", "the Python int is out of range for int64");
  }
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

bool int_fits(DType d, int64_t v) {
  switch (d) {
    case DType::Bool: return v == 0 || v == 1;
    case DType::UInt8: return v >= 0 && v <= 255;
    case DType::Int8: return v >= -128 && v <= 127;
    case DType::Int16: return v >= -32768 && v <= 32767;
    case DType::Int32: return v >= INT32_MIN && v <= INT32_MAX;
    default: return true;
  }
}

}  // namespace

void InputConverter::finish(SharedNumbers* shared) {
  static const auto rank = [](char kind) { return kind == 'f' ? 2 : kind == 'i' ? 1 : 0; };
  if (n_pending_ == 0) return;
  // numbers go to the call's device (its first tensor's, as check_call takes it), as torch's and
  // JAX's scalars do: `ops.mul(cuda_tensor, 2.0)`
  Device device;
  for (size_t j = 0; j < n_; ++j) {
    if (tensors_[j]) {
      device = tensors_[j]->device();
      break;
    }
  }
  for (size_t k = 0; k < n_pending_; ++k) {
    const Pending& p = pending_[k];
    const ArgInfo& arg = info_.inputs[p.index];
    DType dtype;
    int bound_by = -1;
    if (arg.typevar < 0) {
      dtype = arg.dtype;
    } else {
      // the dtype of a tensor input of the same type variable; with none, the widest scalar's
      // default dtype (float -> float32, int -> int64, bool -> bool), whatever the order
      char widest = p.kind;
      for (size_t j = 0; j < n_ && bound_by < 0; ++j) {
        if (tensors_[j] && info_.inputs[j].typevar == arg.typevar) bound_by = static_cast<int>(j);
      }
      for (size_t m = 0; m < n_pending_; ++m) {
        const Pending& q = pending_[m];
        if (info_.inputs[q.index].typevar == arg.typevar && rank(q.kind) > rank(widest)) widest = q.kind;
      }
      dtype = bound_by >= 0 ? tensors_[static_cast<size_t>(bound_by)]->dtype()
              : widest == 'f' ? DType::Float32 : widest == 'i' ? DType::Int64 : DType::Bool;
    }
    const bool share = shared && (shared->inputs >> p.index & 1u);
    if (share) {
      const auto hit = std::find_if(shared->made.begin(), shared->made.end(), [&](const SharedNumbers::Entry& m) {
        return m.index == p.index && m.dtype == dtype && m.device == device;
      });
      if (hit != shared->made.end()) {
        tensors_[p.index] = hit->tensor;
        continue;
      }
    }
    TensorPtr t = number_tensor(info_.name, arg.name, p.kind, p.fvalue, p.ivalue, dtype,
                                bound_by < 0 ? nullptr : info_.inputs[static_cast<size_t>(bound_by)].name);
    if (device.type != DeviceType::CPU) {
      TensorPtr on = empty(dtype, {}, Format::Default, device);
      fill_on_device(info_.name, *on, *t);
      t = std::move(on);
    }
    if (share) shared->made.push_back({p.index, dtype, device, t});
    tensors_[p.index] = std::move(t);
  }
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

namespace {

const char* param_name(const OpInfo& info, size_t i) {
  return i < info.inputs.size() ? info.inputs[i].name : info.attrs[i - info.inputs.size()].name;
}

std::string signature(const OpInfo& info) {
  std::string s = std::string(info.name) + "(";
  for (size_t i = 0, n = info.inputs.size() + info.attrs.size(); i < n; ++i) {
    s += std::string(i ? ", " : "") + param_name(info, i);
  }
  return s + ")";
}

}  // namespace

// The Python exception for an opforge error: TypeError, ValueError, IndexError, MemoryError or
// RuntimeError.
void set_error(const Error& e) {
  PyObject* type = dynamic_cast<const TypeError*>(&e)     ? PyExc_TypeError
                   : dynamic_cast<const ValueError*>(&e)  ? PyExc_ValueError
                   : dynamic_cast<const IndexError*>(&e)  ? PyExc_IndexError
                   : dynamic_cast<const MemoryError*>(&e) ? PyExc_MemoryError
                                                          : PyExc_RuntimeError;
  PyErr_SetString(type, e.what());
}

namespace {

void set_python_error() {
  try {
    throw;
  } catch (abi::__forced_unwind&) {
    throw;  // (a thread ended by pthread_exit: its unwind goes on)
  } catch (const Error& e) {
    set_error(e);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, "opforge: out of memory");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "opforge: unknown C++ exception");
  }
}

enum class AttrKind : uint8_t { Bool, Int, Float, Str, IntList, FloatList };

AttrKind attr_kind(const OpInfo& info, const AttrInfo& a) {
  static const std::pair<std::string_view, AttrKind> kinds[] = {
      {"bool", AttrKind::Bool}, {"int", AttrKind::Int}, {"float", AttrKind::Float},
      {"str", AttrKind::Str}, {"list[int]", AttrKind::IntList}, {"list[float]", AttrKind::FloatList}};
  for (const auto& [type, kind] : kinds) {
    if (a.type == type) return kind;
  }
  fail<RuntimeError>(info.name, "attr '", a.name, "' has a type the Python binding does not know: ", a.type);
}

// One op's Python function, or its meta rule: the entry and what binding its arguments needs.
struct OpCaller {
  const binding::OpEntry* entry;
  std::vector<py::object> defaults;  // per parameter (inputs, then attrs); null object: required
  std::vector<AttrKind> kinds;       // per attr
  std::vector<char> nullable;        // per attr: an optional attr (None allowed)
  bool meta;
  int inplace = -1;                  // the in-place variant (add_): the input it writes into
};

AttrValue convert_attr(const OpInfo& info, const OpCaller& c, size_t k, py::handle v) {
  if (c.nullable[k] && v.is_none()) return {};
  const char* name = info.attrs[k].name;
  switch (c.kinds[k]) {
    case AttrKind::Bool: return attr_bool(info.name, name, v);
    case AttrKind::Int: return attr_int(info.name, name, v);
    case AttrKind::Float: return attr_float(info.name, name, v);
    case AttrKind::Str: return attr_str(info.name, name, v);
    case AttrKind::IntList: return attr_int_list(info.name, name, v);
    case AttrKind::FloatList: return attr_float_list(info.name, name, v);
  }
  return {};
}

// Room for up to N values of T on the stack, of which the first n are constructed (and destroyed):
// a call pays for the attrs and outputs its op has, not for the most any op may have.
template <typename T, size_t N>
class Slots {
 public:
  Slots() : n_(0) {}
  explicit Slots(size_t n) : n_(n) {
    for (size_t i = 0; i < n_; ++i) new (&data()[i]) T();
  }
  void push(T&& v) {  // (counted once constructed: an exception leaves only constructed values)
    new (&data()[n_]) T(std::move(v));
    ++n_;
  }
  ~Slots() {
    for (size_t i = 0; i < n_; ++i) data()[i].~T();
  }
  Slots(const Slots&) = delete;
  Slots& operator=(const Slots&) = delete;
  T* data() { return std::launder(reinterpret_cast<T*>(buf_)); }
  T& operator[](size_t i) { return data()[i]; }

 private:
  alignas(T) unsigned char buf_[N * sizeof(T)];
  size_t n_;
};

// ---- out= and in-place variants
//
// A call with out= (or an in-place variant, whose out is its first input) writes its results into
// existing tensors. Their dtypes, shapes and devices are checked against the op's meta rule before
// anything runs, so a bad call leaves them untouched. Without autograd to record, each out tensor
// that is contiguous and safe to write while the op reads its inputs is offered to the op's
// allocations (BufferOfferScope): the kernel then writes it directly; otherwise, or when an
// intermediate took it, the result is copied in. Every written tensor's version is bumped, so a
// tensor saved for backward and then overwritten makes that backward fail (autograd.cpp).

// The tensors out= names: one per output (a tensor, or a tuple or list of them).
void out_tensors(const OpInfo& info, py::handle out, TensorPtr* outs) {
  const size_t n = info.outputs.size();
  if (py::isinstance<Tensor>(out)) {
    if (n != 1) fail<TypeError>(info.name, "out= needs a tuple of ", n, " tensors, one per output; got one tensor");
    outs[0] = holder_of(out.ptr(), info.name, "out");
    return;
  }
  if (!PyTuple_Check(out.ptr()) && !PyList_Check(out.ptr())) {
    fail<TypeError>(info.name, "out= must be an opforge.Tensor", n > 1 ? " or a tuple of them" : "", ", got ",
                    type_name(out));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(out);
  if (seq.size() != n) fail<TypeError>(info.name, "out= needs ", n, " tensors, one per output; got ", seq.size());
  for (size_t j = 0; j < n; ++j) {
    py::handle t = seq[j];
    if (!py::isinstance<Tensor>(t)) fail<TypeError>(info.name, "out[", j, "] must be an opforge.Tensor, got ", type_name(t));
    outs[j] = holder_of(t.ptr(), info.name, "out");
  }
}

// Whether the kernel may write out's memory while it reads the inputs: no input's memory overlaps
// it, or the op is elementwise (one fused loop, each element read before it is written) and the
// input is exactly out (same first element, shape and strides). By the memory the tensors span, not
// by their Storage: each wrapping of one NumPy array (or DLPack capsule) is a Storage of its own.
bool safe_to_write_in_kernel(const OpInfo& info, const TensorPtr* inputs, const Tensor& out) {
  const bool elementwise = std::string_view(info.impl) == "expr";
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    const Tensor* t = inputs[i].get();
    if (t == nullptr || !overlap(*t, out)) continue;
    if (!(elementwise && t->raw_data() == out.raw_data() && t->shape() == out.shape() &&
          t->strides() == out.strides())) {
      return false;
    }
  }
  return true;
}

// Checks out tensor j against the result the op will give (meta) before anything runs.
void check_out(const OpInfo& info, const char* name, size_t j, const Tensor& out, const TensorMeta& m,
               const char* what) {
  if (out.storage()->readonly) fail<ValueError>(name, what, " is read-only (it wraps read-only memory)");
  if (out.dtype() != m.dtype || out.shape() != m.shape) {
    fail<ValueError>(name, what, " is ", dtype_name(out.dtype()), " of shape ", shape_str(out.shape()),
                     ", but output '", info.outputs[j].name, "' is ", dtype_name(m.dtype), " of shape ",
                     shape_str(m.shape));
  }
  if (out.device() != m.device) {
    fail<TypeError>(name, what, " is on ", out.device().str(), ", but the result is on ", m.device.str());
  }
  check_writable(name, what, out);
}

// The checks of a call writing its results into outs, before anything runs (run_into's; foreach
// runs them for every position before the first runs): each out tensor against the result (meta),
// out tensors whose memory overlaps, forward-mode tangents, and out= while gradients are recorded.
// Returns whether the call records gradients (an in-place variant's may).
bool check_into(const OpCaller& c, const TensorPtr* inputs, const std::vector<TensorMeta>& metas,
                const TensorPtr* outs) {
  const OpInfo& info = *c.entry->info;
  const char* name = c.inplace >= 0 ? info.inplace : info.name;  // (what errors name)
  const size_t n_in = info.inputs.size(), n_out = info.outputs.size();
  const char* what = c.inplace >= 0 ? info.inputs[static_cast<size_t>(c.inplace)].name : "out";
  for (size_t j = 0; j < n_out; ++j) {
    check_out(info, name, j, *outs[j], metas[j], what);
    for (size_t k = 0; k < j; ++k) {
      if (overlap(*outs[k], *outs[j])) {  // (by memory: two wrappings of one array are two Storages)
        fail<ValueError>(name, "out tensors ", k, " and ", j, " share memory: each output needs its own");
      }
    }
  }
  bool any_grad = false;
  for (size_t i = 0; i < n_in; ++i) any_grad = any_grad || (inputs[i] && inputs[i]->requires_grad());
  const bool recording = GradMode::is_enabled() && (any_grad || outs[0]->requires_grad());
  for (size_t i = 0; i < n_in; ++i) {
    if (inputs[i] && inputs[i]->fw_grad()) {
      fail<RuntimeError>(name, c.inplace >= 0 ? "the in-place variant" : "out=",
                         " does not carry forward-mode tangents; call the op without it");
    }
  }
  if (c.inplace < 0 && recording) {
    fail<RuntimeError>(name, "out= does not record gradients, but ", any_grad ? "an input" : "the out tensor",
                       " requires grad (call it under opforge.no_grad(), or without out=)");
  }
  return recording;
}

// Runs the op writing its results into outs (out=, or the in-place variant's input `inplace`).
void run_into(const OpCaller& c, const TensorPtr* given, AttrValue* attrs, TensorPtr* outputs, TensorPtr* outs,
              bool release_gil) {
  const binding::OpEntry& e = *c.entry;
  const OpInfo& info = *e.info;
  const char* name = c.inplace >= 0 ? info.inplace : info.name;  // (what errors name)
  const size_t n_in = info.inputs.size(), n_out = info.outputs.size();
  TensorPtr inputs[kMaxInputs];
  for (size_t i = 0; i < n_in; ++i) inputs[i] = given[i];
  std::vector<AttrValue> attrs_copy(attrs, attrs + info.attrs.size());  // (meta may move them out)
  const std::vector<TensorMeta> metas = e.meta(inputs, attrs_copy.data());
  const char* what = c.inplace >= 0 ? info.inputs[static_cast<size_t>(c.inplace)].name : "out";
  const bool recording = check_into(c, inputs, metas, outs);
  for (size_t j = 0; j < n_out; ++j) note_device_use(*outs[j]);  // (a graph being captured keeps what its work writes)
  if (c.inplace >= 0 && recording) {
    // PyTorch's rules: a leaf that requires grad cannot change under autograd; any other tensor
    // takes the op's history. Its old value goes to the op as a copy that keeps its history (the
    // op may save it for backward), and the result is copied into it.
    TensorPtr& x = inputs[static_cast<size_t>(c.inplace)];
    if (x->requires_grad() && x->is_leaf()) {
      fail<RuntimeError>(name, "'", what, "' is a leaf tensor that requires grad: it cannot be modified in "
                         "place while gradients are recorded (use opforge.no_grad(), or the out-of-place op)");
    }
    if (x->storage().use_count() > 1) {
      fail<RuntimeError>(name, "'", what, "' shares its memory with another tensor (a view of it, or a tensor "
                         "saved for backward): in place, that one's gradient would be wrong; use the out-of-place op");
    }
    TensorPtr old = empty(x->dtype(), x->shape(), x->format(), x->device());
    copy_into(old, x);
    if (Edge h = x->history(); h.fn) old->set_history(std::move(h.fn), h.input_nr);
    TensorPtr target = x;
    x = std::move(old);
    e.call(inputs, attrs, outputs);
    if (target->requires_grad() && !outputs[0]->requires_grad()) {
      fail<RuntimeError>(name, "the result carries no gradient of '", what, "', which requires grad");
    }
    copy_into(target, outputs[0]);
    target->mark_written();
    if (Edge h = outputs[0]->history(); h.fn) target->set_history(std::move(h.fn), h.input_nr);
    return;
  }
  std::vector<BufferOffer> offers;
  for (size_t j = 0; j < n_out; ++j) {
    const Tensor& o = *outs[j];
    if (o.is_contiguous() && safe_to_write_in_kernel(info, inputs, o)) {
      offers.push_back(BufferOffer{o.raw_data(), o.dtype(), o.shape(), o.device()});
    }
  }
  {
    BufferOfferScope scope(&offers);
    if (release_gil) {
      ReleaseGil nogil;
      e.call(inputs, attrs, outputs);
    } else {
      e.call(inputs, attrs, outputs);
    }
  }
  for (size_t j = 0; j < n_out; ++j) {
    if (outputs[j]->raw_data() != outs[j]->raw_data()) copy_into(outs[j], outputs[j]);
    outs[j]->mark_written();
  }
}

// Converts the bound parameters and runs the op (or its meta rule).
// (shared: a foreach call's numbers, InputConverter::finish)
py::object run(const OpCaller& c, const py::handle* params, py::handle out = py::handle(),
               SharedNumbers* shared = nullptr) {
  const binding::OpEntry& e = *c.entry;
  const OpInfo& info = *e.info;
  const size_t n_in = info.inputs.size();
  InputConverter in(info);
  for (size_t i = 0; i < n_in; ++i) in.add(params[i]);
  in.finish(shared);
  Slots<AttrValue, kMaxParams> attrs;
  for (size_t k = 0; k < info.attrs.size(); ++k) attrs.push(convert_attr(info, c, k, params[n_in + k]));
  const TensorPtr* inputs = &in[0];
  if (c.meta) return metas(e.meta(inputs, attrs.data()));
  const size_t n_out = info.outputs.size();
  Slots<TensorPtr, kMaxParams> outputs(n_out);
  if (out || c.inplace >= 0) {
    TensorPtr outs[kMaxParams];
    if (c.inplace >= 0) {
      const py::handle x = params[c.inplace];
      if (!py::isinstance<Tensor>(x)) {
        fail<TypeError>(info.inplace, "writes into '", info.inputs[static_cast<size_t>(c.inplace)].name,
                        "', which must be an opforge.Tensor, got ", type_name(x));
      }
      outs[0] = inputs[c.inplace];
    } else {
      out_tensors(info, out, outs);
    }
    run_into(c, inputs, attrs.data(), outputs.data(), outs, in.release_gil());
    if (c.inplace >= 0) return py::reinterpret_borrow<py::object>(params[c.inplace]);
    return py::reinterpret_borrow<py::object>(out);
  }
  if (in.release_gil()) {
    ReleaseGil nogil;
    e.call(inputs, attrs.data(), outputs.data());
  } else {
    e.call(inputs, attrs.data(), outputs.data());
  }
  if (n_out == 1) return wrap(std::move(outputs[0]));
  py::tuple results(n_out);
  for (size_t i = 0; i < n_out; ++i) results[i] = wrap(std::move(outputs[i]));
  return std::move(results);
}

// METH_FASTCALL entry of every op: binds positional and keyword arguments to parameter slots.
PyObject* call_op(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PythonScope scope;  // (reading the arguments, a pyfunc kernel and freeing may run Python code)
  auto* caller = static_cast<OpCaller*>(PyCapsule_GetPointer(self, "opforge.OpCaller"));
  const OpInfo& info = *caller->entry->info;
  const size_t n = info.inputs.size() + info.attrs.size();
  try {
    py::handle bound[kMaxParams];
    if (static_cast<size_t>(nargs) > n) {
      fail<TypeError>(info.name, "takes at most ", n, " arguments ", signature(info), ", got ", nargs);
    }
    for (Py_ssize_t i = 0; i < nargs; ++i) bound[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    py::handle out;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      size_t i = 0;
      while (i < n && PyUnicode_CompareWithASCIIString(key, param_name(info, i)) != 0) ++i;
      // out= (no parameter is named out: codegen refuses it), looked for only after the parameters
      if (i == n && !caller->meta && caller->inplace < 0 && PyUnicode_CompareWithASCIIString(key, "out") == 0) {
        if (args[nargs + k] != Py_None) out = args[nargs + k];
        continue;
      }
      const std::string name = i < n ? std::string() : py::str(key).cast<std::string>();
      if (i == n) {
        std::string best;
        size_t best_d = 3;
        for (size_t j = 0; j < n; ++j) {
          const size_t d = edit_distance(name, param_name(info, j));
          if (d < best_d) {
            best_d = d;
            best = param_name(info, j);
          }
        }
        fail<TypeError>(info.name, "unexpected keyword '", name, "'",
                        best.empty() ? std::string() : " (did you mean '" + best + "'?)",
                        "; signature: ", signature(info));
      }
      if (bound[i]) fail<TypeError>(info.name, "got multiple values for '", param_name(info, i), "'");
      bound[i] = args[nargs + k];
    }
    for (size_t i = 0; i < n; ++i) {
      if (bound[i]) continue;
      if (!caller->defaults[i]) {
        fail<TypeError>(info.name, "missing required ", i < info.inputs.size() ? "input" : "attr", " '",
                        param_name(info, i), "'; signature: ", signature(info));
      }
      bound[i] = caller->defaults[i];
    }
    return run(*caller, bound, out).release().ptr();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// ---- foreach: one call running an op over lists of tensors
//
// opforge.foreach(op, *inputs, out=..., **attrs) for an op whose spec says `foreach: true`: each
// input is a list (or tuple) of L values, or one value that every position shares; attrs are one
// value each; out= is a list of L tensors (one output) or one such list per output. Position i runs
// the op's own call path (its checks, out= rules and kernel) on the i-th values; the lists are
// checked against each other before anything runs, so a mismatch writes nothing.
py::object foreach_call(py::handle fn, py::tuple args, py::dict kwargs, bool check_only = false) {
  const OpCaller* caller = nullptr;
  if (PyCFunction_Check(fn.ptr()) && PyCFunction_GET_FUNCTION(fn.ptr()) ==
      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op))) {
    PyObject* self = PyCFunction_GET_SELF(fn.ptr());
    if (self != nullptr && PyCapsule_IsValid(self, "opforge.OpCaller")) {
      caller = static_cast<const OpCaller*>(PyCapsule_GetPointer(self, "opforge.OpCaller"));
    }
  }
  if (caller == nullptr || caller->meta || caller->inplace >= 0) {
    fail<TypeError>("foreach", "takes an op function (opforge.ops.<op>), got ", type_name(fn));
  }
  const OpInfo& info = *caller->entry->info;
  if (!info.foreach) {
    fail<TypeError>(info.name, "has no foreach form: its spec does not declare `foreach: true`");
  }
  const size_t n_in = info.inputs.size(), n = n_in + info.attrs.size(), n_out = info.outputs.size();
  if (args.size() > n) fail<TypeError>(info.name, "takes at most ", n, " arguments ", signature(info), ", got ", args.size());
  py::handle bound[kMaxParams];
  for (size_t i = 0; i < args.size(); ++i) bound[i] = args[i];
  py::handle out;
  for (const auto& item : kwargs) {
    const std::string key = py::str(item.first);
    size_t i = 0;
    while (i < n && key != param_name(info, i)) ++i;
    if (i == n && key == "out") {
      if (!item.second.is_none()) out = item.second;
      continue;
    }
    if (i == n) fail<TypeError>(info.name, "unexpected keyword '", key, "'; signature: ", signature(info));
    if (bound[i]) fail<TypeError>(info.name, "got multiple values for '", key, "'");
    bound[i] = item.second;
  }
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    if (!caller->defaults[i]) {
      fail<TypeError>(info.name, "missing required ", i < n_in ? "input" : "attr", " '", param_name(info, i),
                      "'; signature: ", signature(info));
    }
    bound[i] = caller->defaults[i];
  }
  // the lists' common length, and which inputs are lists
  const auto is_seq = [](py::handle h) { return PyList_Check(h.ptr()) || PyTuple_Check(h.ptr()); };
  bool listed[kMaxInputs] = {};
  size_t length = 0;
  const char* first = nullptr;
  for (size_t k = 0; k < n_in; ++k) {
    if (!is_seq(bound[k])) continue;
    listed[k] = true;
    const size_t len = static_cast<size_t>(PySequence_Size(bound[k].ptr()));
    if (first == nullptr) {
      length = len;
      first = info.inputs[k].name;
    } else if (len != length) {
      fail<ValueError>(info.name, "foreach: input '", info.inputs[k].name, "' has ", len, " values, '", first, "' has ",
                       length);
    }
  }
  if (first == nullptr) fail<TypeError>(info.name, "foreach: give at least one input as a list of tensors");
  std::vector<py::object> outs;  // one list of `length` tensors per output
  if (out) {
    if (!is_seq(out)) fail<TypeError>(info.name, "foreach: out= must be a list of tensors", n_out > 1 ? " per output" : "");
    if (n_out > 1) {
      if (static_cast<size_t>(PySequence_Size(out.ptr())) != n_out) {
        fail<TypeError>(info.name, "foreach: out= needs ", n_out, " lists, one per output; got ", PySequence_Size(out.ptr()));
      }
      for (size_t j = 0; j < n_out; ++j) outs.push_back(py::reinterpret_borrow<py::sequence>(out)[j]);
    } else {
      outs.push_back(py::reinterpret_borrow<py::object>(out));
    }
    for (size_t j = 0; j < n_out; ++j) {
      if (!is_seq(outs[j]) || static_cast<size_t>(PySequence_Size(outs[j].ptr())) != length) {
        fail<ValueError>(info.name, "foreach: out list ", j, " must hold ", length, " tensors, like input '", first, "'");
      }
    }
  }
  SharedNumbers shared;  // (an input given as one Python number: its tensor made once per dtype and device)
  for (size_t k = 0; k < n_in; ++k) {
    const PyObject* p = bound[k].ptr();
    if (!listed[k] && (PyBool_Check(p) || PyLong_Check(p) || PyFloat_Check(p))) shared.inputs |= 1u << k;
  }
  std::vector<py::object> held(n_in);  // (the i-th items, kept alive for the call)
  py::handle params[kMaxParams];
  const auto position = [&](size_t i) {
    for (size_t k = 0; k < n; ++k) params[k] = bound[k];
    for (size_t k = 0; k < n_in; ++k) {
      if (!listed[k]) continue;
      held[k] = py::reinterpret_borrow<py::sequence>(bound[k])[i];
      params[k] = held[k];
    }
  };
  const auto out_at = [&](size_t i, size_t j) { return py::reinterpret_borrow<py::sequence>(outs[j])[i]; };
  // every position's inputs and attrs through the op's meta rule, and its out tensors checked as
  // the call will check them (against the results, shared memory, gradients, tangents), before any
  // position runs: a bad position leaves every tensor as it was
  const binding::OpEntry& e = *caller->entry;
  for (size_t i = 0; i < length; ++i) {
    position(i);
    InputConverter in(info);
    for (size_t k = 0; k < n_in; ++k) in.add(params[k]);
    in.finish(&shared);
    Slots<AttrValue, kMaxParams> attrs;
    for (size_t k = 0; k < info.attrs.size(); ++k) attrs.push(convert_attr(info, *caller, k, params[n_in + k]));
    const std::vector<TensorMeta> metas = e.meta(&in[0], attrs.data());
    if (outs.empty()) continue;
    TensorPtr out_i[kMaxParams];
    for (size_t j = 0; j < outs.size(); ++j) {
      const py::object t = out_at(i, j);
      if (!py::isinstance<Tensor>(t)) fail<TypeError>(info.name, "foreach: out list ", j, " holds a ", type_name(t), " at ", i);
      out_i[j] = holder_of(t.ptr(), info.name, "out");
    }
    (void)check_into(*caller, &in[0], metas, out_i);
  }
  if (check_only) return py::none();
  py::list results;
  for (size_t i = 0; i < length; ++i) {
    position(i);
    py::object out_i;
    if (out) {
      if (n_out == 1) {
        out_i = out_at(i, 0);
      } else {
        py::tuple t(n_out);
        for (size_t j = 0; j < n_out; ++j) t[j] = out_at(i, j);
        out_i = std::move(t);
      }
    }
    results.append(run(*caller, params, out_i, &shared));
  }
  return std::move(results);
}

// Adds caller's function to m (the caller lives as long as the process: module functions are
// never unloaded).
void def_function(py::module_& m, const char* name, const char* doc, OpCaller* caller) {
  auto* def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op)),
                              METH_FASTCALL | METH_KEYWORDS, doc};
  py::capsule self(caller, "opforge.OpCaller");
  py::object fn = py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, self.ptr(), m.attr("__name__").ptr()));
  if (!fn) throw py::error_already_set();
  m.attr(name) = fn;
}

py::object to_python(const AttrValue& v) {
  return std::visit([](const auto& x) -> py::object {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<X, std::monostate>) return py::none();
    else if constexpr (std::is_same_v<X, std::vector<int64_t>> || std::is_same_v<X, std::vector<double>>) {
      py::list out;
      for (auto item : x) out.append(py::cast(item));
      return std::move(out);
    } else return py::cast(x);
  }, v);
}

}  // namespace

}  // namespace opforge::python

extern "C" const opforge::binding::OpEntry* opforge_op_entry(void* fn) {
  auto* obj = static_cast<PyObject*>(fn);
  if (obj == nullptr || !PyCFunction_Check(obj) || PyCFunction_GET_FUNCTION(obj) !=
      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&opforge::python::call_op))) {
    return nullptr;
  }
  PyObject* self = PyCFunction_GET_SELF(obj);
  if (self == nullptr || !PyCapsule_IsValid(self, "opforge.OpCaller")) return nullptr;
  const auto* caller = static_cast<const opforge::python::OpCaller*>(PyCapsule_GetPointer(self, "opforge.OpCaller"));
  return caller->meta || caller->inplace >= 0 ? nullptr : caller->entry;
}

namespace opforge::python {

void def_op(py::module_& m, py::module_& meta, const binding::OpEntry& entry) {
  const OpInfo& info = *entry.info;
  if (info.inputs.size() > kMaxInputs || info.inputs.size() + info.attrs.size() > kMaxParams ||
      info.outputs.size() > kMaxParams) {
    fail<RuntimeError>(info.name, "has more parameters than the Python binding supports");
  }
  if (entry.defaults.size() != info.attrs.size()) {
    fail<RuntimeError>(info.name, "its entry has ", entry.defaults.size(), " attr defaults for ", info.attrs.size(), " attrs");
  }
  auto* caller = new OpCaller{&entry, {}, {}, {}, false};
  for (const ArgInfo& a : info.inputs) caller->defaults.push_back(a.optional ? py::none() : py::object());
  for (size_t k = 0; k < info.attrs.size(); ++k) {
    const auto& d = entry.defaults[k];
    caller->defaults.push_back(d ? to_python(*d) : py::object());
    caller->kinds.push_back(attr_kind(info, info.attrs[k]));
    caller->nullable.push_back(d && std::holds_alternative<std::monostate>(*d));
  }
  auto* meta_caller = new OpCaller{*caller};
  meta_caller->meta = true;
  def_function(m, info.name, entry.doc, caller);
  def_function(meta, info.name, entry.doc, meta_caller);
  if (info.inplace[0] != '\0') {
    auto* inplace_caller = new OpCaller{*caller};
    inplace_caller->inplace = 0;
    def_function(m, info.inplace, entry.doc, inplace_caller);
  }
}

bool attr_bool(const char* op, const char* name, py::handle v) {
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True;
  if (py::hasattr(v, "dtype") && py::hasattr(v, "item") && py::str(v.attr("dtype")).cast<std::string>() == "bool") {
    return v.attr("item")().cast<bool>();
  }
  fail<TypeError>(op, "attr '", name, "' must be a bool, got ", type_name(v));
}

int64_t attr_int(const char* op, const char* name, py::handle v) {
  PyObject* p = v.ptr();
  if (!PyBool_Check(p) && PyIndex_Check(p)) {
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(p));  // ints, NumPy integers
    if (index) {
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow) fail<ValueError>(op, "attr '", name, "' is out of range for int64");
      return x;
    }
    PyErr_Clear();
  }
  fail<TypeError>(op, "attr '", name, "' must be an int, got ", type_name(v));
}

double attr_float(const char* op, const char* name, py::handle v) {
  PyObject* p = v.ptr();
  if (PyFloat_Check(p)) return PyFloat_AS_DOUBLE(p);
  if (!PyBool_Check(p) && PyLong_Check(p)) {
    const double x = PyLong_AsDouble(p);
    if (x == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      fail<ValueError>(op, "attr '", name, "' is out of range for float");
    }
    return x;
  }
  // NumPy scalars (np.float32(0.1), np.int64(2)); not arrays, tensors or bools
  const std::string type = type_name(v);
  py::module_ np = py::module_::import("numpy");
  if (py::isinstance(v, np.attr("generic")) && !py::isinstance(v, np.attr("bool_"))) {
    const double x = PyFloat_AsDouble(p);
    if (!(x == -1.0 && PyErr_Occurred())) return x;
    PyErr_Clear();
  }
  fail<TypeError>(op, "attr '", name, "' must be a float, got ", type);
}

std::string attr_str(const char* op, const char* name, py::handle v) {
  if (!py::isinstance<py::str>(v)) fail<TypeError>(op, "attr '", name, "' must be a str, got ", type_name(v));
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
  if (!s) {  // (a lone surrogate: no UTF-8 for it)
    PyErr_Clear();
    fail<ValueError>(op, "attr '", name, "' must be a str of Unicode characters (it has a lone surrogate)");
  }
  std::string out(s, static_cast<size_t>(n));
  if (out.find('\0') != std::string::npos) {  // (messages and C APIs would cut it there)
    fail<ValueError>(op, "attr '", name, "' must not contain a NUL character");
  }
  return out;
}

std::vector<int64_t> attr_int_list(const char* op, const char* name, py::handle v) {
  if (!PyBool_Check(v.ptr()) && (PyLong_Check(v.ptr()) ||
                                 py::isinstance(v, py::module_::import("numpy").attr("integer")))) {
    return {attr_int(op, name, v)};
  }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<int64_t> out;
    for (py::handle x : v) {
      if (PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr())) {
        fail<TypeError>(op, "attr '", name, "' must be an int or a list of ints, got an item of type ", type_name(x));
      }
      out.push_back(attr_int(op, name, x));
    }
    return out;
  }
  fail<TypeError>(op, "attr '", name, "' must be an int or a list of ints, got ", type_name(v));
}

std::vector<double> attr_float_list(const char* op, const char* name, py::handle v) {
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<double> out;
    for (py::handle x : v) out.push_back(attr_float(op, name, x));
    return out;
  }
  return {attr_float(op, name, v)};
}

py::object wrap(TensorPtr t) { return py::cast(std::move(t)); }

py::object metas(const std::vector<TensorMeta>& ms) {
  py::list out(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    py::tuple shape(ms[i].shape.size());
    for (size_t d = 0; d < ms[i].shape.size(); ++d) shape[d] = py::int_(ms[i].shape[d]);
    out[i] = py::make_tuple(std::move(shape), py::str(dtype_name(ms[i].dtype)));
  }
  return std::move(out);
}

// ---------------------------------------------------------------------------- op_info

namespace {

py::list target_info(const OpInfo& op) {
  py::list out;
  for (const auto& target : op.targets) {
    py::dict d;
    d["op_name"] = op.name;
    d["imply_type"] = op.impl;
    py::list inputs, outputs, attrs, dtype_format;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      py::dict a;
      a["index"] = i;
      a["name"] = op.inputs[i].name;
      a["param_type"] = op.inputs[i].optional ? "optional" : "required";
      inputs.append(a);
    }
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      py::dict a;
      a["index"] = i;
      a["name"] = op.outputs[i].name;
      a["param_type"] = "required";
      outputs.append(a);
    }
    for (const auto& at : op.attrs) {
      py::dict a;
      a["name"] = at.name;
      a["param_type"] = at.required ? "required" : "optional";
      a["value_type"] = at.type;
      if (!at.required) a["default_value"] = at.default_repr;
      attrs.append(a);
    }
    for (const auto& row : target.rows) {
      py::list cols;
      auto col = [&](const ArgInfo& a) {
        const DType d = a.typevar < 0 ? a.dtype : row.vars[static_cast<size_t>(a.typevar)];
        cols.append(py::make_tuple(dtype_name(d), format_name(row.format)));
      };
      for (const auto& a : op.inputs) col(a);
      for (const auto& a : op.outputs) col(a);
      dtype_format.append(py::tuple(cols));
    }
    d["inputs"] = inputs;
    d["outputs"] = outputs;
    d["attr"] = attrs;
    d["dtype_format"] = dtype_format;
    d["target"] = target.mindspore_target;
    out.append(d);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------- module

namespace {

constexpr const char* kNoTensorNew =
    "opforge.Tensor objects are made by opforge.tensor(), opforge.from_numpy(), opforge.from_dlpack() and the "
    "ops, not by Tensor() or Tensor.__new__()";

// What Tensor.backward(create_graph=True) warns, as PyTorch does: the leaves' .grad then hold a
// graph whose AccumulateGrad nodes (and saved tensors) hold the leaves: a cycle of shared_ptrs
// that nothing collects.
constexpr const char* kCreateGraphCycle =
    "[backward] backward(create_graph=True) makes each leaf's .grad hold a graph that refers back to the "
    "leaf: a reference cycle that keeps both alive (a memory leak) until .grad is reset to None; "
    "opforge.gradients(..., create_graph=True) gives the same gradients without touching .grad";

}  // namespace

// Makes a bound type immutable (no attribute set on it, no __class__ assignment to or from it).
// Tensor and _Graph have the same instance size, so CPython would let `t.__class__ = _Graph` (or
// the reverse) through on mutable types, and each would then read the other's holder as its own.
static void seal_type(PyObject* type) {
  auto* t = reinterpret_cast<PyTypeObject*>(type);
  t->tp_flags |= Py_TPFLAGS_IMMUTABLETYPE;
  PyType_Modified(t);
}

void bind_runtime(py::module_& m) {
  if (_import_array() < 0) throw py::error_already_set();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      set_error(e);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError, "opforge: out of memory");
    }
  });

  py::class_<Tensor, TensorPtr> cls(m, "Tensor", py::buffer_protocol(), R"doc(
An n-dimensional array with autograd, sharing memory with NumPy and DLPack producers.

Create one with ``opforge.tensor(data, dtype=None, requires_grad=False)`` (copies) or
``opforge.from_numpy(array)`` / ``opforge.from_dlpack(obj)`` (zero copy).
)doc");
  cls.def_buffer([](Tensor& t) -> py::buffer_info {
    check_on_host("buffer", t);
    const char* fmt = buffer_format(t.dtype());
    if (!fmt) fail<TypeError>("buffer", "the buffer protocol has no ", dtype_name(t.dtype()), " format");
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
    const auto item = static_cast<py::ssize_t>(itemsize(t.dtype()));
    for (int64_t s : t.strides()) strides.push_back(s * item);
    return py::buffer_info(t.raw_data(), item, fmt, t.dim(), shape, strides, t.storage()->readonly);
  });
  cls.def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype", [](const Tensor& t) { return dtype_name(t.dtype()); })
      .def_property_readonly("format", [](const Tensor& t) { return format_name(t.format()); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", [](const Tensor& t) { return t.dim(); })
      .def_property_readonly("size", [](const Tensor& t) { return t.numel(); })
      .def_property_readonly("strides", [](const Tensor& t) { return py::tuple(py::cast(t.strides())); },
                             "Strides in elements.")
      .def_property_readonly("is_leaf", [](const Tensor& t) { return t.is_leaf(); })
      .def_property_readonly("grad_fn", [](const Tensor& t) -> py::object {
        std::shared_ptr<Node> fn = t.grad_fn();
        if (!fn) return py::none();
        return py::str(fn->name());
      }, "The name of the op that produced this tensor, or None for a leaf.")
      .def_property("requires_grad", [](const Tensor& t) { return t.requires_grad(); },
                    [](Tensor& t, py::handle on) {
                      // (pybind11's bool takes None for False: refused, as torch refuses it)
                      if (!PyBool_Check(on.ptr()) && !PyArray_IsScalar(on.ptr(), Bool)) {
                        fail<TypeError>("requires_grad", "must be a bool, got ", type_name(on));
                      }
                      t.set_requires_grad(PyObject_IsTrue(on.ptr()) == 1);
                    })
      .def_property_readonly("_version", [](const Tensor& t) { return t.version(); },
                             "How many times this tensor's memory (shared with its views) was written in place "
                             "(in-place ops, out=): autograd checks it for the tensors it saved, as PyTorch does.")
      .def_property("grad", [](const Tensor& t) { return t.grad(); }, [](Tensor& t, py::object g) { set_grad(t, g); },
                    "The gradient accumulated by backward(), or None. Assigning checks it like PyTorch: "
                    "None, or a tensor (or array) of this tensor's shape and dtype.")
      .def("numpy", [](const TensorPtr& t) { return numpy_view(t); },
           "A NumPy array sharing this tensor's memory (no copy).")
      .def("item", [](const TensorPtr& t) { return item(t); })
      .def("detach", [](const TensorPtr& t) { return detach(t); },
           "The same data without autograd history.")
      .def("copy_", [](const TensorPtr& t, py::handle src) {
        PythonScope scope;
        return copy_from(t, src);
      }, py::arg("src"),
           "Writes src (broadcast to this shape, converted to this dtype, from any device) into this "
           "tensor's memory and returns it (torch's copy_; no gradient is recorded).")
      .def("astype", [](const TensorPtr& t, py::handle d) { return cast(t, parse_dtype(d, "astype")); },
           py::arg("dtype"), "A copy converted to dtype (differentiable).")
      .def("reshape", [](const TensorPtr& t, const Shape& s) { return reshape(t, s); }, py::arg("shape"),
           "A tensor with the same data and another shape (differentiable).")
      .def("with_format", [](const TensorPtr& t, const std::string& f) {
        Format fmt;
        if (!format_from_name(f, &fmt)) fail<ValueError>("with_format", "unknown format '", f, "'; supported: DefaultFormat, NCHW, NHWC");
        auto out = detach(t);
        out->set_format(fmt);
        return out;
      }, py::arg("format"), "A view of the same data tagged with a layout format (NCHW, NHWC...).")
      .def("backward", [](const TensorPtr& t, py::object grad, py::object retain_graph, bool create_graph) {
        PythonScope scope;
        TensorList grads{grad.is_none() ? nullptr : to_tensor(grad, "backward", "grad")};
        const bool retain = retain_graph.is_none() ? create_graph : retain_graph.cast<bool>();
        if (create_graph && PyErr_WarnEx(PyExc_UserWarning, kCreateGraphCycle, 1) != 0) {
          throw py::error_already_set();
        }
        ReleaseGil nogil;
        run_backward({t}, grads, retain, create_graph);
      }, py::arg("grad") = py::none(), py::arg("retain_graph") = py::none(), py::arg("create_graph") = false,
         "Accumulate the gradient of this tensor into the .grad of the leaves it depends on.\n"
         "retain_graph defaults to create_graph, as in PyTorch.")
      .def("__dlpack__", [](const TensorPtr& t, py::object stream, py::object max_version, py::object dl_device,
                            py::object copy) {
        const DLDevice at = dl_device_of(t->device());
        const py::tuple here = py::make_tuple(int(at.device_type), at.device_id);
        if (!dl_device.is_none() && !dl_device.equal(here)) {
          throw py::buffer_error(message("__dlpack__", "cannot export to DLPack device ",
                                         py::repr(dl_device).cast<std::string>(), "; the tensor is on ",
                                         py::repr(here).cast<std::string>(), " (", t->device().str(), ")"));
        }
        if (!t->on_host()) order_for_consumer(*t, stream);
        return to_dlpack(t, max_version, copy);
      }, py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
         py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        const DLDevice at = dl_device_of(t.device());
        return py::make_tuple(int(at.device_type), at.device_id);
      })
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) fail<TypeError>("len", "len() of a 0-d tensor");
        return t.shape()[0];
      })
      .def("__float__", [](const TensorPtr& t) { return item(t).cast<double>(); })
      .def("__int__", [](const TensorPtr& t) { return py::int_(item(t)); })
      .def("__bool__", [](const TensorPtr& t) { return py::bool_(item(t)).cast<bool>(); })
      .def_property_readonly_static("__array_ufunc__", [](py::object) { return py::none(); });

  tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  // Tensor objects are made by opforge only: one from Tensor.__new__ would hold no tensor, and
  // every conversion and method would read a holder that is not there. So the type's tp_new
  // refuses (for subclasses and pybind11_object.__new__(Tensor) too), and so does Tensor.__new__.
  tensor_type->tp_new = [](PyTypeObject*, PyObject*, PyObject*) -> PyObject* {
    set_error(TypeError(message("Tensor", kNoTensorNew)));
    return nullptr;
  };
  py::cpp_function refuse_new([](const py::args&, const py::kwargs&) -> py::object {
    fail<TypeError>("Tensor", kNoTensorNew);
  });
  if (PyDict_SetItemString(tensor_type->tp_dict, "__new__", py::staticmethod(refuse_new).ptr()) != 0) {
    throw py::error_already_set();
  }
  PyType_Modified(tensor_type);
  m.def("_foreach", [](py::handle fn, py::tuple args, py::dict kwargs) {
    PythonScope scope;
    return foreach_call(fn, args, kwargs);
  },
        "opforge.foreach's work: op over lists of tensors (the op's spec says foreach: true).");
  m.def("_foreach_check",
        [](py::handle fn, py::tuple args, py::dict kwargs) {
          PythonScope scope;
          return foreach_call(fn, args, kwargs, true);
        },
        "_foreach's checks of every position, raising what the call would raise, without running it "
        "(opforge.optim checks each group of a step before the first runs).");
  m.def("from_numpy", [](py::handle a) {
    PythonScope scope;
    return to_tensor(a, "from_numpy", "array");
  }, py::arg("array"),
        "Wrap a NumPy array (or any buffer-protocol object) without copying.");
  m.def("from_dlpack", [](py::handle a) {
    PythonScope scope;
    if (py::isinstance<Tensor>(a)) return holder_of(a.ptr(), "from_dlpack", "x");
    if (PyCapsule_CheckExact(a.ptr())) return from_capsule(a, "from_dlpack", "x");
    if (!py::hasattr(a, "__dlpack__")) fail<TypeError>("from_dlpack", "object of type ", type_name(a), " has no __dlpack__");
    return from_dlpack_obj(a, "from_dlpack", "x");
  }, py::arg("x"), "Wrap a DLPack producer (torch tensor, NumPy array, ...) without copying.");
  m.def("_convert", [](const TensorPtr& t, py::handle d) {
    const DType dtype = parse_dtype(d, "tensor");
    auto out = empty(dtype, t->shape(), t->format());
    copy_into(out, t);
    return out;
  });
  m.def("_zeros_like", [](const TensorPtr& t) { return zeros_like(t); });
  // forward mode (opforge.jvp): dual tensors and the tangents ops compute from them
  m.def("_make_dual", [](const TensorPtr& primal, const TensorPtr& tangent) { return make_dual(primal, tangent); },
        py::arg("primal"), py::arg("tangent"));
  m.def("_tangent", [](const TensorPtr& t) { return t->fw_grad(); }, py::arg("t"),
        "The tangent t carries (forward mode), or None.");
  m.def("_drop_tangent", [](const TensorPtr& t) { t->set_fw_grad(nullptr); }, py::arg("t"));
  // The path of an aot op's external library, loaded and checked for the symbol (RuntimeError
  // naming the paths tried and the symbol otherwise): what framework adapters hand the host.
  m.def("_aot_infer_shape", &aot::call_infer_shape, py::arg("symbol"), py::arg("shapes"));
  // The last failure of an AOT entry point in this process, as (status, message), taken (a
  // second call gives (0, "")): opforge.mindspore raises it where MindSpore reports only the code.
  m.def("_aot_take_failure", [] {
    aot::Failure f = aot::take_failure();
    return py::make_tuple(f.status, f.message);
  });
  m.def("_aot_library", [](const std::string& op, const std::string& library, const std::string& symbol) {
    return aot::resolve(op.c_str(), library.c_str(), symbol.c_str()).path;
  });
  // A tensor of any shape and dtype holding no memory of its own (every stride 0 over one
  // read-only zero element): the stand-in inputs of opforge._C._meta.<op>, which computes output
  // shapes and dtypes without running a kernel.
  m.def("_meta_tensor", [](const Shape& shape, py::handle d, const std::string& format) {
    static const double zero[2] = {0.0, 0.0};
    const DType dtype = parse_dtype(d, "_meta_tensor");
    checked_numel("_meta_tensor", shape, dtype);  // (no negative dimension; a size int64 holds, as any tensor's)
    auto storage = std::make_shared<Storage>();
    storage->data = const_cast<double*>(zero);
    storage->nbytes = sizeof(zero);
    storage->external = true;
    storage->readonly = true;
    Format fmt;
    if (!format_from_name(format, &fmt)) fail<ValueError>("_meta_tensor", "unknown format '", format, "'");
    return std::make_shared<Tensor>(std::move(storage), dtype, shape, Shape(shape.size(), 0), 0, fmt);
  }, py::arg("shape"), py::arg("dtype"), py::arg("format") = "DefaultFormat");
  m.def("_parse_dtype", [](py::handle d) { return dtype_name(parse_dtype(d, "dtype")); });
  // Test hook: records whether the GIL was held when each op's kernel dispatch began.
  m.def("_trace_gil", [](bool on) {
    static std::vector<std::pair<std::string, bool>> calls;
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    auto out = calls;
    calls.clear();
    on_checked_call = on ? +[](const OpInfo& info) {
      std::lock_guard<std::mutex> g(lock);
      calls.emplace_back(info.name, PyGILState_Check() != 0);
    } : nullptr;
    return out;
  }, py::arg("on"), "Start (True) or stop (False) tracing op calls; returns [(op, gil_held)] so far.");
  // Test hook: the AOT entry points' reading of a float or int attr's text.
  m.def("_aot_attr_value", [](const std::string& type, const std::string& text) -> py::object {
    if (type == "float") return py::float_(aot::parse_float("aot", "attr", text));
    if (type == "int") return py::int_(aot::parse_int("aot", "attr", text));
    fail<ValueError>("_aot_attr_value", "type must be 'float' or 'int', got '", type, "'");
  }, py::arg("type"), py::arg("text"));
  m.def("_drain_at_exit", [] { drain_at_exit(std::chrono::seconds(2)); },
        "atexit hook: waits (at most 2 s) until no other thread is inside an op call, and parks daemon "
        "threads that would start one (see src/python/gil.h).");
  static const int atfork = pthread_atfork(nullptr, nullptr, [] { reset_drain_in_child(); });
  (void)atfork;
  m.def("is_grad_enabled", &GradMode::is_enabled);
  m.def("set_grad_enabled", &GradMode::set_enabled, py::arg("enabled"));
  m.def("_run_backward", [](const TensorList& roots, std::vector<py::object> grads, bool retain_graph,
                            bool create_graph, const TensorList& inputs, bool allow_unused) {
    PythonScope scope;
    TensorList gs;
    for (auto& g : grads) gs.push_back(g.is_none() ? nullptr : to_tensor(g, "backward", "grad"));
    ReleaseGil nogil;
    return run_backward(roots, gs, retain_graph, create_graph, inputs, allow_unused);
  });
  m.def("op_info", [](const std::string& name) {
    const OpInfo* op = find_op(name);
    if (!op) {
      std::string names;
      for (const OpInfo* o : registry()) names += std::string(names.empty() ? "" : ", ") + o->name;
      fail<ValueError>("op_info", "unknown op '", name, "'; known ops: ", names);
    }
    return target_info(*op);
  }, py::arg("name"));
  m.def("_op_info_of", [](py::handle fn) {
    // (an op module's own registration: op_info(name) gives the name's latest, which another
    // module may have registered under the same name)
    PyObject* self = PyCFunction_Check(fn.ptr()) && PyCFunction_GET_FUNCTION(fn.ptr()) ==
                     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_op))
                     ? PyCFunction_GET_SELF(fn.ptr()) : nullptr;
    if (self == nullptr || !PyCapsule_IsValid(self, "opforge.OpCaller")) {
      fail<TypeError>("op_info", "takes an op function (<module>.<op> or <module>._meta.<op>), got ", type_name(fn));
    }
    return target_info(*static_cast<const OpCaller*>(PyCapsule_GetPointer(self, "opforge.OpCaller"))->entry->info);
  }, py::arg("fn"), "The registration info (as op_info) of this op function's own op.");
  m.def("list_ops", [] {
    std::vector<std::string> names;
    for (const OpInfo* o : registry()) names.push_back(o->name);
    std::sort(names.begin(), names.end());
    return names;
  });
  // devices (device.h): opforge.cuda and tensor(device=) read these
  m.def("_device_count", [](const std::string& type) {
    DeviceRuntime* rt = find_device_runtime(parse_device("device_count", type).type);
    return rt ? rt->device_count() : 0;
  }, py::arg("type"));
  m.def("_device_unavailable_reason", [](const std::string& type) -> std::string {
    DeviceRuntime* rt = find_device_runtime(parse_device("is_available", type).type);
    if (!rt) return std::string("this opforge was built without ") + type + " (its wheel's targets: " + built_targets() + ")";
    return rt->unavailable_reason();
  }, py::arg("type"));
  // The device named by text, checked present (device_runtime's errors); returns its name with the index
  m.def("_check_device", [](const std::string& op, const std::string& text) {
    Device d = parse_device(op.c_str(), text);
    if (d.type != DeviceType::CPU) device_runtime(op.c_str(), d);
    return d.str();
  }, py::arg("op"), py::arg("device"));
  m.def("_synchronize", [](const std::string& text) {
    Device d = parse_device("synchronize", text);
    DeviceRuntime& rt = device_runtime("synchronize", d);
    ReleaseGil nogil;
    rt.synchronize("synchronize", d.index);
  }, py::arg("device"));
  m.def("_set_sync_index_checks", [](bool on) { return set_sync_index_checks(on); }, py::arg("on"));
  m.def("_sync_index_checks", []() { return sync_index_checks(); });
  m.def("_device_runtime_version", [](const std::string& type) -> std::string {
    DeviceRuntime* rt = find_device_runtime(parse_device("version", type).type);
    return rt ? rt->version() : "";
  }, py::arg("type"));
  // memory and streams of a device type's runtime (opforge.cuda); streams cross as ints (cudaStream_t)
  m.def("_memory_allocated", [](const std::string& text) -> size_t {
    Device d = parse_device("memory_allocated", text);
    DeviceRuntime* rt = find_device_runtime(d.type);
    if (!rt || rt->device_count() == 0) return 0;
    return rt->memory_allocated(d.index < 0 ? rt->current_device() : d.index);
  }, py::arg("device"));
  m.def("_empty_cache", [](const std::string& type) {
    DeviceRuntime* rt = find_device_runtime(parse_device("empty_cache", type).type);
    if (!rt || rt->device_count() == 0) return;
    ReleaseGil nogil;
    rt->empty_cache();
  }, py::arg("type"));
  m.def("_current_stream", [](const std::string& text) {
    Device d = parse_device("current_stream", text);
    DeviceRuntime& rt = device_runtime("current_stream", d);
    return py::make_tuple(d.index, reinterpret_cast<uintptr_t>(rt.current_stream(d.index)));
  }, py::arg("device"));
  // op: an op call on its caller's stream (opforge.torch's kernel), checked as StreamScope does
  m.def("_set_current_stream", [](const std::string& text, uintptr_t stream, const std::string& op) {
    Device d = parse_device("set_stream", text);
    DeviceRuntime& rt = device_runtime("set_stream", d);
    if (!op.empty()) check_caller_stream(op.c_str(), rt, d, reinterpret_cast<void*>(stream));
    rt.set_current_stream(d.index, reinterpret_cast<void*>(stream));
  }, py::arg("device"), py::arg("stream"), py::arg("op") = "");
  m.def("_create_stream", [](const std::string& text) {
    Device d = parse_device("Stream", text);
    DeviceRuntime& rt = device_runtime("Stream", d);
    return py::make_tuple(d.index, reinterpret_cast<uintptr_t>(rt.create_stream("Stream", d.index)));
  }, py::arg("device"));
  m.def("_release_stream", [](int index, uintptr_t stream) {
    Device d{DeviceType::CUDA, index};
    device_runtime("Stream", d).destroy_stream(index, reinterpret_cast<void*>(stream));
  }, py::arg("index"), py::arg("stream"));
  m.def("_synchronize_stream", [](int index, uintptr_t stream) {
    Device d{DeviceType::CUDA, index};
    DeviceRuntime& rt = device_runtime("synchronize", d);
    ReleaseGil nogil;
    rt.synchronize_stream("synchronize", index, reinterpret_cast<void*>(stream));
  }, py::arg("index"), py::arg("stream"));
  m.def("_stream_wait", [](int index, uintptr_t waiter, uintptr_t waitee) {
    Device d{DeviceType::CUDA, index};
    device_runtime("wait_stream", d).stream_wait("wait_stream", index, reinterpret_cast<void*>(waiter),
                                                  reinterpret_cast<void*>(waitee));
  }, py::arg("index"), py::arg("waiter"), py::arg("waitee"));
  // graphs (opforge.cuda.CUDAGraph): a device runtime's graph handle, released with the object
  py::class_<GraphHandle> graph(m, "_Graph");
  graph
      .def(py::init<const std::string&>(), py::arg("device"))
      // (lambdas taking a reference, not member pointers, whose self None would load as null)
      .def("capture_begin", [](GraphHandle& g) { g.capture_begin(); })
      .def("capture_end", [](GraphHandle& g, bool discard) { g.capture_end(discard); }, py::arg("discard") = false)
      .def("replay", [](GraphHandle& g) { g.replay(); })
      .def("reset", [](GraphHandle& g) { g.reset(); })
      .def_property_readonly("device", [](const GraphHandle& g) { return g.device(); });
  seal_type(graph.ptr());
  // Tensor is sealed by opforge/__init__.py once it has added its Python methods and operators
  m.def("_seal_tensor_type", [] { seal_type(reinterpret_cast<PyObject*>(tensor_type)); });
  m.def("_graph_memory", [](const std::string& text) -> size_t {
    Device d = parse_device("graph_memory", text);
    DeviceRuntime* rt = find_device_runtime(d.type);
    if (!rt || rt->device_count() == 0) return 0;
    return rt->graph_memory(d.index < 0 ? rt->current_device() : d.index);
  }, py::arg("device"));
  m.def("_to", [](const TensorPtr& t, const std::string& text) {
    Device d = parse_device("to", text);
    ReleaseGil nogil;
    return to(t, d);  // (differentiable: recorded when t requires grad)
  }, py::arg("tensor"), py::arg("device"));
  m.attr("built_targets") = built_targets();
}

PyObject* create_op_module(PyModuleDef* def, const char* name, const char* doc, const binding::RegisterOp* ops,
                           size_t n, const char* abi) {
  try {
    py::module_::import("opforge");  // opforge's Python types (Tensor) are registered first
    const std::string here = py::str(py::module_::import("opforge._native").attr("abi_id")());
    if (here != abi) {
      PyErr_Format(PyExc_ImportError,
                   "[%s] was compiled against another build of opforge (ABI %s; this opforge's is %s: its "
                   "headers or compiler differ) and cannot load here: rebuild it against this opforge "
                   "(opforge build, or pip install it again)", name, abi, here.c_str());
      return nullptr;
    }
    auto m = py::module_::create_extension_module(name, doc, def);
    py::options options;
    options.disable_function_signatures();  // each op's docstring starts with its typed signature
    auto meta = m.def_submodule("_meta", "Output shapes and dtypes of each op's call, computed without running it.");
    for (size_t i = 0; i < n; ++i) def_op(m, meta, ops[i]());
    return m.release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
  }
  return nullptr;
}

}  // namespace opforge::python

// ---------------------------------------------------------------------------- pyfunc ops

namespace opforge::pyfunc {

namespace {

namespace py = pybind11;

// The exception being handled, raised again as the same type with "[op] pyfunc 'target': " before
// its message and the original as its __cause__ (a type that cannot be made from one message
// keeps the original exception, with that text added as a note).
[[noreturn]] void raise_naming(const std::string& op, const std::string& target, py::error_already_set& e) {
  py::object type = e.type();
  py::object original = e.value();
  const std::string text = "[" + op + "] pyfunc '" + target + "': " + py::str(original).cast<std::string>();
  PyObject* fresh = PyObject_CallOneArg(type.ptr(), py::str(text).ptr());
  if (fresh == nullptr || !PyExceptionInstance_Check(fresh)) {
    Py_XDECREF(fresh);
    PyErr_Clear();
    py::object add_note = py::getattr(original, "add_note", py::none());
    if (!add_note.is_none()) add_note(text);
    e.restore();
    throw py::error_already_set();
  }
  PyException_SetCause(fresh, original.release().ptr());  // (steals the reference)
  PyErr_SetObject(type.ptr(), fresh);
  Py_DECREF(fresh);
  throw py::error_already_set();
}

// The function named by target ("module:function"), imported once per process (a failed import is
// tried again at the next call). A dict, not a C++ lock: an import may let other threads take the
// GIL, and one waiting on a lock held by the importing thread would never give it back.
py::object resolve(const char* op, const char* target) {
  static PyObject* cache = PyDict_New();  // (leaked: outlives every op call, even at exit)
  if (PyObject* hit = PyDict_GetItemString(cache, target)) return py::reinterpret_borrow<py::object>(hit);
  const std::string text(target);
  const size_t colon = text.find(':');
  const std::string module = text.substr(0, colon), name = text.substr(colon + 1);
  py::object fn;
  try {
    fn = py::module_::import(module.c_str()).attr(name.c_str());
  } catch (py::error_already_set& e) {
    raise_naming(op, text, e);  // ImportError / AttributeError, naming the op and target
  }
  if (!PyCallable_Check(fn.ptr())) {
    fail<TypeError>(op, "pyfunc '", text, "' is not callable: a ", python::type_name(fn));
  }
  PyDict_SetItemString(cache, target, fn.ptr());
  return fn;
}

// A read-only NumPy array over the input (zero copy; the array holds the tensor, so the memory
// outlives anything the function keeps).
py::object input_array(const char* op, const TensorPtr& t) {
  if (!t) return py::none();
  if (!python::buffer_format(t->dtype())) {
    fail<TypeError>(op, "a pyfunc op cannot take ", dtype_name(t->dtype()), " (NumPy has no ",
                    dtype_name(t->dtype()), " dtype)");
  }
  py::object arr = python::numpy_view(t);
  arr.attr("setflags")(py::arg("write") = false);
  return arr;
}

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += std::to_string(s[i]) + (s.size() == 1 ? "," : i + 1 < s.size() ? ", " : "");
  return out + ")";
}

void fill_output(const char* op, const char* target, const char* name, py::handle r, const TensorPtr& out) {
  py::module_ np = py::module_::import("numpy");
  if (!py::isinstance(r, np.attr("ndarray")) && !py::isinstance(r, np.attr("generic"))) {
    fail<TypeError>(op, "pyfunc '", target, "' must return a NumPy array for output '", name, "', got ",
                    python::type_name(r));
  }
  py::object a = np.attr("asarray")(r);
  const std::string got = py::str(a.attr("dtype").attr("name")).cast<std::string>();
  if (got != dtype_name(out->dtype())) {
    fail<TypeError>(op, "pyfunc '", target, "' returned output '", name, "' of dtype ", got, "; expected ",
                    dtype_name(out->dtype()), " (convert it with .astype)");
  }
  const TensorPtr src = python::to_tensor(a, op, name);
  if (src->shape() != out->shape()) {
    fail<ValueError>(op, "pyfunc '", target, "' returned output '", name, "' of shape ", shape_text(src->shape()),
                     "; expected ", shape_text(out->shape()));
  }
  copy_into(out, src);
}

}  // namespace

void call(const char* op, const char* target, const TensorList& inputs, const std::vector<const char*>& output_names,
          const TensorList& outputs, const Kwargs& kwargs) {
  if (!Py_IsInitialized()) {
    fail<RuntimeError>(op, "pyfunc '", target, "' needs a Python interpreter (none is running)");
  }
  python::AcquireGil gil;  // (held or not: kernels may run with the GIL released, or on another thread)
  // The function's own op calls allocate as usual: the out= buffers offered to this call's
  // allocations (run_into) are not theirs to take (a tensor kept by the function would alias the
  // caller's out without owning it)
  BufferOfferScope no_offers(nullptr);
  py::object fn = resolve(op, target);
  py::tuple args(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) args[i] = input_array(op, inputs[i]);
  py::dict kw;
  for (const auto& [name, value] : kwargs.items()) kw[name] = python::to_python(value);
  py::object result;
  try {
    result = fn(*args, **kw);
  } catch (py::error_already_set& e) {
    raise_naming(op, target, e);
  }
  if (outputs.size() == 1) {
    fill_output(op, target, output_names[0], result, outputs[0]);
    return;
  }
  if (!py::isinstance<py::tuple>(result) || py::len(result) != outputs.size()) {
    fail<TypeError>(op, "pyfunc '", target, "' must return a tuple of ", outputs.size(), " arrays (",
                    outputs.size(), " outputs), got ", python::type_name(result));
  }
  const auto items = py::reinterpret_borrow<py::tuple>(result);
  for (size_t k = 0; k < outputs.size(); ++k) fill_output(op, target, output_names[k], items[k], outputs[k]);
}

}  // namespace opforge::pyfunc
