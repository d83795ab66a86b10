// The extension module opforge._C: runtime bindings plus the generated ops in opforge._C.ops.
#include <pybind11/pybind11.h>

#include "runtime/python.h"

namespace opforge {
void register_all_ops(pybind11::module_& m);  // generated: ops_registry.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "opforge runtime and generated ops";
  opforge::python::bind_runtime(m);
  auto ops = m.def_submodule("ops", "Ops generated from op_specs/.");
  pybind11::options options;
  options.disable_function_signatures();  // each op's docstring starts with its typed signature
  opforge::register_all_ops(ops);
}
