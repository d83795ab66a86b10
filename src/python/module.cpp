// The extension module opforge._C: runtime bindings plus the generated ops in opforge._C.ops
// (and their output-shape rules in opforge._C._meta).
#include <pybind11/pybind11.h>

#include <vector>

#include "python/python.h"

namespace opforge {
std::vector<binding::RegisterOp> all_ops();  // generated: ops_registry.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "opforge runtime and generated ops";
  opforge::python::bind_runtime(m);
  auto ops = m.def_submodule("ops", "Ops generated from op_specs/.");
  pybind11::options options;
  options.disable_function_signatures();  // each op's docstring starts with its typed signature
  auto meta = m.def_submodule("_meta", "Output shapes and dtypes of each op's call, computed without running it.");
  for (opforge::binding::RegisterOp op : opforge::all_ops()) opforge::python::def_op(ops, meta, op());
}
