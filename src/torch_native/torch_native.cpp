// opforge's ops as native PyTorch kernels: the CPU and Autograd kernels of torch.ops.<ns>.<op>,
// registered with torch's C++ dispatcher so that a call runs no Python unless it must.
//
// opforge.torch builds this file on first use against the installed torch (its headers and
// libraries: C++ has no stable ABI across torch versions, so the build is cached per torch
// version, see opforge/_torch_native.py) and hands each op to register(): its opforge entry (the
// function of opforge._C.ops, through opforge_op_entry) and what autograd needs from its spec.
//
// - CPU kernel: torch tensors are seen as opforge tensors (zero copy: the torch storage stays
//   alive as long as the opforge tensor), the op's entry runs, and its results become torch
//   tensors owning the opforge tensors. Elementwise ops keep channels_last, and ops with a layout
//   attr run NHWC on channels_last inputs, as the Python kernel does.
// - CUDA kernel (the cu130 wheel, ops with a cuda row): the same view of the inputs; the results
//   are torch tensors from torch's caching allocator (shapes and dtypes from the op's meta rule),
//   offered to the op's allocations so that its kernels write them directly (inside
//   torch.cuda.graph capture they live in the graph's pool), and the op runs on torch's current
//   stream of the inputs' device (opforge's current stream for the call: ordered with torch's work,
//   no synchronization). No CUDA header is needed: the stream is c10's opaque handle.
// - Autograd kernel: without gradients to record, the op is redispatched below autograd. Otherwise
//   the forward runs below autograd too and a C++ node records the graph (next edges, the saved
//   tensors the spec's bprop reads, under torch's version counters); its apply() evaluates the
//   spec's bprop formula, a Python function calling these same torch ops (gradients of gradients
//   work). Calls that need more than this (an input with a forward-mode tangent, a tensor subclass
//   or symbolic sizes, as under torch.compile's tracing) go to the Python autograd.Function.
//
// opforge's exceptions become torch's (TypeError, ValueError, IndexError, MemoryError as
// torch.OutOfMemoryError; others RuntimeError),
// with the op's message.
#include <Python.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/binding.h"
#include "runtime/device.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"

