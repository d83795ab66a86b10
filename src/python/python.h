// Python conversions of the runtime module (opforge._C) and of every op's entry (binding.h).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/binding.h"
#include "runtime/registry.h"
#include "runtime/tensor.h"

// pybind11 declares its types hidden, and GCC gives anything whose signature names them hidden
// visibility too; these are libopforge.so's Python API, used by _C and by op modules built
// against it, so they say default visibility explicitly (and their hidden-typed fields are fine:
// pybind11's objects are plain PyObject pointers in every module).
#define OPFORGE_PY_API __attribute__((visibility("default")))
// A Python argument bound to a TensorPtr is never None. pybind11 loads None into a shared_ptr
// argument as a null pointer (and accepts None as the self of a method bound without py::arg),
// which every binding would then dereference: None now fails to load, so the call raises
// pybind11's TypeError listing the accepted argument types. (References, `const Tensor&`,
// already refuse None; optional tensors are py::object or py::handle.)
namespace pybind11::detail {
template <>
class type_caster<std::shared_ptr<opforge::Tensor>>
    : public copyable_holder_caster<opforge::Tensor, std::shared_ptr<opforge::Tensor>> {
 public:
  bool load(handle src, bool convert) {
    return !src.is_none() && copyable_holder_caster<opforge::Tensor, std::shared_ptr<opforge::Tensor>>::load(src, convert);
  }
};
}  // namespace pybind11::detail

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"

namespace opforge::python {

namespace py = pybind11;

// An opforge Tensor, a buffer-protocol object (NumPy array) or a DLPack producer, zero copy.
OPFORGE_PY_API TensorPtr to_tensor(py::handle obj, const char* op, const char* arg);

constexpr size_t kMaxParams = 16;  // inputs + attrs of one op
constexpr size_t kMaxInputs = 8;

// The tensors of Python numbers that every position of an opforge.foreach call shares (an input
// given as one number, not a list): made once per dtype and device, not once per position (on a
// device each is a fill kernel).
struct SharedNumbers {
  struct Entry { size_t index; DType dtype; Device device; TensorPtr tensor; };
  uint32_t inputs = 0;  // bit k: input k is one number every position shares
  std::vector<Entry> made;
};

// Converts the inputs of one call; Python scalars take the dtype their type variable is bound to
// and the device of the call's first tensor.
// Allocation-free for up to kMaxInputs inputs (the common case on the per-call hot path).
class OPFORGE_PY_API InputConverter {
 public:
  explicit InputConverter(const OpInfo& info) : info_(info) {}
  // (with the GIL held) hands the wrappers of NumPy arrays that nothing else holds back to this
  // thread's pool, each releasing its array
  ~InputConverter();
  InputConverter(const InputConverter&) = delete;
  InputConverter& operator=(const InputConverter&) = delete;
  // Converts the next input (None allowed only for optional inputs).
  void add(py::handle obj);
  // Finishes scalar conversion (taking shared's numbers from it, where given); then operator[]
  // gives the inputs (nullptr for absent ones).
  void finish(SharedNumbers* shared = nullptr);
  const TensorPtr& operator[](size_t i) const { return tensors_[i]; }
  // Whether the call is big enough that its kernel should run without the GIL.
  bool release_gil() const { return elements_ >= kReleaseGilElements; }
  static constexpr int64_t kReleaseGilElements = 16384;  // tiny kernels keep it, as NumPy's do

 private:
  struct Pending { size_t index; double fvalue; int64_t ivalue; char kind; };  // kind: b(ool) i(nt) f(loat)
  const OpInfo& info_;
  TensorPtr tensors_[kMaxInputs];
  size_t n_ = 0;
  Pending pending_[kMaxInputs];
  size_t n_pending_ = 0;
  int64_t elements_ = 0;
  uint32_t wrapped_ = 0;  // bit i: input i wraps a NumPy array (from_ndarray)
};

// Adds the op of `entry` (which must outlive the modules) to m as a fast builtin and to meta as
// its meta rule (returning [(shape, dtype), ...] per output). Each is a METH_FASTCALL function
// binding arguments without building tuples or dicts; errors name the op: "[op] unexpected keyword
// 'alhpa' (did you mean 'alpha'?)", "[op] missing required attr 'axis'", "[op] attr 'axis' must be
// an int ...". The attrs are converted by their AttrInfo::type before the entry is called.
OPFORGE_PY_API void def_op(py::module_& m, py::module_& meta, const binding::OpEntry& entry);

// Attr conversion with "[op] attr 'name' must be ..." errors.
OPFORGE_PY_API bool attr_bool(const char* op, const char* name, py::handle v);
OPFORGE_PY_API int64_t attr_int(const char* op, const char* name, py::handle v);
OPFORGE_PY_API double attr_float(const char* op, const char* name, py::handle v);
OPFORGE_PY_API std::string attr_str(const char* op, const char* name, py::handle v);
OPFORGE_PY_API std::vector<int64_t> attr_int_list(const char* op, const char* name, py::handle v);
OPFORGE_PY_API std::vector<double> attr_float_list(const char* op, const char* name, py::handle v);

OPFORGE_PY_API py::object wrap(TensorPtr t);
// [(shape tuple, dtype name), ...]: what opforge._C._meta.<op> returns.
OPFORGE_PY_API py::object metas(const std::vector<TensorMeta>& ms);

// PyInit_<module> of an op module (codegen's module.cpp.j2, which declares this itself so that
// it compiles without pybind11): the module `name` with each op's register function called and
// its entry defined in it and in its `_meta` submodule. `def` must outlive the module. `abi` is
// the opforge ABI id the module was compiled with (opforge/_native.py's abi_id()): another one is
// an ImportError, before any of the module's code runs.
OPFORGE_PY_API PyObject* create_op_module(PyModuleDef* def, const char* name, const char* doc,
                                          const binding::RegisterOp* ops, size_t n, const char* abi);

OPFORGE_PY_API void bind_runtime(py::module_& m);

}  // namespace opforge::python

#pragma GCC diagnostic pop
