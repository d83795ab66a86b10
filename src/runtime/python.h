// Python conversions shared by the runtime module and the generated op bindings.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/registry.h"
#include "runtime/tensor.h"

namespace opforge::python {

namespace py = pybind11;

// An opforge Tensor, a buffer-protocol object (NumPy array) or a DLPack producer, zero copy.
TensorPtr to_tensor(py::handle obj, const char* op, const char* arg);

// Converts the inputs of one call; Python scalars take the dtype their type variable is bound to.
class InputConverter {
 public:
  explicit InputConverter(const OpInfo& info) : info_(info) {}
  // Converts input i (None allowed only for optional inputs).
  void add(py::handle obj);
  // Finishes scalar conversion and returns the inputs in order (nullptr for absent ones).
  const TensorList& finish();

 private:
  struct Pending { size_t index; double fvalue; int64_t ivalue; char kind; };  // kind: b(ool) i(nt) f(loat)
  const OpInfo& info_;
  TensorList tensors_;
  std::vector<Pending> pending_;
};

// Binds a call's positional and keyword arguments to the op's parameters (inputs, then attrs),
// filling defaults (a null object marks a required parameter). Errors name the op:
// "[op] unexpected keyword 'alhpa' (did you mean 'alpha'?)", "[op] missing required attr 'axis'".
std::vector<py::handle> bind_args(const OpInfo& info, const std::vector<py::object>& defaults,
                                  const py::args& args, const py::kwargs& kwargs);

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

void bind_runtime(py::module_& m);

}  // namespace opforge::python