namespace {

using opforge::AttrValue;
using opforge::DType;
using opforge::TensorPtr;
using torch::autograd::variable_list;

constexpr size_t kMaxParams = 16;  // inputs + attrs, and outputs, of one op (as the Python face)

enum class Kind : uint8_t { Bool, Int, Float, Str, IntList, FloatList };

// What the kernels of one op need: its opforge entry and, from its spec, what autograd does.
struct OpData {
  std::string name;
  const opforge::binding::OpEntry* entry = nullptr;
  size_t n_in = 0, n_out = 0;
  std::vector<Kind> kinds;                // per attr
  bool elementwise = false;               // expr ops: channels_last in, channels_last out
  int format_attr = -1;                   // the layout attr (NCHW | NHWC), if the op has one
  std::vector<int> same_input;            // per output: the input its shape is the same as, or -1
  std::vector<char> differentiable;       // per output
  std::vector<std::pair<int, std::vector<int>>> saved;  // (slot: input k or n_in + output j, needers)
  PyObject* backward = nullptr;           // (need, metas, values, douts, attrs) -> grads; null: no bprop
  PyObject* fallback = nullptr;           // the Python autograd.Function's apply(*args)
};

// ---------------------------------------------------------------------------- errors

[[noreturn]] void rethrow_as_torch() {
  const c10::SourceLocation here{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
  try {
    throw;
  } catch (const opforge::TypeError& e) {
    throw c10::TypeError(here, e.what());
  } catch (const opforge::ValueError& e) {
    throw c10::ValueError(here, e.what());
  } catch (const opforge::IndexError& e) {
    throw c10::IndexError(here, e.what());
  } catch (const opforge::MemoryError& e) {  // (torch.OutOfMemoryError, as torch's allocators raise)
    throw c10::OutOfMemoryError(here, e.what());
  } catch (const opforge::Error& e) {
    throw c10::Error(here, e.what());
  }
}

[[noreturn]] void throw_python_error() {
  ::python_error err;
  err.persist();
  throw std::move(err);
}

// A Python object (a new reference), or the Python error as a C++ exception.
PyObject* checked(PyObject* obj) {
  if (obj == nullptr) throw_python_error();
  return obj;
}

// ---------------------------------------------------------------------------- tensors

bool to_opforge_dtype(c10::ScalarType s, DType* out) {
  switch (s) {
    case c10::ScalarType::Bool: *out = DType::Bool; return true;
    case c10::ScalarType::Byte: *out = DType::UInt8; return true;
    case c10::ScalarType::Char: *out = DType::Int8; return true;
    case c10::ScalarType::Short: *out = DType::Int16; return true;
    case c10::ScalarType::Int: *out = DType::Int32; return true;
    case c10::ScalarType::Long: *out = DType::Int64; return true;
    case c10::ScalarType::Half: *out = DType::Float16; return true;
    case c10::ScalarType::BFloat16: *out = DType::BFloat16; return true;
    case c10::ScalarType::Float: *out = DType::Float32; return true;
    case c10::ScalarType::Double: *out = DType::Float64; return true;
    default: return false;
  }
}

c10::ScalarType to_torch_dtype(DType d) {
  switch (d) {
    case DType::Bool: return c10::ScalarType::Bool;
    case DType::UInt8: return c10::ScalarType::Byte;
    case DType::Int8: return c10::ScalarType::Char;
    case DType::Int16: return c10::ScalarType::Short;
    case DType::Int32: return c10::ScalarType::Int;
    case DType::Int64: return c10::ScalarType::Long;
    case DType::Float16: return c10::ScalarType::Half;
    case DType::BFloat16: return c10::ScalarType::BFloat16;
    case DType::Float32: return c10::ScalarType::Float;
    case DType::Float64: return c10::ScalarType::Double;
  }
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   "opforge returned a dtype torch does not have");
}

// torch's name of a dtype ("torch.complex64"), for error messages.
std::string dtype_repr(c10::ScalarType s) {
  std::string name = c10::toString(s);
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyObject* text = PyObject_Str(reinterpret_cast<PyObject*>(torch::getTHPDtype(s)))) {
    if (const char* utf8 = PyUnicode_AsUTF8(text)) name = utf8;
    Py_DECREF(text);
  }
  PyErr_Clear();
  PyGILState_Release(gil);
  return name;
}

// The storage of a torch tensor seen by opforge holds torch's storage: one allocation, no
// separate keep-alive.
struct TorchStorage final : opforge::Storage {
  explicit TorchStorage(c10::Storage s) : torch_storage(std::move(s)) {}
  c10::Storage torch_storage;
};

// A torch tensor (host or CUDA memory) as an opforge tensor (zero copy; the opforge tensor keeps torch's storage).
TensorPtr to_opforge(const OpData& d, size_t i, const at::Tensor& t) {
  DType dtype;
  if (!to_opforge_dtype(t.scalar_type(), &dtype)) {
    throw c10::TypeError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                         "[" + d.name + "] input '" + d.entry->info->inputs[i].name + "' has dtype " +
                             dtype_repr(t.scalar_type()) +
                             ", which opforge does not have; supported dtypes: bool, uint8, int8, int16, int32, "
                             "int64, float16, bfloat16, float32, float64");
  }
  auto storage = std::make_shared<TorchStorage>(t.storage());
  storage->data = t.numel() > 0 ? t.data_ptr() : nullptr;
  storage->nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  storage->external = true;
  if (t.is_cuda()) storage->device = opforge::Device{opforge::DeviceType::CUDA, t.device().index()};
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  return std::make_shared<opforge::Tensor>(std::move(storage), dtype, opforge::Shape(sizes.begin(), sizes.end()),
                                           opforge::Shape(strides.begin(), strides.end()), 0);
}

