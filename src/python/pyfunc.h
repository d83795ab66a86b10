// The kernel of a pyfunc op (impl: {pyfunc: "module:function"}): calls a Python function on NumPy
// arrays. Declared without pybind11 so that generated code needs no Python headers for it; defined
// in python.cpp, beside the other Python glue.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "runtime/binding.h"
#include "runtime/tensor.h"

namespace opforge::pyfunc {

// An attr's value as the Python function gets it (monostate: None).
using Value = AttrValue;

// The attrs of one call, in spec order, passed as keyword arguments.
class Kwargs {
 public:
  template <typename T>
  Kwargs& add(const char* name, const T& v) {
    items_.emplace_back(name, Value(v));
    return *this;
  }
  template <typename T>
  Kwargs& add(const char* name, const std::optional<T>& v) {
    items_.emplace_back(name, v ? Value(*v) : Value());
    return *this;
  }
  const std::vector<std::pair<const char*, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<const char*, Value>> items_;
};

// Calls `target` ("module:function", imported once) with the GIL held: every input as a read-only
// NumPy array (None when absent), the attrs as keyword arguments. It must return one array per
// output (a tuple for several) of exactly the output's dtype and shape; they are copied into
// `outputs` (preallocated). Mistakes raise TypeError / ValueError naming the op and output; an
// exception of the function propagates as the same Python exception type naming the op.
void call(const char* op, const char* target, const TensorList& inputs,
          const std::vector<const char*>& output_names, const TensorList& outputs, const Kwargs& kwargs);

}  // namespace opforge::pyfunc
