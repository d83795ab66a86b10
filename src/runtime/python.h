// Python conversions shared by the runtime module and the generated op bindings.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/registry.h"
#include "runtime/tensor.h"

namespace opforge::python {

namespace py = pybind11;

// An opforge Tensor, a buffer-protocol object (NumPy array) or a DLPack producer, zero copy.
TensorPtr to_tensor(py::handle obj, const char* op, const char* arg);

constexpr size_t kMaxParams = 16;  // inputs + attrs of one op
constexpr size_t kMaxInputs = 8;

// Converts the inputs of one call; Python scalars take the dtype their type variable is bound to.
// Allocation-free for up to kMaxInputs inputs (the common case on the per-call hot path).
class InputConverter {
 public:
  explicit InputConverter(const OpInfo& info) : info_(info) {}
  // Converts the next input (None allowed only for optional inputs).
  void add(py::handle obj);
  // Finishes scalar conversion; then operator[] gives the inputs (nullptr for absent ones).
  void finish();
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
};

// One op's Python entry point: a METH_FASTCALL function binding arguments without building
// tuples or dicts. Errors name the op: "[op] unexpected keyword 'alhpa' (did you mean 'alpha'?)",
// "[op] missing required attr 'axis'". `impl` receives every parameter (inputs, then attrs), defaults filled in.
struct OpCaller {
  const OpInfo* info;
  std::vector<py::object> defaults;  // null object: required parameter
  py::object (*impl)(const py::handle* params);
};

// Adds `name` to module m as a fast builtin calling caller (which must outlive the module).
void def_op(py::module_& m, const char* name, const char* doc, OpCaller* caller);

// Attr conversion with "[op] attr 'name' must be ..." errors.
bool attr_bool(const char* op, const char* name, py::handle v);
int64_t attr_int(const char* op, const char* name, py::handle v);
double attr_float(const char* op, const char* name, py::handle v);
std::string attr_str(const char* op, const char* name, py::handle v);
std::vector<int64_t> attr_int_list(const char* op, const char* name, py::handle v);
std::vector<double> attr_float_list(const char* op, const char* name, py::handle v);

template <typename F>
auto attr_optional(py::handle v, F convert) -> std::optional<decltype(convert(v))> {
  if (v.is_none()) return std::nullopt;
  return convert(v);
}

py::object wrap(TensorPtr t);
py::object wrap(const TensorList& ts);
// [(shape tuple, dtype name), ...]: what opforge._C._meta.<op> returns.
py::object metas(const std::vector<TensorMeta>& ms);

void bind_runtime(py::module_& m);

}  // namespace opforge::python