// An opforge result as a torch tensor that owns it.
at::Tensor to_torch(TensorPtr t) {
  const opforge::Tensor& x = *t;
  const at::IntArrayRef sizes(x.shape());
  const at::IntArrayRef strides(x.strides());
  const auto options = at::TensorOptions().dtype(to_torch_dtype(x.dtype())).device(at::kCPU);
  void* data = x.raw_data();
  auto* owner = new TensorPtr(std::move(t));
  return at::for_blob(data, sizes)
      .strides(strides)
      .context(owner, [](void* p) { delete static_cast<TensorPtr*>(p); })
      .options(options)
      .make_tensor();
}

AttrValue to_attr(Kind kind, const c10::IValue& v) {
  if (v.isNone()) return {};
  switch (kind) {
    case Kind::Bool: return v.toBool();
    case Kind::Int: return v.toInt();
    case Kind::Float: return v.toDouble();
    case Kind::Str: return v.toStringRef();
    case Kind::IntList: return v.toIntVector();
    case Kind::FloatList: return v.toDoubleVector();
  }
  return {};
}

// Whether an input is there (an absent optional input is None, or from C++ an undefined tensor).
bool present(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined(); }

// ---- memory formats (opforge/torch.py's _nhwc_call, for the native kernel)

at::Tensor nhwc(const at::Tensor& t) {
  at::Tensor v = t;
  while (v.dim() < 4) v = v.unsqueeze(0);
  return v.permute({0, 2, 3, 1});
}

bool channels_last_only(const at::Tensor& t) {
  return !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// ---------------------------------------------------------------------------- the CPU and CUDA kernels

struct OpKernel final : c10::OperatorKernel {
  OpKernel(std::shared_ptr<OpData> data, bool on_device) : d(std::move(data)), device(on_device) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n_attrs = d->kinds.size();
    const size_t n_args = d->n_in + n_attrs;
    auto args = torch::jit::last(*stack, n_args);
    std::array<at::Tensor, kMaxParams> views;  // the NHWC views a channels_last call runs on
    std::array<char, kMaxParams> back{};       // the outputs to view back as NCHW
    bool run_nhwc = false;
    std::string nhwc_attr;
    if (d->elementwise || d->format_attr >= 0) run_nhwc = plan_nhwc(args, &views, &back, &nhwc_attr);

    std::array<TensorPtr, kMaxParams> inputs;
    for (size_t i = 0; i < d->n_in; ++i) {
      const c10::IValue& v = args[i];
      if (!present(v)) continue;  // (an absent optional input)
      const at::Tensor& t = run_nhwc && views[i].defined() ? views[i] : v.toTensor();
      // (a negated view, torch._neg_view's, has its sign in a flag, not in memory)
      inputs[i] = t.is_neg() ? to_opforge(*d, i, t.resolve_neg()) : to_opforge(*d, i, t);
    }
    std::array<AttrValue, kMaxParams> attrs;
    for (size_t k = 0; k < n_attrs; ++k) attrs[k] = to_attr(d->kinds[k], args[d->n_in + k]);
    if (run_nhwc && d->format_attr >= 0) attrs[static_cast<size_t>(d->format_attr)] = nhwc_attr;
    std::array<at::Tensor, kMaxParams> results;
    try {
      if (device) {
        run_on_device(args, inputs, attrs, &results);
      } else {
        std::array<TensorPtr, kMaxParams> outputs;
        d->entry->call(inputs.data(), attrs.data(), outputs.data());
        for (size_t j = 0; j < d->n_out; ++j) results[j] = to_torch(std::move(outputs[j]));
      }
    } catch (const opforge::Error&) {
      rethrow_as_torch();
    }
    torch::jit::drop(*stack, n_args);
    for (size_t j = 0; j < d->n_out; ++j) {
      if (run_nhwc && back[j]) results[j] = results[j].permute({0, 3, 1, 2});
      stack->emplace_back(std::move(results[j]));
    }
  }

  // The op on the inputs' device, into results from torch's allocator, on torch's current stream.
  void run_on_device(c10::ArrayRef<c10::IValue> args, std::array<TensorPtr, kMaxParams>& inputs,
                     std::array<AttrValue, kMaxParams>& attrs, std::array<at::Tensor, kMaxParams>* results) const {
    const size_t n_attrs = d->kinds.size();
    std::array<AttrValue, kMaxParams> meta_attrs;  // (the meta rule and the call each take them by move)
    for (size_t k = 0; k < n_attrs; ++k) meta_attrs[k] = attrs[k];
    // shapes and dtypes, and the call's argument errors, before anything is allocated
    const std::vector<opforge::TensorMeta> metas = d->entry->meta(inputs.data(), meta_attrs.data());
    c10::Device where(c10::kCUDA);
    for (size_t i = 0; i < d->n_in; ++i) {
      if (present(args[i]) && args[i].toTensor().is_cuda()) {
        where = args[i].toTensor().device();
        break;
      }
    }
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(where);
    std::array<TensorPtr, kMaxParams> given;
    std::vector<opforge::BufferOffer> offers;
    for (size_t j = 0; j < d->n_out; ++j) {
      const opforge::TensorMeta& m = metas[j];
      const auto options = at::TensorOptions().dtype(to_torch_dtype(m.dtype));
      (*results)[j] = m.device.type == opforge::DeviceType::CUDA
                          ? at::empty(m.shape, options.device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(m.device.index))))
                          : at::empty(m.shape, options);
      given[j] = to_opforge(*d, 0, (*results)[j]);
      offers.push_back(opforge::BufferOffer{given[j]->raw_data(), m.dtype, m.shape, m.device});
    }
    opforge::Device on{opforge::DeviceType::CUDA, where.index()};
    opforge::StreamScope scope(d->name.c_str(), on, stream.native_handle());
    std::array<TensorPtr, kMaxParams> outputs;
    {
      opforge::BufferOfferScope offered(&offers);
      d->entry->call(inputs.data(), attrs.data(), outputs.data());
    }
    for (size_t j = 0; j < d->n_out; ++j) {  // (an intermediate took the offer, or the op returned a view)
      if (outputs[j]->numel() > 0 && outputs[j]->raw_data() != given[j]->raw_data()) opforge::copy_into(given[j], outputs[j]);
    }
  }

  // Whether the call runs in NHWC order (opforge/torch.py's _nhwc_call): an elementwise op whose
  // first 4-d input is channels_last, on NHWC views of every input; an op with a layout attr given
  // NCHW and only channels_last 4-d inputs, on NHWC views of those, with the attr NHWC.
  bool plan_nhwc(c10::ArrayRef<c10::IValue> args, std::array<at::Tensor, kMaxParams>* views,
                 std::array<char, kMaxParams>* back, std::string* attr) const {
    if (d->elementwise) {
      const at::Tensor* first = nullptr;
      for (size_t i = 0; i < d->n_in; ++i) {
        if (!present(args[i])) continue;
        const at::Tensor& t = args[i].toTensor();
        if (t.dim() > 4) return false;
        if (first == nullptr && t.dim() == 4) first = &t;
      }
      if (first == nullptr || !channels_last_only(*first)) return false;
      for (size_t i = 0; i < d->n_in; ++i) {
        if (present(args[i])) (*views)[i] = nhwc(args[i].toTensor());
      }
      for (size_t j = 0; j < d->n_out; ++j) (*back)[j] = 1;
      return true;
    }
    const c10::IValue& fmt = args[d->n_in + static_cast<size_t>(d->format_attr)];
    if (!fmt.isString() || fmt.toStringRef() != "NCHW") return false;
    bool any = false;
    for (size_t i = 0; i < d->n_in; ++i) {
      if (!present(args[i]) || args[i].toTensor().dim() != 4) continue;
      if (!channels_last_only(args[i].toTensor())) return false;
      any = true;
    }
    if (!any) return false;
    for (size_t i = 0; i < d->n_in; ++i) {
      if (present(args[i]) && args[i].toTensor().dim() == 4) (*views)[i] = nhwc(args[i].toTensor());
    }
    for (size_t j = 0; j < d->n_out; ++j) {
      const int k = d->same_input[j];
      (*back)[j] = k >= 0 && (*views)[static_cast<size_t>(k)].defined();
    }
    *attr = "NHWC";
    return true;
  }

  std::shared_ptr<OpData> d;
  bool device;  // the CUDA kernel
};

// ---------------------------------------------------------------------------- Python values

// A new reference to the Python value of an attr or optional tensor.
PyObject* to_python(const c10::IValue& v) {
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  }
  if (v.isIntList()) {
    const auto items = v.toIntVector();
    PyObject* list = checked(PyList_New(static_cast<Py_ssize_t>(items.size())));
    for (size_t i = 0; i < items.size(); ++i) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(items[i]));
    return list;
  }
  if (v.isDoubleList()) {
    const auto items = v.toDoubleVector();
    PyObject* list = checked(PyList_New(static_cast<Py_ssize_t>(items.size())));
    for (size_t i = 0; i < items.size(); ++i) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), PyFloat_FromDouble(items[i]));
    return list;
  }
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   "opforge.torch: an argument of a type the native kernels do not convert: " + v.tagKind());
}

PyObject* wrap(const at::Tensor& t) {
  if (!t.defined()) Py_RETURN_NONE;
  return THPVariable_Wrap(t);
}

// A Python reference released on scope exit.
struct Ref {
  PyObject* p;
  explicit Ref(PyObject* obj) : p(obj) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

// ---------------------------------------------------------------------------- autograd

// Graph nodes are owned by c10::intrusive_ptr in recent torch (2.13 here) and by std::shared_ptr
// with deleteNode in older releases (2.11 on the GPU machines): both are supported, so that the
// same source builds for either. (Templates: only the branch of the installed torch is instantiated.)
template <class N, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  } else {
    // (torch's deleteNode, found by argument-dependent lookup: it exists only in those versions)
    return std::shared_ptr<N>(new N(std::forward<Args>(args)...), [](N* n) { deleteNode(n); });
  }
}

template <class N>
auto self_ptr(N* node) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) {
    return node->getptr();
  } else {
    return node->shared_from_this();
  }
}

struct Metas {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
};

// The graph node of one call: the spec's bprop, evaluated by the op's Python backward function.
struct OpBackward final : torch::autograd::Node {
  explicit OpBackward(std::shared_ptr<OpData> data) : d(std::move(data)) {}

  // (named as torch names an overload: "<op>_backward" would be another op's name, e.g.
  // layer_norm_backward, which layer_norm's bprop may call; an op name has no dot)
  std::string name() const override { return "opforge::" + d->name + ".backward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t n_in = d->n_in;
    variable_list result(n_in);
    bool any = false;
    std::vector<char> need(n_in);
    for (size_t k = 0; k < n_in; ++k) any |= (need[k] = task_should_compute_output(k));
    if (!any) return result;
    std::vector<at::Tensor> values(n_in + d->n_out);
    for (size_t s = 0; s < saved.size(); ++s) {
      if (present[s]) values[static_cast<size_t>(d->saved[s].first)] = saved[s].unpack(self_ptr(this));
    }
    for (size_t g = 0; g < grads.size(); ++g) {  // (an output backward did not reach: zeros, as torch's)
      if (!grads[g].defined()) grads[g] = at::zeros(out_sizes[g], out_options[g]);
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    try {
      Ref py_need(checked(PyTuple_New(static_cast<Py_ssize_t>(n_in))));
      Ref py_metas(checked(PyTuple_New(static_cast<Py_ssize_t>(n_in))));
      for (size_t k = 0; k < n_in; ++k) {
        PyTuple_SET_ITEM(py_need.p, static_cast<Py_ssize_t>(k), PyBool_FromLong(need[k]));
        PyObject* meta = Py_None;
        Py_INCREF(Py_None);
        if (need[k] && metas[k]) {
          Ref shape(checked(PyTuple_New(static_cast<Py_ssize_t>(metas[k]->sizes.size()))));
          for (size_t i = 0; i < metas[k]->sizes.size(); ++i) {
            PyTuple_SET_ITEM(shape.p, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(metas[k]->sizes[i]));
          }
          Py_DECREF(meta);
          meta = checked(PyTuple_Pack(2, shape.p, reinterpret_cast<PyObject*>(torch::getTHPDtype(metas[k]->dtype))));
        }
        PyTuple_SET_ITEM(py_metas.p, static_cast<Py_ssize_t>(k), meta);
      }
      Ref py_values(checked(PyTuple_New(static_cast<Py_ssize_t>(values.size()))));
      for (size_t i = 0; i < values.size(); ++i) PyTuple_SET_ITEM(py_values.p, static_cast<Py_ssize_t>(i), checked(wrap(values[i])));
      Ref py_douts(checked(PyTuple_New(static_cast<Py_ssize_t>(grads.size()))));
      for (size_t g = 0; g < grads.size(); ++g) PyTuple_SET_ITEM(py_douts.p, static_cast<Py_ssize_t>(g), checked(wrap(grads[g])));
      Ref py_attrs(checked(PyTuple_New(static_cast<Py_ssize_t>(attrs.size()))));
      for (size_t k = 0; k < attrs.size(); ++k) PyTuple_SET_ITEM(py_attrs.p, static_cast<Py_ssize_t>(k), checked(to_python(attrs[k])));
      Ref out(checked(PyObject_CallFunctionObjArgs(d->backward, py_need.p, py_metas.p, py_values.p, py_douts.p,
                                                   py_attrs.p, nullptr)));
      Ref seq(checked(PySequence_Fast(out.p, "the bprop formula must return a tuple")));
      if (PySequence_Fast_GET_SIZE(seq.p) != static_cast<Py_ssize_t>(n_in)) {
        PyErr_Format(PyExc_RuntimeError, "[%s] the bprop formula returned %zd gradients for %zu inputs",
                     d->name.c_str(), PySequence_Fast_GET_SIZE(seq.p), n_in);
        throw_python_error();
      }
      for (size_t k = 0; k < n_in; ++k) {
        PyObject* g = PySequence_Fast_GET_ITEM(seq.p, static_cast<Py_ssize_t>(k));
        if (g == Py_None || !need[k]) continue;
        if (!THPVariable_Check(g)) {
          PyErr_Format(PyExc_TypeError, "[%s] the bprop formula's gradient %zu is not a tensor", d->name.c_str(), k);
          throw_python_error();
        }
        result[k] = THPVariable_Unpack(g);
      }
    } catch (...) {
      PyGILState_Release(gil);
      throw;
    }
    PyGILState_Release(gil);
    return result;
  }

  std::shared_ptr<OpData> d;
  std::vector<torch::autograd::SavedVariable> saved;  // per d->saved entry
  std::vector<char> present;                          // per d->saved entry: saved (a needer needs it)
  std::vector<std::optional<Metas>> metas;            // per input: its shape and dtype, when it needs a gradient
  std::vector<c10::IValue> attrs;
  std::vector<std::vector<int64_t>> out_sizes;        // per differentiable output
  std::vector<at::TensorOptions> out_options;
};

struct AutogradKernel final : c10::OperatorKernel {
  explicit AutogradKernel(std::shared_ptr<OpData> data) : d(std::move(data)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t n_in = d->n_in;
    const size_t n_args = n_in + d->kinds.size();
    auto args = torch::jit::last(*stack, n_args);
    bool requires_grad = false, special = false, tangent = false;
    for (size_t i = 0; i < n_in; ++i) {
      if (!args[i].isTensor()) continue;
      const at::Tensor& t = args[i].toTensor();
      if (!t.defined()) continue;
      requires_grad = requires_grad || t.requires_grad();
      tangent = tangent || t._fw_grad(0).defined();
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      special = special || impl->is_python_dispatch() || impl->has_symbolic_sizes_strides();
    }
    const bool record = d->backward != nullptr && requires_grad && at::GradMode::is_enabled();
    if (d->fallback != nullptr && (tangent || (record && special))) {
      python_fallback(stack);
      return;
    }
    if (!record) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
      return;
    }
    std::vector<at::Tensor> inputs(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      if (args[i].isTensor()) inputs[i] = args[i].toTensor();
    }
    auto node = make_node<OpBackward>(d);
    node->attrs.assign(args.begin() + static_cast<ptrdiff_t>(n_in), args.end());
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    }
    auto results = torch::jit::last(*stack, d->n_out);
    node->set_next_edges(torch::autograd::collect_next_edges(inputs));
    std::vector<char> need(n_in);
    node->metas.resize(n_in);
    for (size_t k = 0; k < n_in; ++k) {
      need[k] = inputs[k].defined() && inputs[k].requires_grad();
      if (need[k]) node->metas[k] = Metas{inputs[k].sizes().vec(), inputs[k].scalar_type()};
    }
    for (size_t j = 0; j < d->n_out; ++j) {
      if (!d->differentiable[j]) continue;
      const at::Tensor& out = results[j].toTensor();
      torch::autograd::set_history(out, node);
      node->out_sizes.push_back(out.sizes().vec());
      node->out_options.push_back(out.options());
    }
    node->saved.reserve(d->saved.size());
    for (const auto& [slot, needers] : d->saved) {
      bool used = false;
      for (int k : needers) used = used || need[static_cast<size_t>(k)];
      const auto s = static_cast<size_t>(slot);
      const at::Tensor& value = s < n_in ? inputs[s] : results[s - n_in].toTensor();
      node->present.push_back(used && value.defined());
      node->saved.emplace_back(used ? value : at::Tensor(), /*is_output=*/s >= n_in);
    }
  }

  // The Python autograd.Function (forward-mode tangents, tensor subclasses, symbolic sizes).
  void python_fallback(torch::jit::Stack* stack) const {
    const size_t n_args = d->n_in + d->kinds.size();
    auto args = torch::jit::last(*stack, n_args);
    PyGILState_STATE gil = PyGILState_Ensure();
    std::vector<at::Tensor> outs;
    try {
      Ref py_args(checked(PyTuple_New(static_cast<Py_ssize_t>(n_args))));
      for (size_t i = 0; i < n_args; ++i) PyTuple_SET_ITEM(py_args.p, static_cast<Py_ssize_t>(i), checked(to_python(args[i])));
      Ref out(checked(PyObject_Call(d->fallback, py_args.p, nullptr)));
      if (d->n_out == 1) {
        outs.push_back(THPVariable_Unpack(out.p));
      } else {
        for (size_t j = 0; j < d->n_out; ++j) outs.push_back(THPVariable_Unpack(PyTuple_GET_ITEM(out.p, static_cast<Py_ssize_t>(j))));
      }
    } catch (...) {
      PyGILState_Release(gil);
      throw;
    }
    PyGILState_Release(gil);
    torch::jit::drop(*stack, n_args);
    for (auto& t : outs) stack->emplace_back(std::move(t));
  }

  std::shared_ptr<OpData> d;
};

// ---------------------------------------------------------------------------- registration

// The libraries holding the registrations (one per namespace and key; never unloaded).
std::map<std::pair<std::string, c10::DispatchKey>, std::unique_ptr<torch::Library>>& libraries() {
  static auto* libs = new std::map<std::pair<std::string, c10::DispatchKey>, std::unique_ptr<torch::Library>>();
  return *libs;
}

torch::Library& library(const std::string& ns, c10::DispatchKey key) {
  auto& lib = libraries()[{ns, key}];
  if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return *lib;
}

bool kind_of(const char* type, Kind* kind) {
  static const std::pair<std::string_view, Kind> kinds[] = {
      {"bool", Kind::Bool}, {"int", Kind::Int}, {"float", Kind::Float},
      {"str", Kind::Str}, {"list[int]", Kind::IntList}, {"list[float]", Kind::FloatList}};
  for (const auto& [name, k] : kinds) {
    if (name == type) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// register(namespace, fn, elementwise, format_attr, same_input, differentiable, saved, backward, fallback, cuda)
PyObject* register_op(PyObject*, PyObject* args) {
  const char* ns;
  PyObject *fn, *same_input, *differentiable, *saved, *backward, *fallback;
  int elementwise, format_attr, cuda;
  if (!PyArg_ParseTuple(args, "sOpiOOOOOp", &ns, &fn, &elementwise, &format_attr, &same_input, &differentiable,
                        &saved, &backward, &fallback, &cuda)) {
    return nullptr;
  }
  const opforge::binding::OpEntry* entry = opforge_op_entry(fn);
  if (entry == nullptr) {
    PyErr_SetString(PyExc_TypeError, "opforge.torch: not an opforge op function");
    return nullptr;
  }
  try {
    auto d = std::make_shared<OpData>();
    const opforge::OpInfo& info = *entry->info;
    d->name = info.name;
    d->entry = entry;
    d->n_in = info.inputs.size();
    d->n_out = info.outputs.size();
    if (d->n_in + info.attrs.size() > kMaxParams || d->n_out > kMaxParams) {
      PyErr_Format(PyExc_ValueError, "[%s] has more parameters than opforge.torch's native kernels take", info.name);
      return nullptr;
    }
    for (const opforge::AttrInfo& a : info.attrs) {
      Kind k;
      if (!kind_of(a.type, &k)) {
        PyErr_Format(PyExc_ValueError, "[%s] attr '%s' has type %s, which the native kernels do not convert", info.name,
                     a.name, a.type);
        return nullptr;
      }
      d->kinds.push_back(k);
    }
    d->elementwise = elementwise != 0;
    d->format_attr = format_attr;
    for (Py_ssize_t j = 0; j < PySequence_Size(same_input); ++j) {
      Ref v(checked(PySequence_GetItem(same_input, j)));
      d->same_input.push_back(static_cast<int>(PyLong_AsLong(v.p)));
    }
    for (Py_ssize_t j = 0; j < PySequence_Size(differentiable); ++j) {
      Ref v(checked(PySequence_GetItem(differentiable, j)));
      d->differentiable.push_back(static_cast<char>(PyObject_IsTrue(v.p)));
    }
    for (Py_ssize_t s = 0; s < PySequence_Size(saved); ++s) {
      Ref item(checked(PySequence_GetItem(saved, s)));
      int slot;
      PyObject* needers;
      if (!PyArg_ParseTuple(item.p, "iO", &slot, &needers)) return nullptr;
      std::vector<int> ks;
      for (Py_ssize_t i = 0; i < PySequence_Size(needers); ++i) {
        Ref v(checked(PySequence_GetItem(needers, i)));
        ks.push_back(static_cast<int>(PyLong_AsLong(v.p)));
      }
      d->saved.emplace_back(slot, std::move(ks));
    }
    if (PyErr_Occurred()) return nullptr;
    if (d->same_input.size() != d->n_out || d->differentiable.size() != d->n_out) {
      PyErr_Format(PyExc_ValueError, "[%s] one entry per output expected", info.name);
      return nullptr;
    }
    if (backward != Py_None) {
      Py_INCREF(backward);  // (kept as long as the registration: the process)
      d->backward = backward;
    }
    if (fallback != Py_None) {
      Py_INCREF(fallback);
      d->fallback = fallback;
    }
    library(ns, c10::DispatchKey::CPU).impl(info.name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(d, false)));
    if (cuda) {
      library(ns, c10::DispatchKey::CUDA)
          .impl(info.name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(d, true)));
    }
    library(ns, c10::DispatchKey::Autograd)
        .impl(info.name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(d)));
  } catch (const ::python_error& e) {
    const_cast<::python_error&>(e).restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"register", register_op, METH_VARARGS,
     "register(namespace, fn, elementwise, format_attr, same_input, differentiable, saved, backward, fallback, "
     "cuda): the op of fn (a function of opforge._C.ops or of an op module) as the native CPU and Autograd "
     "kernels of torch.ops.<namespace>.<op>, and its CUDA kernel when cuda is true"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "opforge_torch_native",
                          "opforge's ops as native PyTorch kernels (built by opforge.torch on first use)", -1,
                          methods};

}  // namespace

PyMODINIT_FUNC PyInit_opforge_torch_native() { return PyModule_Create(&module_def); }
